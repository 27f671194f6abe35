"""Task environments: the Python a task's code and tests run with (``[environment]`` in ``task.toml``).

Without an ``[environment]`` table a task runs on opencomposer's own interpreter, which is enough
for the built-in projects (standard library only) but not for a real repository with
dependencies. With one, the task gets a virtual environment of its own:

```toml
[environment]
python = "3.11"                          # used when an interpreter of that version is found
packages = ["attrs>=23", "numpy<2"]      # pip requirement specifiers
requirements = ["requirements-dev.txt"]  # requirement files inside the repository
install_repo = true                      # the repository's own dependencies; the repo importable
extras = ["test"]                        # extras (or PEP 735 dependency groups) installed with install_repo
repo_metadata = true                     # the repository's name and version visible to importlib.metadata
pythonpath = ["src"]                     # workspace folders on PYTHONPATH (default: see below)
commands = ["python -m pip install -e vendor/lib --no-deps"]   # plain shell steps, after the installs
pip_args = ["--index-url", "https://mirror.example/simple"]
find_links = ["wheels"]                  # folders of wheels (relative to the task folder, or absolute)
```

**Cache key.** An environment is a function of what defines it, so it is built once and shared:
the key hashes the interpreter (path and full version), the packages, the text of each requirement
file, the repository's *dependency declarations* (``[project] dependencies`` and the chosen
optional dependencies of ``pyproject.toml``, ``install_requires`` of ``setup.cfg``/``setup.py``; the
whole text of those files only when the dependencies are dynamic), the commands, the pip arguments,
the names and sizes of the wheels in ``find_links``, and the test stack's versions. The repository's
source is not in the key: a thousand tasks mined from one repository at nearby commits, whose
dependencies rarely change, share a handful of environments. Built environments live in
``sandbox.env_cache_dir`` (default ``$OPENCOMPOSER_HOME/task-envs``) as ``<key>/`` (the virtual
environment), ``<key>.json`` (the manifest, written last: an environment without it is incomplete
and is rebuilt) and ``logs/<key>.log`` (the build's output, kept for failed builds too).

**How the repository becomes importable.** The environment never contains the repository itself:
``install_repo`` installs only its dependencies, and at run time the sandbox puts the workspace's
own folders on ``PYTHONPATH`` (``pythonpath``; by default ``src`` for a src layout, else the
repository root). With ``repo_metadata`` the environment also holds a metadata-only distribution
of the repository (a ``NAME-VERSION.dist-info`` folder, no code, no files recorded), so that code
reading its own version (``importlib.metadata.version("isort")``) imports as it would from an
editable install; the version is the one the packaging files declare, else ``0+workspace``, and
is part of the key. So the agent's edits take effect at once, exactly like an editable install that
points at the workspace copy, never at the cache; and one environment serves every commit. When the
dependencies cannot be read without running the build backend (dynamic dependencies, Poetry), the
build installs a copy of the repository (pip, with the network) and uninstalls its own distribution
again, keeping the dependencies. Console scripts and compiled extensions of the repository itself are
therefore not available (a limit: a repository that must be compiled needs ``commands``).

**Build.** Building runs in the sandbox too (``sandbox.workspace.Sandbox`` over a copy of the
repository): ``python -m venv --without-pip``, then one ``pip install`` (opencomposer's pip driving
the environment's interpreter) of packages, requirement files and the repository's dependencies,
then ``commands`` with the environment first on PATH. Only this build has the network
(``sandbox.env_build_network``; off: ``pip --no-index`` and the ``find_links`` folders) and the
environment folder writable; agent and test commands never have either. pytest and pytest-timeout
(the test stack grading runs on) are copied from opencomposer's installation into the environment
and put *after* its site-packages, so a repository that pins its own pytest keeps it. A failed build
raises ``EnvironmentBuildError`` naming its kept log: grading turns it into an infrastructure error,
never a zero reward.

**Use.** ``prepare_task_environment(task, config)`` returns the ``TaskEnvironment`` to bind
(building on first use); grading (``grading.grade.task_environment``),
validation and the miner call it, ``opencomposer tasks build-env DIR`` builds ahead of time.
"""

from __future__ import annotations

import ast
import configparser
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opencomposer.config import SandboxConfig
from opencomposer.io import atomic_write_text, cache_dir
from opencomposer.pysource import literal_eval, parse
from opencomposer.sandbox.patch import copy_tree
from opencomposer.sandbox.workspace import Mount, Sandbox, SandboxError, TaskEnvironment
from opencomposer.types import Task

