"""Selecting entries: periods and filters."""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from .models import Entry, LedgerError


@dataclass(frozen=True)
class Period:
    """An inclusive range of dates."""

    start: date
    end: date

    def __contains__(self, day: object) -> bool:
        return isinstance(day, date) and self.start <= day <= self.end


def parse_period(text: str) -> Period:
    """``2024`` (a year), ``2024-03`` (a month), ``2024-Q1`` (a quarter) or ``2024-03-01..2024-03-15``."""
    text = text.strip()
    if match := re.fullmatch(r"(\d{4})", text):
        year = int(match.group(1))
        return Period(date(year, 1, 1), date(year, 12, 31))
    if match := re.fullmatch(r"(\d{4})-(\d{2})", text):
        year, month = int(match.group(1)), int(match.group(2))
        if not 1 <= month <= 12:
            raise LedgerError(f"no month {month} in period {text!r}")
        return Period(date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1]))
    if match := re.fullmatch(r"(\d{4})-[Qq]([1-4])", text):
        year, quarter = int(match.group(1)), int(match.group(2))
        first_month = 3 * (quarter - 1) + 1
        last_month = first_month + 2
        return Period(
            date(year, first_month, 1),
            date(year, last_month, calendar.monthrange(year, last_month)[1]),
        )
    if match := re.fullmatch(r"(\S+)\.\.(\S+)", text):
        try:
            start, end = date.fromisoformat(match.group(1)), date.fromisoformat(match.group(2))
        except ValueError:
            raise LedgerError(f"bad date range {text!r}") from None
        if end < start:
            raise LedgerError(f"date range {text!r} ends before it starts")
        return Period(start, end)
    raise LedgerError(f"not a period: {text!r} (use 2024, 2024-03, 2024-Q1 or START..END)")


@dataclass(frozen=True)
class Filter:
    """Criteria an entry must all meet; ``None`` means "any"."""

    period: Period | None = None
    category: str | None = None
    text: str | None = None
    tag: str | None = None

    def matches(self, entry: Entry) -> bool:
        if self.period is not None and entry.date not in self.period:
            return False
        if self.category is not None and not (
            entry.category == self.category or entry.category.startswith(self.category + "/")
        ):
            return False
        if self.text is not None and self.text.casefold() not in entry.description.casefold():
            return False
        if self.tag is not None and self.tag.lower() not in entry.tags:
            return False
        return True


def select(entries: Iterable[Entry], criteria: Filter) -> list[Entry]:
    """The entries that match ``criteria``, in their original order."""
    return [entry for entry in entries if criteria.matches(entry)]
