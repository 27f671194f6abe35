from datetime import timedelta

import pytest

from confkit import Schema, ValidationErrors, fields


@pytest.fixture
def schema():
    return Schema(
        {
            "name": fields.String(description="service name"),
            "debug": fields.Boolean(default=False),
            "timeout": fields.Duration(default="30s"),
            "log_file": fields.String(required=False),
            "db": fields.Nested(
                Schema(
                    {
                        "host": fields.String(),
                        "port": fields.Integer(default=5432, minimum=1, maximum=65535),
                        "password": fields.String(secret=True, default="changeme"),
                    }
                )
            ),
            "servers": fields.List(
                fields.Nested(Schema({"host": fields.String(), "port": fields.Integer(minimum=1)})),
            ),
        }
    )


def test_valid_document_gets_defaults_and_types(schema):
    config = schema.validate({"name": "api", "db": {"host": "h"}, "servers": [{"host": "a", "port": "80"}]})
    assert config == {
        "name": "api",
        "debug": False,
        "timeout": timedelta(seconds=30),
        "log_file": None,
        "db": {"host": "h", "port": 5432, "password": "changeme"},
        "servers": [{"host": "a", "port": 80}],
    }


def test_every_error_is_reported_with_its_path(schema):
    with pytest.raises(ValidationErrors) as info:
        schema.validate(
            {
                "debug": "perhaps",
                "db": {"port": 0},
                "servers": [{"host": "a", "port": 1}, {"port": "x"}],
                "colour": "blue",
            }
        )
    assert info.value.paths() == [
        "colour",
        "db.host",
        "db.port",
        "debug",
        "name",
        "servers[1].host",
        "servers[1].port",
    ]
    messages = {str(e) for e in info.value}
    assert "colour: unknown key (allowed: name, debug, timeout, log_file, db, servers)" in messages
    assert "servers[1].port: not an integer: 'x'" in messages
    assert "name: is required" in messages


def test_missing_nested_section_uses_its_defaults():
    schema = Schema({"db": fields.Nested(Schema({"port": fields.Integer(default=1)}))})
    assert schema.validate({}) == {"db": {"port": 1}}


def test_non_mapping_document(schema):
    with pytest.raises(ValidationErrors, match="<root>: expected a mapping, got list"):
        schema.validate([])
    with pytest.raises(ValidationErrors, match="db: expected a mapping, got str"):
        schema.validate({"name": "x", "db": "postgres://", "servers": []})


def test_allow_unknown_passes_keys_through():
    schema = Schema({"a": fields.Integer()}, allow_unknown=True)
    assert schema.validate({"a": "1", "extra": [1]}) == {"a": 1, "extra": [1]}


def test_field_names_are_checked():
    with pytest.raises(ValueError, match="no dots"):
        Schema({"a.b": fields.Integer()})


def test_describe_flattens_and_hides_secrets(schema):
    rows = {row.path: row for row in schema.describe()}
    assert list(rows)[:5] == ["name", "debug", "timeout", "log_file", "db.host"]
    assert rows["db.port"].default == 5432 and not rows["db.port"].required
    assert rows["db.password"].default == "***" and rows["db.password"].secret
    assert rows["name"].required and rows["name"].description == "service name"
    assert rows["servers"].type_name == "list"
