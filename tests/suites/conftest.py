"""Shared helpers for the content checks of the built-in suites (``opencomposer/suites``).

These are our own trusted files, so the checks run pytest directly in a temporary copy
rather than in the sandbox; the oracle and do-nothing policies through the real sandbox are
tested with the harness (``tests/envs``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import opencomposer

SUITES = Path(opencomposer.__file__).parent / "suites"
PROJECTS = SUITES / "projects"
CURSORBENCH = SUITES / "cursorbench"
COPY_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc", ".ruff_cache")
PYTEST_TIMEOUT_S = 180

# A pytest plugin that records the outcome of every test by its exact node id. JUnit XML would
# do too, but turning its classname/name pairs back into node ids is lossy for parametrized tests.
RESULTS_PLUGIN = """
import json
import os

_outcomes = {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        _outcomes[report.nodeid] = report.outcome
    elif report.failed:
        _outcomes[report.nodeid] = "error"
    elif report.skipped and report.when == "setup":
        _outcomes[report.nodeid] = "skipped"


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid or "<collection>"] = "collection-error"


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["SUITE_CHECK_RESULTS"], "w") as handle:
        json.dump(_outcomes, handle)
"""


@dataclass
class PytestRun:
    """The outcome of one ``python -m pytest -q`` over a workspace."""

    outcomes: dict[str, str]  # node id -> passed | failed | error | skipped | collection-error
    output: str
    exit_code: int

    @property
    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}

    def not_passed(self) -> dict[str, str]:
        return {node: outcome for node, outcome in self.outcomes.items() if outcome != "passed"}


class Workspaces:
    """Builds task states in temporary folders and runs a project's test command in them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.plugin_dir = root / "plugin"
        self.plugin_dir.mkdir()
        (self.plugin_dir / "suite_check_results.py").write_text(RESULTS_PLUGIN)
        self._count = 0

    def copy(self, source: Path, *overlays: Path) -> Path:
        """A fresh copy of ``source`` with each existing overlay folder copied on top."""
        self._count += 1
        target = self.root / f"ws{self._count}"
        shutil.copytree(source, target, ignore=COPY_IGNORE)
        for overlay in overlays:
            if overlay.is_dir():
                shutil.copytree(overlay, target, dirs_exist_ok=True, ignore=COPY_IGNORE)
        return target

    def run_pytest(self, workspace: Path) -> PytestRun:
        results = workspace.parent / f"{workspace.name}.results.json"
        env = dict(
            os.environ,
            PYTHONDONTWRITEBYTECODE="1",
            # the projects need no plugins, and loading every installed one costs seconds per run
            PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
            PYTHONPATH=str(self.plugin_dir),
            SUITE_CHECK_RESULTS=str(results),
        )
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_check_results"],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=PYTEST_TIMEOUT_S,
        )
        output = proc.stdout + proc.stderr
        if not results.exists():
            raise AssertionError(f"pytest wrote no results in {workspace}:\n{output[-3000:]}")
        return PytestRun(json.loads(results.read_text()), output, proc.returncode)


def apply_patch(workspace: Path, patch: str) -> None:
    """Apply a unified diff with ``git apply``, or ``patch -p1`` where git is missing or refuses."""
    git = shutil.which("git")
    if git is not None:
        proc = subprocess.run(
            [git, "apply", "--whitespace=nowarn", "-"],
            cwd=workspace,
            input=patch,
            text=True,
            capture_output=True,
            timeout=60,
        )
        if proc.returncode == 0:
            return
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "--silent"],
        cwd=workspace,
        input=patch,
        text=True,
        capture_output=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AssertionError(f"the patch does not apply in {workspace}:\n{proc.stdout}{proc.stderr}")


@pytest.fixture
def workspaces(tmp_path: Path) -> Workspaces:
    return Workspaces(tmp_path)
