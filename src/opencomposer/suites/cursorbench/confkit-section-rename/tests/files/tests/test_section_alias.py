import warnings

import pytest
from confkit import Schema, fields, load, redact


def inner():
    return Schema({"port": fields.Integer(default=1), "key": fields.String(secret=True, default="k")})


def test_section_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = Schema({"db": fields.Section(inner())})
        assert schema.validate({}) == {"db": {"port": 1, "key": "k"}}


def test_nested_still_works_but_warns():
    with pytest.warns(DeprecationWarning, match="Section"):
        field = fields.Nested(inner())
    assert isinstance(field, fields.Section)
    schema = Schema({"db": field})
    assert schema.validate({"db": {"port": "2"}}) == {"db": {"port": 2, "key": "k"}}
    assert [row.path for row in schema.describe()] == ["db.port", "db.key"]
    assert redact(load(schema), schema)["db"]["key"] == "***"


def test_describe_and_redact_with_sections():
    schema = Schema({"db": fields.Section(inner())})
    assert [row.path for row in schema.describe()] == ["db.port", "db.key"]
    assert redact(load(schema), schema) == {"db": {"port": 1, "key": "***"}}