ENVIRONMENT_KEYS = ("python", "packages", "requirements", "install_repo", "extras", "repo_metadata", "pythonpath",
                    "commands", "pip_args", "find_links")
KEY_VERSION = "opencomposer task env v1"
TEST_STACK = ("pytest", "pytest-timeout")
"""What grading runs tests with; copied into every environment behind its own packages."""
TEST_STACK_DIR = "opencomposer-test-stack"
PASSTHROUGH = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "HTTP_PROXY", "HTTPS_PROXY",
               "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
"""Host variables a build with the network sees (a mirror or a proxy of the package index)."""
PYTHON_VERSION = re.compile(r"^\d+\.\d+$")
SETUP_FILES = ("pyproject.toml", "setup.cfg", "setup.py")


class EnvironmentSpecError(ValueError):
    """An ``[environment]`` table that breaks the format; ``field`` names the key."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"environment.{field}: {problem}" if field else f"environment: {problem}")


class EnvironmentBuildError(RuntimeError):
    """An environment could not be built: an infrastructure error, never the agent's doing. ``log``
    is the kept build log."""

    def __init__(self, message: str, log: Path | None = None):
        self.log = log
        super().__init__(message + (f" (build log: {log})" if log else ""))


@dataclass(frozen=True)
class EnvironmentSpec:
    """An ``[environment]`` table, validated (see the module docstring for each key)."""

    python: str = ""
    packages: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()
    install_repo: bool = False
    extras: tuple[str, ...] = ()
    repo_metadata: bool = False
    pythonpath: tuple[str, ...] | None = None
    commands: tuple[str, ...] = ()
    pip_args: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def to_table(self) -> dict[str, Any]:
        """The table ``task.toml`` holds: only the keys that differ from the defaults."""
        table: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                table[f.name] = list(value) if isinstance(value, tuple) else value
        return table


def parse_environment(table: Any) -> EnvironmentSpec:
    """Validate an ``[environment]`` table; ``EnvironmentSpecError`` names the key at fault."""
    if not isinstance(table, dict):
        raise EnvironmentSpecError("", f"expected a table, got {table!r}")
    for key in table:
        if key not in ENVIRONMENT_KEYS:
            raise EnvironmentSpecError(key, f"unknown key; valid keys: {', '.join(ENVIRONMENT_KEYS)}")
    python = table.get("python", "")
    if not isinstance(python, str) or (python and not PYTHON_VERSION.match(python)):
        raise EnvironmentSpecError("python", f"{python!r} must be a version like \"3.11\"")
    install_repo = table.get("install_repo", False)
    if not isinstance(install_repo, bool):
        raise EnvironmentSpecError("install_repo", f"{install_repo!r} must be true or false")
    repo_metadata = table.get("repo_metadata", False)
    if not isinstance(repo_metadata, bool):
        raise EnvironmentSpecError("repo_metadata", f"{repo_metadata!r} must be true or false")
    if repo_metadata and not install_repo:
        raise EnvironmentSpecError("repo_metadata", "the repository's metadata needs install_repo = true")
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("packages", "requirements", "extras", "pythonpath", "commands", "pip_args", "find_links"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise EnvironmentSpecError(key, f"expected a list of non-empty strings, got {value!r}")
        lists[key] = tuple(v.strip() for v in value)
    for key in ("requirements", "pythonpath"):
        for value in lists[key]:
            if value.startswith("/") or ".." in value.split("/"):
                raise EnvironmentSpecError(key, f"{value!r} must be a path inside the repository (relative, no '..')")
    for value in lists["packages"]:
        if value.startswith("-"):
            raise EnvironmentSpecError("packages", f"{value!r} is a pip option; put options in pip_args")
    if lists["extras"] and not install_repo:
        raise EnvironmentSpecError("extras", "extras of the repository need install_repo = true")
    return EnvironmentSpec(python=python, install_repo=install_repo, repo_metadata=repo_metadata,
                           pythonpath=lists["pythonpath"] if "pythonpath" in table else None,
                           **{k: v for k, v in lists.items() if k != "pythonpath"})


def task_environment_spec(task: Task) -> EnvironmentSpec | None:
    """The ``[environment]`` of the folder ``task`` was loaded from, or None (no table, or a task
    made in code). ``tasks.format.load_task`` has validated it already."""
    if task.path is None or not (Path(task.path) / "task.toml").is_file():
        return None
    data = tomllib.loads((Path(task.path) / "task.toml").read_text(encoding="utf-8"))
    return parse_environment(data["environment"]) if "environment" in data else None


# ----------------------------------------------------------------------------------------------
# What defines an environment


@dataclass(frozen=True)
class Interpreter:
    """The Python an environment is made from."""

    executable: str
    version: str  # full, e.g. 3.11.7
    base_prefix: str
    note: str = ""  # why it is not the one asked for


def find_interpreter(version: str) -> Interpreter:
    """An interpreter of ``version`` ("3.11"): opencomposer's own when it matches (or none is asked
    for), else ``python3.X`` on PATH; when none is found, opencomposer's own with a note (the
    task format asks for the version "if available")."""
    ours = Interpreter(sys.executable, ".".join(map(str, sys.version_info[:3])), sys.base_prefix)
    if not version or version == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return ours
    found = shutil.which(f"python{version}")
    if found:
        proc = subprocess.run([found, "-c", "import sys, json; print(json.dumps([sys.version.split()[0], "
                                            "sys.base_prefix]))"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            full, base = json.loads(proc.stdout)
            return Interpreter(found, full, base)
    return dataclasses.replace(ours, note=f"python {version} was asked for but not found (no python{version} on "
                                          f"PATH); using {ours.version}")


def repo_dependencies(repo: Path, extras: tuple[str, ...] = ()) -> tuple[list[str] | None, str]:
    """(the repository's declared dependencies, where they came from), read without running
    anything: ``pyproject.toml``'s ``[project]``, else ``setup.py``'s literal ``install_requires``,
    else ``setup.cfg``'s. None when they are dynamic (the build then installs the repository and
    removes it again); an empty list when the repository declares none."""
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            return None, "pyproject.toml (unreadable)"
        project = data.get("project")
        groups = data.get("dependency-groups") if isinstance(data.get("dependency-groups"), dict) else {}
        if isinstance(project, dict):
            dynamic = project.get("dynamic", [])
            if "dependencies" in dynamic or ("optional-dependencies" in dynamic and any(e not in groups for e in extras)):
                return None, "pyproject.toml (dynamic dependencies)"
            deps = list(project.get("dependencies", []))
            optional = project.get("optional-dependencies", {})
            for extra in extras:
                deps += _extra_requirements(extra, optional, groups, project.get("name"), set())
            return _without_self(list(dict.fromkeys(deps)), project.get("name")), "pyproject.toml"
        if isinstance(data.get("tool"), dict) and "poetry" in data["tool"]:
            return None, "pyproject.toml (Poetry)"
    setup_py, setup_cfg = repo / "setup.py", repo / "setup.cfg"
    if setup_py.is_file():
        found = _setup_py_requirements(setup_py, extras)
        if found is None:
            return None, "setup.py (computed dependencies)"
        if found or not setup_cfg.is_file():
            return found, "setup.py"
    if setup_cfg.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(setup_cfg.read_text(encoding="utf-8"))
        except (configparser.Error, UnicodeDecodeError):
            return None, "setup.cfg (unreadable)"
        deps = _lines(parser.get("options", "install_requires", fallback=""))
        for extra in extras:
            deps += _lines(parser.get("options.extras_require", extra, fallback=""))
        name = parser.get("metadata", "name", fallback=None)
        return _without_self(deps, name), "setup.cfg"
    return [], "no packaging files"


def _extra_requirements(extra: str, optional: Any, groups: Any, name: Any, seen: set[str]) -> list[str]:
    """The requirements of ``extra``: the optional dependencies of that name, else the PEP 735
    dependency group (``{include-group = ...}`` followed), with the project's references to its own
    extras (``attrs[tests-no-zope]``) replaced by what those extras require."""
    if extra in seen:
        return []
    seen.add(extra)
    items = optional.get(extra) if isinstance(optional, dict) and extra in optional else (
        groups.get(extra) if isinstance(groups, dict) else None)
    out: list[str] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("include-group"), str):
            out += _extra_requirements(item["include-group"], {}, groups, name, seen)
        elif isinstance(item, str):
            own = _self_extras(item, name)
            if own is None:
                out.append(item)
            for inner in own or ():
                out += _extra_requirements(inner, optional, groups, name, seen)
    return out


def _self_extras(requirement: str, name: Any) -> list[str] | None:
    """The extras a requirement on the project itself asks for (``[]`` for a bare self-reference),
    or None when it names another project."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    normal = lambda text: re.sub(r"[-_.]+", "-", str(text or "")).lower()  # noqa: E731
    if not match or not name or normal(match.group(1)) != normal(name):
        return None
    return [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]


