import pytest
from confkit import Schema, ValidationErrors, fields

SERVER = Schema({"host": fields.String(), "port": fields.Integer(minimum=1)})


def paths(schema, document):
    with pytest.raises(ValidationErrors) as info:
        schema.validate(document)
    return info.value.paths()


def test_list_of_sections():
    schema = Schema({"servers": fields.List(fields.Nested(SERVER))})
    document = {"servers": [{"host": "a", "port": 1}, {"host": "b", "port": 0}, {"port": "x", "colour": 1}]}
    assert paths(schema, document) == [
        "servers[1].port",
        "servers[2].colour",
        "servers[2].host",
        "servers[2].port",
    ]


def test_nested_lists_and_mappings():
    schema = Schema(
        {"matrix": fields.List(fields.List(fields.Integer())), "limits": fields.Mapping(fields.Integer())}
    )
    assert paths(schema, {"matrix": [[1], [2, "x"]], "limits": {"cpu": 2, "memory": "lots"}}) == [
        "limits.memory",
        "matrix[1][1]",
    ]


def test_unknown_keys_in_nested_sections_keep_their_path():
    schema = Schema({"db": fields.Nested(Schema({"host": fields.String(default="h")}))})
    assert paths(schema, {"db": {"colour": "blue"}, "extra": 1}) == ["db.colour", "extra"]
