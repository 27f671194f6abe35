from datetime import datetime, timedelta

import pytest

from scheduler import Calendar, Event, EventError, Frequency, Rule


def weekly_standup(zone, **kwargs):
    return Event(
        "standup",
        "Standup",
        datetime(2024, 1, 1, 9, 0, tzinfo=zone),
        timedelta(minutes=30),
        rule=Rule(Frequency.WEEKLY, weekdays=(0, 2, 4)),
        **kwargs,
    )


def test_event_validation(berlin):
    with pytest.raises(EventError, match="aware"):
        Event("a", "A", datetime(2024, 1, 1), timedelta(hours=1))
    with pytest.raises(EventError, match="positive"):
        Event("a", "A", datetime(2024, 1, 1, tzinfo=berlin), timedelta(0))
    with pytest.raises(EventError, match="non-empty"):
        Event("", "A", datetime(2024, 1, 1, tzinfo=berlin), timedelta(hours=1))


def test_occurrences_in_window(berlin):
    event = weekly_standup(berlin)
    found = event.occurrences(datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 8, tzinfo=berlin))
    assert [o.start.day for o in found] == [1, 3, 5]
    assert found[0].end == datetime(2024, 1, 1, 9, 30, tzinfo=berlin)
    assert found[0].duration == timedelta(minutes=30)


def test_occurrence_running_at_window_start_is_included(berlin):
    event = weekly_standup(berlin)
    found = event.occurrences(datetime(2024, 1, 1, 9, 15, tzinfo=berlin), datetime(2024, 1, 2, tzinfo=berlin))
    assert len(found) == 1
    found = event.occurrences(datetime(2024, 1, 1, 9, 30, tzinfo=berlin), datetime(2024, 1, 2, tzinfo=berlin))
    assert found == []


def test_cancel_single_occurrence(berlin):
    event = weekly_standup(berlin).cancel(datetime(2024, 1, 3, 9, 0, tzinfo=berlin))
    found = event.occurrences(datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 8, tzinfo=berlin))
    assert [o.start.day for o in found] == [1, 5]
    with pytest.raises(EventError, match="no occurrence"):
        event.cancel(datetime(2024, 1, 2, 9, 0, tzinfo=berlin))


def test_calendar_collects_and_sorts(berlin, new_york):
    calendar = Calendar(
        [
            weekly_standup(berlin),
            Event("call", "Call", datetime(2024, 1, 1, 2, 0, tzinfo=new_york), timedelta(hours=1)),
        ]
    )
    found = calendar.occurrences(datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 2, tzinfo=berlin))
    assert [o.event_id for o in found] == ["call", "standup"]
    with pytest.raises(ValueError, match="empty window"):
        calendar.occurrences(datetime(2024, 1, 2, tzinfo=berlin), datetime(2024, 1, 1, tzinfo=berlin))


def test_calendar_ids(berlin):
    calendar = Calendar([weekly_standup(berlin)])
    with pytest.raises(EventError, match="duplicate"):
        calendar.add(weekly_standup(berlin))
    assert "standup" in calendar and len(calendar) == 1
    calendar.remove("standup")
    with pytest.raises(EventError, match="no event"):
        calendar.get("standup")


def test_calendar_cancel_occurrence(berlin):
    calendar = Calendar([weekly_standup(berlin)])
    calendar.cancel_occurrence("standup", datetime(2024, 1, 1, 9, tzinfo=berlin))
    assert calendar.agenda(datetime(2024, 1, 1).date(), berlin) == []


def test_agenda_uses_the_given_zone(berlin, new_york):
    calendar = Calendar([weekly_standup(berlin)])
    # 09:00 Berlin on Monday 1 January is 03:00 in New York, the same day there
    assert len(calendar.agenda(datetime(2024, 1, 1).date(), new_york)) == 1
    late = Event("late", "Late", datetime(2024, 1, 1, 23, 30, tzinfo=new_york), timedelta(hours=1))
    calendar.add(late)
    # 23:30 New York is 05:30 the next morning in Berlin
    assert [o.event_id for o in calendar.agenda(datetime(2024, 1, 2).date(), berlin)] == ["late"]