def repo_name_version(repo: Path) -> tuple[str | None, str]:
    """(the distribution name, its version) as the packaging files declare them without running
    anything (``pyproject.toml``'s ``[project]``, ``setup.cfg``'s ``[metadata]``, literals of
    ``setup.py``'s ``setup()``); the version is ``0+workspace`` when it is dynamic or missing, the
    name None when it cannot be read."""
    name, version = None, None
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            project = None
        if isinstance(project, dict):
            name, version = project.get("name"), project.get("version")
    if not name and (repo / "setup.cfg").is_file():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string((repo / "setup.cfg").read_text(encoding="utf-8"))
            name = parser.get("metadata", "name", fallback=None)
            version = parser.get("metadata", "version", fallback=None)
        except (configparser.Error, UnicodeDecodeError):
            pass
    if not name and (repo / "setup.py").is_file():
        try:
            tree = parse((repo / "setup.py").read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            tree = None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
                keywords = {k.arg: k.value for k in node.keywords if k.arg}
                if isinstance(keywords.get("name"), ast.Constant):
                    name = keywords["name"].value
                    if isinstance(keywords.get("version"), ast.Constant):
                        version = keywords["version"].value
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        return None, "0+workspace"
    ok = isinstance(version, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", version)
    return name, version if ok else "0+workspace"


def _lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _without_self(deps: list[str], name: Any) -> list[str]:
    """Drop the project's references to itself (``pkg[test]`` in its own extras)."""
    own = re.sub(r"[-_.]+", "-", str(name or "")).lower()
    return [d for d in deps if not own or re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;@(]", d, maxsplit=1)[0]).lower() != own]


def _setup_py_requirements(path: Path, extras: tuple[str, ...]) -> list[str] | None:
    """``install_requires`` (plus ``extras_require`` of ``extras``) of the ``setup()`` call when
    they are literals; [] when the call has none; None when they are computed."""
    try:
        tree = parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None
    # module-level NAME = literal, so that extras_require=EXTRAS_REQUIRE is read too (the first
    # binding; later item assignments such as EXTRAS_REQUIRE["dev"] = ... are not followed)
    bound: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
            bound.setdefault(statement.targets[0].id, statement.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
            keywords = {k.arg: bound.get(k.value.id, k.value) if isinstance(k.value, ast.Name) else k.value
                        for k in node.keywords if k.arg}
            if any(k.arg is None for k in node.keywords):
                return None  # setup(**options)
            try:
                deps = list(literal_eval(keywords["install_requires"])) if "install_requires" in keywords else []
                if extras:
                    optional = literal_eval(keywords["extras_require"]) if "extras_require" in keywords else {}
                    for extra in extras:
                        deps += list(optional.get(extra, []))
            except (ValueError, TypeError, SyntaxError):
                return None
            name = keywords.get("name")
            return _without_self([str(d) for d in deps], name.value if isinstance(name, ast.Constant) else None)
    return []


def default_pythonpath(repo: Path) -> tuple[str, ...]:
    """Where the repository's own code is imported from: ``src`` for a src layout (a ``src``
    folder holding a package or module), else the repository root."""
    src = repo / "src"
    if src.is_dir() and any((p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"
                            for p in src.iterdir()):
        return ("src",)
    return (".",)


TEST_EXTRAS = ("test", "tests", "testing")
DEV_EXTRAS = ("dev",)
"""Installed by detection when a repository declares none of ``TEST_EXTRAS`` (isort keeps its test
dependencies in a ``dev`` dependency group)."""
REQUIREMENT_FILES = ("requirements.txt", "requirements-dev.txt", "requirements_dev.txt", "requirements-test.txt",
                     "requirements_test.txt", "requirements-tests.txt", "test-requirements.txt",
                     "dev-requirements.txt")


def detect_repo_environment(repo: Path, base: EnvironmentSpec | None = None) -> EnvironmentSpec | None:
    """The ``[environment]`` an imported or mined repository needs, read from its files: its own
    dependencies (``install_repo``, with the ``test``/``tests``/``testing`` extras or dependency
    groups it declares, else a ``dev`` one) and its name and version for ``importlib.metadata`` (``repo_metadata``), the
    requirement files at its root that do not install the repository itself (no ``-e``, ``.`` or
    ``file:`` lines: the repository is imported from the workspace, never installed), and its code
    on PYTHONPATH (``default_pythonpath``). None when it has no packaging file, no requirement file
    and no src layout (then ``base``): it runs on opencomposer's Python as before. ``base`` supplies
    the rest (``find_links``, ``pip_args``, ``python``)."""
    repo = Path(repo)
    packaged = any((repo / name).is_file() for name in SETUP_FILES)
    requirements = tuple(name for name in REQUIREMENT_FILES if (repo / name).is_file()
                         and _plain_requirements((repo / name).read_text(encoding="utf-8", errors="replace")))
    src_layout = default_pythonpath(repo) == ("src",)
    if not (packaged or requirements or src_layout):
        return base
    plain = repo_dependencies(repo)[0] if packaged else []
    extras: tuple[str, ...] = ()
    for names in (TEST_EXTRAS, DEV_EXTRAS):  # a development extra only when no test extra is declared
        extras = extras or tuple(e for e in names if packaged and (with_extra := repo_dependencies(repo, (e,))[0])
                                 is not None and with_extra != plain)
    base = base or EnvironmentSpec()
    return dataclasses.replace(
        base, install_repo=packaged or base.install_repo, extras=extras or base.extras,
        repo_metadata=base.repo_metadata or (packaged and (plain is None or repo_name_version(repo)[0] is not None)),
        requirements=base.requirements or requirements,
        pythonpath=base.pythonpath if base.pythonpath is not None else default_pythonpath(repo))


def _plain_requirements(text: str) -> bool:
    """A requirement file that installs only other packages (no editable, local or nested file)."""
    for line in _lines(text):
        if line.startswith(("-e", "--editable", ".", "/", "-r", "--requirement", "-c")) or "file:" in line:
            return False
    return True


def test_stack() -> list[Any]:
    """The distributions of pytest and pytest-timeout and everything they require (markers
    evaluated for this interpreter), as installed for opencomposer."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict[str, Any] = {}
    todo = list(TEST_STACK)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return [seen[name] for name in sorted(seen)]


@dataclass(frozen=True)
class ResolvedEnvironment:
    """An ``EnvironmentSpec`` read against a repository and a task folder: everything a build needs
    and the ``key`` that names it."""

    spec: EnvironmentSpec
    interpreter: Interpreter
    requirements: tuple[tuple[str, str], ...]  # (path in the repository, text)
    repo_dependencies: tuple[str, ...] | None  # None: dynamic, install and remove the repository
    dependency_source: str
    setup_texts: tuple[tuple[str, str], ...]  # the packaging files, keyed only when dependencies are dynamic
    find_links: tuple[str, ...]  # absolute host folders
    find_links_listing: tuple[tuple[str, int], ...]
    stack: tuple[tuple[str, str], ...]  # (name, version) of the test stack
    pythonpath: tuple[str, ...]
    metadata: tuple[str, str] | None = None  # (name, version) of repo_metadata; name "" when only the build knows it
    key: str = ""

    def definition(self) -> dict[str, Any]:
        """What the key hashes (and the manifest records)."""
        return {
            "version": KEY_VERSION,
            "interpreter": [os.path.realpath(self.interpreter.executable), self.interpreter.version],
            "packages": list(self.spec.packages),
            "requirements": [list(r) for r in self.requirements],
            "install_repo": self.spec.install_repo,
            "repo_dependencies": None if self.repo_dependencies is None else list(self.repo_dependencies),
            "setup_files": [list(s) for s in self.setup_texts] if self.repo_dependencies is None else [],
            "commands": list(self.spec.commands),
            "pip_args": list(self.spec.pip_args),
            "find_links": [list(f) for f in self.find_links_listing],
            "test_stack": [list(s) for s in self.stack],
            **({"repo_metadata": list(self.metadata)} if self.metadata is not None else {}),
        }


def resolve_environment(spec: EnvironmentSpec, repo: Path, task_folder: Path | None = None) -> ResolvedEnvironment:
    """Read ``spec`` against ``repo`` (requirement files, the repository's dependencies) and
    ``task_folder`` (relative ``find_links``); ``EnvironmentSpecError`` for files that are missing."""
    repo = Path(repo)
    requirements = []
    for rel in spec.requirements:
        path = repo / rel
        if not path.is_file():
            raise EnvironmentSpecError("requirements", f"{rel!r} is not a file of the repository")
        requirements.append((rel, path.read_text(encoding="utf-8", errors="replace")))
    deps: list[str] | None = []
    source = ""
    setup_texts: list[tuple[str, str]] = []
    if spec.install_repo:
        deps, source = repo_dependencies(repo, spec.extras)
        setup_texts = [(name, (repo / name).read_text(encoding="utf-8", errors="replace"))
                       for name in SETUP_FILES if (repo / name).is_file()]
        if deps is None and not setup_texts:
            raise EnvironmentSpecError("install_repo", "the repository has no pyproject.toml, setup.cfg or setup.py")
    links, listing = [], []
    for value in spec.find_links:
        folder = Path(value) if value.startswith("/") else (Path(task_folder or repo) / value)
        if not folder.is_dir():
            raise EnvironmentSpecError("find_links", f"{value!r} is not a folder (looked at {folder})")
        links.append(str(folder.resolve()))
        listing += [(f"{value}/{p.name}", p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file()]
    resolved = ResolvedEnvironment(
        spec=spec, interpreter=find_interpreter(spec.python), requirements=tuple(requirements),
        repo_dependencies=None if deps is None else tuple(deps), dependency_source=source,
        setup_texts=tuple(setup_texts), find_links=tuple(links), find_links_listing=tuple(listing),
        stack=tuple((d.metadata["Name"], d.version) for d in test_stack()),
        pythonpath=spec.pythonpath if spec.pythonpath is not None else
        (default_pythonpath(repo) if spec.install_repo else ()),
        metadata=(lambda n, v: (n or "", v))(*repo_name_version(repo)) if spec.repo_metadata else None,
    )
    digest = hashlib.sha256(json.dumps(resolved.definition(), sort_keys=True).encode()).hexdigest()[:32]
    return dataclasses.replace(resolved, key=digest)


# ----------------------------------------------------------------------------------------------
# Building and the cache


def env_cache_root(config: SandboxConfig | None = None) -> Path:
    """The folder of built environments (``sandbox.env_cache_dir``, else ``cache_dir()/task-envs``)."""
    configured = (config or SandboxConfig()).env_cache_dir
    root = Path(configured).expanduser() if configured else cache_dir() / "task-envs"
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class BuiltEnvironment:
    """A finished environment in the cache."""

    key: str
    root: Path
    manifest: dict[str, Any]
    built: bool  # built by this call (False: it was in the cache)
    seconds: float

    @property
    def log(self) -> Path:
        return self.root.parent / "logs" / f"{self.key}.log"


def build_environment(resolved: ResolvedEnvironment, repo: Path, config: SandboxConfig | None = None) -> BuiltEnvironment:
    """The environment of ``resolved`` from the cache, built there first if missing (``repo``: the
    repository the build's commands and dynamic dependencies see). Safe to call from many threads
    and processes at once: a lock file per key lets one build while the others wait for it."""
    config = config or SandboxConfig()
    started = time.monotonic()
    root = env_cache_root(config)
    final, manifest_path = root / resolved.key, root / f"{resolved.key}.json"
    if final.is_dir() and manifest_path.is_file():
        return BuiltEnvironment(resolved.key, final, json.loads(manifest_path.read_text()), False,
                                time.monotonic() - started)
    with open(root / f".{resolved.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and manifest_path.is_file():
            return BuiltEnvironment(resolved.key, final, json.loads(manifest_path.read_text()), False,
                                    time.monotonic() - started)
        manifest = _build(resolved, Path(repo), final, root, config)
        manifest["build_s"] = round(time.monotonic() - started, 3)
        atomic_write_text(manifest_path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return BuiltEnvironment(resolved.key, final, manifest, True, time.monotonic() - started)


def _build(resolved: ResolvedEnvironment, repo: Path, final: Path, root: Path, config: SandboxConfig) -> dict[str, Any]:
    """Build into ``final`` (its path is baked into the environment's scripts, so it is built in
    place, and an incomplete one is removed first and on failure); returns the manifest."""
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"{resolved.key}.log"
    if final.exists():
        shutil.rmtree(final)  # a crash during an earlier build: no manifest, so never used
    final.mkdir()
    pip_cache = root / "pip-cache"
    pip_cache.mkdir(exist_ok=True)
    network = config.env_build_network
    build_config = dataclasses.replace(
        config, timeout_s=config.env_build_timeout_s, max_timeout_s=max(config.max_timeout_s, config.env_build_timeout_s),
        tmp_size_mb=max(config.tmp_size_mb, 4096), memory_mb=max(config.memory_mb, 8192),
        file_size_mb=max(config.file_size_mb, 2048), cpu_s=max(config.cpu_s, int(config.env_build_timeout_s)))
    mounts = [Mount(str(final), str(final), writable=True), Mount(str(pip_cache), str(pip_cache), writable=True)]
    mounts += [Mount(folder, folder) for folder in resolved.find_links]
    interpreter_root = resolved.interpreter.base_prefix
    if not interpreter_root.startswith(("/usr/", "/bin", "/lib")) and interpreter_root != "/usr":
        mounts.append(Mount(interpreter_root, interpreter_root))
    variables = {"PIP_CACHE_DIR": str(pip_cache), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if network:
        variables.update({k: os.environ[k] for k in PASSTHROUGH if k in os.environ})
    else:
        variables["PIP_NO_INDEX"] = "1"
    header = (f"# opencomposer task environment {resolved.key}\n# interpreter: {resolved.interpreter.executable} "
              f"({resolved.interpreter.version}){'; ' + resolved.interpreter.note if resolved.interpreter.note else ''}"
              f"\n# repository dependencies: {resolved.dependency_source or 'not installed'}\n"
              f"# network: {'open (package index)' if network else 'closed (--no-index)'}\n")
    script = _build_script(resolved, final)
    try:
        with tempfile.TemporaryDirectory(prefix="opencomposer-envbuild-") as tmp:
            snapshot = Path(tmp) / "repo"
            copy_tree(repo, snapshot)
            (snapshot / ".opencomposer-env-requirements.txt").write_text(_requirements_file(resolved))
            try:
                with Sandbox(snapshot, build_config, mounts=mounts, network=network) as sandbox:
                    result = sandbox.run(script, timeout_s=config.env_build_timeout_s, env=variables)
            except SandboxError as e:
                atomic_write_text(log, header + f"\nthe build sandbox failed: {e}\n")
                raise EnvironmentBuildError(f"environment {resolved.key}: the build sandbox failed: {e}", log) from e
        atomic_write_text(log, header + "\n" + script + "\n# ---- output ----\n" + result.output)
        if result.exit_code != 0 or result.timed_out:
            why = "timed out" if result.timed_out else f"exited {result.exit_code}"
            tail = result.output.strip().splitlines()[-12:]
            raise EnvironmentBuildError(f"environment {resolved.key}: the build {why}:\n  " + "\n  ".join(tail), log)
        stack = _install_test_stack(final)
        metadata = _write_repo_metadata(final, resolved, result.output)
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    return {"key": resolved.key, "definition": resolved.definition(), "spec": resolved.spec.to_table(),
            "interpreter": resolved.interpreter.executable, "base_prefix": resolved.interpreter.base_prefix,
            "python": resolved.interpreter.version, "note": resolved.interpreter.note, "test_stack": stack,
            "dependency_source": resolved.dependency_source, "repo_metadata": metadata,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _requirements_file(resolved: ResolvedEnvironment) -> str:
    lines = list(resolved.spec.packages) + list(resolved.repo_dependencies or ())
    lines += [f"-r {rel}" for rel, _ in resolved.requirements]
    return "".join(f"{line}\n" for line in lines)


def _build_script(resolved: ResolvedEnvironment, final: Path) -> str:
    """The shell script the build sandbox runs from the repository copy."""
    env = shlex.quote(str(final))
    pip = f"{shlex.quote(sys.executable)} -m pip --python {env}/bin/python"
    options = " ".join(shlex.quote(a) for a in resolved.spec.pip_args)
    options += "".join(f" --find-links {shlex.quote(f)}" for f in resolved.find_links)
    lines = [
        "set -eu",
        f"{shlex.quote(resolved.interpreter.executable)} -m venv --without-pip {env}",
        # pip and pip3 drive the environment's interpreter with opencomposer's pip (no pip inside)
        f"printf '#!/bin/sh\\nexec %s \"$@\"\\n' {shlex.quote(pip)} > {env}/bin/pip",
        f"chmod +x {env}/bin/pip && ln -s pip {env}/bin/pip3",
        f"export VIRTUAL_ENV={env} PATH={env}/bin:$PATH",
    ]
    if resolved.requirements or resolved.spec.packages or resolved.repo_dependencies:
        lines.append(f"{pip} install {options} -r .opencomposer-env-requirements.txt")
    if resolved.spec.install_repo and resolved.repo_dependencies is None:
        # dependencies only the build backend knows: install the repository, then remove it again
        lines += [
            f"{pip} install {options} --report /tmp/opencomposer-install.json "
            + shlex.quote(f".[{','.join(resolved.spec.extras)}]" if resolved.spec.extras else "."),
            f"name=$({env}/bin/python -c \"import json; print(next(i['metadata']['name'] for i in "
            f"json.load(open('/tmp/opencomposer-install.json'))['install'] if i.get('is_direct')))\")",
            f"{pip} uninstall -y \"$name\"",
            f"echo \"{NAME_MARKER}$name\"",
        ]
    lines += list(resolved.spec.commands)
    return "\n".join(lines) + "\n"


NAME_MARKER = "opencomposer: the repository's distribution is "


def _write_repo_metadata(env: Path, resolved: ResolvedEnvironment, output: str) -> str | None:
    """With ``repo_metadata``: a metadata-only ``NAME-VERSION.dist-info`` in the environment's
    site-packages (the name from the packaging files, else the one the build installed and removed);
    its folder name, or None when there is none to write."""
    if resolved.metadata is None:
        return None
    name, version = resolved.metadata
    if not name:
        found = [line[len(NAME_MARKER):].strip() for line in output.splitlines() if line.startswith(NAME_MARKER)]
        name = found[-1] if found else ""
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise EnvironmentBuildError(f"environment {resolved.key}: repo_metadata: the repository's distribution "
                                    "name cannot be read from its packaging files or its build")
    folder = f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    for site in env.glob("lib/python*/site-packages"):
        info = site / folder
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("opencomposer\n")
        (info / "RECORD").write_text("")  # no files: the code is the workspace's
    return folder


def _install_test_stack(env: Path) -> list[str]:
    """Copy pytest, pytest-timeout and what they need into the environment, behind its own
    site-packages (a ``.pth`` line), and give it a ``pytest`` script; returns name==version."""
    target = env / TEST_STACK_DIR
    target.mkdir(exist_ok=True)
    names = []
    for dist in test_stack():
        names.append(f"{dist.metadata['Name']}=={dist.version}")
        for rel in dist.files or []:
            if rel.parts and (rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc"):
                continue
            source = Path(dist.locate_file(rel))
            if source.is_file():
                path = target / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, path)
    for site in env.glob("lib/python*/site-packages"):
        (site / "zzz-opencomposer-test-stack.pth").write_text(f"{target}\n")
    script = env / "bin" / "pytest"
    if not script.exists():
        script.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pytest "$@"\n')
        script.chmod(0o755)
    return names


# ----------------------------------------------------------------------------------------------
# Use


def sandbox_environment(built: BuiltEnvironment, pythonpath: tuple[str, ...]) -> TaskEnvironment:
    """How the sandbox binds ``built``: the folder read-only, its ``bin`` first on PATH, the
    repository's folders on PYTHONPATH, the base interpreter bound when it lives outside ``/usr``."""
    base = str(built.manifest.get("base_prefix", ""))
    binds = (base,) if base and not base.startswith(("/usr/", "/bin", "/lib")) and base != "/usr" else ()
    return TaskEnvironment(root=str(built.root), bin_dir=str(built.root / "bin"), pythonpath=pythonpath,
                              binds=binds)


def prepare_environment(spec: EnvironmentSpec, repo: Path, config: SandboxConfig | None = None,
                        task_folder: Path | None = None) -> tuple[TaskEnvironment, BuiltEnvironment]:
    """Resolve, build if needed, and return what the sandbox binds plus the cache entry."""
    try:
        resolved = resolve_environment(spec, repo, task_folder)
    except EnvironmentSpecError as e:
        raise EnvironmentBuildError(f"the environment cannot be built: {e}") from e
    built = build_environment(resolved, repo, config)
    return sandbox_environment(built, resolved.pythonpath), built


def prepare_task_environment(task: Task, config: SandboxConfig | None = None) -> TaskEnvironment | None:
    """The environment of ``task`` (built on first use), or None when it has no ``[environment]``."""
    spec = task_environment_spec(task)
    if spec is None:
        return None
    return prepare_environment(spec, task.repo, config, task.path)[0]
