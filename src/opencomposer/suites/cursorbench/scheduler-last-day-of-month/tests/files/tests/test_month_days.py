from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest
from scheduler import Event, RuleError, occurrences, parse_rule, to_ical


def dates(start, text, n=6):
    return [d.strftime("%Y-%m-%d") for d in islice(occurrences(start, parse_rule(text)), n)]


def test_last_day_of_every_month(berlin):
    start = datetime(2024, 1, 15, 9, tzinfo=berlin)
    assert dates(start, "FREQ=MONTHLY;BYMONTHDAY=-1;COUNT=5") == [
        "2024-01-31",
        "2024-02-29",
        "2024-03-31",
        "2024-04-30",
        "2024-05-31",
    ]


def test_wall_time_is_kept(berlin):
    start = datetime(2024, 2, 1, 9, tzinfo=berlin)
    march = list(islice(occurrences(start, parse_rule("FREQ=MONTHLY;BYMONTHDAY=-1")), 2))[1]
    assert (march.day, march.hour, march.utcoffset()) == (31, 9, timedelta(hours=2))


def test_several_days_and_interval(berlin):
    start = datetime(2024, 1, 10, 9, tzinfo=berlin)
    assert dates(start, "FREQ=MONTHLY;BYMONTHDAY=1,15", 4) == [
        "2024-01-15",
        "2024-02-01",
        "2024-02-15",
        "2024-03-01",
    ]
    start = datetime(2024, 1, 31, 9, tzinfo=berlin)
    assert dates(start, "FREQ=MONTHLY;INTERVAL=2;BYMONTHDAY=-1;COUNT=3") == [
        "2024-01-31",
        "2024-03-31",
        "2024-05-31",
    ]


def test_positive_days_skip_short_months_negative_days_do_not(berlin):
    start = datetime(2024, 1, 1, 9, tzinfo=berlin)
    assert dates(start, "FREQ=MONTHLY;BYMONTHDAY=31", 3) == ["2024-01-31", "2024-03-31", "2024-05-31"]
    assert dates(start, "FREQ=MONTHLY;BYMONTHDAY=-2", 3) == ["2024-01-30", "2024-02-28", "2024-03-30"]
    assert dates(start, "FREQ=MONTHLY;BYMONTHDAY=-1,30", 4) == [
        "2024-01-30",
        "2024-01-31",
        "2024-02-29",
        "2024-03-30",
    ]


def test_round_trips_through_rrule_text():
    for text in ["FREQ=MONTHLY;BYMONTHDAY=-1", "FREQ=MONTHLY;INTERVAL=3;BYMONTHDAY=1,15,-1;COUNT=9"]:
        rule = parse_rule(text)
        assert "BYMONTHDAY" in rule.to_rrule()
        assert parse_rule(rule.to_rrule()) == rule


def test_ical_export_keeps_the_month_day(berlin):
    event = Event(
        "rent",
        "Pay rent",
        datetime(2024, 1, 31, 9, tzinfo=berlin),
        timedelta(minutes=5),
        rule=parse_rule("FREQ=MONTHLY;BYMONTHDAY=-1"),
    )
    text = to_ical([event], stamp=datetime(2024, 1, 1, tzinfo=UTC))
    assert "BYMONTHDAY=-1" in text


@pytest.mark.parametrize(
    "value", ["0", "32", "-32", "x", "1,,2"], ids=["zero", "too-big", "too-small", "word", "empty"]
)
def test_bad_month_days(value):
    with pytest.raises(RuleError):
        parse_rule(f"FREQ=MONTHLY;BYMONTHDAY={value}")


def test_plain_monthly_rules_are_unchanged(berlin):
    start = datetime(2024, 1, 31, 9, tzinfo=berlin)
    assert dates(start, "FREQ=MONTHLY;COUNT=3") == ["2024-01-31", "2024-03-31", "2024-05-31"]
