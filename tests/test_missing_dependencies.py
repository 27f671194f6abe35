"""The rule of tests/conftest.py: a skip for a missing dependency is a skip, under CI a failure.

A small test module is run by a separate pytest with the project's conftest as a plugin, once
without and once with ``CI=true``; the machine is made to look as if it had no bubblewrap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def pytest_sessionfinish(session):
    with open("outcomes.json", "w") as f:
        json.dump(OUTCOMES, f)
'''


def outcomes(tmp_path: Path, ci: bool) -> dict[str, str]:
    (tmp_path / "test_module.py").write_text(MODULE)
    (tmp_path / "conftest.py").write_text(NO_BWRAP)
    (tmp_path / "reporter.py").write_text(REPORTER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    bwrap: needs bubblewrap\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    if ci:
        env["CI"] = "true"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "reporter", "test_module.py"],
                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return json.loads((tmp_path / "outcomes.json").read_text())


def test_missing_dependencies_skip_outside_ci(tmp_path: Path):
    assert outcomes(tmp_path, ci=False) == {"test_needs_a_wheel": "skipped", "test_needs_the_jail": "skipped",
                                             "test_skipped_on_purpose": "skipped", "test_plain": "passed"}


def test_missing_dependencies_fail_under_ci(tmp_path: Path):
    assert outcomes(tmp_path, ci=True) == {"test_needs_a_wheel": "failed", "test_needs_the_jail": "failed",
                                            "test_skipped_on_purpose": "skipped", "test_plain": "passed"}
