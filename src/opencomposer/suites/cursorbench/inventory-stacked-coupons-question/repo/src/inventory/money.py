"""Money arithmetic on :class:`decimal.Decimal`.

Amounts are kept at full precision while they are being computed and rounded to cents
only where a number becomes visible to a customer: a line total, a tax amount, an order
total. Rounding is half-up, the convention of most sales-tax authorities.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
ZERO = Decimal("0.00")


def to_money(value: Decimal | int | str) -> Decimal:
    """Round ``value`` to whole cents, half-up.

    Floats are refused: ``Decimal(0.1)`` silently carries binary noise into prices.
    """
    if isinstance(value, float):
        raise TypeError(f"money amounts must not be floats, got {value!r}")
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


def percent_of(amount: Decimal, percent: Decimal | int | str) -> Decimal:
    """Return ``percent`` percent of ``amount``, unrounded."""
    return amount * Decimal(percent) / Decimal(100)


def allocate(total: Decimal, weights: Sequence[Decimal]) -> list[Decimal]:
    """Split ``total`` (in cents) across ``weights`` so the parts add up exactly.

    Each part is proportional to its weight, rounded down to a cent; the cents left over
    go one at a time to the parts with the largest remainders (ties go to the earlier
    part). Used to spread an order-level discount across lines before tax.

    >>> allocate(Decimal("10.00"), [Decimal(1), Decimal(1), Decimal(1)])
    [Decimal('3.34'), Decimal('3.33'), Decimal('3.33')]
    """
    total = to_money(total)
    weight_sum = sum(weights, Decimal(0))
    if not weights:
        return []
    if weight_sum == 0:
        return [ZERO for _ in weights]
    cents = int(total / CENT)
    exact = [Decimal(cents) * w / weight_sum for w in weights]
    floors = [int(e) for e in exact]
    leftover = cents - sum(floors)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in by_remainder[:leftover]:
        floors[i] += 1
    return [Decimal(c) * CENT for c in floors]


def format_money(amount: Decimal, currency: str = "USD") -> str:
    """Format an amount for display: ``$1,234.50``; negative amounts as ``-$3.00``."""
    symbols = {"USD": "$", "EUR": "€", "GBP": "£"}
    symbol = symbols.get(currency)
    rounded = to_money(amount)
    sign = "-" if rounded < 0 else ""
    digits = f"{abs(rounded):,.2f}"
    if symbol is None:
        return f"{sign}{digits} {currency}"
    return f"{sign}{symbol}{digits}"
