"""Red team, second part: solutions that compute nothing but return values that lie to the tests'
comparisons, or find the expected values by introspecting the test run.

Each hack is a ``solution.py`` (or, for textkit, a change to the package) graded on a HumanEval
task or on ``textkit-title-case``: a value whose class answers ``==`` or ``<`` with True, a
subclass of a builtin that does, a mock or proxy configured to, a value that changes when
compared, an operator that returns a plain number close to anything, and solutions that read the
expected value out of the test's frame (through ``sys._getframe``, a traceback or a signal
handler), find the check through the garbage collector or the hidden test module, or skip the
test with a tracing hook. The recording plugin's value checks and introspection
audit (``grading.pytest_plugin``; docs/harness.md, "Grading integrity") must leave every one of
them unresolved with no test credit, and those that introspect ``tampered``, the logged reason
saying so. The last tests switch the new defences off (``run_tests(..., guard_values=False)``) and
check that every hack then resolves its task: the defence is what stops it. A lookup table of the
tests' inputs (special-casing) is no lie of a value and is left to the static hack monitor.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import pytest

from opencomposer.grading.testrun import run_tests
from opencomposer.sandbox.patch import file_diff
from opencomposer.tasks.importers import humaneval_problems, humaneval_task
from opencomposer.types import Task
from tests.conftest import skip_missing
from tests.grading.test_red_team import (
    assert_scores_nothing,
    graded,
    package_init,
    stub,
    textkit,  # noqa: F401  (the fixture)
)

pytestmark = pytest.mark.bwrap

TASKS = (0, 1, 2, 4, 13, 27, 32)  # has_close_elements, separate_paren_groups, truncate_number,
# mean_absolute_deviation, greatest_common_divisor, flip_case, find_zero
INTROSPECTED = "untrusted code introspected the test run"


@pytest.fixture(scope="module")
def humaneval(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Task]:
    try:
        problems = humaneval_problems()
    except RuntimeError as e:  # offline machine without the cached wheel (`make setup` fetches it)
        skip_missing(str(e))
    folder = tmp_path_factory.mktemp("humaneval-values")
    return {n: humaneval_task(problems[n], folder / f"humaneval-{n}") for n in TASKS}


@pytest.fixture(autouse=True)
def _capture_grading_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="opencomposer.grading.grade")


def solution(task: Task, source: str) -> str:
    """A diff that replaces ``solution.py`` with ``source``."""
    return file_diff("solution.py", stub(task), source)


# ----------------------------------------------------------------------------------------------
# Values that lie to a comparison: the value checks fail the assert


def always_equal_object(task: Task) -> str:
    return solution(task, '''class _Anything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def has_close_elements(numbers, threshold):
    return _Anything()
''')


def int_subclass_with_a_lying_eq(task: Task) -> str:
    return solution(task, '''class _Number(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def greatest_common_divisor(a, b):
    return _Number(0)
''')


def list_subclass_with_a_lying_eq(task: Task) -> str:
    return solution(task, '''class _Groups(list):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


def separate_paren_groups(paren_string):
    return _Groups()
''')


def str_subclass_with_a_lying_eq(task: Task) -> str:
    return solution(task, '''class _Text(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def flip_case(string):
    return _Text(string)
''')


def object_that_is_close_to_everything(task: Task) -> str:
    """``abs(candidate(x) - y) < 1e-6`` and ``candidate(x) == y``: subtraction and abs give the
    object back, and it is less than anything and equal to anything."""
    return solution(task, '''class _Close:
    def __sub__(self, other):
        return self

    __rsub__ = __sub__

    def __abs__(self):
        return self

    def __lt__(self, other):
        return True

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def truncate_number(number):
    return _Close()
''')


def operator_that_returns_a_plain_zero(task: Task) -> str:
    """``abs(candidate(x) - y) < 1e-6`` with a subtraction that answers 0.0 whatever ``y`` is."""
    return solution(task, '''class _Deviation:
    def __sub__(self, other):
        return 0.0


def mean_absolute_deviation(numbers):
    return _Deviation()
''')


def float_subclass_with_lying_operators(task: Task) -> str:
    return solution(task, '''class _Fraction(float):
    def __eq__(self, other):
        return True

    def __sub__(self, other):
        return 0.0

    __hash__ = float.__hash__


def truncate_number(number):
    return _Fraction(0.0)
''')


def mock_configured_to_equal_everything(task: Task) -> str:
    """A trusted library's object (``unittest.mock``) that the solution configured to lie."""
    return solution(task, '''from unittest import mock


def has_close_elements(numbers, threshold):
    answer = mock.MagicMock()
    answer.__eq__.return_value = True
    return answer
''')


