import pytest

from confkit import ValidationError, ValidationErrors, format_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ((), "<root>"),
        (("db",), "db"),
        (("db", "port"), "db.port"),
        (("servers", 2, "port"), "servers[2].port"),
        (("matrix", 0, 1), "matrix[0][1]"),
    ],
)
def test_format_path(path, expected):
    assert format_path(path) == expected


def test_validation_errors_sort_and_count():
    errors = ValidationErrors([ValidationError(("b",), "bad"), ValidationError(("a", 0), "worse")])
    assert errors.paths() == ["a[0]", "b"]
    assert str(errors) == "2 configuration errors:\n  a[0]: worse\n  b: bad"
    assert len(errors) == 2 and [e.message for e in errors] == ["worse", "bad"]


def test_validation_errors_needs_errors():
    with pytest.raises(ValueError):
        ValidationErrors([])
    assert str(ValidationErrors([ValidationError((), "x")])) == "1 configuration error:\n  <root>: x"
