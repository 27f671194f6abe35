"""Source repositories as in-memory trees: which files are code, which are tests, and how to write
a tree back to disk without leaving traces.

A generator works on a ``Tree`` (POSIX relative path -> file bytes) read from a Python repository
with a pytest suite: one of the built-in source projects (``opencomposer/suites/projects``) or any
folder the user points at. Reading skips version control (``.git``), caches (``__pycache__``,
``*.pyc``, ``.pytest_cache``, ``.mypy_cache``, ``.ruff_cache``, ...), editor and patch backups
(``*~``, ``*.orig``, ``*.rej``, ``.*.swp``), virtual environments and build outputs, so a task repository written from a tree carries no bytecode, no type-checker cache
and no history that could reveal deleted or original code (docs/recipe.md §9, the reward hacks).

Not here: running tests (``grading.testrun``), editing code (``generators.edits``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from opencomposer.grading.integrity import TEST_DIR_NAMES, is_test_path
from opencomposer.sandbox.patch import IGNORED_NAMES, IGNORED_SUFFIXES
from opencomposer.tasks.format import PROJECTS_DIR

Tree = dict[str, bytes]

# Never part of a task repository: history, caches of tools that could hold the original code,
# environments and build outputs.
SKIPPED_NAMES = IGNORED_NAMES | frozenset(
    {".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "build", "dist", ".eggs", "node_modules",
     ".pytype", ".pyre", ".dmypy.json", ".coverage", "htmlcov", ".idea", ".vscode"}
)
SKIPPED_SUFFIXES = IGNORED_SUFFIXES + (".egg-info", ".so", ".pyd")
# Left in a repository, these let an agent read back code it was asked to write.
TRACE_NAMES = frozenset({"__pycache__", ".mypy_cache", ".pytype", ".pyre", ".ruff_cache", ".pytest_cache",
                         ".hypothesis", ".git", ".hg", ".svn", ".dmypy.json"})
TRACE_SUFFIXES = IGNORED_SUFFIXES + (".egg-info",)  # bytecode, editor and patch backups


class SourceError(ValueError):
    """A folder that cannot serve as a source repository; the message says what is missing."""


def is_skipped(rel: str) -> bool:
    return any(part in SKIPPED_NAMES or part.endswith(SKIPPED_SUFFIXES) for part in rel.split("/"))


def read_tree(root: Path) -> Tree:
    """Every regular file under ``root`` except skipped ones (symlinks are not followed)."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder")
    tree: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = sorted(d for d in dirnames if not is_skipped(d))
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = Path(dirpath) / name
            if is_skipped(rel) or path.is_symlink() or not path.is_file():
                continue
            tree[rel] = path.read_bytes()
    return tree


def write_tree(tree: Tree, target: Path) -> Path:
    """Write ``tree`` into ``target`` (created; must not hold other files that matter)."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for rel, data in tree.items():
        if rel.startswith("/") or ".." in rel.split("/"):
            raise SourceError(f"tree path {rel!r}: expected a relative path without '..'")
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return target


def tree_digest(tree: Tree) -> str:
    h = hashlib.sha256()
    for rel in sorted(tree):
        h.update(rel.encode() + b"\0" + hashlib.sha256(tree[rel]).digest())
    return h.hexdigest()


def find_traces(root: Path) -> list[str]:
    """Paths under ``root`` that could leak code to an agent: bytecode, tool caches, VCS folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name in TRACE_NAMES or name.endswith(TRACE_SUFFIXES):
                found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def protected_roots(paths: list[str] | set[str]) -> list[str]:
    """What to protect so the grader restores the tests: top-level test folders, and test files
    (``conftest.py`` included) that live outside them."""
    roots = set()
    for rel in paths:
        first = rel.split("/", 1)[0]
        roots.add(first if first in TEST_DIR_NAMES and "/" in rel else rel)
    return sorted(roots)


