from datetime import datetime, time, timedelta

import pytest
from scheduler import Calendar, Event, Frequency, Rule

HOUR = timedelta(hours=1)


@pytest.fixture
def calendar(berlin):
    # 2024-01-01 is a Monday
    return Calendar(
        [
            Event(
                "standup",
                "Standup",
                datetime(2024, 1, 1, 9, tzinfo=berlin),
                timedelta(minutes=30),
                rule=Rule(Frequency.DAILY),
            ),
            Event("planning", "Planning", datetime(2024, 1, 1, 10, tzinfo=berlin), 2 * HOUR),
            Event("offsite", "Offsite", datetime(2024, 1, 2, 8, tzinfo=berlin), 9 * HOUR),
        ]
    )


def hm(value):
    return value.strftime("%a %H:%M")


def find(calendar, duration, start, end, zone, **options):
    slot = calendar.find_slot(duration, start, end, zone, **options)
    return None if slot is None else (hm(slot[0]), hm(slot[1]))


def test_first_gap_that_fits(calendar, berlin):
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 8, tzinfo=berlin))
    assert find(calendar, timedelta(minutes=30), *window, berlin) == ("Mon 09:30", "Mon 10:00")
    assert find(calendar, HOUR, *window, berlin) == ("Mon 12:00", "Mon 13:00")


def test_busy_days_are_skipped(calendar, berlin):
    window = (datetime(2024, 1, 2, tzinfo=berlin), datetime(2024, 1, 8, tzinfo=berlin))
    assert find(calendar, 3 * HOUR, *window, berlin) == ("Wed 09:30", "Wed 12:30")


def test_slot_never_crosses_closing_time(calendar, berlin):
    window = (datetime(2024, 1, 1, 16, tzinfo=berlin), datetime(2024, 1, 8, tzinfo=berlin))
    assert find(calendar, 2 * HOUR, *window, berlin) == ("Wed 09:30", "Wed 11:30")


def test_window_start_inside_working_hours(calendar, berlin):
    window = (datetime(2024, 1, 1, 13, 15, tzinfo=berlin), datetime(2024, 1, 2, tzinfo=berlin))
    assert find(calendar, HOUR, *window, berlin) == ("Mon 13:15", "Mon 14:15")


def test_weekends_are_not_working_days(calendar, berlin):
    window = (datetime(2024, 1, 6, tzinfo=berlin), datetime(2024, 1, 9, tzinfo=berlin))
    assert find(calendar, HOUR, *window, berlin) == ("Mon 09:30", "Mon 10:30")
    assert find(calendar, HOUR, *window, berlin, weekdays=[5, 6]) == ("Sat 09:30", "Sat 10:30")


def test_custom_working_hours(calendar, berlin):
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 2, tzinfo=berlin))
    assert find(calendar, HOUR, *window, berlin, working_hours=(time(7), time(9))) == (
        "Mon 07:00",
        "Mon 08:00",
    )


def test_hours_are_read_in_the_requested_zone(calendar, berlin, new_york):
    # 09:00-17:00 in New York is 15:00-23:00 in Berlin: the Berlin planning meeting is irrelevant
    window = (datetime(2024, 1, 1, tzinfo=new_york), datetime(2024, 1, 8, tzinfo=new_york))
    slot = calendar.find_slot(8 * HOUR, *window, new_york)
    assert slot is not None
    start, end = slot
    assert (hm(start), hm(end)) == ("Mon 09:00", "Mon 17:00")
    assert start.utcoffset() == timedelta(hours=-5)


def test_nothing_fits(calendar, berlin):
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 3, tzinfo=berlin))
    assert calendar.find_slot(8 * HOUR, *window, berlin) is None


def test_bad_working_hours(calendar, berlin):
    window = (datetime(2024, 1, 1, tzinfo=berlin), datetime(2024, 1, 3, tzinfo=berlin))
    with pytest.raises(ValueError):
        calendar.find_slot(HOUR, *window, berlin, working_hours=(time(17), time(9)))
