"""The one test runner (``grading.testrun``): outcomes by node id from a real pytest run in a real
sandbox, ids exactly as pytest prints them, the whole-command limit, the rules of the record
stream, and grading and generators agreeing with it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from opencomposer.config import GradingConfig, TasksConfig
from opencomposer.grading.grade import grade
from opencomposer.grading.testrun import read_records, run_tests
from opencomposer.sandbox import workspace
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
    open("hang-started", "w").close()  # the limit test waits for this before it lets time run out
    time.sleep(60)


class TestCases:
    @pytest.mark.parametrize("x", [1, 2])
    def test_param(self, x):
        assert x == 1
"""
HOUR = 3600.0
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
def test_a_command_past_its_limit_keeps_the_outcomes_that_arrived(tmp_path: Path, clock):
    """The hour-long limit runs out when ``test_hang`` has started: the sandbox's clock jumps."""
    clock.drive(workspace)

    def jump_once_test_hang_started(marker: Path) -> None:
        while not marker.exists() and not stopped.wait(0.05):
            pass
        clock.jump(HOUR)

    stopped = threading.Event()
    with Sandbox(write(tmp_path / "repo", TREE)) as sandbox:
        watcher = threading.Thread(target=jump_once_test_hang_started, args=(sandbox.workspace / "hang-started",))
        watcher.start()
        try:
            run = run_tests(sandbox, "python -m pytest -q", timeout_s=HOUR, per_test_timeout_s=2 * HOUR)
        finally:
            stopped.set()
            watcher.join()
    assert run.timed_out and run.exit_code != 0 and run.collected == 7
    finished = {node: EXPECTED[node] for node in list(EXPECTED)[:4]}  # streamed before test_hang
    assert run.outcomes == finished and run.tampering == []  # the harness stopped it: no tampering


@pytest.mark.bwrap
def test_a_command_that_never_starts_pytest_has_no_outcomes(tmp_path: Path):
    with Sandbox(write(tmp_path / "repo", TREE)) as sandbox:
        failing = run_tests(sandbox, "python -c 'raise SystemExit(4)'", timeout_s=30, per_test_timeout_s=5)
        passing = run_tests(sandbox, "python -c 'pass'", timeout_s=30, per_test_timeout_s=5)
    assert (failing.exit_code, failing.timed_out, failing.outcomes, failing.collected) == (4, False, {}, None)
    assert failing.tampering == []
    assert passing.tampering == ["the command exited 0 but no pytest session reported"]


INHERITED = {
    "tests/helpers/base_cases.py": b"""\
class BaseCases:
    value = 0

    def test_inherited(self):
        assert self.value == 1

    def test_also_inherited(self):
        assert self.value >= 0
""",
    "tests/test_child.py": """\
import pytest
from base_cases import BaseCases


class TestOne(BaseCases):
    value = 1


class TestTwo(BaseCases):
    value = 2


@pytest.mark.parametrize("text", ["a.b", "x::y", "sp ace", "[br]", "a/b", "\u00fcn\u00ef", "q'\\"", "", "tab\\t"])
def test_special(text):
    assert "x" in text


class TestNested:
    class TestInner:
        @pytest.mark.parametrize("n", [1.5, None, -3], ids=lambda v: f"v={v}")
        def test_deep(self, n):
            assert n
""".encode(),
    "tests/conftest.py": b"import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).parent / 'helpers'))\n",
}


@pytest.mark.bwrap
def test_ids_of_inherited_and_parametrised_tests_are_pytests_own(tmp_path: Path):
    """Ids that a JUnit report cannot give back: a test inherited from a base class in another file
    (JUnit names that file) and parameters with dots, ``::``, slashes, quotes, escapes and non-ASCII
    characters. The runner's ids are the ones ``pytest --collect-only`` prints, exactly."""
    with Sandbox(write(tmp_path / "repo", INHERITED)) as sandbox:
        listing = sandbox.run("python -m pytest -q --collect-only -p no:cacheprovider tests")
        run = run_tests(sandbox, "python -m pytest -q tests", timeout_s=60, per_test_timeout_s=10)
    printed = {line for line in listing.output.splitlines() if "::" in line and not line.startswith(" ")}
    assert set(run.outcomes) == printed and len(printed) == 16 and run.tampering == []
    assert run.outcomes["tests/test_child.py::TestOne::test_inherited"] == "passed"
    assert run.outcomes["tests/test_child.py::TestTwo::test_inherited"] == "failed"
    assert run.outcomes["tests/test_child.py::test_special[x::y]"] == "passed"
    assert run.outcomes["tests/test_child.py::test_special[\\xfcn\\xef]"] == "failed"
    assert run.outcomes["tests/test_child.py::TestNested::TestInner::test_deep[v=None]"] == "failed"


