import pytest
from textkit import Template, TemplateSyntaxError, render


def test_index_and_index0():
    source = "{% for x in xs %}{{ loop.index }}:{{ loop.index0 }}:{{ x }} {% endfor %}"
    assert render(source, xs=["a", "b", "c"]) == "1:0:a 2:1:b 3:2:c "


def test_first_last_and_length():
    source = (
        "{% for x in xs %}{% if loop.first %}[{% endif %}{{ x }}"
        "{% if not loop.last %}, {% else %}]{% endif %}{% endfor %}"
    )
    assert render(source, xs=[1, 2, 3]) == "[1, 2, 3]"
    assert render(source, xs=[7]) == "[7]"
    assert render("{% for x in xs %}{{ loop.length }}{% endfor %}", xs="ab") == "22"


def test_revindex_counts_down():
    assert render("{% for x in xs %}{{ loop.revindex }}{% endfor %}", xs=[0, 0, 0]) == "321"


def test_generators_have_a_length():
    source = "{% for x in xs %}{{ loop.index }}/{{ loop.length }} {% endfor %}"
    assert render(source, xs=(c for c in "ab")) == "1/2 2/2 "


def test_inner_loop_shadows_outer_loop():
    source = (
        "{% for row in rows %}"
        "{% for cell in row %}{{ loop.index }}{% endfor %}"
        "({{ loop.index }}) "
        "{% endfor %}"
    )
    assert render(source, rows=[[1, 2], [3, 4, 5]]) == "12(1) 123(2) "


def test_loop_is_not_visible_after_the_loop():
    assert render("{% for x in xs %}{% endfor %}[{{ loop.index }}]", xs=[1]) == "[]"


@pytest.mark.parametrize("empty", [[], None, ()], ids=["list", "none", "tuple"])
def test_else_renders_for_empty_sequences(empty):
    source = "{% for x in xs %}{{ x }}{% else %}nothing{% endfor %}"
    assert render(source, xs=empty) == "nothing"
    assert render(source, xs=[1, 2]) == "12"


def test_for_else_nested_in_if():
    source = "{% if show %}{% for x in xs %}{{ x }}{% else %}-{% endfor %}{% else %}hidden{% endif %}"
    assert render(source, show=True, xs=[]) == "-"
    assert render(source, show=False, xs=[1]) == "hidden"


def test_second_else_is_an_error():
    with pytest.raises(TemplateSyntaxError) as info:
        Template("{% for x in xs %}a{% else %}b{% else %}c{% endfor %}")
    assert "'else' outside" in str(info.value)
