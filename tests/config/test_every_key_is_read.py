"""No recipe key silently does nothing: every field of every section is read by code outside the
config package (as an attribute, or by name in a table such as ``rl.length_penalty``'s
``LENGTH_FEATURES``). ``[numerics]`` is read by the numerics library (``numerics.qlinear``,
``numerics.convert``), which the commands call; that each command applies it is tested in
``tests/pretrain/test_numerics_pretrain.py`` and ``tests/rl/test_numerics_rl.py``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from opencomposer.config import Config
from opencomposer.config.section import field_types, is_section

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "opencomposer"


def recipe_keys(section: type, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, field name) for every value of the recipe."""
    keys = []
    for f in dataclasses.fields(section):
        tp = field_types(section)[f.name]
        if is_section(tp):
            keys += recipe_keys(tp, f"{prefix}{f.name}.")
        else:
            keys.append((prefix + f.name, f.name))
    return keys


def names_read_outside_config() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] in ("config", "suites"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return names


def test_every_recipe_key_is_read_somewhere():
    read = names_read_outside_config()
    unread = [key for key, name in recipe_keys(Config) if name not in read]
    assert not unread, f"recipe keys no code reads (wire them or remove them): {unread}"
