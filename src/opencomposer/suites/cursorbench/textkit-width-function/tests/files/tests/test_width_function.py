import pytest
from textkit import wrapping

CJK = "日本語 テキスト です"


def test_wrap_and_fill_take_a_width_function():
    assert wrapping.wrap(CJK, 8) == ["日本語", "テキスト", "です"]
    assert wrapping.wrap(CJK, 8, width_of=len) == ["日本語 テキスト", "です"]
    assert wrapping.fill(CJK, 8, width_of=len) == "日本語 テキスト\nです"


def test_long_words_are_split_by_the_given_width():
    assert wrapping.wrap("日本語テキスト", 4) == ["日本", "語テ", "キス", "ト"]
    assert wrapping.wrap("日本語テキスト", 4, width_of=len) == ["日本語テ", "キスト"]


def test_indents_are_measured_with_it_too():
    def stars(text):
        return len(text) + 2 * text.count("*")

    assert wrapping.wrap("aa bb cc", 6, indent="*", width_of=stars) == ["*aa", "*bb", "*cc"]
    with pytest.raises(ValueError):
        wrapping.wrap("aa", 3, indent="*", width_of=stars)


def test_fill_paragraphs():
    text = f"{CJK}\n\n{CJK}"
    assert wrapping.fill_paragraphs(text, 8, width_of=len) == "日本語 テキスト\nです\n\n日本語 テキスト\nです"


def test_justify():
    assert wrapping.justify("日本 語", 8) == "日本  語"
    assert wrapping.justify("日本 語", 8, width_of=len) == "日本     語"


def test_shorten():
    assert wrapping.shorten(CJK, 10) == "日本語…"
    assert wrapping.shorten(CJK, 10, width_of=len) == "日本語 テキスト…"
    assert wrapping.shorten("日本語テキスト", 5) == "日本…"
    assert wrapping.shorten("日本語テキスト", 5, width_of=len) == "日本語テ…"


def test_defaults_are_unchanged():
    assert wrapping.wrap("The quick brown fox", 10) == ["The quick", "brown fox"]
    assert wrapping.shorten("Hello   there big world", 12) == "Hello there…"
