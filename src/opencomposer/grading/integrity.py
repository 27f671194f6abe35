"""What the agent's change may not bring into the run of the hidden tests, and what the run may not touch.

Before grading runs the hidden tests, ``secure_workspace`` compares the workspace (the agent's
diff applied, protected paths restored, hidden tests overlaid) with the task's own files (``tests/
files`` first, then ``repo/``) and puts back everything that steers pytest or the interpreter
before a single test runs:

- **pytest configuration**: ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``
  anywhere, and the pytest section of ``pyproject.toml`` (``[tool.pytest...]``), ``tox.ini``
  (``[pytest]``) and ``setup.cfg`` (``[tool:pytest]``): added, changed or deleted, the task's file
  is restored (an ``addopts = -k nothing``, ``--co`` or ``-p plugin`` never reaches pytest; other
  edits to ``pyproject.toml`` stay when its pytest section is untouched);
- **conftest.py** anywhere: restored or removed (a hook that marks every test passed never loads);
- **interpreter startup hooks**: ``sitecustomize.py``, ``usercustomize.py`` and ``*.pth`` files the
  task does not have are removed (a ``.pth`` file with an ``import`` line is a startup hook), and so are added modules that would shadow the standard library
  or the test stack (``pytest.py``, ``_pytest/__init__.py``, ``unittest.py``, ...) from a folder
  that is not a package (the root, ``src/``), where an import would find them first.

Restoring configuration is not by itself tampering (agents edit ``pyproject.toml`` and write
conftest fixtures for good reasons); planting a startup hook or a module named like pytest or one
of its dependencies is, and comes back in ``Secured.tampering``. The result also names the paths
the test command must not change (``protected``: the task's protected paths, its hidden tests, every
conftest and configuration file, and the test files (``is_test_path``) the change left as the task
has them; mounted read-only, and the only workspace code the recording plugin trusts) and the
hidden test sources the code under test may not read (``hidden``), and the repository's own
non-test Python files the change left byte for byte as the task has them (``unchanged``, with their
digests: the recording plugin lets that code, run on the tests' behalf, read frames as it always
did). A test file the agent changed
outside the protected paths is not trusted: its tests count as errors (``grading.pytest_plugin``).

Not here: running the tests and checking what the run reports (``grading.testrun``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from opencomposer.sandbox.patch import IGNORED_NAMES

TEST_DIR_NAMES = frozenset({"tests", "test", "testing"})
PYTEST_FILES = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"})
SECTIONED_FILES = {"pyproject.toml": (), "tox.ini": ("pytest",), "setup.cfg": ("tool:pytest", "pytest")}
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
# pytest, its plugins and what they import: a module of one of these names is always a hack
TEST_STACK = frozenset({"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments",
                        "pytest_timeout", "exceptiongroup", "tomli", "colorama"})


@dataclass
class Secured:
    """What ``secure_workspace`` did and what the test run must honour (workspace-relative paths)."""

    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    unchanged: dict[str, str] = field(default_factory=dict)  # non-test .py files as the task has them -> sha256


def secure_workspace(workspace: Path, repo: Path, tests_dir: Path | None, protected_paths: list[str]) -> Secured:
    """Put the task's test infrastructure back in ``workspace`` and list what the run must protect."""
    secured = Secured()
    reference_roots = [root for root in (tests_dir, repo) if root is not None]

    def reference(rel: str) -> Path | None:
        for root in reference_roots:
            path = root / rel
            if path.is_file() and not path.is_symlink():
                return path
        return None

    candidates = set(_walk(workspace))
    for root in reference_roots:
        candidates |= {rel for rel in _walk(root) if _is_infrastructure(PurePosixPath(rel).name)}
    for rel in sorted(candidates):
        name = PurePosixPath(rel).name
        target, original = workspace / rel, reference(rel)
        if _is_infrastructure(name):
            if _same_for_pytest(name, target, original):
                continue
            if _is_startup_hook(name, target):
                secured.tampering.append(f"{rel}: an interpreter startup hook the task does not have")
            _put_back(target, original)
            (secured.restored if original is not None else secured.removed).append(rel)
        elif original is None and rel.endswith(".py"):
            shadowed = _shadowed_module(workspace, rel)
            if shadowed is not None:
                _put_back(target, None)
                secured.removed.append(rel)
                if shadowed in TEST_STACK:
                    secured.tampering.append(f"{rel}: a module that shadows {shadowed!r}, which the tests run on")
    hidden = sorted(_walk(tests_dir)) if tests_dir is not None else []
    secured.hidden = [rel for rel in hidden if rel.endswith(".py")]
    present = list(_walk(workspace))
    infrastructure = [rel for rel in present if _is_infrastructure(PurePosixPath(rel).name)]
    unchanged_tests = [rel for rel in present if is_test_path(rel) and _unchanged(workspace / rel, reference(rel))]
    wanted = {p.strip("/") for p in protected_paths} | set(hidden) | set(infrastructure) | set(unchanged_tests)
    secured.protected = _outermost(rel for rel in wanted if _plain_path(workspace, rel))
    for rel in present:  # the repository's own code the change left alone (its introspection is its own)
        original = repo / rel if (repo / rel).is_file() and not (repo / rel).is_symlink() else None
        if original is not None and rel.endswith(".py") and rel not in wanted and not is_test_path(rel) and _unchanged(workspace / rel, original):
            secured.unchanged[rel] = hashlib.sha256(original.read_bytes()).hexdigest()
    return secured


