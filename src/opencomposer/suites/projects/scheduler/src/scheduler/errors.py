"""Errors raised by the scheduler package."""


class SchedulerError(Exception):
    """Base class for scheduler errors."""


class UnknownTimeZone(SchedulerError):
    """A time zone name that the zoneinfo database does not know."""


class RuleError(SchedulerError, ValueError):
    """A recurrence rule that is invalid or cannot be parsed."""


class EventError(SchedulerError):
    """An invalid event, or an event id that is missing or duplicated."""
