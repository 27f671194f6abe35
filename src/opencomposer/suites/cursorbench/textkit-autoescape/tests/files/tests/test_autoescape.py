import textkit
from textkit import Template, render


def test_off_by_default():
    assert render("{{ x }}", x="<b>") == "<b>"
    assert Template("{{ x }}").autoescape is False


def test_values_are_escaped_but_template_text_is_not():
    template = Template("<p title='{{ t }}'>{{ body }}</p>", autoescape=True)
    assert template.render(t="a'b", body="1 < 2 & 3") == "<p title='a&#x27;b'>1 &lt; 2 &amp; 3</p>"


def test_filter_output_is_escaped_too():
    assert render("{{ xs|join:'<br>' }}", xs=["a", "b"], autoescape=True) == "a&lt;br&gt;b"


def test_safe_filter_marks_trusted_html():
    assert render("{{ html|safe }}", html="<em>hi</em>", autoescape=True) == "<em>hi</em>"
    assert render("[{{ missing|safe }}]", autoescape=True) == "[]"


def test_markup_values_are_not_escaped():
    assert render("{{ x }}", x=textkit.Markup("<i>ok</i>"), autoescape=True) == "<i>ok</i>"


def test_escape_filter_does_not_double_escape():
    assert render("{{ x|escape }}", x="&", autoescape=True) == "&amp;"
    assert render("{{ x|escape|escape }}", x="<", autoescape=False) == "&lt;"


def test_markup_is_a_string():
    value = textkit.Markup("<b>")
    assert isinstance(value, str) and value == "<b>"
    assert value.__html__() == "<b>"


def test_non_string_values_and_none():
    assert render("{{ n }}|{{ none }}", n=3, none=None, autoescape=True) == "3|"
