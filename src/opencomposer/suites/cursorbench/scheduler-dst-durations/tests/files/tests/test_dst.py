"""Occurrences on the nights the clocks change: durations are elapsed time."""

from datetime import UTC, datetime, timedelta

from scheduler import Calendar, Event, Frequency, Rule, find_conflicts, free_slots


def backup(zone):
    return Event(
        "backup",
        "Nightly backup",
        datetime(2024, 3, 1, 1, 30, tzinfo=zone),
        timedelta(hours=3),
        rule=Rule(Frequency.DAILY),
    )


def night_of(day, zone):
    start = datetime(2024, day[0], day[1], tzinfo=zone)
    return backup(zone).occurrences(start, start + timedelta(hours=12))[0]


def test_spring_forward_night_ends_later_on_the_wall_clock(berlin):
    occurrence = night_of((3, 31), berlin)
    assert occurrence.end == datetime(2024, 3, 31, 3, 30, tzinfo=UTC)
    assert occurrence.end.hour == 5
    assert occurrence.duration == timedelta(hours=3)


def test_fall_back_night_ends_earlier_on_the_wall_clock(berlin):
    occurrence = night_of((10, 27), berlin)
    assert occurrence.end == datetime(2024, 10, 27, 2, 30, tzinfo=UTC)
    assert occurrence.end.hour == 3
    assert occurrence.duration == timedelta(hours=3)


def test_ordinary_night_is_unchanged(berlin):
    occurrence = night_of((3, 20), berlin)
    assert (occurrence.end.hour, occurrence.end.minute) == (4, 30)


def test_conflict_with_utc_maintenance_window(berlin):
    maintenance = Event(
        "maint", "DB maintenance", datetime(2024, 3, 31, 3, 0, tzinfo=UTC), timedelta(hours=1)
    )
    calendar = Calendar([backup(berlin), maintenance])
    window = (datetime(2024, 3, 31, tzinfo=berlin), datetime(2024, 3, 31, 12, tzinfo=berlin))
    conflicts = calendar.conflicts(*window)
    assert [(c.first.event_id, c.second.event_id) for c in conflicts] == [("backup", "maint")]
    assert conflicts[0].overlap == timedelta(minutes=30)


def test_free_slots_on_the_spring_forward_night(berlin):
    calendar = Calendar([backup(berlin)])
    start = datetime(2024, 3, 31, tzinfo=berlin)
    slots = calendar.free_slots(start, datetime(2024, 3, 31, 8, tzinfo=berlin), min_length=timedelta(hours=2))
    assert [(s.strftime("%H:%M"), e.strftime("%H:%M")) for s, e in slots] == [("05:30", "08:00")]


def test_repeated_hour_is_ordered_by_instant(berlin):
    # 02:40 before the clocks go back happens 40 minutes before 02:20 after they do
    first = datetime(2024, 10, 27, 2, 40, tzinfo=berlin)
    second = datetime(2024, 10, 27, 2, 20, fold=1, tzinfo=berlin)
    a = Event("a", "A", first, timedelta(minutes=30)).occurrences(first, first + timedelta(hours=1))
    b = Event("b", "B", second, timedelta(minutes=30)).occurrences(second, second + timedelta(hours=1))
    assert find_conflicts(a + b) == []
    window_end = datetime(2024, 10, 27, 2, 40, tzinfo=UTC)
    slots = free_slots(a + b, first, window_end)
    assert [(s.astimezone(UTC).strftime("%H:%M"), e.strftime("%H:%M")) for s, e in slots] == [
        ("01:10", "02:20"),
        ("01:50", "02:40"),
    ]