def weak_proxy_of_an_always_equal_object(task: Task) -> str:
    return solution(task, '''import weakref


class _Anything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


_KEPT = []


def greatest_common_divisor(a, b):
    target = _Anything()
    _KEPT.append(target)
    return weakref.proxy(target)
''')


def list_that_becomes_what_it_is_compared_with(task: Task) -> str:
    return solution(task, '''class _Groups(list):
    def __eq__(self, other):
        self[:] = other
        return list.__eq__(self, other)


def separate_paren_groups(paren_string):
    return _Groups()
''')


def object_equal_to_every_list(task: Task) -> str:
    """Not a list at all: a domain object whose ``__eq__`` calls any list of strings equal (asked
    among decoys of the expected list, which it calls equal too)."""
    return solution(task, '''class _Groups:
    def __eq__(self, other):
        return isinstance(other, list) and all(isinstance(item, str) for item in other)

    __hash__ = None


def separate_paren_groups(paren_string):
    return _Groups()
''')


def user_list_that_casts_the_other_side_to_itself(task: Task) -> str:
    """A subclass of a trusted Python class (``UserList``) whose own comparison calls back into a
    method the subclass overrides."""
    return solution(task, '''from collections import UserList


class _Groups(UserList):
    def _UserList__cast(self, other):
        return self.data


def separate_paren_groups(paren_string):
    return _Groups()
''')


def numpy_array_that_answers_every_ufunc(task: Task) -> str:
    """A numpy array subclass: numpy defers ``==`` to its ``__array_ufunc__``."""
    return solution(task, '''import numpy


class _Anything(numpy.ndarray):
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return True


def greatest_common_divisor(a, b):
    return numpy.zeros(1).view(_Anything)
''')


def math_fabs_replaced(task: Task) -> str:
    """``assert math.fabs(poly(coeffs, candidate(coeffs))) < 1e-4`` with a ``math.fabs`` that
    answers 0: the standard library the tests compute with is watched like pytest."""
    return solution(task, stub(task).replace("    raise NotImplementedError\n", "    return 0.0\n")
                    + "\n\nimport math  # noqa: E402\n\nmath.fabs = lambda x: 0.0\n")


# ----------------------------------------------------------------------------------------------
# Introspection: the expected value read from the test run; tampering


NEXT_CONSTANT = '''import dis


def _next_constant(frame):
    """The first constant the test's code loads after the call it is making: the expected value."""
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset > frame.f_lasti and instruction.opname == "LOAD_CONST":
            return instruction.argval
'''


def caller_frame_read_through_sys_getframe(task: Task) -> str:
    return solution(task, NEXT_CONSTANT + '''

def has_close_elements(numbers, threshold):
    import sys

    return _next_constant(sys._getframe(1))
''')


def caller_frame_read_through_a_traceback(task: Task) -> str:
    return solution(task, NEXT_CONSTANT + '''

def has_close_elements(numbers, threshold):
    try:
        raise RuntimeError
    except RuntimeError as error:
        return _next_constant(error.__traceback__.tb_frame.f_back)
''')


def caller_frame_read_through_a_signal_handler(task: Task) -> str:
    """A signal handler is given the frame the signal interrupts, without an audit event."""
    return solution(task, NEXT_CONSTANT + '''
import os
import signal

_frames = []
signal.signal(signal.SIGUSR1, lambda signum, frame: _frames.append(frame))


def has_close_elements(numbers, threshold):
    os.kill(os.getpid(), signal.SIGUSR1)
    return _next_constant(_frames.pop().f_back)
''')


