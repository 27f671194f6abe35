"""Export to iCalendar (RFC 5545) text.

Only what the rest of the package models is written: one VEVENT per event with its start
in its own zone, a DURATION, the RRULE and EXDATEs for cancelled occurrences. Lines are
folded at 75 octets and end in CRLF as the RFC requires.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from .events import Event
from .timezones import zone_name


def escape_text(value: str) -> str:
    """Escape backslashes, semicolons, commas and newlines in a TEXT value."""
    return value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def format_duration(duration: timedelta) -> str:
    """``timedelta(hours=1, minutes=30)`` → ``PT1H30M``; whole days use ``P2D``."""
    seconds = int(duration.total_seconds())
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {duration}")
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"P{days}D" if days else "P"
    if hours or minutes or seconds:
        text += "T"
        text += f"{hours}H" if hours else ""
        text += f"{minutes}M" if minutes else ""
        text += f"{seconds}S" if seconds else ""
    return text


def _format_local(value: datetime) -> tuple[str, str]:
    """The ``;TZID=...`` parameter (empty for UTC) and the value of a DATE-TIME."""
    name = zone_name(value)
    if name == "UTC":
        return "", value.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f";TZID={name}", value.strftime("%Y%m%dT%H%M%S")


def fold_line(line: str) -> str:
    """Fold a content line into chunks of at most 75 octets, continuation lines starting with a space."""
    encoded = line.encode("utf-8")
    if len(encoded) <= 75:
        return line
    chunks: list[str] = []
    current = ""
    limit = 75
    for ch in line:
        if len((current + ch).encode("utf-8")) > limit:
            chunks.append(current)
            current = ""
            limit = 74  # the leading space counts
        current += ch
    chunks.append(current)
    return "\r\n ".join(chunks)


def event_lines(event: Event, stamp: datetime) -> list[str]:
    tzid, start = _format_local(event.start)
    lines = [
        "BEGIN:VEVENT",
        f"UID:{event.id}",
        f"DTSTAMP:{stamp.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}",
        f"DTSTART{tzid}:{start}",
        f"DURATION:{format_duration(event.duration)}",
        f"SUMMARY:{escape_text(event.title)}",
    ]
    if event.rule is not None:
        lines.append(f"RRULE:{event.rule.to_rrule()}")
    for cancelled in sorted(event.cancelled):
        tzid, value = _format_local(cancelled.astimezone(event.start.tzinfo))
        lines.append(f"EXDATE{tzid}:{value}")
    lines.append("END:VEVENT")
    return lines


def to_ical(events: Iterable[Event], *, stamp: datetime, product: str = "-//scheduler//EN") -> str:
    """A VCALENDAR holding ``events``; ``stamp`` is the DTSTAMP written on every event."""
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", f"PRODID:{product}"]
    for event in sorted(events, key=lambda e: e.id):
        lines.extend(event_lines(event, stamp))
    lines.append("END:VCALENDAR")
    return "".join(fold_line(line) + "\r\n" for line in lines)
