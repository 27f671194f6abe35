"""The source projects under ``opencomposer/suites/projects`` are realistic and green.

Generators inject bugs into them and delete features from them, so each needs several
modules of real code and a test suite that pins behaviour down, and every test must pass.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from .conftest import PROJECTS, Workspaces

PROJECT_NAMES = sorted(p.name for p in PROJECTS.iterdir() if (p / "pyproject.toml").is_file())


def package_dir(project: Path) -> Path:
    """``src/<package>`` or ``<package>`` at the project root: the folder with an ``__init__.py``."""
    candidates = [p.parent for p in project.glob("src/*/__init__.py")]
    candidates += [p.parent for p in project.glob("*/__init__.py") if p.parent.name != "tests"]
    assert len(candidates) == 1, f"{project.name}: expected one package folder, found {candidates}"
    return candidates[0]


def code_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def test_there_are_five_projects():
    assert PROJECT_NAMES == ["confkit", "inventory", "ledger", "scheduler", "textkit"]


@pytest.mark.parametrize("name", PROJECT_NAMES)
def test_project_layout(name):
    project = PROJECTS / name
    assert (project / "README.md").read_text().startswith(f"# {name}")
    config = tomllib.loads((project / "pyproject.toml").read_text())
    assert config["project"]["requires-python"] == ">=3.11"
    assert config["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    modules = [p for p in package_dir(project).glob("*.py") if p.name != "__init__.py"]
    assert len(modules) >= 4, f"{name}: {len(modules)} modules"
    lines = sum(code_lines(p) for p in package_dir(project).glob("*.py"))
    assert 300 <= lines <= 1000, f"{name}: {lines} non-blank lines of code"
    assert len(list((project / "tests").glob("test_*.py"))) >= 4


@pytest.mark.bwrap
@pytest.mark.parametrize("name", PROJECT_NAMES)
def test_project_suite_is_green(name, workspaces: Workspaces):
    run = workspaces.run_pytest(workspaces.copy(PROJECTS / name))
    assert run.exit_code == 0, run.output[-3000:]
    assert not run.not_passed(), run.not_passed()
    assert len(run.passed) >= 30, f"{name}: only {len(run.passed)} tests"