def is_test_path(rel: str) -> bool:
    """Test files and test infrastructure: anything under a ``tests``/``test``/``testing`` folder,
    and ``test_*.py``, ``*_test.py`` and ``conftest.py`` anywhere."""
    path = PurePosixPath(rel)
    if any(part in TEST_DIR_NAMES for part in path.parts[:-1]):
        return True
    name = path.name
    return name == "conftest.py" or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))


# ----------------------------------------------------------------------------------------------


def _walk(root: Path):
    """Workspace-relative paths of the files and symlinks under ``root`` (caches and .git skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_NAMES]
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            yield (base / name).relative_to(root).as_posix()


def _is_infrastructure(name: str) -> bool:
    return (name in PYTEST_FILES or name in SECTIONED_FILES or name == "conftest.py" or name in STARTUP_HOOKS
            or name.endswith(".pth"))


def _is_startup_hook(name: str, path: Path) -> bool:
    """sitecustomize/usercustomize, or a ``.pth`` file with a line that ``site`` would execute."""
    if name in STARTUP_HOOKS:
        return True
    if not name.endswith(".pth") or not path.is_file():
        return False
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    return any(line.startswith(("import ", "import\t")) for line in lines)


def _same_for_pytest(name: str, target: Path, original: Path | None) -> bool:
    """Whether pytest (or the interpreter) sees the same thing in ``target`` as in ``original``."""
    present = target.is_file() and not target.is_symlink()
    if not present and not target.is_symlink() and not target.exists():
        return original is None
    if not present:
        return False
    if original is not None and target.read_bytes() == original.read_bytes():
        return True
    if name not in SECTIONED_FILES:
        return False
    mine = _pytest_section(name, target.read_bytes())
    theirs = _pytest_section(name, original.read_bytes()) if original is not None else None
    return mine is not _UNREADABLE and mine == theirs


_UNREADABLE = object()


def _pytest_section(name: str, data: bytes) -> object:
    """The part of a shared configuration file that pytest reads (None if it has none)."""
    try:
        text = data.decode("utf-8")
        if name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return _UNREADABLE
    sections: list[str] = []
    inside = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.strip("[] \t").strip() in SECTIONED_FILES[name]
        if inside:
            sections.append(line.rstrip())
    return "\n".join(sections) or None


def _unchanged(target: Path, original: Path | None) -> bool:
    return (original is not None and target.is_file() and not target.is_symlink()
            and target.read_bytes() == original.read_bytes())


def _put_back(target: Path, original: Path | None) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    if original is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(original, target)


def _shadowed_module(workspace: Path, rel: str) -> str | None:
    """The standard-library or test-stack module that the added file ``rel`` would shadow from a
    folder that is not a package, or None."""
    path = PurePosixPath(rel)
    if path.name == "__init__.py":
        path = path.parent
        if not path.name:
            return None
    folder = workspace / path.parent
    if (folder / "__init__.py").is_file():
        return None  # inside a package: imported as package.name, it shadows nothing
    name = path.name.removesuffix(".py")
    return name if name in TEST_STACK or name in sys.stdlib_module_names else None


def _plain_path(workspace: Path, rel: str) -> bool:
    """``rel`` exists and is reached without following a symlink."""
    path = workspace
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            return False
    return path.exists()


def _outermost(paths) -> list[str]:
    kept: list[str] = []
    for rel in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(rel == k or rel.startswith(k + "/") for k in kept):
            kept.append(rel)
    return sorted(kept)