@dataclass
class SourceRepo:
    """A Python repository with tests, read once. ``name`` labels tasks made from it."""

    name: str
    root: Path
    tree: Tree
    test_command: str = "python -m pytest -q"
    digest: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.digest = tree_digest(self.tree)

    @property
    def task_command(self) -> str:
        """The test command of tasks made from this source. pytest gets
        ``--continue-on-collection-errors``: hidden tests often import what the agent has yet to
        write, and one module that fails to import must not stop every other test from running."""
        if "pytest" in self.test_command and "--continue-on-collection-errors" not in self.test_command:
            return self.test_command + " --continue-on-collection-errors"
        return self.test_command

    @property
    def code_files(self) -> list[str]:
        """Python files that are not tests, in path order."""
        return sorted(p for p in self.tree if p.endswith(".py") and not is_test_path(p))

    @property
    def test_files(self) -> list[str]:
        return sorted(p for p in self.tree if is_test_path(p))

    @property
    def package(self) -> str:
        """The importable package the code lives in (the folder holding most code files)."""
        counts: dict[str, int] = {}
        for rel in self.code_files:
            parts = rel.split("/")
            if len(parts) >= 2:
                package = parts[-2]
                counts[package] = counts.get(package, 0) + 1
        return max(sorted(counts), key=counts.get) if counts else self.name

    def module_name(self, rel: str) -> str:
        """Dotted import name of a code file (``src/`` layouts and flat layouts)."""
        parts = rel[:-3].split("/")
        if parts[0] == "src":
            parts = parts[1:]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def code_tree(self) -> Tree:
        return {p: d for p, d in self.tree.items() if not is_test_path(p)}

    def tests_tree(self) -> Tree:
        return {p: d for p, d in self.tree.items() if is_test_path(p)}


def load_source(root: Path | str, name: str | None = None, test_command: str = "python -m pytest -q") -> SourceRepo:
    """Read a repository folder as a source; it needs Python code and at least one test file."""
    root = Path(root)
    tree = read_tree(root)
    source = SourceRepo(name or root.name, root, tree, test_command)
    if not source.code_files:
        raise SourceError(f"{root}: no Python code outside the tests; a source needs code to change")
    if not any(p.endswith(".py") and PurePosixPath(p).name != "conftest.py" for p in source.test_files):
        raise SourceError(f"{root}: no test files (tests/, test_*.py or *_test.py); tasks need tests to verify")
    return source


def flat_layout(source: SourceRepo) -> SourceRepo | None:
    """``source`` with its ``src/`` folder's contents moved to the repository root and pytest's
    ``pythonpath`` (and ruff's ``src``) in ``pyproject.toml`` pointed there: the same project in a
    flat layout. None for a project that has no ``src/`` folder (flat already). Keeps ``name`` and
    ``root``, so a task made from it stores the move in its setup patch against the shipped base."""
    import re

    if not any(p.startswith("src/") for p in source.code_files):
        return None
    tree: Tree = {}
    for rel, data in source.tree.items():
        moved = rel.removeprefix("src/")
        if moved in tree or (moved != rel and moved in source.tree):
            raise SourceError(f"{source.name}: {rel} would overwrite {moved} in a flat layout")
        tree[moved] = data
    if "pyproject.toml" in tree:
        text = tree["pyproject.toml"].decode("utf-8")
        text = re.sub(r'(?m)^(\s*(?:pythonpath|src)\s*=\s*)\[\s*"src"\s*\]', r'\1["."]', text)
        tree["pyproject.toml"] = text.encode("utf-8")
    return SourceRepo(source.name, source.root, tree, source.test_command)


def with_layouts(sources: list[SourceRepo], layouts: list[str]) -> list[SourceRepo]:
    """Every source in every layout of ``tasks.layouts`` (``as_shipped``, ``flat``); a flat
    project counts once when both are asked for."""
    out = []
    for source in sources:
        flat = flat_layout(source) if "flat" in layouts else None
        if "as_shipped" in layouts or flat is None:
            out.append(source)
        if flat is not None:
            out.append(flat)
    return out


def project(name: str) -> SourceRepo:
    """One of the built-in source projects (inventory, textkit, ledger, scheduler, confkit)."""
    root = PROJECTS_DIR / name
    if not (root / "pyproject.toml").is_file():
        known = ", ".join(project_names())
        raise SourceError(f"unknown source project {name!r}; the built-in ones are: {known}")
    return load_source(root, name)


def project_names() -> list[str]:
    return sorted(p.name for p in PROJECTS_DIR.iterdir() if (p / "pyproject.toml").is_file())
