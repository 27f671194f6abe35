from datetime import UTC, datetime, timedelta, timezone

import pytest

from scheduler import UnknownTimeZone, get_zone, localize, to_zone
from scheduler.timezones import add_elapsed, as_utc, elapsed, exists, utc_offset_hours, zone_name


def test_get_zone():
    assert get_zone("Europe/Berlin").key == "Europe/Berlin"
    with pytest.raises(UnknownTimeZone, match="Mars/Olympus"):
        get_zone("Mars/Olympus")


def test_localize_ordinary_time(berlin):
    value = localize(datetime(2024, 7, 1, 9, 0), berlin)
    assert value.utcoffset() == timedelta(hours=2)
    assert value.hour == 9


def test_localize_moves_times_in_the_gap_forward(berlin):
    assert not exists(datetime(2024, 3, 31, 2, 30), berlin)
    value = localize(datetime(2024, 3, 31, 2, 30), berlin)
    assert (value.hour, value.minute) == (3, 30)
    assert value.utcoffset() == timedelta(hours=2)


def test_localize_picks_first_of_repeated_times(berlin):
    value = localize(datetime(2024, 10, 27, 2, 30), berlin)
    assert value.utcoffset() == timedelta(hours=2)
    assert value.astimezone(UTC).hour == 0


def test_localize_rejects_aware(berlin):
    with pytest.raises(ValueError, match="naive"):
        localize(datetime(2024, 1, 1, tzinfo=UTC), berlin)


def test_to_zone_keeps_the_instant(berlin, new_york):
    value = datetime(2024, 1, 15, 17, 0, tzinfo=berlin)
    converted = to_zone(value, new_york)
    assert converted == value
    assert converted.hour == 11
    with pytest.raises(ValueError):
        to_zone(datetime(2024, 1, 1), new_york)


def test_zone_name_and_offset(berlin):
    assert zone_name(datetime(2024, 1, 1, tzinfo=berlin)) == "Europe/Berlin"
    assert zone_name(datetime(2024, 1, 1, tzinfo=UTC)) == "UTC"
    with pytest.raises(ValueError, match="fixed offset"):
        zone_name(datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=3))))
    assert utc_offset_hours(datetime(2024, 1, 1, tzinfo=get_zone("Asia/Kolkata"))) == 5.5


def test_elapsed_time_arithmetic_goes_through_utc(berlin):
    start = datetime(2024, 3, 31, 1, 30, tzinfo=berlin)
    end = add_elapsed(start, timedelta(hours=3))
    assert (end.hour, end.minute, end.utcoffset()) == (5, 30, timedelta(hours=2))
    assert elapsed(start, end) == timedelta(hours=3)
    assert end - start == timedelta(hours=4)  # plain datetime arithmetic uses wall-clock readings
    assert as_utc(end) == datetime(2024, 3, 31, 3, 30, tzinfo=UTC)
    with pytest.raises(ValueError):
        as_utc(datetime(2024, 1, 1))
