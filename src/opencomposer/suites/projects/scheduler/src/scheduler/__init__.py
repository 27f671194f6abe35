"""Recurring events across time zones, conflict detection and free-slot search."""

from .calendar import Calendar
from .conflicts import Conflict, busy_intervals, find_conflicts, free_slots, overlaps
from .errors import EventError, RuleError, SchedulerError, UnknownTimeZone
from .events import Event, Occurrence
from .ical import to_ical
from .recurrence import Frequency, Rule, between, occurrences, parse_rule
from .timezones import get_zone, localize, to_zone

__all__ = [
    "Calendar",
    "Conflict",
    "Event",
    "EventError",
    "Frequency",
    "Occurrence",
    "Rule",
    "RuleError",
    "SchedulerError",
    "UnknownTimeZone",
    "between",
    "busy_intervals",
    "find_conflicts",
    "free_slots",
    "get_zone",
    "localize",
    "occurrences",
    "overlaps",
    "parse_rule",
    "to_ical",
    "to_zone",
]
