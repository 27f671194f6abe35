from decimal import Decimal

from ledger import reports
from ledger.formatting import format_amount, table


def test_balance(entries):
    assert reports.balance(entries) == Decimal("2463.30")
    assert reports.balance([]) == Decimal("0.00")


def test_by_category_orders_biggest_expense_first(entries):
    assert reports.by_category(entries) == [
        ("rent", Decimal("-2400.00")),
        ("food/restaurants", Decimal("-78.00")),
        ("food/groceries", Decimal("-54.20")),
        ("food/coffee", Decimal("-4.50")),
        ("salary", Decimal("5000.00")),
    ]


def test_by_category_folds_to_depth(entries):
    assert dict(reports.by_category(entries, depth=1))["food"] == Decimal("-136.70")


def test_monthly(entries):
    months = reports.monthly(entries)
    assert [m.month for m in months] == ["2024-01", "2024-02", "2024-03"]
    february = months[1]
    assert february.income == Decimal("2500.00")
    assert february.expenses == Decimal("-1332.20")
    assert february.net == Decimal("1167.80")
    assert months[2].income == Decimal("0.00")


def test_largest_expenses(entries):
    assert [e.id for e in reports.largest_expenses(entries, 3)] == [2, 7, 4]


def test_format_amount():
    assert format_amount(Decimal("1234.5")) == "1,234.50"
    assert format_amount(Decimal("-4.5")) == "-4.50"


def test_table_alignment():
    text = table(["name", "n"], [("a", 1), ("bbb", 22)], align="lr")
    assert text.splitlines() == ["name   n", "a      1", "bbb   22"]


def test_table_validates_shape():
    import pytest

    with pytest.raises(ValueError, match="align"):
        table(["a"], [], align="lr")
    with pytest.raises(ValueError, match="row 1"):
        table(["a", "b"], [("x",)])
