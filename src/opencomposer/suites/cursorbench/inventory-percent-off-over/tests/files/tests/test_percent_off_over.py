from decimal import Decimal

import inventory
import pytest
from inventory import AmountOff, OrderService, TaxTable
from inventory.pricing import PricedLine, price_lines


def lines():
    return [
        PricedLine("MUG-1", "kitchen", 2, Decimal("12.00")),
        PricedLine("TEA-1", "food", 3, Decimal("4.50")),
    ]


def test_below_threshold_nothing_happens():
    rule = inventory.PercentOffOver(Decimal(10), threshold=Decimal("40.00"))
    result = price_lines(lines(), [rule])
    assert result.discount == 0
    assert result.adjustments == []


def test_at_threshold_every_line_is_discounted():
    rule = inventory.PercentOffOver(Decimal(10), threshold=Decimal("37.50"), label="big order")
    result = price_lines(lines(), [rule])
    assert [line.discount for line in result.lines] == [Decimal("2.40"), Decimal("1.35")]
    assert [(a.label, a.sku) for a in result.adjustments] == [("big order", "MUG-1"), ("big order", "TEA-1")]


def test_threshold_is_measured_after_earlier_rules():
    rule = inventory.PercentOffOver(Decimal(10), threshold=Decimal("35.00"))
    assert price_lines(lines(), [AmountOff(Decimal("5.00")), rule]).discount == Decimal("5.00")
    assert price_lines(lines(), [rule, AmountOff(Decimal("5.00"))]).discount == Decimal("8.75")


def test_validation():
    with pytest.raises(ValueError):
        inventory.PercentOffOver(Decimal(0), threshold=Decimal(10))
    with pytest.raises(ValueError):
        inventory.PercentOffOver(Decimal(5), threshold=Decimal(0))


def test_works_as_a_store_rule(catalog, warehouse):
    service = OrderService(
        catalog,
        warehouse,
        TaxTable.default(),
        rules=[inventory.PercentOffOver(Decimal(5), threshold=Decimal("100"))],
    )
    order = service.create_order("o-1", "OR")
    service.add_line(order, "KET-1", 3)
    quote = service.quote(order)
    assert quote.subtotal == Decimal("119.97")
    assert quote.discount == Decimal("6.00")
