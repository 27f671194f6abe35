"""A calendar: a set of events and the questions asked of it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import date, datetime, time, timedelta, tzinfo

from .conflicts import Conflict, find_conflicts, free_slots
from .errors import EventError
from .events import Event, Occurrence
from .timezones import localize


class Calendar:
    """Events by id."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: dict[str, Event] = {}
        for event in events:
            self.add(event)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events.values())

    def __len__(self) -> int:
        return len(self._events)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    def add(self, event: Event) -> None:
        if event.id in self._events:
            raise EventError(f"duplicate event id {event.id!r}")
        self._events[event.id] = event

    def get(self, event_id: str) -> Event:
        try:
            return self._events[event_id]
        except KeyError:
            raise EventError(f"no event {event_id!r}") from None

    def remove(self, event_id: str) -> Event:
        event = self.get(event_id)
        del self._events[event_id]
        return event

    def cancel_occurrence(self, event_id: str, occurrence_start: datetime) -> None:
        """Call off one occurrence of a repeating event."""
        self._events[event_id] = self.get(event_id).cancel(occurrence_start)

    def occurrences(self, window_start: datetime, window_end: datetime) -> list[Occurrence]:
        """Every occurrence overlapping ``[window_start, window_end)``, in start order."""
        if window_end <= window_start:
            raise ValueError(f"empty window: {window_start.isoformat()} to {window_end.isoformat()}")
        found: list[Occurrence] = []
        for event in self._events.values():
            found.extend(event.occurrences(window_start, window_end))
        return sorted(found)

    def agenda(self, day: date, zone: tzinfo) -> list[Occurrence]:
        """Occurrences overlapping ``day`` as it is on ``zone``'s clock (midnight to midnight)."""
        start = localize(datetime.combine(day, time.min), zone)
        end = localize(datetime.combine(day + timedelta(days=1), time.min), zone)
        return self.occurrences(start, end)

    def conflicts(self, window_start: datetime, window_end: datetime) -> list[Conflict]:
        """Overlapping pairs of occurrences in the window."""
        return find_conflicts(self.occurrences(window_start, window_end))

    def free_slots(
        self, window_start: datetime, window_end: datetime, min_length: timedelta = timedelta(0)
    ) -> list[tuple[datetime, datetime]]:
        """Free time in the window, in slots of at least ``min_length``."""
        return free_slots(self.occurrences(window_start, window_end), window_start, window_end, min_length)
