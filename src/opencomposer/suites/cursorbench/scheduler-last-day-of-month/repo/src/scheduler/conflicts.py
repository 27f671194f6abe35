"""Overlaps between occurrences and the free time around them.

Occurrences are half-open intervals ``[start, end)``: a meeting ending at 10:00 does not
conflict with one starting at 10:00. Every comparison and length is taken on UTC instants
(see :func:`~scheduler.timezones.as_utc`), so occurrences in different zones, or around a
DST change, are ordered by when they really happen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .events import Occurrence
from .timezones import as_utc, elapsed


def _by_instant(occurrence: Occurrence) -> tuple[datetime, datetime, str]:
    return as_utc(occurrence.start), as_utc(occurrence.end), occurrence.event_id


@dataclass(frozen=True)
class Conflict:
    """Two occurrences that overlap; ``first`` starts no later than ``second``."""

    first: Occurrence
    second: Occurrence

    @property
    def overlap(self) -> timedelta:
        return elapsed(self.second.start, min(self.first.end, self.second.end, key=as_utc))


def overlaps(a: Occurrence, b: Occurrence) -> bool:
    return as_utc(a.start) < as_utc(b.end) and as_utc(b.start) < as_utc(a.end)


def find_conflicts(occurrences: Iterable[Occurrence]) -> list[Conflict]:
    """Every overlapping pair, ordered by the first occurrence and then the second.

    A sweep over occurrences sorted by start: each one is compared only with those still
    running when it starts.
    """
    conflicts: list[Conflict] = []
    running: list[Occurrence] = []
    for occurrence in sorted(occurrences, key=_by_instant):
        running = [r for r in running if as_utc(r.end) > as_utc(occurrence.start)]
        conflicts.extend(Conflict(r, occurrence) for r in running)
        running.append(occurrence)
    return conflicts


def busy_intervals(occurrences: Iterable[Occurrence]) -> list[tuple[datetime, datetime]]:
    """The union of the occurrences as disjoint, sorted intervals (touching ones merge)."""
    merged: list[tuple[datetime, datetime]] = []
    for occurrence in sorted(occurrences, key=_by_instant):
        if merged and as_utc(occurrence.start) <= as_utc(merged[-1][1]):
            start, end = merged[-1]
            merged[-1] = (start, max(end, occurrence.end, key=as_utc))
        else:
            merged.append((occurrence.start, occurrence.end))
    return merged


def free_slots(
    occurrences: Iterable[Occurrence],
    window_start: datetime,
    window_end: datetime,
    min_length: timedelta = timedelta(0),
) -> list[tuple[datetime, datetime]]:
    """Gaps in ``[window_start, window_end)`` not covered by any occurrence, at least ``min_length`` long."""
    if as_utc(window_end) <= as_utc(window_start):
        raise ValueError(f"empty window: {window_start.isoformat()} to {window_end.isoformat()}")
    slots = []
    cursor = window_start
    for start, end in busy_intervals(occurrences):
        if as_utc(end) <= as_utc(cursor):
            continue
        if as_utc(start) >= as_utc(window_end):
            break
        if as_utc(start) > as_utc(cursor):
            slots.append((cursor, start))
        cursor = max(cursor, end, key=as_utc)
    if as_utc(cursor) < as_utc(window_end):
        slots.append((cursor, window_end))
    return [(s, e) for s, e in slots if elapsed(s, e) >= min_length and elapsed(s, e) > timedelta(0)]
