from decimal import Decimal

import pytest

from inventory.pricing import AmountOff, BuyXGetY, PercentOff, PricedLine, price_lines


def lines():
    return [
        PricedLine("MUG-1", "kitchen", 2, Decimal("12.00")),
        PricedLine("TEA-1", "food", 3, Decimal("4.50")),
    ]


def test_percent_off_all_lines():
    result = price_lines(lines(), [PercentOff(Decimal(10))])
    assert result.subtotal == Decimal("37.50")
    assert result.discount == Decimal("3.75")
    assert [a.sku for a in result.adjustments] == ["MUG-1", "TEA-1"]


def test_percent_off_one_category():
    result = price_lines(lines(), [PercentOff(Decimal(25), category="food")])
    assert result.discount == Decimal("3.38")
    assert result.lines[0].discount == Decimal("0.00")


def test_percent_rules_compound():
    result = price_lines(lines(), [PercentOff(Decimal(10)), PercentOff(Decimal(10))])
    # 10% of 24.00 = 2.40, then 10% of 21.60 = 2.16; 10% of 13.50 = 1.35, then 1.215 -> 1.22
    assert result.lines[0].discount == Decimal("4.56")
    assert result.lines[1].discount == Decimal("2.57")


def test_percent_off_validates_range():
    with pytest.raises(ValueError):
        PercentOff(Decimal(0))
    with pytest.raises(ValueError):
        PercentOff(Decimal(101))


def test_amount_off_is_allocated_across_lines():
    result = price_lines(lines(), [AmountOff(Decimal("5.00"), min_subtotal=Decimal("30"))])
    assert result.discount == Decimal("5.00")
    assert [line.discount for line in result.lines] == [Decimal("3.20"), Decimal("1.80")]
    assert len(result.adjustments) == 1 and result.adjustments[0].sku is None


def test_amount_off_needs_minimum_subtotal():
    result = price_lines(lines(), [AmountOff(Decimal("5.00"), min_subtotal=Decimal("40"))])
    assert result.discount == Decimal("0")
    assert result.adjustments == []


def test_amount_off_never_goes_below_zero():
    result = price_lines(lines(), [AmountOff(Decimal("100"))])
    assert result.discount == result.subtotal
    assert all(line.net == 0 for line in result.lines)


def test_buy_x_get_y_counts_complete_groups():
    line = PricedLine("TEA-1", "food", 5, Decimal("4.50"))
    result = price_lines([line], [BuyXGetY("TEA-1", buy=2, free=1)])
    assert result.discount == Decimal("4.50")
    line = PricedLine("TEA-1", "food", 6, Decimal("4.50"))
    result = price_lines([line], [BuyXGetY("TEA-1", buy=2, free=1)])
    assert result.discount == Decimal("9.00")


def test_buy_x_get_y_ignores_other_skus():
    result = price_lines(lines(), [BuyXGetY("KET-1", buy=1)])
    assert result.discount == 0
    with pytest.raises(ValueError):
        BuyXGetY("KET-1", buy=0)


def test_rules_apply_in_order():
    first = price_lines(lines(), [AmountOff(Decimal("10.00")), PercentOff(Decimal(50))])
    second = price_lines(lines(), [PercentOff(Decimal(50)), AmountOff(Decimal("10.00"))])
    assert first.discount == Decimal("23.75")
    assert second.discount == Decimal("28.75")