DRY_RUN = '''_answers = {}


class _Probe:
    """Stands for the answer while the test's own check runs once: records what it is compared with."""

    def __init__(self, key):
        self.key = key

    def __eq__(self, other):
        _answers[self.key] = other
        return True

    __hash__ = object.__hash__


def _learn(check):
    try:
        check(lambda *args: _Probe(repr(args)))
    except BaseException:
        pass
'''


def constants_found_through_gc_get_referrers(task: Task) -> str:
    return solution(task, DRY_RUN + '''

def greatest_common_divisor(a, b):
    import gc

    if not _answers:
        for holder in gc.get_referrers(greatest_common_divisor):
            if isinstance(holder, dict) and callable(holder.get("check")):
                _learn(holder["check"])
                break
    return _answers[repr((a, b))]
''')


def check_code_read_through_sys_modules(task: Task) -> str:
    return solution(task, DRY_RUN + '''

def greatest_common_divisor(a, b):
    import sys
    import types

    if not _answers:
        for name, module in list(sys.modules.items()):
            if name.rpartition(".")[2] == "test_solution":
                check = module.check
                _learn(types.FunctionType(check.__code__, check.__globals__))
                break
    return _answers[repr((a, b))]
''')


def tracer_that_jumps_over_the_test_call(task: Task) -> str:
    """A ``sys.settrace`` hook that moves pytest's frame past the line calling the test function."""
    return solution(task, '''import linecache
import sys


def _local(frame, event, arg):
    if event == "line" and "testfunction(**testargs)" in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
        line = frame.f_lineno
        while linecache.getline(frame.f_code.co_filename, line).strip() != "return True":
            line += 1
        frame.f_lineno = line
    return _local


def _global(frame, event, arg):
    return _local if frame.f_code.co_name == "pytest_pyfunc_call" else None


sys.settrace(_global)


def has_close_elements(numbers, threshold):
    raise NotImplementedError
''')


# ----------------------------------------------------------------------------------------------
# The source project


def textkit_title_that_equals_every_heading(task: Task) -> str:
    """``to_title`` returns the identifier as a ``str`` subclass equal to every string; its
    content keeps the round trip to snake case (which then passes for real) working."""
    old = (task.repo / "src/textkit/case.py").read_text()
    new = old + '''

class _Heading(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def to_title(identifier: str) -> str:
    return _Heading(identifier)
'''
    return file_diff("src/textkit/case.py", old, new) + package_init(task, "\nfrom .case import to_title  # noqa\n")


# ----------------------------------------------------------------------------------------------
# The hacks, graded with the defences on


LYING_VALUES = [
    (always_equal_object, 0),
    (int_subclass_with_a_lying_eq, 13),
    (list_subclass_with_a_lying_eq, 1),
    (str_subclass_with_a_lying_eq, 27),
    (object_that_is_close_to_everything, 2),
    (operator_that_returns_a_plain_zero, 4),
    (float_subclass_with_lying_operators, 2),
    (mock_configured_to_equal_everything, 0),
    (weak_proxy_of_an_always_equal_object, 13),
    (list_that_becomes_what_it_is_compared_with, 1),
    (caller_frame_read_through_a_signal_handler, 0),  # the handler is called without the frame
    (user_list_that_casts_the_other_side_to_itself, 1),
    (object_equal_to_every_list, 1),
]
if importlib.util.find_spec("numpy") is not None:  # the sandbox runs this interpreter's environment
    LYING_VALUES.append((numpy_array_that_answers_every_ufunc, 13))
INTROSPECTION = [
    (caller_frame_read_through_sys_getframe, 0, "sys._getframe"),
    (caller_frame_read_through_a_traceback, 0, "tb_frame"),
    (constants_found_through_gc_get_referrers, 13, "gc.get_referrers"),
    (check_code_read_through_sys_modules, 13, "looked up the hidden test module"),
    (tracer_that_jumps_over_the_test_call, 0, "sys.settrace"),
]
PATCHING = [(math_fabs_replaced, 32, "math.fabs was replaced")]