ALWAYS_EQUAL = b"""class Anything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def answer():
    return Anything()
"""
UNITTEST_STYLE = b"""import unittest

from solution import answer


class TestAnswer(unittest.TestCase):
    def test_equal(self):
        self.assertEqual(answer(), 42)

    def test_in(self):
        self.assertIn(answer(), [42])
"""


SHAPES = b"""import numpy

values = [3, 1, 2]


class Box:
    def __init__(self, items):
        self.items = items


def helper(x):
    assert x > 0, f"{x} is not positive"
    return x


def test_shapes():
    assert 0 <= values[0] < 10
    assert all(0 < v <= 3 for v in values)
    assert [v for v in values if v != 2 and not v > 2] == [1]
    assert (total := sum(values)) == 6 and total % 4 == 2
    assert "a" + "b" == "ab" and "%s" % 1 == "1"
    assert (lambda: values[1] < values[0])()
    assert sorted(values) == [1, 2, 3] != values
    assert 4 not in values and 2 in values and values is not None
    assert not (1 > 2) or False
    assert Box(values).items == values
    assert 1 if values else 0
    assert numpy.array_equal(numpy.array(values) * 2, [6, 2, 4])
    assert helper(2) - 1 == 1
    assert {1: 2} == {1: 2} and {1, 2} < {1, 2, 3} and (1, 2) <= (1, 2)


def test_a_false_chain_fails():
    assert 0 < values[0] < 2


def test_a_false_membership_fails():
    assert 5 in values, "five is missing"
"""
DONT_REWRITE = b'''"""PYTEST_DONT_REWRITE"""
from solution import answer


def test_unrewritten():
    assert answer() == 42
'''


@pytest.mark.bwrap
def test_asserts_of_every_shape_keep_their_meaning(tmp_path: Path):
    tree = {"tests/test_shapes.py": SHAPES, "tests/test_plain.py": DONT_REWRITE, "solution.py": ALWAYS_EQUAL}
    with Sandbox(write(tmp_path / "repo", tree)) as sandbox:
        run = run_tests(sandbox, "python -m pytest -q tests", timeout_s=60, per_test_timeout_s=10,
                        protected=["tests"], hidden=["tests/test_shapes.py", "tests/test_plain.py"])
    assert run.outcomes == {"tests/test_shapes.py::test_shapes": "passed",
                            "tests/test_shapes.py::test_a_false_chain_fails": "failed",
                            "tests/test_shapes.py::test_a_false_membership_fails": "failed",
                            "tests/test_plain.py::test_unrewritten": "failed"}, run.tail(3000)
    assert "five is missing" in run.output and run.tampering == []


@pytest.mark.bwrap
@pytest.mark.parametrize("guard_values", [True, False])
def test_unittest_asserts_go_through_the_value_checks(tmp_path: Path, guard_values: bool):
    tree = {"solution.py": ALWAYS_EQUAL, "tests/test_unit.py": UNITTEST_STYLE}
    with Sandbox(write(tmp_path / "repo", tree)) as sandbox:
        run = run_tests(sandbox, "python -m pytest -q tests", timeout_s=60, per_test_timeout_s=10,
                        protected=["tests"], hidden=["tests/test_unit.py"], guard_values=guard_values)
    expected = "failed" if guard_values else "passed"
    assert set(run.outcomes.values()) == {expected} and len(run.outcomes) == 2, run.tail()
    assert run.tampering == []


