"""Overlaps between occurrences and the free time around them.

Occurrences are half-open intervals ``[start, end)``: a meeting ending at 10:00 does not
conflict with one starting at 10:00.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .events import Occurrence


@dataclass(frozen=True)
class Conflict:
    """Two occurrences that overlap; ``first`` starts no later than ``second``."""

    first: Occurrence
    second: Occurrence

    @property
    def overlap(self) -> timedelta:
        return min(self.first.end, self.second.end) - self.second.start


def overlaps(a: Occurrence, b: Occurrence) -> bool:
    return a.start < b.end and b.start < a.end


def find_conflicts(occurrences: Iterable[Occurrence]) -> list[Conflict]:
    """Every overlapping pair, ordered by the first occurrence and then the second.

    A sweep over occurrences sorted by start: each one is compared only with those still
    running when it starts.
    """
    conflicts: list[Conflict] = []
    running: list[Occurrence] = []
    for occurrence in sorted(occurrences):
        running = [r for r in running if r.end > occurrence.start]
        conflicts.extend(Conflict(r, occurrence) for r in running)
        running.append(occurrence)
    return conflicts


def busy_intervals(occurrences: Iterable[Occurrence]) -> list[tuple[datetime, datetime]]:
    """The union of the occurrences as disjoint, sorted intervals (touching ones merge)."""
    merged: list[tuple[datetime, datetime]] = []
    for occurrence in sorted(occurrences):
        if merged and occurrence.start <= merged[-1][1]:
            start, end = merged[-1]
            merged[-1] = (start, max(end, occurrence.end))
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
    if window_end <= window_start:
        raise ValueError(f"empty window: {window_start.isoformat()} to {window_end.isoformat()}")
    slots = []
    cursor = window_start
    for start, end in busy_intervals(occurrences):
        if end <= cursor:
            continue
        if start >= window_end:
            break
        if start > cursor:
            slots.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < window_end:
        slots.append((cursor, window_end))
    return [(s, e) for s, e in slots if e - s >= min_length and e - s > timedelta(0)]
