from decimal import Decimal

from inventory import AmountOff, OrderService, PercentOff, TaxTable
from inventory.pricing import PricedLine, price_lines


def test_amount_off_is_spread_over_what_is_left_of_each_line():
    lines = [
        PricedLine("MUG-1", "kitchen", 2, Decimal("12.00")),
        PricedLine("TEA-1", "food", 3, Decimal("4.50")),
    ]
    result = price_lines(lines, [PercentOff(Decimal(50), category="kitchen"), AmountOff(Decimal("6.00"))])
    # nets before the coupon: 12.00 and 13.50 -> shares of 6.00 in proportion 12 : 13.5
    assert [line.discount for line in result.lines] == [Decimal("14.82"), Decimal("3.18")]
    assert result.discount == Decimal("18.00")


def test_tax_follows_discounts_through_a_whole_quote(catalog, warehouse):
    service = OrderService(
        catalog,
        warehouse,
        TaxTable.default(),
        rules=[PercentOff(Decimal(20), category="kitchen", label="kitchen sale")],
        coupons={"HALF": PercentOff(Decimal(50), label="half off")},
    )
    order = service.create_order("o-1", "TX")
    service.add_line(order, "KET-1", 1)
    service.apply_coupon(order, "HALF")
    quote = service.quote(order)
    assert [a.label for a in quote.adjustments] == ["kitchen sale", "half off"]
    # 39.99 - 8.00 = 31.99, then half of it: 16.00 off -> net 15.99, taxed at 6.25%
    assert quote.discount == Decimal("24.00")
    assert quote.tax == Decimal("1.00")
    assert quote.total == Decimal("16.99")