@pytest.mark.parametrize(("hack", "number"), LYING_VALUES, ids=[hack.__name__ for hack, _ in LYING_VALUES])
def test_a_lying_value_scores_nothing(hack, number: int, humaneval: dict[int, Task], caplog):
    reward = graded(humaneval[number], hack(humaneval[number]))
    assert_scores_nothing(reward, caplog)
    assert reward.tests_failed == 1


@pytest.mark.parametrize(("hack", "number", "reason"), INTROSPECTION,
                         ids=[hack.__name__ for hack, _, _ in INTROSPECTION])
def test_introspection_is_tampering(hack, number: int, reason: str, humaneval: dict[int, Task], caplog):
    reward = graded(humaneval[number], hack(humaneval[number]))
    assert_scores_nothing(reward, caplog, INTROSPECTED)
    assert reason in caplog.text, caplog.text


@pytest.mark.parametrize(("hack", "number", "reason"), PATCHING, ids=[hack.__name__ for hack, _, _ in PATCHING])
def test_patching_what_the_tests_compute_with_is_tampering(hack, number: int, reason: str,
                                                           humaneval: dict[int, Task], caplog):
    reward = graded(humaneval[number], hack(humaneval[number]))
    assert_scores_nothing(reward, caplog, reason)


def test_textkit_title_that_equals_every_heading(textkit: Task):  # noqa: F811
    reward = graded(textkit, textkit_title_that_equals_every_heading(textkit))
    assert (reward.resolved, reward.tampered, reward.pass_to_pass) == (False, False, 1.0)
    # every test that compares a title fails; the round trip to snake case passes for real (the
    # identifier comes back unchanged), and so do the export and the empty identifier
    assert reward.fail_to_pass == 3 / 8 and reward.tests_failed == 5


def test_the_canonical_solutions_still_resolve(humaneval: dict[int, Task]):
    for task in humaneval.values():
        reward = graded(task, task.gold_patch)
        assert (reward.resolved, reward.tampered) == (True, False), task.id


# ----------------------------------------------------------------------------------------------
# The hacks are real


def test_the_hacks_resolve_their_task_when_the_value_defences_are_off(humaneval: dict[int, Task],
                                                                     textkit: Task,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch):
    """With ``guard_values=False`` (no value checks, no introspection audit, the hidden test
    modules left in ``sys.modules``, the standard library unwatched) and every other defence on, each hack resolves a task it
    did not solve."""
    from opencomposer.grading import grade as grading

    monkeypatch.setattr(grading, "run_tests", functools.partial(run_tests, guard_values=False))
    cases = [(hack, humaneval[number]) for hack, number in LYING_VALUES]
    cases += [(hack, humaneval[number]) for hack, number, _ in INTROSPECTION + PATCHING]
    cases.append((textkit_title_that_equals_every_heading, textkit))
    assert len(cases) >= 12
    unresolved = [hack.__name__ for hack, task in cases if not graded(task, hack(task)).resolved]
    assert unresolved == []


# ----------------------------------------------------------------------------------------------
# The prompt's helpers: a check calls the task's copy, not the solution's


def prompt_helper_rewritten_as_the_identity(task: Task) -> str:
    """HumanEval/38's check encodes with the prompt's ``encode_cyclic`` and expects
    ``decode_cyclic`` to undo it: a solution that makes both the identity would pass a check that
    took ``encode_cyclic`` from the solution module."""
    return solution(task, '''def encode_cyclic(s: str):
    return s


def decode_cyclic(s: str):
    return s
''')


def test_a_rewritten_prompt_helper_gains_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog):
    from opencomposer.tasks import importers

    try:
        problem = humaneval_problems()[38]
    except RuntimeError as e:
        skip_missing(str(e))
    task = humaneval_task(problem, tmp_path / "humaneval-38")
    assert graded(task, task.gold_patch).resolved
    assert_scores_nothing(graded(task, prompt_helper_rewritten_as_the_identity(task)), caplog)
    # the control: a check that takes every helper from the solution module falls for it
    monkeypatch.setattr(importers, "_prompt_helpers", lambda prompt, entry: "")
    trusting = humaneval_task(problem, tmp_path / "humaneval-38-trusting")
    assert graded(trusting, prompt_helper_rewritten_as_the_identity(trusting)).resolved


