import json
from datetime import timedelta

import pytest
from confkit import LoadError, Schema, fields, load


@pytest.fixture
def schema():
    return Schema(
        {
            "debug": fields.Boolean(default=False),
            "timeout": fields.Duration(default="30s"),
            "tags": fields.List(fields.String(), default=[]),
            "db": fields.Nested(
                Schema({"host": fields.String(default="localhost"), "port": fields.Integer(default=5432)})
            ),
        }
    )


def test_toml_file(schema, tmp_path):
    path = tmp_path / "app.toml"
    path.write_text('debug = true\ntimeout = "2m"\ntags = ["a", "b"]\n\n[db]\nport = 6543\n')
    config = load(schema, files=(path,))
    assert config == {
        "debug": True,
        "timeout": timedelta(minutes=2),
        "tags": ["a", "b"],
        "db": {"host": "localhost", "port": 6543},
    }


def test_json_and_toml_layer_in_order(schema, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"db": {"host": "db.internal", "port": 1}}))
    override = tmp_path / "override.TOML"
    override.write_text("[db]\nport = 2\n")
    config = load(schema, files=(base, override), environ={"APP_DEBUG": "yes"}, env_prefix="APP_")
    assert config["db"] == {"host": "db.internal", "port": 2}
    assert config["debug"] is True


def test_invalid_toml_names_the_file(schema, tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[db\nport = 1\n")
    with pytest.raises(LoadError, match="broken.toml"):
        load(schema, files=(path,))


def test_missing_toml_file(schema, tmp_path):
    with pytest.raises(LoadError, match="not found"):
        load(schema, files=(tmp_path / "nope.toml",))


def test_unknown_suffix_is_refused(schema, tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text('{"debug": true}\n')
    with pytest.raises(LoadError, match="yaml"):
        load(schema, files=(path,))
