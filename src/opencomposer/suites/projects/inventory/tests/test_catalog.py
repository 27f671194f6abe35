from decimal import Decimal

import pytest

from inventory import Catalog, PriceBreak, Product, UnknownProduct


def test_unit_price_uses_best_applicable_break(catalog):
    mug = catalog.get("MUG-1")
    assert mug.unit_price_for(1) == Decimal("12.00")
    assert mug.unit_price_for(5) == Decimal("12.00")
    assert mug.unit_price_for(6) == Decimal("10.00")
    assert mug.unit_price_for(30) == Decimal("9.00")


def test_unit_price_for_rejects_non_positive_quantity(catalog):
    with pytest.raises(ValueError, match="positive"):
        catalog.get("TEA-1").unit_price_for(0)


def test_product_validation():
    with pytest.raises(ValueError, match="negative"):
        Product("X", "x", Decimal("-1"))
    with pytest.raises(ValueError, match="sku"):
        Product("", "x", Decimal("1"))
    with pytest.raises(ValueError, match="2 units"):
        Product("X", "x", Decimal("1"), price_breaks=(PriceBreak(1, Decimal("0.5")),))


def test_catalog_rejects_duplicates_and_unknown_skus(catalog):
    with pytest.raises(ValueError, match="duplicate"):
        catalog.add(Product("TEA-1", "Other tea", Decimal("1")))
    with pytest.raises(UnknownProduct) as info:
        catalog.get("NOPE")
    assert "NOPE" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_replace_changes_price(catalog):
    catalog.replace(Product("TEA-1", "Green tea", Decimal("5.00"), category="food"))
    assert catalog.get("TEA-1").unit_price == Decimal("5.00")
    with pytest.raises(UnknownProduct):
        Catalog().replace(Product("TEA-1", "Green tea", Decimal("5.00")))


def test_category_and_search(catalog):
    assert [p.sku for p in catalog.in_category("kitchen")] == ["KET-1", "MUG-1"]
    assert [p.sku for p in catalog.search("TEA")] == ["TEA-1"]
    assert [p.sku for p in catalog.search("bag")] == ["BAG-1"]
    assert "KET-1" in catalog and len(catalog) == 4
