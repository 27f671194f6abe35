from datetime import timedelta

import pytest

from confkit import Schema, ValidationErrors, fields, validators


def check(field, value):
    """Validate one value through a single-field schema; return the value or the error messages."""
    schema = Schema({"x": field})
    try:
        return schema.validate({"x": value})["x"]
    except ValidationErrors as errors:
        return [str(e) for e in errors]


def test_string_constraints():
    field = fields.String(min_length=2, max_length=4, pattern=r"[a-z]+")
    assert check(field, "  abc ") == "abc"
    assert check(field, "a") == ["x: must be at least 2 characters long, got 1"]
    assert check(field, "ABCDE") == [
        "x: must be at most 4 characters long, got 5",
        "x: does not match [a-z]+: 'ABCDE'",
    ]
    assert check(field, 12) == ["x: expected a string, got int 12"]
    assert check(fields.String(strip=False), " a ") == " a "


def test_numbers():
    assert check(fields.Integer(minimum=1, maximum=10), "7") == 7
    assert check(fields.Integer(minimum=1), 0) == ["x: must be at least 1, got 0"]
    assert check(fields.Float(maximum=1.0), "1.5") == ["x: must be at most 1.0, got 1.5"]
    assert check(fields.Integer(), "seven") == ["x: not an integer: 'seven'"]


def test_boolean_duration_size():
    assert check(fields.Boolean(), "on") is True
    assert check(fields.Duration(), "1m") == timedelta(minutes=1)
    assert check(fields.Duration(minimum=timedelta(seconds=5)), "1s") == [
        "x: must be at least 0:00:05, got 0:00:01"
    ]
    assert check(fields.Size(), "1KiB") == 1024


def test_choice_returns_canonical_spelling():
    field = fields.Choice(["debug", "INFO", "warning"])
    assert check(field, "Info") == "INFO"
    assert check(field, "loud") == ["x: must be one of debug, INFO, warning, got 'loud'"]
    with pytest.raises(ValueError):
        fields.Choice([])


def test_list_items_have_indexed_paths():
    field = fields.List(fields.Integer(minimum=0), min_items=1)
    assert check(field, "1, 2,3") == [1, 2, 3]
    assert check(field, ["1", "-1", "x"]) == ["x[1]: must be at least 0, got -1", "x[2]: not an integer: 'x'"]
    assert check(field, []) == ["x: must have at least 1 item(s), got 0"]
    assert check(fields.List(fields.String(), max_items=1), ["a", "b"]) == [
        "x: must have at most 1 item(s), got 2"
    ]


def test_list_unique():
    field = fields.List(fields.String(), unique=True)
    assert check(field, ["a", "b", "a"]) == ["x[2]: duplicate item 'a'"]


def test_mapping():
    field = fields.Mapping(fields.Integer())
    assert check(field, {"a": "1", "b": 2}) == {"a": 1, "b": 2}
    assert check(field, {"a": "one"}) == ["x.a: not an integer: 'one'"]
    assert check(field, ["a"]) == ["x: expected a mapping, got list"]


def test_validators_run_after_coercion():
    field = fields.String(validators=[validators.hostname()])
    assert check(field, "db-1.example.com") == "db-1.example.com"
    assert check(field, "-bad-.com") == ["x: not a valid hostname: '-bad-.com'"]
    field = fields.String(validators=[validators.url()])
    assert check(field, "ftp://x") == ["x: not a http/https URL: 'ftp://x'"]
    field = fields.Integer(validators=[validators.one_of(1, 2), validators.in_range(maximum=1)])
    assert check(field, 2) == ["x: must be at most 1, got 2"]
    assert check(field, 3) == ["x: must be one of 1, 2, got 3", "x: must be at most 1, got 3"]


def test_custom_field():
    field = fields.custom("percent", lambda v: float(str(v).rstrip("%")) / 100)
    assert check(field, "25%") == 0.25
    assert field.type_name == "percent"