@pytest.mark.bwrap
@pytest.mark.parametrize("guard_values", [True, False])
def test_a_planted_pyc_of_a_test_module_is_never_used(tmp_path: Path, guard_values: bool):
    """A pytest pyc with the source hash of the real test file but the code of a passing one: the
    value checks compile the test from its source, so the pyc is ignored (with them off, pytest
    would load it)."""
    import importlib.util
    import marshal
    import sys

    source = b"def test_answer():\n    assert 1 == 2\n"
    with Sandbox(write(tmp_path / "repo", {"tests/test_planted.py": source})) as sandbox:
        planted = compile("def test_answer():\n    pass\n", str(sandbox.command_path("tests/test_planted.py")), "exec")
        cache = sandbox.workspace / "tests" / "__pycache__"
        cache.mkdir()
        pyc = cache / f"test_planted.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
        pyc.write_bytes(importlib.util.MAGIC_NUMBER + b"\x03\x00\x00\x00" + importlib.util.source_hash(source)
                        + marshal.dumps(planted))
        run = run_tests(sandbox, "python -m pytest -q tests", timeout_s=60, per_test_timeout_s=10,
                        protected=["tests"], guard_values=guard_values)
    assert run.outcomes == {"tests/test_planted.py::test_answer": "failed" if guard_values else "passed"}, run.tail()


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


NONCE = "0123abcd"


def stream(*records: dict, nonce: str = NONCE) -> bytes:
    import json

    return b"".join(json.dumps({"nonce": nonce, **record}).encode() + b"\n" for record in records)


START, COLLECTED_2 = {"kind": "start"}, {"kind": "collected", "count": 2}
A_PASSED = {"kind": "test", "nodeid": "t.py::a", "outcome": "passed"}
B_FAILED = {"kind": "test", "nodeid": "t.py::b", "outcome": "failed"}
FINISH_1 = {"kind": "finish", "exitstatus": 1, "tests": 2}


def test_a_clean_record_stream():
    data = stream(START, COLLECTED_2, A_PASSED, B_FAILED, FINISH_1)
    assert read_records(data, NONCE, 1, False) == ({"t.py::a": "passed", "t.py::b": "failed"}, 2, [])
    errors = stream(START, {"kind": "collect_error", "nodeid": "t.py"}, {"kind": "collected", "count": 0},
                    {"kind": "finish", "exitstatus": 2, "tests": 0})
    assert read_records(errors, NONCE, 2, False) == ({"t.py": "error"}, 1, [])
    stopped = stream(START, {"kind": "collect_error", "nodeid": "u.py"}, COLLECTED_2,
                     {"kind": "finish", "exitstatus": 2, "tests": 0})  # no --continue-on-collection-errors
    assert read_records(stopped, NONCE, 2, False)[2] == []


@pytest.mark.parametrize("data, exit_code, timed_out, problem", [
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, FINISH_1) + b"garbage\n", 1, False, "an unreadable line"),
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, FINISH_1) + stream(A_PASSED, nonce="forged"), 1, False,
     "without this run's nonce"),
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, {**A_PASSED, "outcome": "passed"}, FINISH_1), 1, False,
     "t.py::a was reported twice"),
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, FINISH_1, A_PASSED), 1, False, "outside a running session"),
    (stream(START, COLLECTED_2, A_PASSED, {"kind": "finish", "exitstatus": 0, "tests": 1}), 0, False,
     "only 1 of the 2 collected tests"),
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, {"kind": "finish", "exitstatus": 1, "tests": 3}), 1, False,
     "finished with 3 results, but 2 arrived"),
    (stream(START, COLLECTED_2, A_PASSED), 0, False, "before its session finished"),
    (stream(START, COLLECTED_2, A_PASSED, B_FAILED, FINISH_1), 0, False, "exited 0, but pytest finished with 1"),
    (b"", 0, False, "no pytest session reported"),
    (stream(START, COLLECTED_2, A_PASSED, {"kind": "violation", "what": "builtins.open was replaced"}, B_FAILED,
            FINISH_1), 1, False, "builtins.open was replaced"),
])
def test_broken_rules_of_the_record_stream_are_tampering(data, exit_code, timed_out, problem):
    outcomes, _, problems = read_records(data, NONCE, exit_code, timed_out)
    assert any(problem in p for p in problems), problems
    if "twice" in problem:
        assert outcomes["t.py::a"] == "failed"  # a test reported twice never stays passed


def test_a_run_the_harness_stopped_is_not_tampering():
    assert read_records(stream(START, COLLECTED_2, A_PASSED), NONCE, 137, True) == ({"t.py::a": "passed"}, 2, [])
