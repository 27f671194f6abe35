"""The rule of tests/conftest.py: a skip for a missing dependency is a skip, under CI a failure.

Two small test modules are run by a separate pytest with the project's conftest as a plugin, once
without and once with ``CI=true``, and under CI once more on two pytest-xdist workers (as ``make
test`` runs); the machine is made to look as if it had no bubblewrap, and one module skips itself
at import for a package that is not installed, as a module-level ``pytest.importorskip`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MODULE = '''
import pytest

from tests.conftest import skip_missing


def test_needs_a_wheel():
    skip_missing("the frobnicate wheel")


@pytest.mark.bwrap
def test_needs_the_jail():
    pass


def test_skipped_on_purpose():
    pytest.skip("regenerated a golden file")


def test_plain():
    pass


def test_needs_a_package():
    pytest.importorskip("opencomposer_no_such_package")
'''
WHOLE_MODULE = '''
import pytest

pytest.importorskip("opencomposer_no_such_package")


def test_never_collected():
    pass
'''
NO_BWRAP = '''
from opencomposer.sandbox import jail

jail._BWRAP_OK = False  # as on a machine without bubblewrap
'''
REPORTER = '''
import json

OUTCOMES = {}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        OUTCOMES[report.nodeid.split("::")[-1]] = report.outcome


def pytest_collectreport(report):
    if report.outcome != "passed":
        OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session):
    with open("outcomes.json", "w") as f:
        json.dump(OUTCOMES, f)
'''


def outcomes(tmp_path: Path, ci: bool, workers: int = 0) -> dict[str, str]:
    (tmp_path / "test_module.py").write_text(MODULE)
    (tmp_path / "test_whole_module.py").write_text(WHOLE_MODULE)
    (tmp_path / "conftest.py").write_text(NO_BWRAP)
    (tmp_path / "reporter.py").write_text(REPORTER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    bwrap: needs bubblewrap\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    if ci:
        env["CI"] = "true"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "reporter",
               "--continue-on-collection-errors", "-n", str(workers), "test_module.py", "test_whole_module.py"]
    subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return json.loads((tmp_path / "outcomes.json").read_text())


def test_missing_dependencies_skip_outside_ci(tmp_path: Path):
    assert outcomes(tmp_path, ci=False) == {"test_needs_a_wheel": "skipped", "test_needs_the_jail": "skipped",
                                             "test_skipped_on_purpose": "skipped", "test_plain": "passed",
                                             "test_needs_a_package": "skipped", "test_whole_module.py": "skipped"}


UNDER_CI = {"test_needs_a_wheel": "failed", "test_needs_the_jail": "failed", "test_skipped_on_purpose": "skipped",
            "test_plain": "passed", "test_needs_a_package": "failed", "test_whole_module.py": "failed"}


def test_missing_dependencies_fail_under_ci(tmp_path: Path):
    assert outcomes(tmp_path, ci=True) == UNDER_CI


@pytest.mark.slow  # the rule itself runs in the default selection above; this checks that it holds under xdist
def test_missing_dependencies_fail_under_ci_on_two_workers(tmp_path: Path):
    assert outcomes(tmp_path, ci=True, workers=2) == UNDER_CI
