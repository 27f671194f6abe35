from datetime import timedelta
from decimal import Decimal

import inventory
import pytest
from inventory import AmountOff, InsufficientStock, InvalidCoupon, OrderService, PercentOff, TaxTable


@pytest.fixture
def shop(catalog, warehouse, clock):
    return OrderService(
        catalog,
        warehouse,
        TaxTable.default(),
        coupons={
            "LAUNCH": inventory.Coupon("LAUNCH", PercentOff(Decimal(20)), max_uses=2),
            "SPRING": inventory.Coupon(
                "SPRING", AmountOff(Decimal("5")), expires_at=clock.now + timedelta(days=1)
            ),
            "PLAIN": PercentOff(Decimal(5)),
        },
    )


def order_with(shop, order_id, code, sku="BAG-1"):
    order = shop.create_order(order_id, "OR")
    shop.add_line(order, sku, 1)
    shop.apply_coupon(order, code)
    return order


def test_limited_coupon_discounts_like_a_rule(shop):
    order = order_with(shop, "o-1", "launch")
    assert order.coupons == ["LAUNCH"]
    assert shop.quote(order).discount == Decimal("1.65")


def test_uses_are_counted_when_orders_are_placed(shop):
    first = order_with(shop, "o-1", "LAUNCH")
    second = order_with(shop, "o-2", "LAUNCH")
    third = order_with(shop, "o-3", "LAUNCH")  # applying does not use the coupon up
    shop.place(first)
    shop.place(second)
    with pytest.raises(InvalidCoupon, match="LAUNCH"):
        shop.place(third)
    assert third.status.value == "draft"
    assert third.reservation_ids == []
    with pytest.raises(InvalidCoupon):
        order_with(shop, "o-4", "LAUNCH")


def test_cancelling_a_placed_order_gives_the_use_back(shop):
    first = order_with(shop, "o-1", "LAUNCH")
    second = order_with(shop, "o-2", "LAUNCH")
    shop.place(first)
    shop.place(second)
    shop.cancel(first)
    shop.place(order_with(shop, "o-3", "LAUNCH"))


def test_cancelling_a_draft_gives_nothing_back(shop):
    shop.place(order_with(shop, "o-1", "LAUNCH"))
    draft = order_with(shop, "o-2", "LAUNCH")
    shop.cancel(draft)
    shop.place(order_with(shop, "o-3", "LAUNCH"))
    with pytest.raises(InvalidCoupon):
        order_with(shop, "o-4", "LAUNCH")


def test_failed_placement_does_not_use_the_coupon(shop):
    short = shop.create_order("o-1", "OR")
    shop.add_line(short, "KET-1", 4)
    shop.apply_coupon(short, "LAUNCH")
    with pytest.raises(InsufficientStock):
        shop.place(short)
    shop.place(order_with(shop, "o-2", "LAUNCH"))
    shop.place(order_with(shop, "o-3", "LAUNCH"))


def test_expired_coupons_are_rejected(shop, clock):
    order = order_with(shop, "o-1", "SPRING")
    clock.advance(days=1)
    with pytest.raises(InvalidCoupon, match="expired"):
        shop.place(order)
    with pytest.raises(InvalidCoupon, match="expired"):
        order_with(shop, "o-2", "spring")


def test_plain_rules_still_work_without_limits(shop):
    for n in range(5):
        shop.place(order_with(shop, f"o-{n}", "PLAIN"))
    with pytest.raises(InvalidCoupon, match="unknown"):
        order_with(shop, "o-9", "NOPE")


def test_max_uses_must_be_positive():
    with pytest.raises(ValueError):
        inventory.Coupon("X", PercentOff(Decimal(1)), max_uses=0)
