"""Ledger entries and the parsing of user input into them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation

_CATEGORY = re.compile(r"[a-z][a-z0-9_-]*(?:/[a-z][a-z0-9_-]*)*")


class LedgerError(Exception):
    """A problem the user can fix: bad input, a missing entry, an unreadable file."""


@dataclass(frozen=True)
class Entry:
    """One transaction. ``amount`` is positive for income and negative for expenses.

    Categories are lowercase and may be nested with slashes: ``food/groceries``.
    """

    id: int
    date: date
    amount: Decimal
    category: str
    description: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_expense(self) -> bool:
        return self.amount < 0

    @property
    def top_category(self) -> str:
        """``food`` for ``food/groceries``."""
        return self.category.split("/", 1)[0]

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "date": self.date.isoformat(),
            "amount": str(self.amount),
            "category": self.category,
            "description": self.description,
            "tags": sorted(self.tags),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Entry:
        tags = data.get("tags") or []
        if not isinstance(tags, list):
            raise LedgerError(f"entry {data.get('id')}: tags must be a list, got {tags!r}")
        return cls(
            id=int(str(data["id"])),
            date=date.fromisoformat(str(data["date"])),
            amount=Decimal(str(data["amount"])),
            category=str(data["category"]),
            description=str(data.get("description", "")),
            tags=frozenset(str(tag) for tag in tags),
        )


def parse_amount(text: str) -> Decimal:
    """Parse ``"12.5"``, ``"-3"``, ``"1,200.00"`` into a Decimal with two places."""
    cleaned = text.strip().replace(",", "")
    try:
        amount = Decimal(cleaned)
    except InvalidOperation:
        raise LedgerError(f"not an amount: {text!r}") from None
    if not amount.is_finite():
        raise LedgerError(f"not an amount: {text!r}")
    if amount == 0:
        raise LedgerError("amount must not be zero")
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -2:
        raise LedgerError(f"amount has more than two decimal places: {text!r}")
    return amount.quantize(Decimal("0.01"))


def parse_date(text: str, *, today: date | None = None) -> date:
    """Parse an ISO date, ``today`` or ``yesterday``."""
    today = today or date.today()
    lowered = text.strip().lower()
    if lowered == "today":
        return today
    if lowered == "yesterday":
        return today - timedelta(days=1)
    try:
        return date.fromisoformat(lowered)
    except ValueError:
        raise LedgerError(f"not a date (use YYYY-MM-DD, today or yesterday): {text!r}") from None


def parse_category(text: str) -> str:
    """Normalise a category name: lowercase, slashes between levels."""
    category = text.strip().lower()
    if not _CATEGORY.fullmatch(category):
        raise LedgerError(f"bad category {text!r}: use lowercase words, digits, '-' or '_', nested with '/'")
    return category


def parse_tags(text: str) -> frozenset[str]:
    """Comma-separated tags, trimmed and lowercased; empty pieces are ignored."""
    return frozenset(tag.strip().lower() for tag in text.split(",") if tag.strip())
