"""Time zone helpers on top of :mod:`zoneinfo`.

Local wall-clock times are ambiguous twice a year. When clocks go forward a local time
can fall in the gap and not exist (02:30 on the spring-forward night in Europe); when
they go back a local time happens twice. :func:`localize` settles both the way calendar
applications do: a time in the gap moves forward by the length of the gap, and a
repeated time means its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import UnknownTimeZone


@lru_cache(maxsize=64)
def get_zone(name: str) -> ZoneInfo:
    """The zone called ``name`` (``"Europe/Berlin"``, ``"UTC"``)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UnknownTimeZone(f"unknown time zone {name!r}") from None


def zone_name(value: datetime) -> str:
    """The IANA name of an aware datetime's zone, or ``UTC`` for fixed UTC."""
    if value.tzinfo is None:
        raise ValueError(f"expected an aware datetime, got naive {value.isoformat()}")
    if isinstance(value.tzinfo, ZoneInfo):
        return value.tzinfo.key
    if value.utcoffset() == timedelta(0):
        return "UTC"
    raise ValueError(f"{value.isoformat()} has a fixed offset, not a named zone")


def exists(local: datetime, zone: tzinfo) -> bool:
    """Whether the naive wall-clock time ``local`` occurs in ``zone`` (it is not in a DST gap)."""
    aware = local.replace(tzinfo=zone, fold=0)
    round_trip = aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
    return round_trip == local.replace(fold=0)


def localize(local: datetime, zone: tzinfo) -> datetime:
    """Attach ``zone`` to the naive ``local`` time, resolving DST gaps and folds.

    A nonexistent time is moved forward by the gap (02:30 becomes 03:30 when clocks jump
    from 02:00 to 03:00); a repeated time resolves to its first occurrence (``fold=0``).
    """
    if local.tzinfo is not None:
        raise ValueError(f"expected a naive datetime, got {local.isoformat()}")
    aware = local.replace(tzinfo=zone, fold=0)
    if exists(local, zone):
        return aware
    # In the gap zoneinfo applies the offset from before the transition; converting
    # through UTC lands on the same instant expressed after the transition.
    return aware.astimezone(UTC).astimezone(zone)


def to_zone(value: datetime, zone: tzinfo) -> datetime:
    """The same instant as ``value`` on ``zone``'s clock."""
    if value.tzinfo is None:
        raise ValueError(f"expected an aware datetime, got naive {value.isoformat()}")
    return value.astimezone(zone)


def utc_offset_hours(value: datetime) -> float:
    """The UTC offset of an aware datetime in hours (5.5 for India)."""
    offset = value.utcoffset()
    if offset is None:
        raise ValueError(f"expected an aware datetime, got naive {value.isoformat()}")
    return offset.total_seconds() / 3600