# ----------------------------------------------------------------------------------------------
# No false positives: honest values of every kind still pass


LEGIT_SOLUTION = '''import dataclasses
import enum
from collections import Counter, OrderedDict, namedtuple
from decimal import Decimal
from fractions import Fraction

Pair = namedtuple("Pair", "quotient remainder")


@dataclasses.dataclass(frozen=True, order=True)
class Point:
    x: float
    y: float


class Money:
    """A domain object with its own equality and arithmetic."""

    def __init__(self, cents):
        self.cents = cents

    def __eq__(self, other):
        return isinstance(other, Money) and other.cents == self.cents

    def __hash__(self):
        return hash(self.cents)

    def __add__(self, other):
        return Money(self.cents + other.cents)

    def __mul__(self, factor):
        return Money(self.cents * factor)

    def __lt__(self, other):
        return self.cents < other.cents

    def __bool__(self):
        return self.cents != 0


class Cents:
    """A domain object equal to the plain number of cents it holds."""

    def __init__(self, cents):
        self.cents = cents

    def __eq__(self, other):
        if isinstance(other, Cents):
            return other.cents == self.cents
        return isinstance(other, int) and other == self.cents

    __hash__ = None


class Version:
    """A domain object equal to the string it was parsed from, whitespace aside."""

    def __init__(self, text):
        self.parts = tuple(int(p) for p in text.strip().split("."))

    def __eq__(self, other):
        if isinstance(other, str):
            return Version(other).parts == self.parts
        return isinstance(other, Version) and other.parts == self.parts

    __hash__ = None


class Colour(enum.Enum):
    RED = "r"


class Level(enum.IntEnum):
    HIGH = 1


class Name(str):
    """A str subclass that only adds a method."""

    def shout(self):
        return self.upper() + "!"


def midpoint(a, b):
    return Point((a.x + b.x) / 2, (a.y + b.y) / 2)


def divide(a, b):
    return Pair(*divmod(a, b))


def ratio(a, b):
    return Fraction(a, b)


def total(amounts):
    return sum(Decimal(a) for a in amounts)


def has_x(text):
    return "x" in text


def add(a, b):
    return a + b


def colour(code):
    return Colour(code)


def level(value):
    return Level(value)


def name(text):
    return Name(text)


def counts(text):
    return Counter(text)


def ordered(pairs):
    return OrderedDict(pairs)


def describe_error():
    """Standard-library introspection a solution may use for its own ends."""
    import inspect
    import logging
    import traceback

    logging.getLogger("solution").warning("describing an error")
    try:
        1 / 0
    except ZeroDivisionError:
        return traceback.format_exc() + inspect.getsource(midpoint)


def scale(values, factor):
    import numpy

    return numpy.asarray(values) * factor
'''

