"""The command line as users see it, frozen: every command, subcommand and flag, against a golden file.

Scripts, the README and docs/ call these commands; renaming a flag, dropping a choice or making an
argument required breaks them without failing any other test. ``tests/data/cli_surface.json`` holds
the tree that ``build_parser()`` declares; change it deliberately, by regenerating it:

    OPENCOMPOSER_REGENERATE_CLI_SURFACE=1 .venv/bin/python -m pytest -q tests/test_cli_surface.py
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
from pathlib import Path

import pytest

from opencomposer.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "cli_surface.json"
REGENERATE = "OPENCOMPOSER_REGENERATE_CLI_SURFACE"


ACTION_KINDS = {"_StoreTrueAction": "store_true", "_AppendAction": "append", "_RecipeFlag": "set",
                "_RecipeListFlag": "set-append"}


def argument_surface(action: argparse.Action) -> dict:
    """What a caller of one argument relies on; unset attributes are left out to keep lines short."""
    entry: dict = {}
    if action.required and action.option_strings:
        entry["required"] = True
    if action.nargs not in (None, 0):
        entry["nargs"] = action.nargs
    if action.type is not None:
        entry["type"] = action.type.__name__
    if action.choices is not None:
        entry["choices"] = list(action.choices)
    if action.default not in (None, argparse.SUPPRESS, []) and action.default is not False:  # keeps 0
        entry["default"] = action.default
    kind = ACTION_KINDS.get(type(action).__name__)
    if kind:
        entry["action"] = kind
    if getattr(action, "recipe_key", None):
        entry["sets"] = action.recipe_key  # a shorthand for --set KEY=VALUE
    return entry


def cli_surface(parser: argparse.ArgumentParser, path: str = "opencomposer") -> dict[str, dict]:
    """The tree flattened to ``{"opencomposer tasks generate --kind": {...}}``: one entry per command
    (its handler) and per argument (positionals as ``<name>`` with their position), in parser order."""
    node: dict = {}
    if parser.get_default("handler"):
        node["handler"] = parser.get_default("handler")
    surface = {path: node}
    position = 0
    children: dict[str, dict] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            node["subcommands_required"] = bool(action.required)
            for name, sub in sorted(action.choices.items()):
                children.update(cli_surface(sub, f"{path} {name}"))
        elif action.option_strings:
            surface[f"{path} {', '.join(action.option_strings)}"] = argument_surface(action)
        else:
            surface[f"{path} <{action.dest}>"] = {"position": position, **argument_surface(action)}
            position += 1
    return {**surface, **children}


def to_json(surface: dict[str, dict]) -> str:
    """One line per command or argument, so that a change reads as a one-line diff."""
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in surface.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def test_the_cli_surface_matches_the_golden_file() -> None:
    current = to_json(cli_surface(build_parser()))
    if os.environ.get(REGENERATE):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(current)
        pytest.skip(f"regenerated {GOLDEN.relative_to(ROOT)}; review its diff and commit it")
    assert GOLDEN.is_file(), f"{GOLDEN.relative_to(ROOT)} is missing; create it with {REGENERATE}=1"
    golden = GOLDEN.read_text()
    if current != golden:
        diff = "".join(difflib.unified_diff(golden.splitlines(True), current.splitlines(True),
                                            "golden " + str(GOLDEN.relative_to(ROOT)), "build_parser()"))
        pytest.fail(
            "The command-line surface changed (commands, flags, required, choices, defaults or --set "
            "shorthands).\nScripts, README.md and docs/ rely on it. If the change is deliberate, update "
            f"the docs and regenerate the golden file:\n\n    {REGENERATE}=1 .venv/bin/python -m pytest -q "
            f"tests/test_cli_surface.py\n\n{diff}",
            pytrace=False,
        )


def test_every_handler_is_a_function_in_commands() -> None:
    paths = [entry["handler"] for entry in cli_surface(build_parser()).values() if "handler" in entry]
    assert len(paths) == len(set(paths)) > 10
    for path in paths:
        module_name, func_name = path.split(":")
        assert module_name.startswith("opencomposer.commands."), f"{path}: handlers live in opencomposer/commands/"
        assert callable(getattr(importlib.import_module(module_name), func_name, None)), f"{path}: not found"


def test_only_the_cli_and_its_handlers_import_argparse() -> None:
    package = ROOT / "src" / "opencomposer"
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.relative_to(package).parts[0] not in ("cli.py", "commands", "suites")
        and re.search(r"^\s*(import argparse|from argparse import)", path.read_text(), re.M)
    ]
    assert offenders == [], f"library modules take typed arguments, not a Namespace: {offenders}"
