from decimal import Decimal

import pytest
from inventory import AmountOff, OrderService, OrderStateError, PercentOff, Product, TaxTable


@pytest.fixture
def shop(catalog, warehouse):
    return OrderService(catalog, warehouse, TaxTable.default(), coupons={"FIVE": AmountOff(Decimal("5.00"))})


def fulfilled(shop, *lines, region="CA", coupon=None):
    order = shop.create_order("o-1", region)
    for sku, quantity in lines:
        shop.add_line(order, sku, quantity)
    if coupon:
        shop.apply_coupon(order, coupon)
    shop.place(order)
    shop.fulfil(order)
    return order


def test_full_return_refunds_what_was_paid_and_restocks(shop, warehouse):
    order = fulfilled(shop, ("KET-1", 1))
    assert warehouse.on_hand("KET-1") == 2
    refund = shop.return_items(order, "KET-1", 1)
    assert refund == Decimal("39.99") + Decimal("2.90")
    assert warehouse.on_hand("KET-1") == 3
    assert order.returned == {"KET-1": 1}
    assert order.refunded_total == refund


def test_refund_uses_prices_at_placement(shop, catalog):
    order = fulfilled(shop, ("BAG-1", 2))
    catalog.replace(Product("BAG-1", "Tote bag", Decimal("20.00")))
    assert shop.return_items(order, "BAG-1", 2) == Decimal("16.50") + Decimal("1.20")


def test_refund_is_after_discounts(shop):
    order = fulfilled(shop, ("BAG-1", 2), ("KET-1", 1), coupon="FIVE")
    # FIVE is spread 16.50 : 39.99 -> 1.46 off the bags, tax 7.25% on 15.04 -> 1.09
    assert shop.return_items(order, "BAG-1", 2) == Decimal("16.13")


def test_partial_returns_add_up_exactly(shop):
    order = fulfilled(shop, ("TEA-1", 3), ("MUG-1", 3), region="NY")
    # mugs: 3 x 12.00 = 36.00 + 4% tax 1.44 = 37.44
    first = shop.return_items(order, "MUG-1", 1)
    second = shop.return_items(order, "MUG-1", 1)
    third = shop.return_items(order, "MUG-1", 1)
    assert (first, second) == (Decimal("12.48"), Decimal("12.48"))
    assert first + second + third == Decimal("37.44")
    with pytest.raises(ValueError, match="0 of 3 left"):
        shop.return_items(order, "MUG-1", 1)


def test_rounding_remainder_goes_to_the_last_unit(catalog, warehouse):
    service = OrderService(catalog, warehouse, TaxTable.default(), rules=[PercentOff(Decimal(10))])
    order = service.create_order("o-1", "OR")
    service.add_line(order, "TEA-1", 3)
    service.place(order)
    service.fulfil(order)
    # 13.50 - 1.35 = 12.15 paid for three: 4.05 each
    refunds = [service.return_items(order, "TEA-1", 1) for _ in range(3)]
    assert sum(refunds) == Decimal("12.15")


def test_returns_need_a_fulfilled_order(shop):
    order = shop.create_order("o-1", "CA")
    shop.add_line(order, "BAG-1", 1)
    with pytest.raises(OrderStateError):
        shop.return_items(order, "BAG-1", 1)
    shop.place(order)
    with pytest.raises(OrderStateError):
        shop.return_items(order, "BAG-1", 1)


def test_invalid_returns(shop):
    order = fulfilled(shop, ("BAG-1", 2))
    with pytest.raises(ValueError, match="no line"):
        shop.return_items(order, "KET-1", 1)
    with pytest.raises(ValueError):
        shop.return_items(order, "BAG-1", 3)
    with pytest.raises(ValueError):
        shop.return_items(order, "BAG-1", 0)
    assert order.returned == {}
