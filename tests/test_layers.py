"""The packages form layers, and a module imports only from its own package or a lower layer.

``LAYERS`` is the one table of the layering; ``docs/architecture.md`` shows it, and a test here
checks that the two agree. Every ``import`` is checked, function-level ones included: a lazy import
still ties the packages together. Packages of the same layer are peers and do not import each other
(``rl`` does not reach into ``pretrain`` nor the reverse); the foundation layer is the exception,
where ``protocols`` names the records of ``types``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "opencomposer"

# Bottom to top. Names are top-level modules or packages of opencomposer.
LAYERS: list[tuple[str, ...]] = [
    ("types", "protocols", "io", "config"),
    ("numerics",),
    ("model",),
    ("inference",),
    ("sandbox",),
    ("agent",),
    ("grading",),
    ("episode",),
    ("tasks",),
    ("distributed",),
    ("training",),
    ("rl", "pretrain", "bench"),
    ("services", "serve"),
    ("commands", "cli"),
]
FOUNDATION = 0
PLANNED: set[str] = set()  # in the table, not yet in the tree


def layer_of(name: str) -> int:
    for index, names in enumerate(LAYERS):
        if name in names:
            return index
    raise KeyError(name)


def top_level(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def source_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "suites" not in p.relative_to(PACKAGE).parts)


def imported_names(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, top-level opencomposer name) for every import of the package, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "opencomposer" and len(parts) > 1:
                    found.append((node.lineno, parts[1]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = path.relative_to(PACKAGE).parts[: -node.level]
                parts = [*base, *(node.module or "").split(".")] if node.module else list(base)
                parts = [p for p in parts if p]
                names = [parts[0]] if parts else [a.name for a in node.names]
                found.extend((node.lineno, n.removesuffix(".py")) for n in names)
                continue
            parts = (node.module or "").split(".")
            if parts[0] != "opencomposer":
                continue
            if len(parts) > 1:
                found.append((node.lineno, parts[1]))
            else:  # from opencomposer import x
                found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def violations() -> list[str]:
    problems = []
    for path in source_modules():
        own = top_level(path)
        if own == "__init__":
            continue
        try:
            own_layer = layer_of(own)
        except KeyError:
            problems.append(f"{path.relative_to(ROOT)}: package {own!r} is missing from LAYERS")
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, name in imported_names(tree, path):
            if name == own or name == "__init__":
                continue
            try:
                their = layer_of(name)
            except KeyError:
                problems.append(f"{path.relative_to(ROOT)}:{line}: imports unknown module opencomposer.{name}")
                continue
            if their < own_layer or (their == own_layer == FOUNDATION):
                continue
            where = "a peer of the same layer" if their == own_layer else "a higher layer"
            problems.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {name} ({where})")
    return problems


def test_every_import_points_down() -> None:
    problems = violations()
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_every_package_is_in_the_table() -> None:
    present = {top_level(p) for p in source_modules()} - {"__init__"}
    present |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present -= {"suites"}
    listed = {name for names in LAYERS for name in names}
    assert present - listed == set(), f"not in LAYERS: {sorted(present - listed)}"
    assert listed - present == PLANNED, f"in LAYERS but absent: {sorted(listed - present - PLANNED)}"


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, from a lower layer to a higher one, is found."""
    source = "def f():\n    from opencomposer.rl.loop import run_rl\n    import opencomposer.grading.grade\n"
    fake = PACKAGE / "model" / "fake.py"
    names = imported_names(ast.parse(source), fake)
    assert names == [(2, "rl"), (3, "grading")]
    assert all(layer_of(n) > layer_of("model") for _, n in names)


def documented_layers() -> list[tuple[str, ...]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- layers -->\n```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no <!-- layers --> block"
    rows = []
    for line in block.group(1).strip().splitlines():
        rows.append(tuple(name.strip().strip("`").removesuffix("(planned)").strip() for name in line.split(",")))
    return rows[::-1]  # the document lists top first


def test_docs_show_the_same_table() -> None:
    assert documented_layers() == LAYERS


def test_planned_packages_are_marked_in_the_docs() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name in sorted(PLANNED):
        assert f"{name} (planned)" in text, name
