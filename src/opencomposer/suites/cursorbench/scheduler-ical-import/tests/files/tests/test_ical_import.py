from datetime import UTC, datetime, timedelta

import pytest
import scheduler
from scheduler import Event, Frequency, Rule, SchedulerError, to_ical

STAMP = datetime(2024, 1, 1, tzinfo=UTC)


def sample_events(berlin, new_york):
    return [
        Event(
            "standup",
            "Standup, daily; really",
            datetime(2024, 1, 1, 9, 0, tzinfo=berlin),
            timedelta(minutes=15),
            rule=Rule(Frequency.WEEKLY, weekdays=(0, 2, 4), count=30),
        ).cancel(datetime(2024, 1, 3, 9, 0, tzinfo=berlin)),
        Event(
            "launch",
            "Launch\nparty " + "x" * 90,
            datetime(2024, 5, 1, 18, tzinfo=new_york),
            timedelta(hours=3),
        ),
        Event("utc", "UTC thing", datetime(2024, 5, 2, 12, tzinfo=UTC), timedelta(days=1, seconds=30)),
        Event(
            "review",
            "Quarterly review",
            datetime(2024, 1, 31, 14, tzinfo=berlin),
            timedelta(hours=1),
            rule=Rule(Frequency.MONTHLY, interval=3, until=datetime(2024, 12, 31, tzinfo=UTC)),
        ),
    ]


def test_round_trip(berlin, new_york):
    events = sample_events(berlin, new_york)
    imported = scheduler.from_ical(to_ical(events, stamp=STAMP))
    assert sorted(imported, key=lambda e: e.id) == sorted(events, key=lambda e: e.id)
    standup = next(e for e in imported if e.id == "standup")
    assert standup.start.utcoffset() == timedelta(hours=1)
    assert str(standup.start.tzinfo) == "Europe/Berlin"


def test_round_trip_keeps_occurrences(berlin, new_york):
    events = sample_events(berlin, new_york)
    imported = {e.id: e for e in scheduler.from_ical(to_ical(events, stamp=STAMP))}
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 2, 1, tzinfo=berlin))
    for event in events:
        assert imported[event.id].occurrences(*window) == event.occurrences(*window)


FOREIGN = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//Other App//EN
BEGIN:VTIMEZONE
TZID:Europe/Berlin
BEGIN:STANDARD
DTSTART:19701025T030000
TZOFFSETFROM:+0200
TZOFFSETTO:+0100
END:STANDARD
END:VTIMEZONE
BEGIN:VEVENT
UID:abc-123@example.com
DTSTAMP:20240101T000000Z
SUMMARY:Team lunch\\, downstairs
LOCATION:Canteen
DTSTART;TZID=Europe/Berlin:20240110T120000
DTEND;TZID=Europe/Berlin:20240110T133000
RRULE:FREQ=WEEKLY;COUNT=4
EXDATE;TZID=Europe/Berlin:20240117T120000,20240124T120000
X-APPLE-TRAVEL-ADVISORY-BEHAVIOR:AUTOMATIC
BEGIN:VALARM
ACTION:DISPLAY
DESCRIPTION:Reminder
TRIGGER:-PT15M
END:VALARM
END:VEVENT
END:VCALENDAR
"""


def test_foreign_calendar_with_dtend_and_extras(berlin):
    (event,) = scheduler.from_ical(FOREIGN)
    assert event.id == "abc-123@example.com"
    assert event.title == "Team lunch, downstairs"
    assert event.start == datetime(2024, 1, 10, 12, tzinfo=berlin)
    assert event.duration == timedelta(minutes=90)
    assert event.rule == Rule(Frequency.WEEKLY, count=4)
    found = event.occurrences(datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 3, 1, tzinfo=berlin))
    assert [o.start.day for o in found] == [10, 31]


def test_folded_lines_are_joined():
    lines = [
        "BEGIN:VEVENT",
        "UID:x",
        "SUMMARY:Long",
        "  title",
        "DTSTART:20240101T100000Z",
        "DURATION:PT1H",
        "END:VEVENT",
    ]
    text = "\r\n".join(lines) + "\r\n"
    (event,) = scheduler.from_ical(text)
    assert event.title == "Long title"


@pytest.mark.parametrize(
    "body",
    [
        "UID:x\nDURATION:PT1H",
        "UID:x\nDTSTART:20240101T100000Z",
        "UID:x\nDTSTART:20240101T100000Z\nDURATION:soon",
        "UID:x\nDTSTART:20240101T100000\nDURATION:PT1H",
        "UID:x\nDTSTART;TZID=Mars/Olympus:20240101T100000\nDURATION:PT1H",
        "UID:x\nDTSTART:20240101T100000Z\nDURATION:PT1H\nRRULE:FREQ=HOURLY",
    ],
    ids=["no-start", "no-length", "bad-duration", "floating", "unknown-zone", "bad-rule"],
)
def test_bad_events_raise_scheduler_errors(body):
    with pytest.raises(SchedulerError):
        scheduler.from_ical(f"BEGIN:VEVENT\n{body}\nEND:VEVENT\n")


def test_unclosed_event_is_an_error():
    with pytest.raises(SchedulerError):
        scheduler.from_ical("BEGIN:VEVENT\nUID:x\nDTSTART:20240101T100000Z\nDURATION:PT1H\n")


def test_empty_calendar():
    assert scheduler.from_ical("BEGIN:VCALENDAR\nVERSION:2.0\nEND:VCALENDAR\n") == []
