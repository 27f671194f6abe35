"""Equality between a value of the solution's class and a plain number, string or container: the
value's own ``__eq__`` is asked among decoys (``grading.pytest_plugin.ValueChecks.honest_equality``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import opencomposer

PLUGIN = Path(opencomposer.__file__).parent / "grading" / "pytest_plugin.py"


@pytest.fixture(scope="module")
def plugin():
    spec = importlib.util.spec_from_file_location("opencomposer_plugin_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Cents:
    def __init__(self, cents):
        self.cents = cents

    def __eq__(self, other):
        return isinstance(other, int) and other == self.cents


class AnyInt:
    def __eq__(self, other):
        return isinstance(other, int)


class ParsesOther:
    def __eq__(self, other):
        return tuple(int(p) for p in other.split(".")) == (1, 2)


class Point:
    """A domain object equal to the plain pair of its coordinates."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, (tuple, list)) and tuple(other) == (self.x, self.y)


class Anything:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("plain", [0, 7, -3, 2.5, 0.0, "abc", "1.2.0", "ABC def", b"xy",
                                   [1, 2], (1, "a"), [], {"a": 1}, {1, 2}, frozenset(), [[1], (2.5, "x")]])
def test_decoys_are_near_the_value_distinct_and_never_equal_to_it(plugin, plain):
    for _ in range(50):
        decoys = plugin._decoys(plain)
        assert 16 <= len(decoys) <= 31 and all(type(d) is type(plain) and d != plain for d in decoys)
        assert all(a != b for i, a in enumerate(decoys) for b in decoys[i + 1:])  # a repeat would stand out


def test_few_near_values_give_fewer_decoys(plugin):
    assert 8 <= len(plugin._decoys("a")) <= 25  # one letter: 25 others


def test_a_containers_decoys_differ_by_one_change(plugin):
    for decoy in plugin._decoys([10, 20, 30]):
        same = sum(a == b for a, b in zip(decoy, [10, 20, 30]))
        assert (len(decoy), same) in ((3, 2), (2, 2), (2, 1), (2, 0), (4, 3), (4, 2), (4, 1), (4, 0))


def test_types_without_decoys(plugin):
    assert plugin._decoys(None) == plugin._decoys(float("nan")) == plugin._decoys(object()) == []
    assert plugin._decoys(True) == plugin._decoys(False) == []  # one other value: the odd one out shows


def test_an_honest_domain_object_is_believed_and_a_liar_is_not(plugin):
    honest = plugin.ValueChecks.honest_equality
    assert honest(Cents(5), 5) is True and honest(Cents(5), 6) is False
    assert all(honest(AnyInt(), n) is None for n in range(20))  # equal to a decoy too: the check fails
    assert honest(ParsesOther(), "1.2") is True  # decoys it cannot parse count as unequal
    with pytest.raises(AttributeError):  # the comparison itself raises as it would have
        honest(ParsesOther(), 12)


def test_equality_with_a_plain_container(plugin):
    honest = plugin.ValueChecks.honest_equality
    assert honest(Point(1, 2), (1, 2)) is True and honest(Point(1, 2), [1, 2]) is True
    assert honest(Point(1, 2), (2, 1)) is False and honest(Point(1, 2), []) is False
    assert honest([Cents(1), Cents(2)], [1, 2]) is True  # a list of the solution's values, item by item
    assert honest({"total": Cents(3)}, {"total": 3}) is True
    assert honest([Cents(1), Cents(2)], [1, 3]) is False
    for plain in ([1, 2], [], {"a": 1}, {1}, (), [[1]]):  # equal to anything: a decoy shows it
        assert honest(Anything(), plain) is None
        assert honest([Anything()], [plain]) is None
    assert honest([Cents(1), Anything()], [1, 2]) is None  # one liar among honest items


def test_the_order_of_the_questions_is_drawn(plugin):
    seen = []

    class Recorder:
        def __eq__(self, other):
            seen.append(other)
            return False

    orders = set()
    for _ in range(40):
        seen.clear()
        plugin.ValueChecks.honest_equality(Recorder(), 50)
        orders.add(seen.index(50))
    assert len(orders) > 1  # the real question is not always in the same place


def test_a_value_that_remembers_what_it_was_asked_rarely_passes(plugin):
    """The best a liar with memory can do is call equal what it was asked at some position; the
    real question is at a drawn place among 17 to 32, so that wins about one assert in twenty-four."""
    class FirstSeen:
        def __init__(self):
            self.first = None

        def __eq__(self, other):
            if self.first is None:
                self.first = other
            return other == self.first

    wins = sum(bool(plugin.ValueChecks.honest_equality(FirstSeen(), 42)) for _ in range(400))
    assert wins < 400 / 10  # expected about 400 / 24


class Repeats:
    """Calls equal a value it was asked about before: through a whole list, an item sees its
    expected value again in every decoy that changes another item."""

    def __init__(self):
        self.seen = []

    def __eq__(self, other):
        again = other in self.seen
        self.seen.append(other)
        return again

    __hash__ = None


class WholeList:
    """The control: the list asked as one value, as the check did before it went item by item."""

    def __init__(self, items):
        self.items = items

    def __eq__(self, other):
        return self.items == other


def test_an_item_that_learns_its_expected_value_from_the_other_items_decoys(plugin):
    honest = plugin.ValueChecks.honest_equality
    wins = sum(bool(honest([Repeats(), Cents(2)], ["alpha", 2])) for _ in range(100))
    assert wins <= 15  # item by item: its expected value once among its own decoys (about 100 / 24)
    control = sum(bool(honest(WholeList([Repeats(), Cents(2)]), ["alpha", 2])) for _ in range(100))
    assert control >= 60  # asked through the whole list it learns it (about 90 of 100)
    in_dicts = sum(bool(honest({"a": Repeats(), "b": Cents(2)}, {"a": "alpha", "b": 2})) for _ in range(100))
    assert in_dicts <= 15
    assert honest([Cents(1), None, "x"], [1, None, "x"]) is True and honest((Cents(1),), [1]) is False
    assert honest({"a": Cents(1)}, {"b": 1}) is False and honest([Cents(1)], [1, 2]) is False
