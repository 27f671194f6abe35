from datetime import date

import pytest
from ledger.models import LedgerError
from ledger.query import Filter, Period, parse_period, select


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("2024", "2024-01-01", "2024-12-31"),
        ("2024-02", "2024-02-01", "2024-02-29"),
        ("2023-02", "2023-02-01", "2023-02-28"),
        ("2024-Q1", "2024-01-01", "2024-03-31"),
        ("2024-q4", "2024-10-01", "2024-12-31"),
        ("2024-03-01..2024-03-15", "2024-03-01", "2024-03-15"),
    ],
)
def test_parse_period(text, start, end):
    assert parse_period(text) == Period(date.fromisoformat(start), date.fromisoformat(end))


@pytest.mark.parametrize("text", ["24", "2024-13", "2024-Q5", "2024-03-15..2024-03-01", "x..y"])
def test_parse_period_rejects(text):
    with pytest.raises(LedgerError):
        parse_period(text)


def test_period_is_inclusive():
    period = parse_period("2024-02")
    assert date(2024, 2, 1) in period and date(2024, 2, 29) in period
    assert date(2024, 3, 1) not in period


def test_filter_by_period(entries):
    assert [e.id for e in select(entries, Filter(period=parse_period("2024-02")))] == [2, 3, 4, 5]


def test_filter_by_category_includes_subcategories(entries):
    assert [e.id for e in select(entries, Filter(category="food"))] == [3, 4, 6]
    assert [e.id for e in select(entries, Filter(category="food/coffee"))] == [6]
    assert select(entries, Filter(category="foo")) == []


def test_filter_by_text_and_tag(entries):
    assert [e.id for e in select(entries, Filter(text="FLAT"))] == [6]
    assert [e.id for e in select(entries, Filter(tag="Treat"))] == [4, 6]


def test_filters_combine(entries):
    criteria = Filter(period=parse_period("2024-Q1"), category="food", tag="treat")
    assert [e.id for e in select(entries, criteria)] == [4, 6]
