from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from scheduler import Frequency, Rule, RuleError, between, occurrences, parse_rule


def dates(start, rule, n=10):
    return [d.strftime("%Y-%m-%d") for d in islice(occurrences(start, rule), n)]


def test_single_event_occurs_once(berlin):
    start = datetime(2024, 1, 1, 9, tzinfo=berlin)
    assert list(occurrences(start, None)) == [start]


def test_daily_with_interval_and_count(berlin):
    start = datetime(2024, 1, 30, 9, tzinfo=berlin)
    rule = Rule(Frequency.DAILY, interval=2, count=3)
    assert dates(start, rule) == ["2024-01-30", "2024-02-01", "2024-02-03"]


def test_weekly_defaults_to_start_weekday(berlin):
    start = datetime(2024, 1, 3, 9, tzinfo=berlin)  # a Wednesday
    assert dates(start, Rule(Frequency.WEEKLY, count=3)) == ["2024-01-03", "2024-01-10", "2024-01-17"]


def test_weekly_on_weekdays_starts_on_or_after_start(berlin):
    start = datetime(2024, 1, 3, 9, tzinfo=berlin)  # Wednesday
    rule = Rule(Frequency.WEEKLY, interval=2, weekdays=(0, 2, 4), count=5)
    assert dates(start, rule) == ["2024-01-03", "2024-01-05", "2024-01-15", "2024-01-17", "2024-01-19"]


def test_monthly_skips_months_without_the_day(berlin):
    start = datetime(2024, 1, 31, 9, tzinfo=berlin)
    rule = Rule(Frequency.MONTHLY, count=4)
    assert dates(start, rule) == ["2024-01-31", "2024-03-31", "2024-05-31", "2024-07-31"]


def test_yearly_on_leap_day(berlin):
    start = datetime(2024, 2, 29, 9, tzinfo=berlin)
    assert dates(start, Rule(Frequency.YEARLY, count=3)) == ["2024-02-29", "2028-02-29", "2032-02-29"]


def test_until_is_inclusive(berlin):
    start = datetime(2024, 1, 1, 9, tzinfo=berlin)
    rule = Rule(Frequency.DAILY, until=datetime(2024, 1, 3, 8, tzinfo=UTC))
    assert dates(start, rule) == ["2024-01-01", "2024-01-02", "2024-01-03"]
    rule = Rule(Frequency.DAILY, until=datetime(2024, 1, 3, 7, 59, tzinfo=UTC))
    assert dates(start, rule) == ["2024-01-01", "2024-01-02"]


def test_occurrences_keep_wall_time_across_dst(berlin):
    start = datetime(2024, 3, 29, 9, tzinfo=berlin)
    result = list(occurrences(start, Rule(Frequency.DAILY, count=4)))
    assert [d.hour for d in result] == [9, 9, 9, 9]
    assert [d.utcoffset() for d in result] == [timedelta(hours=h) for h in (1, 1, 2, 2)]
    in_utc = [d.astimezone(UTC) for d in result]
    assert in_utc[3] - in_utc[2] == timedelta(days=1)
    assert in_utc[2] - in_utc[1] == timedelta(hours=23)


def test_occurrence_in_dst_gap_moves_forward(berlin):
    start = datetime(2024, 3, 30, 2, 30, tzinfo=berlin)
    second = list(occurrences(start, Rule(Frequency.DAILY, count=2)))[1]
    assert (second.day, second.hour, second.minute) == (31, 3, 30)


def test_between_is_half_open(berlin):
    start = datetime(2024, 1, 1, 9, tzinfo=berlin)
    rule = Rule(Frequency.DAILY)
    found = between(
        start, rule, datetime(2024, 1, 2, 9, tzinfo=berlin), datetime(2024, 1, 4, 9, tzinfo=berlin)
    )
    assert [d.day for d in found] == [2, 3]


def test_rule_validation():
    with pytest.raises(RuleError, match="interval"):
        Rule(Frequency.DAILY, interval=0)
    with pytest.raises(RuleError, match="not both"):
        Rule(Frequency.DAILY, count=2, until=datetime(2024, 1, 1, tzinfo=UTC))
    with pytest.raises(RuleError, match="aware"):
        Rule(Frequency.DAILY, until=datetime(2024, 1, 1))
    with pytest.raises(RuleError, match="weekly"):
        Rule(Frequency.DAILY, weekdays=(1,))
    with pytest.raises(RuleError, match="0 \\(Monday\\)"):
        Rule(Frequency.WEEKLY, weekdays=(7,))
    assert Rule(Frequency.WEEKLY, weekdays=(4, 0, 4)).weekdays == (0, 4)


def test_parse_rule():
    rule = parse_rule("RRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,FR;COUNT=6")
    assert rule == Rule(Frequency.WEEKLY, interval=2, count=6, weekdays=(0, 4))
    rule = parse_rule("freq=daily;until=20240105")
    assert rule.until == datetime(2024, 1, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("INTERVAL=2", "no FREQ"),
        ("FREQ=HOURLY", "unsupported FREQ"),
        ("FREQ=DAILY;COUNT=x", "COUNT must be"),
        ("FREQ=WEEKLY;BYDAY=XX", "unknown BYDAY"),
        ("FREQ=DAILY;BYMONTH=1", "unsupported rule part"),
        ("FREQ=DAILY;FREQ=WEEKLY", "twice"),
        ("FREQ", "KEY=VALUE"),
        ("FREQ=DAILY;UNTIL=tomorrow", "UNTIL must be"),
    ],
    ids=["no-freq", "hourly", "bad-count", "bad-byday", "bymonth", "duplicate-freq", "no-value", "bad-until"],
)
def test_parse_rule_errors(text, message):
    with pytest.raises(RuleError, match=message):
        parse_rule(text)


def test_to_rrule_round_trips():
    for text in [
        "FREQ=DAILY",
        "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,WE;COUNT=4",
        "FREQ=YEARLY;UNTIL=20300101T000000Z",
    ]:
        assert parse_rule(text).to_rrule() == text
