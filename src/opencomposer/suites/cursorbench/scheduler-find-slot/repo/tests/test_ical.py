from datetime import UTC, datetime, timedelta

import pytest

from scheduler import Event, Frequency, Rule, to_ical
from scheduler.ical import escape_text, fold_line, format_duration

STAMP = datetime(2024, 1, 1, tzinfo=UTC)


def test_format_duration():
    assert format_duration(timedelta(minutes=90)) == "PT1H30M"
    assert format_duration(timedelta(days=2)) == "P2D"
    assert format_duration(timedelta(days=1, seconds=5)) == "P1DT5S"
    with pytest.raises(ValueError):
        format_duration(timedelta(0))


def test_escape_text():
    assert escape_text("a, b; c\\d\ne") == "a\\, b\\; c\\\\d\\ne"


def test_fold_line():
    line = "SUMMARY:" + "x" * 100
    folded = fold_line(line)
    parts = folded.split("\r\n")
    assert len(parts[0]) == 75 and parts[1].startswith(" ")
    assert folded.replace("\r\n ", "") == line
    assert fold_line("SHORT:x") == "SHORT:x"


def test_to_ical(berlin):
    event = Event(
        "standup",
        "Standup, daily",
        datetime(2024, 1, 1, 9, 0, tzinfo=berlin),
        timedelta(minutes=15),
        rule=Rule(Frequency.WEEKLY, weekdays=(0, 2)),
    ).cancel(datetime(2024, 1, 3, 9, 0, tzinfo=berlin))
    text = to_ical([event], stamp=STAMP)
    assert text.endswith("END:VCALENDAR\r\n")
    assert text.splitlines()[3:] == [
        "BEGIN:VEVENT",
        "UID:standup",
        "DTSTAMP:20240101T000000Z",
        "DTSTART;TZID=Europe/Berlin:20240101T090000",
        "DURATION:PT15M",
        "SUMMARY:Standup\\, daily",
        "RRULE:FREQ=WEEKLY;BYDAY=MO,WE",
        "EXDATE;TZID=Europe/Berlin:20240103T090000",
        "END:VEVENT",
        "END:VCALENDAR",
    ]


def test_to_ical_utc_events_use_z_suffix():
    event = Event("x", "X", datetime(2024, 5, 1, 12, tzinfo=UTC), timedelta(hours=1))
    assert "DTSTART:20240501T120000Z\r\n" in to_ical([event], stamp=STAMP)