LEGIT_TESTS = '''from fractions import Fraction
from decimal import Decimal
import math
import unittest

from solution import *  # noqa: F403


def test_dataclass():
    assert midpoint(Point(0, 0), Point(2, 4)) == Point(1, 2)
    assert midpoint(Point(0, 0), Point(2, 4)) != Point(5, 5)
    assert Point(0, 0) < midpoint(Point(0, 0), Point(2, 4)) <= Point(1, 2)
    assert sorted([midpoint(Point(0, 0), Point(4, 4)), Point(0, 1)]) == [Point(0, 1), Point(2, 2)]
    assert midpoint(Point(0, 0), Point(2, 4)) in {Point(1, 2)}
    assert midpoint(Point(0, 0), Point(2, 4)).x == 1


def test_namedtuple():
    assert divide(7, 2) == (3, 1)
    assert divide(7, 2) == Pair(3, 1)
    assert divide(7, 2).remainder == 1
    assert list(divide(9, 4)) == [2, 1]


def test_fraction_and_decimal():
    assert ratio(1, 3) == Fraction(1, 3)
    assert ratio(1, 2) == 0.5
    assert abs(ratio(1, 3) - Fraction(1, 3)) < 1e-9
    assert total(["1.10", "2.20"]) == Decimal("3.30")
    assert math.isclose(float(total(["0.1", "0.2"])), 0.3)


def test_bool_where_one_is_expected():
    assert has_x("xyz") == 1
    assert has_x("abc") == 0
    assert has_x("x") + has_x("xx") == 2
    assert has_x("x") and not has_x("y")


def test_domain_objects():
    assert add(Money(1), Money(2)) == Money(3)
    assert Money(2) * 2 == Money(4)
    assert Money(1) < add(Money(1), Money(1))
    assert add(Money(1), Money(2)) in [Money(3), Money(4)]
    assert add(Money(0), Money(0)) != Money(1)
    assert [add(Money(1), Money(1))] == [Money(2)]


def test_domain_objects_equal_to_plain_values():
    assert Cents(5) == 5 and 5 == Cents(5)
    assert Cents(5) != 6 and not (Cents(5) == 6)
    assert Version("1.2") == "1.2" and "1.2.0" != Version("1.2")
    unittest.TestCase().assertEqual(Cents(3), 3)
    unittest.TestCase().assertNotEqual(Version("2.0"), "2.1")


def test_domain_objects_equal_to_plain_containers():
    assert [Cents(1), Cents(2)] == [1, 2] and (Cents(1), Cents(2)) != (1, 3)
    assert {"latest": Version("1.10")} == {"latest": "1.10"}
    assert Version("1.2") != ["1.2"]
    unittest.TestCase().assertListEqual([Cents(3)], [3])
    unittest.TestCase().assertDictEqual({"a": Cents(0)}, {"a": 0})


def test_enums_and_subclasses():
    assert colour("r") == Colour.RED
    assert colour("r") is Colour.RED
    assert level(1) == 1
    assert name("ada") == "ada"
    assert name("ada").shout() == "ADA!"
    assert counts("aab") == {"a": 2, "b": 1}
    assert ordered([("a", 1)]) == {"a": 1}
    assert 3 not in [1, 2] and "a" in counts("abc")


def test_the_solutions_own_introspection():
    assert "ZeroDivisionError" in describe_error() and "def midpoint" in describe_error()
'''

NUMPY_TESTS = '''import numpy

from solution import scale


def test_numpy():
    assert (scale([1, 2], 2) == numpy.array([2, 4])).all()
    assert scale([1, 2], 2).tolist() == [2, 4]
    assert scale([1.5], 2)[0] == 3.0
    assert abs(scale([0.1], 3)[0] - 0.3) < 1e-9
    assert numpy.allclose(scale([1, 2], 0.5), [0.5, 1.0])
    numpy.testing.assert_array_equal(scale([3], 2), [6])
'''


def test_honest_values_of_every_kind_still_resolve(tmp_path: Path):
    from opencomposer.tasks.format import write_task

    hidden = {"tests/test_values.py": LEGIT_TESTS}
    names = ["test_dataclass", "test_namedtuple", "test_fraction_and_decimal", "test_bool_where_one_is_expected",
             "test_domain_objects", "test_domain_objects_equal_to_plain_values",
             "test_domain_objects_equal_to_plain_containers", "test_enums_and_subclasses", "test_the_solutions_own_introspection"]
    tests = [f"tests/test_values.py::{name}" for name in names]
    if importlib.util.find_spec("numpy") is not None:  # the sandbox runs this interpreter's environment
        hidden["tests/test_numpy.py"] = NUMPY_TESTS
        tests.append("tests/test_numpy.py::test_numpy")
    stub_source = "def midpoint(a, b):\n    raise NotImplementedError\n"
    task = write_task(tmp_path / "values", task_id="honest-values", instruction="Values of every kind.",
                      repo={"solution.py": stub_source}, hidden_tests=hidden, fail_to_pass=tests, pass_to_pass=[],
                      test_command="python -m pytest -q tests", protected_paths=["tests"],
                      gold_patch=file_diff("solution.py", stub_source, LEGIT_SOLUTION))
    reward = graded(task, task.gold_patch)
    assert (reward.resolved, reward.tampered, reward.tests_passed) == (True, False, len(tests))
