from datetime import timedelta

import pytest

from confkit import coerce


@pytest.mark.parametrize(
    ("text", "expected"),
    [("yes", True), ("OFF", False), (" 1 ", True), ("n", False), (True, True), (0, False)],
    ids=["yes", "OFF", "padded-1", "n", "bool-true", "int-0"],
)
def test_to_bool(text, expected):
    assert coerce.to_bool(text) is expected


@pytest.mark.parametrize("bad", ["maybe", "", 2, None])
def test_to_bool_rejects(bad):
    with pytest.raises(ValueError, match="not a boolean"):
        coerce.to_bool(bad)


def test_to_int():
    assert coerce.to_int("1_000") == 1000
    assert coerce.to_int(" -7 ") == -7
    assert coerce.to_int(42) == 42
    for bad in ["1.5", 1.5, True, "", "0x10"]:
        with pytest.raises(ValueError, match="not an integer"):
            coerce.to_int(bad)


def test_to_float():
    assert coerce.to_float("2.5") == 2.5
    assert coerce.to_float(3) == 3.0
    for bad in ["nan", "inf", False, "abc", None]:
        with pytest.raises(ValueError, match="not a number"):
            coerce.to_float(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("250ms", timedelta(milliseconds=250)),
        ("2d 4h", timedelta(days=2, hours=4)),
        ("1.5h", timedelta(minutes=90)),
        ("45", timedelta(seconds=45)),
        (10, timedelta(seconds=10)),
        (timedelta(minutes=1), timedelta(minutes=1)),
    ],
    ids=[
        "seconds",
        "hours-minutes",
        "millis",
        "days-hours-spaced",
        "fractional-hours",
        "bare-number",
        "int-seconds",
        "timedelta",
    ],
)
def test_parse_duration(text, expected):
    assert coerce.parse_duration(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "5 parsecs", "1h30", "h", "m5", None, True],
    ids=["empty", "parsecs", "trailing-number", "unit-only", "unit-first", "none", "bool"],
)
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="not a duration"):
        coerce.parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("10KB", 10_000),
        ("10KiB", 10_240),
        ("1.5G", 1_500_000_000),
        ("2 mib", 2 * 1024**2),
        (7, 7),
    ],
    ids=["bytes", "kilo", "kibi", "fractional-giga", "spaced-lower-mebi", "int"],
)
def test_parse_size(text, expected):
    assert coerce.parse_size(text) == expected


def test_parse_size_rejects():
    for bad in ["ten", "5XB", -1, 1.5]:
        with pytest.raises(ValueError):
            coerce.parse_size(bad)


def test_to_list():
    assert coerce.to_list(" a, b ,,c ") == ["a", "b", "c"]
    assert coerce.to_list(("x",)) == ["x"]
    with pytest.raises(ValueError, match="not a list"):
        coerce.to_list(5)
