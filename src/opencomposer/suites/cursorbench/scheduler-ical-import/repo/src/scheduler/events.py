"""Events and their occurrences."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .errors import EventError
from .recurrence import Rule, between
from .timezones import add_elapsed, as_utc, elapsed


@dataclass(frozen=True, order=True)
class Occurrence:
    """One concrete time an event happens. Sorts by start, then end, then event id."""

    start: datetime
    end: datetime
    event_id: str
    title: str = field(compare=False)

    @property
    def duration(self) -> timedelta:
        """Real time from start to end, not the difference of the wall-clock readings."""
        return elapsed(self.start, self.end)


@dataclass(frozen=True)
class Event:
    """Something that happens at ``start`` for ``duration``, optionally repeating.

    ``start`` must be aware: its zone is the zone the event repeats in. ``duration`` is
    elapsed time, so on the nights the clocks change an occurrence ends at a different
    wall-clock time than usual. ``cancelled`` holds start times of single occurrences that
    were called off.
    """

    id: str
    title: str
    start: datetime
    duration: timedelta
    rule: Rule | None = None
    cancelled: frozenset[datetime] = frozenset()

    def __post_init__(self) -> None:
        if not self.id:
            raise EventError("an event needs a non-empty id")
        if self.start.tzinfo is None:
            raise EventError(f"event {self.id}: start must be timezone-aware, got {self.start.isoformat()}")
        if self.duration <= timedelta(0):
            raise EventError(f"event {self.id}: duration must be positive, got {self.duration}")

    def occurrences(self, window_start: datetime, window_end: datetime) -> list[Occurrence]:
        """Occurrences that overlap ``[window_start, window_end)``, oldest first.

        An occurrence that started before the window but is still running counts.
        """
        starts = between(self.start, self.rule, add_elapsed(window_start, -self.duration), window_end)
        found = []
        for start in starts:
            end = add_elapsed(start, self.duration)
            if as_utc(end) > as_utc(window_start) and start not in self.cancelled:
                found.append(Occurrence(start, end, self.id, self.title))
        return found

    def cancel(self, occurrence_start: datetime) -> Event:
        """A copy of this event with the occurrence starting at ``occurrence_start`` cancelled."""
        if not between(self.start, self.rule, occurrence_start, occurrence_start + timedelta(seconds=1)):
            raise EventError(f"event {self.id} has no occurrence at {occurrence_start.isoformat()}")
        return Event(
            self.id,
            self.title,
            self.start,
            self.duration,
            self.rule,
            self.cancelled | {occurrence_start},
        )
