"""Shared helpers for the content checks of the built-in suites (``opencomposer/suites``).

Task states are built in temporary folders and their tests run through the harness's runner
(``grading.testrun.run_tests`` in a sandbox made from the folder), so the node ids checked here are
the ids grading looks up; the oracle and do-nothing policies through the whole harness are tested
in ``test_oracle_sweep.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import opencomposer
from opencomposer.grading.testrun import TestRun, run_tests
from opencomposer.sandbox.workspace import Sandbox

SUITES = Path(opencomposer.__file__).parent / "suites"
PROJECTS = SUITES / "projects"
CURSORBENCH = SUITES / "cursorbench"
COPY_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc", ".ruff_cache")
PYTEST_TIMEOUT_S = 180
PER_TEST_TIMEOUT_S = 60


class Workspaces:
    """Builds task states in temporary folders and runs a project's test command in them."""

    def __init__(self, root: Path) -> None:
        self.root = root
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

    def run_pytest(self, workspace: Path) -> TestRun:
        """``python -m pytest -q`` over a sandbox copy of ``workspace``; fails if pytest wrote no report."""
        with Sandbox(workspace) as sandbox:
            run = run_tests(sandbox, "python -m pytest -q", timeout_s=PYTEST_TIMEOUT_S,
                            per_test_timeout_s=PER_TEST_TIMEOUT_S)
        if run.collected is None:
            raise AssertionError(f"pytest wrote no report in {workspace}:\n{run.tail(3000)}")
        return run


def apply_patch(workspace: Path, patch: str) -> None:
    """Apply a unified diff with ``git apply`` (git is a test requirement); a refusal fails the test."""
    git = shutil.which("git")
    if git is None:
        raise AssertionError("git is required by the suite tests (to apply gold patches) and is not on PATH")
    proc = subprocess.run(
        [git, "apply", "--whitespace=nowarn", "-"],
        cwd=workspace,
        input=patch,
        text=True,
        capture_output=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AssertionError(f"git apply refused the patch in {workspace}:\n{proc.stdout}{proc.stderr}")


@pytest.fixture
def workspaces(tmp_path: Path) -> Workspaces:
    return Workspaces(tmp_path)
