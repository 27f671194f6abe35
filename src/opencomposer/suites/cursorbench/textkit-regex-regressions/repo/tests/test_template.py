from dataclasses import dataclass

import pytest

from textkit import Template, TemplateSyntaxError, UndefinedError, render


@dataclass
class User:
    name: str
    tags: list[str]
    _secret: str = "hidden"


def test_variables_and_dotted_paths():
    user = User("ada", ["math", "poetry"])
    assert render("{{ user.name }} likes {{ user.tags.1 }}", user=user) == "ada likes poetry"
    assert render("{{ a.b.c }}", a={"b": {"c": 3}}) == "3"


def test_missing_values_render_empty_unless_strict():
    assert render("[{{ nope }}][{{ user.nope }}][{{ items.9 }}]", user={}, items=[1]) == "[][][]"
    with pytest.raises(UndefinedError, match="'user.nope'"):
        Template("{{ user.nope }}", strict=True).render(user={})


def test_private_attributes_are_not_reachable():
    assert render("{{ user._secret }}", user=User("ada", [])) == ""


def test_none_renders_empty():
    assert render("{{ value }}", value=None) == ""


def test_filters_chain_with_arguments():
    source = '{{ name|default:"anonymous"|upper }} / {{ tags|join:" + " }}'
    assert render(source, name="", tags=["a", "b"]) == "ANONYMOUS / a + b"


def test_filter_argument_can_be_a_variable():
    assert render("{{ items|join:sep }}", items=[1, 2], sep="-") == "1-2"


def test_literals():
    assert render("{{ 'it\\'s' }} {{ 42 }} {{ 1.5 }}") == "it's 42 1.5"


def test_if_else_and_not():
    source = "{% if user %}hi {{ user }}{% else %}who?{% endif %}"
    assert render(source, user="bo") == "hi bo"
    assert render(source, user="") == "who?"
    assert render("{% if not items %}empty{% endif %}", items=[]) == "empty"


def test_for_loop_scopes_its_variable():
    source = "{% for t in tags %}<{{ t }}>{% endfor %}{{ t }}"
    assert render(source, tags=["x", "y"]) == "<x><y>"
    assert render(source, tags=None) == ""


def test_nested_blocks():
    source = (
        "{% for row in rows %}{% for c in row %}"
        "{% if c %}{{ c }}{% else %}.{% endif %}"
        "{% endfor %};{% endfor %}"
    )
    assert render(source, rows=[[1, 0], [0, 2]]) == "1.;.2;"


def test_comments_are_dropped_and_context_is_merged():
    template = Template("{# note #}{{ a }}{{ b }}")
    assert template.render({"a": 1, "b": 2}, b=3) == "13"


@pytest.mark.parametrize(
    ("source", "message", "line"),
    [
        ("{% if x %}", "'if' block opened here is never closed", 1),
        ("a\n{% endfor %}", "unexpected 'endfor'", 2),
        ("{% else %}", "'else' outside", 1),
        ("x\n\n{% while y %}", "unknown tag 'while'", 3),
        ("{{ a|upper: }}", "missing its argument", 1),
        ("{{ a b }}", "expected '|filter'", 1),
        ("{% for x of y %}", "expected 'for NAME in EXPR'", 1),
        ("{{ }}", "expected a value", 1),
    ],
    ids=[
        "unclosed-if",
        "stray-endfor",
        "stray-else",
        "unknown-tag",
        "missing-filter-arg",
        "missing-pipe",
        "bad-for",
        "empty-output",
    ],
)
def test_syntax_errors_name_the_line(source, message, line):
    with pytest.raises(TemplateSyntaxError) as info:
        Template(source)
    assert message in str(info.value)
    assert info.value.line == line


def test_unknown_filter_lists_known_ones():
    with pytest.raises(KeyError, match="unknown filter 'shout'.*upper"):
        render("{{ a|shout }}", a=1)
