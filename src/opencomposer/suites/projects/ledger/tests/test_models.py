from datetime import date
from decimal import Decimal

import pytest

from ledger.models import Entry, LedgerError, parse_amount, parse_category, parse_date, parse_tags


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.5", "12.50"), ("-3", "-3.00"), ("1,200.00", "1200.00"), (" 7.25 ", "7.25")],
    ids=["decimal", "negative-int", "thousands", "padded"],
)
def test_parse_amount(text, expected):
    assert parse_amount(text) == Decimal(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [("abc", "not an amount"), ("0", "zero"), ("1.005", "two decimal"), ("nan", "not an amount")],
    ids=["word", "zero", "three-places", "nan"],
)
def test_parse_amount_rejects(text, message):
    with pytest.raises(LedgerError, match=message):
        parse_amount(text)


def test_parse_date():
    today = date(2024, 3, 1)
    assert parse_date("today", today=today) == today
    assert parse_date("Yesterday", today=today) == date(2024, 2, 29)
    assert parse_date("2023-12-31", today=today) == date(2023, 12, 31)
    with pytest.raises(LedgerError, match="YYYY-MM-DD"):
        parse_date("31/12/2023", today=today)


def test_parse_category():
    assert parse_category(" Food/Groceries ") == "food/groceries"
    for bad in ["", "food//x", "/food", "2food", "food bar"]:
        with pytest.raises(LedgerError, match="bad category"):
            parse_category(bad)


def test_parse_tags():
    assert parse_tags(" Home, treat,,") == frozenset({"home", "treat"})
    assert parse_tags("") == frozenset()


def test_entry_round_trips_through_dict():
    entry = Entry(3, date(2024, 2, 3), Decimal("-54.20"), "food/groceries", "shop", frozenset({"b", "a"}))
    data = entry.to_dict()
    assert data["amount"] == "-54.20" and data["tags"] == ["a", "b"]
    assert Entry.from_dict(data) == entry
    assert entry.is_expense and entry.top_category == "food"


def test_entry_from_dict_checks_tags():
    with pytest.raises(LedgerError, match="tags must be a list"):
        Entry.from_dict({"id": 1, "date": "2024-01-01", "amount": "1", "category": "x", "tags": "a"})
