from datetime import datetime, timedelta

import pytest

from scheduler import Calendar, Event, Frequency, Occurrence, Rule, busy_intervals, find_conflicts, free_slots
from scheduler.conflicts import overlaps


def occ(event_id, start_hour, end_hour, zone, day=1):
    return Occurrence(
        datetime(2024, 1, day, start_hour, tzinfo=zone),
        datetime(2024, 1, day, end_hour, tzinfo=zone),
        event_id,
        event_id.title(),
    )


def test_overlaps_is_half_open(berlin):
    assert overlaps(occ("a", 9, 11, berlin), occ("b", 10, 12, berlin))
    assert not overlaps(occ("a", 9, 10, berlin), occ("b", 10, 11, berlin))


def test_find_conflicts_reports_every_pair_in_order(berlin):
    items = [
        occ("c", 13, 14, berlin),
        occ("a", 9, 12, berlin),
        occ("b", 10, 11, berlin),
        occ("d", 11, 13, berlin),
    ]
    pairs = [(c.first.event_id, c.second.event_id) for c in find_conflicts(items)]
    assert pairs == [("a", "b"), ("a", "d")]
    assert find_conflicts(items)[0].overlap == timedelta(hours=1)


def test_conflicts_across_zones(berlin, new_york):
    # 09:00 in New York is 15:00 in Berlin
    items = [occ("berlin", 14, 16, berlin), occ("ny", 9, 10, new_york)]
    assert len(find_conflicts(items)) == 1


def test_busy_intervals_merge_overlapping_and_touching(berlin):
    items = [
        occ("a", 9, 10, berlin),
        occ("b", 10, 11, berlin),
        occ("c", 10, 12, berlin),
        occ("d", 14, 15, berlin),
    ]
    assert [(s.hour, e.hour) for s, e in busy_intervals(items)] == [(9, 12), (14, 15)]


def test_free_slots(berlin):
    items = [occ("a", 9, 10, berlin), occ("b", 11, 12, berlin), occ("c", 12, 13, berlin)]
    window = (datetime(2024, 1, 1, 8, tzinfo=berlin), datetime(2024, 1, 1, 17, tzinfo=berlin))
    slots = free_slots(items, *window)
    assert [(s.hour, e.hour) for s, e in slots] == [(8, 9), (10, 11), (13, 17)]
    slots = free_slots(items, *window, min_length=timedelta(hours=2))
    assert [(s.hour, e.hour) for s, e in slots] == [(13, 17)]


def test_free_slots_clip_to_window(berlin):
    items = [occ("a", 7, 9, berlin), occ("b", 16, 18, berlin)]
    window = (datetime(2024, 1, 1, 8, tzinfo=berlin), datetime(2024, 1, 1, 17, tzinfo=berlin))
    assert [(s.hour, e.hour) for s, e in free_slots(items, *window)] == [(9, 16)]
    with pytest.raises(ValueError, match="empty window"):
        free_slots(items, window[1], window[0])


def test_calendar_conflicts_and_free_slots(berlin):
    calendar = Calendar(
        [
            Event(
                "standup",
                "Standup",
                datetime(2024, 1, 1, 9, tzinfo=berlin),
                timedelta(minutes=30),
                rule=Rule(Frequency.DAILY),
            ),
            Event("review", "Review", datetime(2024, 1, 2, 9, 15, tzinfo=berlin), timedelta(hours=1)),
        ]
    )
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 3, tzinfo=berlin))
    conflicts = calendar.conflicts(*window)
    assert [(c.first.event_id, c.second.event_id) for c in conflicts] == [("standup", "review")]
    day = (datetime(2024, 1, 2, 8, tzinfo=berlin), datetime(2024, 1, 2, 12, tzinfo=berlin))
    slots = calendar.free_slots(*day, min_length=timedelta(minutes=30))
    assert [(s.strftime("%H:%M"), e.strftime("%H:%M")) for s, e in slots] == [
        ("08:00", "09:00"),
        ("10:15", "12:00"),
    ]
