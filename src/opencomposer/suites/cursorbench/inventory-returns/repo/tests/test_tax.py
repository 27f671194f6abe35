from decimal import Decimal

import pytest

from inventory.pricing import PricedLine
from inventory.tax import TaxTable


def test_rate_for_region_and_category_override():
    table = TaxTable.default()
    assert table.rate_for("CA", "kitchen") == Decimal("7.25")
    assert table.rate_for("CA", "food") == Decimal("0")
    assert table.rate_for("OR", "kitchen") == Decimal("0")


def test_unknown_region_names_known_ones():
    with pytest.raises(ValueError, match="'ZZ'.*CA, NY, OR, TX"):
        TaxTable.default().rate_for("ZZ", "general")


def test_tax_is_rounded_per_line():
    table = TaxTable({"XX": Decimal("7.25")})
    lines = [PricedLine(sku, "general", 1, Decimal("0.10")) for sku in "ABC"]
    # 0.00725 rounds up to a cent on each line; on the summed 0.30 it would be 0.02
    assert table.tax_for(lines, "XX") == Decimal("0.03")


def test_tax_is_computed_on_the_discounted_amount():
    table = TaxTable({"XX": Decimal("10")})
    line = PricedLine("A", "general", 2, Decimal("5.00"), discount=Decimal("2.50"))
    assert table.line_tax(line, "XX") == Decimal("0.75")


def test_negative_rates_are_rejected():
    with pytest.raises(ValueError, match="negative"):
        TaxTable({"XX": Decimal("-1")})


def test_regions_are_sorted():
    assert TaxTable.default().regions == ["CA", "NY", "OR", "TX"]
