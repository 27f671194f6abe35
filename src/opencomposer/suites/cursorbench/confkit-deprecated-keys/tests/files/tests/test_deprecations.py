import warnings

import confkit
import pytest
from confkit import Schema, ValidationErrors, fields


def make_schema():
    return Schema(
        {
            "workers": fields.Integer(default=1, minimum=1),
            "legacy_mode": fields.Boolean(default=False, deprecated="it is always off now"),
            "db": fields.Nested(
                Schema({"host": fields.String(default="localhost")}, renamed={"hostname": "host"})
            ),
        },
        renamed={"threads": "workers"},
    )


def test_old_name_still_works_with_a_warning():
    with pytest.warns(confkit.ConfigWarning, match="threads.*workers"):
        config = make_schema().validate({"threads": "4"})
    assert config["workers"] == 4
    assert "threads" not in config


def test_renames_inside_sections_name_the_full_path():
    with pytest.warns(confkit.ConfigWarning, match="db.hostname"):
        config = make_schema().validate({"db": {"hostname": "db.internal"}})
    assert config["db"] == {"host": "db.internal"}


def test_errors_under_an_old_name_point_at_the_old_name():
    with pytest.warns(confkit.ConfigWarning), pytest.raises(ValidationErrors) as info:
        make_schema().validate({"threads": "0"})
    assert info.value.paths() == ["threads"]


def test_both_names_is_an_error():
    with pytest.raises(ValidationErrors) as info:
        make_schema().validate({"threads": 2, "workers": 3})
    assert info.value.paths() == ["threads"]
    assert "workers" in str(info.value)


def test_deprecated_field_warns_only_when_set():
    with pytest.warns(confkit.ConfigWarning, match="legacy_mode.*always off"):
        make_schema().validate({"legacy_mode": "yes"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_schema().validate({"workers": 2})["legacy_mode"] is False


def test_renamed_targets_must_exist():
    with pytest.raises(ValueError, match="nope"):
        Schema({"a": fields.Integer()}, renamed={"b": "nope"})


def test_describe_shows_deprecations():
    rows = {row.path: row for row in make_schema().describe()}
    assert rows["legacy_mode"].deprecated == "it is always off now"
    assert rows["workers"].deprecated is None


def test_config_warning_is_a_user_warning():
    assert issubclass(confkit.ConfigWarning, UserWarning)
