from decimal import Decimal

import pytest

from inventory import (
    AmountOff,
    InsufficientStock,
    InvalidCoupon,
    OrderService,
    OrderStateError,
    OrderStatus,
    PercentOff,
    ReservationError,
    TaxTable,
    UnknownProduct,
)


def test_add_line_merges_same_sku(service):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "TEA-1", 2)
    service.add_line(order, "TEA-1", 1)
    assert [(line.sku, line.quantity) for line in order.lines] == [("TEA-1", 3)]


def test_add_line_validates(service):
    order = service.create_order("o-1", "CA")
    with pytest.raises(UnknownProduct):
        service.add_line(order, "NOPE", 1)
    with pytest.raises(ValueError):
        service.add_line(order, "TEA-1", 0)


def test_unknown_region_fails_at_creation(service):
    with pytest.raises(ValueError, match="region"):
        service.create_order("o-1", "ZZ")


def test_quote_applies_breaks_and_tax(service):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "MUG-1", 6)
    service.add_line(order, "TEA-1", 2)
    quote = service.quote(order)
    assert quote.subtotal == Decimal("69.00")
    assert quote.discount == Decimal("0")
    assert quote.tax == Decimal("4.35")  # mugs only: 7.25% of 60.00; tea is food
    assert quote.total == Decimal("73.35")


def test_quote_with_rules_and_coupons(catalog, warehouse):
    service = OrderService(
        catalog,
        warehouse,
        TaxTable.default(),
        rules=[PercentOff(Decimal(10), category="kitchen", label="kitchen sale")],
        coupons={"FIVE": AmountOff(Decimal("5.00"), label="coupon FIVE")},
    )
    order = service.create_order("o-1", "NY")
    service.add_line(order, "KET-1", 1)
    service.add_line(order, "BAG-1", 2)
    service.apply_coupon(order, " five ")
    quote = service.quote(order)
    assert [a.label for a in quote.adjustments] == ["kitchen sale", "coupon FIVE"]
    assert quote.subtotal == Decimal("56.49")
    assert quote.discount == Decimal("9.00")
    assert quote.tax == Decimal("1.90")
    assert quote.total == Decimal("49.39")


def test_coupons_are_validated(catalog, warehouse):
    service = OrderService(catalog, warehouse, TaxTable.default(), coupons={"TEN": PercentOff(Decimal(10))})
    order = service.create_order("o-1", "CA")
    with pytest.raises(InvalidCoupon, match="unknown"):
        service.apply_coupon(order, "NOPE")
    service.apply_coupon(order, "ten")
    with pytest.raises(InvalidCoupon, match="already"):
        service.apply_coupon(order, "TEN")


def test_place_reserves_every_line(service, warehouse):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 2)
    service.add_line(order, "TEA-1", 5)
    quote = service.place(order)
    assert order.status is OrderStatus.PLACED
    assert quote.total == service.quote(order).total
    assert warehouse.available("KET-1") == 1
    assert warehouse.available("TEA-1") == 35
    assert len(order.reservation_ids) == 2


def test_place_is_all_or_nothing(service, warehouse):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "TEA-1", 5)
    service.add_line(order, "KET-1", 4)
    with pytest.raises(InsufficientStock):
        service.place(order)
    assert order.status is OrderStatus.DRAFT
    assert warehouse.available("TEA-1") == 40
    assert warehouse.reservations_for("o-1") == []


def test_place_requires_lines_and_draft(service):
    order = service.create_order("o-1", "CA")
    with pytest.raises(OrderStateError, match="no lines"):
        service.place(order)
    service.add_line(order, "BAG-1", 1)
    service.place(order)
    with pytest.raises(OrderStateError, match="placed"):
        service.add_line(order, "BAG-1", 1)
    with pytest.raises(OrderStateError):
        service.place(order)


def test_fulfil_commits_stock(service, warehouse):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 2)
    service.place(order)
    service.fulfil(order)
    assert order.status is OrderStatus.FULFILLED
    assert warehouse.on_hand("KET-1") == 1
    with pytest.raises(OrderStateError):
        service.cancel(order)


def test_fulfil_commits_nothing_if_a_reservation_expired(service, warehouse, clock):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 1)
    service.add_line(order, "TEA-1", 2)
    service.place(order)  # R00001 (kettle) and R00002 (tea) expire after 15 minutes
    clock.advance(minutes=10)
    warehouse.release("R00001")  # the kettle is re-reserved, so its hold is fresher
    order.reservation_ids[0] = warehouse.reserve("KET-1", 1, "o-1").id
    clock.advance(minutes=6)
    with pytest.raises(ReservationError, match="R00002"):
        service.fulfil(order)
    assert order.status is OrderStatus.PLACED
    assert warehouse.on_hand("KET-1") == 3  # the live kettle reservation was not committed


def test_cancel_releases_stock(service, warehouse):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 3)
    service.place(order)
    service.cancel(order)
    assert order.status is OrderStatus.CANCELLED
    assert warehouse.available("KET-1") == 3
    with pytest.raises(OrderStateError):
        service.fulfil(order)


def test_remove_line(service):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 1)
    service.remove_line(order, "KET-1")
    assert order.lines == []
    with pytest.raises(KeyError):
        service.remove_line(order, "KET-1")
