import pytest
from confkit import Schema, ValidationErrors, fields, load

SECRET = "hunter2-Pa$$"


def errors_for(schema, document, **options):
    with pytest.raises(ValidationErrors) as info:
        if options:
            load(schema, document, **options)
        else:
            schema.validate(document)
    return info.value


def assert_hidden(errors, value, path):
    text = str(errors)
    assert value not in text
    assert value not in repr(errors)
    assert all(value not in e.message and value not in str(e) for e in errors)
    assert path in errors.paths()


def test_pattern_failure_does_not_show_a_secret():
    schema = Schema({"password": fields.String(secret=True, pattern=r"[a-z0-9]+")})
    assert_hidden(errors_for(schema, {"password": SECRET}), SECRET, "password")


def test_coercion_failure_does_not_show_a_secret():
    schema = Schema({"db": fields.Nested(Schema({"pin": fields.Integer(secret=True)}))})
    assert_hidden(errors_for(schema, {"db": {"pin": "12ab34"}}), "12ab34", "db.pin")


def test_range_failure_does_not_show_a_secret_number():
    schema = Schema({"pin": fields.Integer(secret=True, maximum=999)})
    errors = errors_for(schema, {"pin": 4721})
    assert_hidden(errors, "4721", "pin")
    assert "999" in str(errors)


def test_validator_failure_does_not_show_a_secret():
    schema = Schema({"token": fields.String(secret=True, validators=[lambda v: int(v)])})
    assert_hidden(errors_for(schema, {"token": "tok_live_abc"}), "tok_live_abc", "token")


def test_secret_list_items_are_hidden():
    schema = Schema({"keys": fields.List(fields.String(secret=True, pattern="[a-z]+"), unique=True)})
    errors = errors_for(schema, {"keys": ["secretkey", "BadKey1", "secretkey"]})
    assert_hidden(errors, "BadKey1", "keys[1]")
    assert_hidden(errors, "secretkey", "keys[2]")


def test_secrets_from_the_environment_are_hidden():
    schema = Schema({"db": fields.Nested(Schema({"password": fields.String(secret=True, pattern="[a-z]+")}))})
    errors = errors_for(schema, {}, environ={"APP_DB__PASSWORD": SECRET}, env_prefix="APP_")
    assert_hidden(errors, SECRET, "db.password")


def test_other_fields_still_show_their_values():
    schema = Schema(
        {"password": fields.String(secret=True, pattern="[a-z]+"), "port": fields.Integer(maximum=10)}
    )
    errors = errors_for(schema, {"password": SECRET, "port": "99"})
    assert "got 99" in str(errors)
    assert SECRET not in str(errors)
