"""Summaries of entries: balance, totals by category and month-by-month figures."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from .models import Entry

ZERO = Decimal("0.00")


def balance(entries: Iterable[Entry]) -> Decimal:
    """Income minus expenses."""
    return sum((entry.amount for entry in entries), ZERO)


def by_category(entries: Iterable[Entry], *, depth: int | None = None) -> list[tuple[str, Decimal]]:
    """Totals per category, largest expense first (most negative), then by name.

    ``depth=1`` folds ``food/groceries`` and ``food/restaurants`` into ``food``.
    """
    totals: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for entry in entries:
        key = entry.category if depth is None else "/".join(entry.category.split("/")[:depth])
        totals[key] += entry.amount
    return sorted(totals.items(), key=lambda item: (item[1], item[0]))


@dataclass(frozen=True)
class MonthSummary:
    month: str  # YYYY-MM
    income: Decimal
    expenses: Decimal  # negative or zero

    @property
    def net(self) -> Decimal:
        return self.income + self.expenses


def monthly(entries: Iterable[Entry]) -> list[MonthSummary]:
    """Income and expenses per calendar month, oldest first; months without entries are left out."""
    income: dict[str, Decimal] = defaultdict(lambda: ZERO)
    expenses: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for entry in entries:
        month = f"{entry.date.year:04d}-{entry.date.month:02d}"
        if entry.is_expense:
            expenses[month] += entry.amount
        else:
            income[month] += entry.amount
    months = sorted(set(income) | set(expenses))
    return [MonthSummary(m, income[m], expenses[m]) for m in months]


def largest_expenses(entries: Iterable[Entry], count: int = 5) -> list[Entry]:
    """The ``count`` biggest expenses, biggest first; ties keep date order."""
    expenses = [entry for entry in entries if entry.is_expense]
    return sorted(expenses, key=lambda entry: entry.amount)[:count]
