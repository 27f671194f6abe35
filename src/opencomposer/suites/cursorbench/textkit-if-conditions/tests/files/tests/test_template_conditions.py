import pytest
from textkit import Template, TemplateSyntaxError, render


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("n == 3", "yes"),
        ("n != 3", "no"),
        ("n < 4", "yes"),
        ("n <= 2", "no"),
        ("n > 2.5", "yes"),
        ("n >= 4", "no"),
        ("name == 'ada'", "yes"),
        ("'d' in name", "yes"),
        ("'z' not in name", "yes"),
        ("tags|length > 1", "yes"),
        ("name|upper == 'ADA'", "yes"),
        ("n == limit", "yes"),
    ],
    ids=[
        "eq",
        "ne",
        "lt",
        "le",
        "gt-float",
        "ge",
        "string-eq",
        "in",
        "not-in",
        "filter-left",
        "filter-eq",
        "two-paths",
    ],
)
def test_comparisons(condition, expected):
    source = "{% if " + condition + " %}yes{% else %}no{% endif %}"
    assert render(source, n=3, limit=3, name="ada", tags=["x", "y"]) == expected


def test_not_and_or_precedence():
    source = "{% if not a and b or c %}T{% else %}F{% endif %}"
    assert render(source, a=False, b=True, c=False) == "T"
    assert render(source, a=True, b=True, c=False) == "F"
    assert render(source, a=True, b=False, c=True) == "T"
    assert render("{% if a or b and c %}T{% else %}F{% endif %}", a=True, b=False, c=False) == "T"
    assert render("{% if not not a %}T{% endif %}", a=1) == "T"


def test_and_or_short_circuit():
    template = Template("{% if user and user.name == 'bo' %}hi{% endif %}", strict=True)
    assert template.render(user=None) == ""
    template = Template("{% if fallback or user.name %}ok{% endif %}", strict=True)
    assert template.render(fallback=True) == "ok"


def test_elif_chain():
    source = "{% if n > 10 %}big{% elif n > 5 %}medium{% elif n > 0 %}small{% else %}none{% endif %}"
    assert [render(source, n=n) for n in (11, 6, 1, 0)] == ["big", "medium", "small", "none"]


def test_elif_without_else_and_nesting():
    source = "{% for n in ns %}{% if n == 1 %}a{% elif n == 2 %}b{% endif %}{% endfor %}"
    assert render(source, ns=[1, 2, 3, 1]) == "aba"


def test_uncomparable_values_are_false():
    assert render("{% if missing > 3 %}T{% else %}F{% endif %}") == "F"
    assert render("{% if 'a' in missing %}T{% else %}F{% endif %}") == "F"


def test_plain_truthiness_still_works():
    assert render("{% if items %}some{% endif %}{% if not items %}none{% endif %}", items=[]) == "none"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{% if a == %}x{% endif %}", "expected a value"),
        ("{% if a b %}x{% endif %}", "unexpected 'b'"),
        ("{% if a %}x{% else %}y{% elif b %}z{% endif %}", "'elif' after 'else'"),
        ("{% elif a %}", "'elif' outside"),
        ("{% if a %}{% else %}{% else %}{% endif %}", "'else' after 'else'"),
        ("{% if and %}x{% endif %}", "expected a value"),
    ],
    ids=["missing-right", "junk", "elif-after-else", "stray-elif", "double-else", "keyword-only"],
)
def test_condition_syntax_errors(source, message):
    with pytest.raises(TemplateSyntaxError, match=message):
        Template(source)
