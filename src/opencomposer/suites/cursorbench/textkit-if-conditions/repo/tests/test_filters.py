from textkit import register, render
from textkit.filters import FILTERS


def test_builtin_text_filters():
    assert render("{{ s|title }}", s="ada lovelace's notes") == "Ada Lovelace's Notes"
    assert render("{{ s|lower }}", s="MiXeD") == "mixed"
    assert render("{{ s|escape }}", s='<a href="x">&</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"


def test_case_and_slug_filters():
    assert render("{{ s|snake }} {{ s|kebab }} {{ s|camel }}", s="Parse HTTP Response") == (
        "parse_http_response parse-http-response parseHttpResponse"
    )
    assert render("{{ s|slugify }}", s="Crème brûlée!") == "creme-brulee"


def test_collection_filters():
    assert render("{{ xs|length }} {{ xs|first }} {{ xs|last }}", xs=[3, 4, 5]) == "3 3 5"
    assert render("{{ xs|first }}{{ xs|last }}", xs=[]) == ""
    assert render("{{ g|length }}", g=(c for c in "abc")) == "3"


def test_truncate():
    assert render("{{ s|truncate:12 }}", s="Hello there big world") == "Hello there…"


def test_register_custom_filter():
    @register("reverse")
    def reverse(value):
        return str(value)[::-1]

    try:
        assert render("{{ s|reverse|upper }}", s="abc") == "CBA"
    finally:
        del FILTERS["reverse"]
