"""Discount rules and the pricing of order lines.

Rules are applied one after another, each to what the previous rules left: two 10%
rules take 19% off, not 20%. Every rule reports what it took off as
:class:`Adjustment` records so a quote can show the customer where the money went.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from .money import ZERO, allocate, percent_of, to_money


@dataclass
class PricedLine:
    """One order line while it is being priced. ``discount`` accumulates across rules."""

    sku: str
    category: str
    quantity: int
    unit_price: Decimal
    discount: Decimal = ZERO

    @property
    def gross(self) -> Decimal:
        return to_money(self.unit_price * self.quantity)

    @property
    def net(self) -> Decimal:
        return self.gross - self.discount


@dataclass(frozen=True)
class Adjustment:
    """An amount taken off by a rule; ``sku`` is None for order-level discounts."""

    label: str
    amount: Decimal
    sku: str | None = None


class Rule(Protocol):
    """A discount rule. ``apply`` updates ``line.discount`` and reports what it did."""

    label: str

    def apply(self, lines: Sequence[PricedLine]) -> list[Adjustment]: ...


@dataclass(frozen=True)
class PercentOff:
    """Take ``percent`` off every line, or only off lines of ``category``."""

    percent: Decimal
    category: str | None = None
    label: str = "percent off"

    def __post_init__(self) -> None:
        if not 0 < self.percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {self.percent}")

    def apply(self, lines: Sequence[PricedLine]) -> list[Adjustment]:
        adjustments = []
        for line in lines:
            if self.category is not None and line.category != self.category:
                continue
            amount = to_money(percent_of(line.net, self.percent))
            if amount:
                line.discount += amount
                adjustments.append(Adjustment(self.label, amount, line.sku))
        return adjustments


@dataclass(frozen=True)
class AmountOff:
    """Take a fixed amount off the order once its net total reaches ``min_subtotal``.

    The amount is spread across lines in proportion to their net amounts so tax can be
    computed per line; it never takes an order below zero.
    """

    amount: Decimal
    min_subtotal: Decimal = ZERO
    label: str = "amount off"

    def __post_init__(self) -> None:
        if self.amount <= 0:
            raise ValueError(f"amount must be positive, got {self.amount}")

    def apply(self, lines: Sequence[PricedLine]) -> list[Adjustment]:
        net_total = sum((line.net for line in lines), ZERO)
        if not lines or net_total < self.min_subtotal:
            return []
        amount = min(to_money(self.amount), net_total)
        shares = allocate(amount, [line.net for line in lines])
        for line, share in zip(lines, shares, strict=True):
            line.discount += share
        return [Adjustment(self.label, amount)]


@dataclass(frozen=True)
class BuyXGetY:
    """For every ``buy`` units of ``sku`` bought, ``free`` more are free.

    Only complete groups count: with buy=2, free=1, five units give one free unit.
    """

    sku: str
    buy: int
    free: int = 1
    label: str = "multi-buy"

    def __post_init__(self) -> None:
        if self.buy < 1 or self.free < 1:
            raise ValueError(f"buy and free must be at least 1, got buy={self.buy} free={self.free}")

    def apply(self, lines: Sequence[PricedLine]) -> list[Adjustment]:
        adjustments = []
        for line in lines:
            if line.sku != self.sku:
                continue
            free_units = (line.quantity // (self.buy + self.free)) * self.free
            amount = min(to_money(line.unit_price * free_units), line.net)
            if amount:
                line.discount += amount
                adjustments.append(Adjustment(self.label, amount, line.sku))
        return adjustments


@dataclass
class PricingResult:
    """Lines after every rule ran, with the adjustments in the order they were made."""

    lines: list[PricedLine]
    adjustments: list[Adjustment] = field(default_factory=list)

    @property
    def subtotal(self) -> Decimal:
        return sum((line.gross for line in self.lines), ZERO)

    @property
    def discount(self) -> Decimal:
        return sum((line.discount for line in self.lines), ZERO)


def price_lines(lines: Iterable[PricedLine], rules: Iterable[Rule]) -> PricingResult:
    """Apply ``rules`` in order to ``lines`` and collect their adjustments."""
    result = PricingResult(list(lines))
    for rule in rules:
        result.adjustments.extend(rule.apply(result.lines))
    return result
