"""Recurrence rules: how an event repeats.

A :class:`Rule` covers the everyday subset of RFC 5545 RRULEs: ``FREQ`` (daily, weekly,
monthly, yearly), ``INTERVAL``, ``COUNT``, ``UNTIL`` and, for weekly rules, ``BYDAY``.
Occurrences are generated in the wall-clock time of the first occurrence's zone, so a
09:00 meeting stays at 09:00 local time across daylight-saving changes.

As in RFC 5545, a monthly rule on the 31st skips months that have no 31st and a yearly
rule on 29 February only occurs in leap years; skipped dates do not count towards
``COUNT``.
"""

from __future__ import annotations

import calendar
import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from .errors import RuleError
from .timezones import as_utc, localize

WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
# Stop a rule that has produced nothing for this many periods in a row (yearly on
# 29 February with a large INTERVAL skips many periods, but never a thousand).
_MAX_EMPTY_PERIODS = 1000


class Frequency(enum.Enum):
    DAILY = "DAILY"
    WEEKLY = "WEEKLY"
    MONTHLY = "MONTHLY"
    YEARLY = "YEARLY"


@dataclass(frozen=True)
class Rule:
    """How often and how long an event repeats.

    ``weekdays`` (0 = Monday) only applies to weekly rules; without it a weekly rule
    repeats on the weekday of the start. With it, the first occurrence is the first
    listed weekday on or after the start. ``until`` is inclusive and must be
    aware. At most one of ``count`` and ``until`` may be given.
    """

    frequency: Frequency
    interval: int = 1
    count: int | None = None
    until: datetime | None = None
    weekdays: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise RuleError(f"interval must be at least 1, got {self.interval}")
        if self.count is not None and self.count < 1:
            raise RuleError(f"count must be at least 1, got {self.count}")
        if self.count is not None and self.until is not None:
            raise RuleError("a rule takes COUNT or UNTIL, not both")
        if self.until is not None and self.until.tzinfo is None:
            raise RuleError(f"until must be an aware datetime, got {self.until.isoformat()}")
        if self.weekdays and self.frequency is not Frequency.WEEKLY:
            raise RuleError(f"weekdays only apply to weekly rules, not {self.frequency.value.lower()}")
        if any(not 0 <= day <= 6 for day in self.weekdays):
            raise RuleError(f"weekdays are 0 (Monday) to 6 (Sunday), got {self.weekdays}")
        object.__setattr__(self, "weekdays", tuple(sorted(set(self.weekdays))))

    def to_rrule(self) -> str:
        """The rule as an RRULE value: ``FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,WE``."""
        parts = [f"FREQ={self.frequency.value}"]
        if self.interval != 1:
            parts.append(f"INTERVAL={self.interval}")
        if self.weekdays:
            parts.append("BYDAY=" + ",".join(WEEKDAYS[d] for d in self.weekdays))
        if self.count is not None:
            parts.append(f"COUNT={self.count}")
        if self.until is not None:
            parts.append("UNTIL=" + self.until.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ"))
        return ";".join(parts)


def parse_rule(text: str) -> Rule:
    """Parse an RRULE value (with or without the ``RRULE:`` prefix)."""
    body = text.strip()
    if body.upper().startswith("RRULE:"):
        body = body[len("RRULE:") :]
    fields: dict[str, str] = {}
    for part in filter(None, body.split(";")):
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise RuleError(f"expected KEY=VALUE in rule, got {part!r}")
        key = key.strip().upper()
        if key in fields:
            raise RuleError(f"{key} appears twice in rule {text!r}")
        fields[key] = value.strip().upper()
    if "FREQ" not in fields:
        raise RuleError(f"rule {text!r} has no FREQ")
    try:
        frequency = Frequency(fields.pop("FREQ"))
    except ValueError:
        raise RuleError(f"unsupported FREQ in {text!r}; use DAILY, WEEKLY, MONTHLY or YEARLY") from None
    interval = _parse_int(fields.pop("INTERVAL", "1"), "INTERVAL")
    count = _parse_int(fields.pop("COUNT"), "COUNT") if "COUNT" in fields else None
    until = _parse_until(fields.pop("UNTIL")) if "UNTIL" in fields else None
    weekdays: tuple[int, ...] = ()
    if "BYDAY" in fields:
        names = fields.pop("BYDAY").split(",")
        unknown = [n for n in names if n not in WEEKDAYS]
        if unknown:
            raise RuleError(f"unknown BYDAY value(s) {', '.join(unknown)}")
        weekdays = tuple(WEEKDAYS.index(n) for n in names)
    if fields:
        raise RuleError(f"unsupported rule part(s): {', '.join(sorted(fields))}")
    return Rule(frequency, interval, count, until, weekdays)


def _parse_int(value: str, name: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise RuleError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _parse_until(value: str) -> datetime:
    for fmt in ("%Y%m%dT%H%M%SZ", "%Y%m%d"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise RuleError(f"UNTIL must be YYYYMMDD or YYYYMMDDTHHMMSSZ, got {value!r}")


def _add_months(day: date, months: int, day_of_month: int) -> date | None:
    """The ``day_of_month`` of the month ``months`` after ``day``'s, or None if it has no such day."""
    index = day.year * 12 + day.month - 1 + months
    year, month = divmod(index, 12)
    month += 1
    if day_of_month > calendar.monthrange(year, month)[1]:
        return None
    return date(year, month, day_of_month)


def _candidate_dates(rule: Rule, first: date) -> Iterator[list[date]]:
    """Dates of each period in turn (possibly none for a period), from the first period on."""
    period = 0
    while True:
        if rule.frequency is Frequency.DAILY:
            yield [first + timedelta(days=period * rule.interval)]
        elif rule.frequency is Frequency.WEEKLY:
            week_start = first - timedelta(days=first.weekday()) + timedelta(weeks=period * rule.interval)
            days = rule.weekdays or (first.weekday(),)
            yield [week_start + timedelta(days=d) for d in days]
        elif rule.frequency is Frequency.MONTHLY:
            candidate = _add_months(first, period * rule.interval, first.day)
            yield [candidate] if candidate else []
        else:
            candidate = _add_months(first, 12 * period * rule.interval, first.day)
            yield [candidate] if candidate else []
        period += 1


def occurrences(start: datetime, rule: Rule | None) -> Iterator[datetime]:
    """Every start time of an event first starting at ``start`` and repeating by ``rule``.

    ``start`` must be aware; each occurrence has the same wall-clock time in the same zone
    (moved forward if that time falls into a DST gap that day). Without a rule there is
    one occurrence. The iterator is infinite for a rule without COUNT or UNTIL.
    """
    if start.tzinfo is None:
        raise ValueError(f"expected an aware start, got naive {start.isoformat()}")
    if rule is None:
        yield start
        return
    zone = start.tzinfo
    wall_time = start.replace(tzinfo=None).time()
    produced = 0
    empty_periods = 0
    for dates in _candidate_dates(rule, start.date()):
        hits = [d for d in dates if d >= start.date()]
        empty_periods = 0 if hits else empty_periods + 1
        if empty_periods > _MAX_EMPTY_PERIODS:
            return
        for day in hits:
            when = localize(datetime.combine(day, wall_time), zone)
            if rule.until is not None and when > rule.until:
                return
            yield when
            produced += 1
            if rule.count is not None and produced >= rule.count:
                return


def between(
    start: datetime, rule: Rule | None, window_start: datetime, window_end: datetime
) -> list[datetime]:
    """Occurrences with ``window_start <= occurrence < window_end``, compared as instants."""
    found = []
    for when in occurrences(start, rule):
        if as_utc(when) >= as_utc(window_end):
            break
        if as_utc(when) >= as_utc(window_start):
            found.append(when)
    return found
