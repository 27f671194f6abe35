from decimal import Decimal

import inventory
import pytest
from inventory import AmountOff, OrderService, TaxTable


def make_service(catalog, warehouse, **shipping_options):
    table = inventory.ShippingTable(
        rates={"CA": Decimal("6.95"), "NY": Decimal("8.50"), "OR": Decimal("5.00")},
        **shipping_options,
    )
    return OrderService(
        catalog,
        warehouse,
        TaxTable.default(),
        coupons={"TENOFF": AmountOff(Decimal("10.00"))},
        shipping=table,
    )


def test_flat_rate_is_added_to_the_total(catalog, warehouse):
    service = make_service(catalog, warehouse)
    order = service.create_order("o-1", "OR")
    service.add_line(order, "BAG-1", 2)
    quote = service.quote(order)
    assert quote.shipping == Decimal("5.00")
    assert quote.tax == Decimal("0.00")
    assert quote.total == Decimal("21.50")


def test_shipping_is_free_over_the_threshold(catalog, warehouse):
    service = make_service(catalog, warehouse, free_over=Decimal("50.00"))
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 1)
    service.add_line(order, "BAG-1", 2)
    assert service.quote(order).shipping == Decimal("0")


def test_threshold_applies_to_the_discounted_subtotal(catalog, warehouse):
    service = make_service(catalog, warehouse, free_over=Decimal("50.00"))
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 1)
    service.add_line(order, "BAG-1", 2)
    service.apply_coupon(order, "TENOFF")
    quote = service.quote(order)
    assert quote.subtotal - quote.discount == Decimal("46.49")
    assert quote.shipping == Decimal("6.95")


def test_shipping_is_taxed_only_in_taxable_regions(catalog, warehouse):
    service = make_service(catalog, warehouse, taxable_regions=frozenset({"NY"}))
    order = service.create_order("o-1", "NY")
    service.add_line(order, "BAG-1", 2)
    quote = service.quote(order)
    assert quote.shipping == Decimal("8.50")
    # 4% of 16.50 goods + 4% of 8.50 shipping
    assert quote.tax == Decimal("0.66") + Decimal("0.34")
    assert quote.total == Decimal("26.00")

    order = service.create_order("o-2", "CA")
    service.add_line(order, "BAG-1", 2)
    quote = service.quote(order)
    assert quote.tax == Decimal("1.20")
    assert quote.total == Decimal("16.50") + Decimal("6.95") + Decimal("1.20")


def test_placing_returns_a_quote_with_shipping(catalog, warehouse):
    service = make_service(catalog, warehouse)
    order = service.create_order("o-1", "CA")
    service.add_line(order, "TEA-1", 1)
    assert service.place(order).shipping == Decimal("6.95")


def test_without_a_table_shipping_is_zero(service):
    order = service.create_order("o-1", "CA")
    service.add_line(order, "BAG-1", 1)
    quote = service.quote(order)
    assert quote.shipping == 0
    assert quote.total == Decimal("8.25") + quote.tax


def test_unknown_shipping_region_is_an_error(catalog, warehouse):
    service = make_service(catalog, warehouse)
    with pytest.raises(ValueError, match="'TX'"):
        service.create_order("o-1", "TX")


def test_negative_rates_are_rejected():
    with pytest.raises(ValueError, match="negative"):
        inventory.ShippingTable(rates={"CA": Decimal("-1")})
