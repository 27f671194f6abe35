"""The one test runner (``envs.testrun``): outcomes by node id from a real pytest run in a real
sandbox, the whole-command limit, the JUnit reading, and grading and generators agreeing with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import GradingConfig, TasksConfig
from opencomposer.envs.grading import grade
from opencomposer.envs.testrun import junit_node_id, parse_junit, run_tests
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import write_task
from opencomposer.tasks.generators.common import Lab

MIXED = """\
import time

import pytest


def test_pass():
    assert 1 + 1 == 2


def test_fail():
    assert 1 + 1 == 3


@pytest.fixture
def broken():
    raise RuntimeError("the fixture fails in setup")


def test_error(broken):
    pass


@pytest.mark.skip(reason="not today")
def test_skip():
    pass


def test_hang():
    time.sleep(60)


class TestCases:
    @pytest.mark.parametrize("x", [1, 2])
    def test_param(self, x):
        assert x == 1
"""
TREE = {"tests/test_mixed.py": MIXED.encode(), "pyproject.toml": b"[tool.pytest.ini_options]\ntestpaths = ['tests']\n"}
EXPECTED = {
    "tests/test_mixed.py::test_pass": "passed",
    "tests/test_mixed.py::test_fail": "failed",
    "tests/test_mixed.py::test_error": "error",
    "tests/test_mixed.py::test_skip": "skipped",
    "tests/test_mixed.py::test_hang": "failed",  # pytest-timeout stops it after per_test_timeout_s
    "tests/test_mixed.py::TestCases::test_param[1]": "passed",
    "tests/test_mixed.py::TestCases::test_param[2]": "failed",
}


def write(root: Path, tree: dict[str, bytes]) -> Path:
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.mark.bwrap
def test_outcome_of_every_test_by_node_id(tmp_path: Path):
    with Sandbox(write(tmp_path / "repo", TREE)) as sandbox:
        run = run_tests(sandbox, "python -m pytest -q", timeout_s=60, per_test_timeout_s=2)
    assert run.outcomes == EXPECTED
    assert (run.exit_code, run.timed_out, run.collected) == (1, False, 7)
    assert [run.count(o) for o in ("passed", "failed", "error", "skipped")] == [2, 3, 1, 1]
    assert run.passed == {"tests/test_mixed.py::test_pass", "tests/test_mixed.py::TestCases::test_param[1]"}
    assert "1 error" in run.output and run.duration_s >= 2  # test_hang ran until its per-test limit


@pytest.mark.bwrap
def test_a_command_past_its_limit_is_timed_out_with_no_outcomes(tmp_path: Path):
    with Sandbox(write(tmp_path / "repo", TREE)) as sandbox:
        run = run_tests(sandbox, "python -m pytest -q", timeout_s=3, per_test_timeout_s=60)
    assert run.timed_out and run.exit_code != 0
    assert (run.outcomes, run.collected) == ({}, None)  # pytest was killed before writing its report


@pytest.mark.bwrap
def test_a_command_that_never_starts_pytest_has_no_report(tmp_path: Path):
    with Sandbox(write(tmp_path / "repo", TREE)) as sandbox:
        run = run_tests(sandbox, "python -c 'raise SystemExit(4)'", timeout_s=30, per_test_timeout_s=5)
    assert (run.exit_code, run.timed_out, run.outcomes, run.collected) == (4, False, {}, None)


@pytest.mark.bwrap
def test_generators_and_grading_read_the_same_ids(tmp_path: Path):
    """The ids a generator's lab lists are the ids grading looks up: listing the lab's passing
    tests as PASS_TO_PASS and its failing ones as FAIL_TO_PASS gives fractions 1.0 and 0.0."""
    lab = Lab(TasksConfig(test_timeout_s=60, per_test_timeout_s=2))
    run = lab.run(TREE, "python -m pytest -q")
    assert run.outcomes == EXPECTED
    failing = sorted(node for node, outcome in run.outcomes.items() if outcome in ("failed", "error"))
    task = write_task(tmp_path / "task", task_id="mixed", instruction="Fix the tests.",
                      repo=write(tmp_path / "repo", TREE), fail_to_pass=failing, pass_to_pass=sorted(run.passed))
    verdict = grade(task, "", config=GradingConfig(lint=False, per_test_timeout_s=2))
    assert (verdict.fail_to_pass, verdict.pass_to_pass, verdict.resolved) == (0.0, 1.0, False)
    assert (verdict.tests_passed, verdict.tests_failed, verdict.tests_errored) == (2, 3, 1)


def test_junit_node_ids():
    assert junit_node_id("tests/test_a.py", "tests.test_a", "test_x[1-2]") == "tests/test_a.py::test_x[1-2]"
    assert junit_node_id("tests/test_a.py", "tests.test_a.TestK.TestInner", "test_y") == (
        "tests/test_a.py::TestK::TestInner::test_y")
    assert junit_node_id(None, "tests.test_a.TestK", "test_z") == "tests/test_a.py::TestK::test_z"


def test_parse_junit_outcomes():
    xml = b"""<testsuites><testsuite tests="5">
      <testcase classname="t.test_a" name="test_ok" file="t/test_a.py"/>
      <testcase classname="t.test_a" name="test_bad" file="t/test_a.py"><failure message="x"/></testcase>
      <testcase classname="t.test_a" name="test_err" file="t/test_a.py"><error message="x"/></testcase>
      <testcase classname="t.test_a" name="test_skip" file="t/test_a.py"><skipped/></testcase>
      <testcase classname="t.test_a" name="test_ok" file="t/test_a.py"><error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    assert parse_junit(xml) == ({"t/test_a.py::test_ok": "error", "t/test_a.py::test_bad": "failed",
                                 "t/test_a.py::test_err": "error", "t/test_a.py::test_skip": "skipped"}, 5)
    assert parse_junit(b"<not xml") == ({}, None)
