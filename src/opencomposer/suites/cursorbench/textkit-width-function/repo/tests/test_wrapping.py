import pytest

from textkit.wrapping import display_width, fill, fill_paragraphs, justify, shorten, wrap


def test_wrap_greedy():
    text = "The quick brown fox jumps over the lazy dog"
    assert wrap(text, 10) == ["The quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_wrap_collapses_whitespace():
    assert wrap("a\n\n  b\tc", 80) == ["a b c"]
    assert wrap("", 10) == []


def test_wrap_indents_count_towards_width():
    lines = wrap("one two three four five", 12, indent="* ", subsequent_indent="  ")
    assert lines == ["* one two", "  three four", "  five"]
    assert all(len(line) <= 12 for line in lines)


def test_wrap_breaks_long_words():
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    assert wrap("abcdefghij xy", 4, break_long_words=False) == ["abcdefghij", "xy"]


def test_wrap_rejects_width_that_leaves_no_room():
    with pytest.raises(ValueError, match="no room"):
        wrap("text", 2, indent="  ")


def test_wide_characters_take_two_columns():
    assert display_width("日本") == 4
    assert wrap("日本語 テキスト", 8) == ["日本語", "テキスト"]


def test_fill_and_paragraphs():
    assert fill("aa bb cc", 5) == "aa bb\ncc"
    text = "one two\nthree\n\n\n  four five  "
    assert fill_paragraphs(text, 9) == "one two\nthree\n\nfour five"


def test_justify_spreads_extra_spaces_left_first():
    assert justify("a b c", 8) == "a   b  c"
    assert justify("ab c d e", 10) == "ab  c  d e"
    assert justify("single", 10) == "single"
    with pytest.raises(ValueError):
        justify("too wide here", 5)


def test_shorten():
    assert shorten("Hello   there big world", 12) == "Hello there…"
    assert shorten("short", 10) == "short"
    assert shorten("Supercalifragilistic", 6) == "Super…"
    assert shorten("a b c d", 5, placeholder="...") == "a..."
