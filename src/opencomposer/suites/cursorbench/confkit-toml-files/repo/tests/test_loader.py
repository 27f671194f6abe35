import json

import pytest

from confkit import LoadError, Schema, ValidationErrors, env_layer, fields, load, merge, read_json, redact


@pytest.fixture
def schema():
    return Schema(
        {
            "debug": fields.Boolean(default=False),
            "workers": fields.Integer(default=2, minimum=1),
            "tags": fields.List(fields.String(), default=[]),
            "db": fields.Nested(
                Schema(
                    {
                        "host": fields.String(default="localhost"),
                        "port": fields.Integer(default=5432),
                        "password": fields.String(secret=True, required=False),
                    }
                )
            ),
        }
    )


def test_merge_is_deep_and_replaces_lists():
    base = {"db": {"host": "a", "port": 1}, "tags": ["x"]}
    merged = merge(base, {"db": {"port": 2}, "tags": ["y"]})
    assert merged == {"db": {"host": "a", "port": 2}, "tags": ["y"]}
    assert base["db"]["port"] == 1


def test_env_layer_nests_on_double_underscore():
    environ = {"APP_DEBUG": "yes", "APP_DB__PORT": "6543", "OTHER": "x", "APP_": "y", "APP_A____B": "z"}
    assert env_layer(environ, "APP_") == {"debug": "yes", "db": {"port": "6543"}}
    with pytest.raises(ValueError, match="prefix"):
        env_layer(environ, "")


def test_env_layer_ignores_conflicting_shapes():
    assert env_layer({"APP_DB": "x", "APP_DB__PORT": "1"}, "APP_") == {"db": "x"}


def test_load_layers_files_then_environment(schema, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"workers": 4, "db": {"host": "db.internal"}}))
    config = load(
        schema,
        {"workers": 3, "tags": ["a"]},
        files=(path,),
        environ={"APP_DB__PORT": "6543", "APP_TAGS": "b, c"},
        env_prefix="APP_",
    )
    assert config["workers"] == 4
    assert config["db"] == {"host": "db.internal", "port": 6543, "password": None}
    assert config["tags"] == ["b", "c"]


def test_load_reports_environment_errors_with_paths(schema):
    with pytest.raises(ValidationErrors) as info:
        load(schema, environ={"APP_WORKERS": "0", "APP_DB__PORT": "many"}, env_prefix="APP_")
    assert info.value.paths() == ["db.port", "workers"]


def test_read_json_errors(tmp_path):
    with pytest.raises(LoadError, match="not found"):
        read_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  'single quotes': 1\n}")
    with pytest.raises(LoadError, match="line 2"):
        read_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(LoadError, match="JSON object"):
        read_json(bad)


def test_redact_hides_secrets_recursively(schema):
    config = load(schema, {"db": {"password": "hunter2"}})
    assert redact(config, schema)["db"]["password"] == "***"
    assert config["db"]["password"] == "hunter2"
    assert redact(load(schema), schema)["db"]["password"] is None
