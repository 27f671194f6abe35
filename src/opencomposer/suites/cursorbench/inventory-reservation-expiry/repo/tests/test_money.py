from decimal import Decimal

import pytest

from inventory.money import allocate, format_money, percent_of, to_money


def test_to_money_rounds_half_up():
    assert to_money(Decimal("2.345")) == Decimal("2.35")
    assert to_money(Decimal("2.344")) == Decimal("2.34")
    assert to_money("-1.005") == Decimal("-1.01")


def test_to_money_refuses_floats():
    with pytest.raises(TypeError, match="float"):
        to_money(0.1)


def test_percent_of_is_unrounded():
    assert percent_of(Decimal("10.00"), Decimal("7.25")) == Decimal("0.725")


def test_allocate_gives_leftover_cents_to_largest_remainders():
    assert allocate(Decimal("10.00"), [Decimal(1)] * 3) == [
        Decimal("3.34"),
        Decimal("3.33"),
        Decimal("3.33"),
    ]


def test_allocate_is_proportional_and_exact():
    parts = allocate(Decimal("5.00"), [Decimal("30.00"), Decimal("10.00"), Decimal("60.00")])
    assert parts == [Decimal("1.50"), Decimal("0.50"), Decimal("3.00")]
    parts = allocate(Decimal("1.00"), [Decimal("1"), Decimal("2")])
    assert parts == [Decimal("0.33"), Decimal("0.67")]
    assert sum(parts) == Decimal("1.00")


def test_allocate_edge_cases():
    assert allocate(Decimal("3.00"), []) == []
    assert allocate(Decimal("3.00"), [Decimal(0), Decimal(0)]) == [Decimal("0.00")] * 2


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        (Decimal("1234.5"), "USD", "$1,234.50"),
        (Decimal("-3"), "USD", "-$3.00"),
        (Decimal("0.005"), "EUR", "€0.01"),
        (Decimal("99"), "CHF", "99.00 CHF"),
    ],
    ids=["usd-thousands", "usd-negative", "eur-rounding", "unknown-currency"],
)
def test_format_money(amount, currency, expected):
    assert format_money(amount, currency) == expected
