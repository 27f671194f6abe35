import pytest

from textkit.slug import slugify, to_ascii, unique_slug


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello, World!", "hello-world"),
        ("Crème brûlée, 2 ways", "creme-brulee-2-ways"),
        ("  --Already--slugged--  ", "already-slugged"),
        ("Straße in Łódź", "strasse-in-lodz"),
        ("Æsop's Fables", "aesop-s-fables"),
        ("日本語", ""),
    ],
    ids=["punctuation", "accents", "separators", "transliteration", "ligature", "no-latin"],
)
def test_slugify(text, expected):
    assert slugify(text) == expected


def test_slugify_options():
    assert slugify("Hello World", separator="_") == "hello_world"
    assert slugify("Hello World", lowercase=False) == "Hello-World"


def test_max_length_cuts_at_word_boundary():
    assert slugify("The quick brown fox", max_length=15) == "the-quick-brown"
    assert slugify("The quick brown fox", max_length=14) == "the-quick"
    assert slugify("Supercalifragilistic", max_length=5) == "super"
    with pytest.raises(ValueError):
        slugify("x", max_length=0)


def test_stopwords_are_dropped_unless_nothing_remains():
    assert slugify("The Art of War", stopwords=["the", "of"]) == "art-war"
    assert slugify("The Of", stopwords=["the", "of"]) == "the-of"


def test_to_ascii():
    assert to_ascii("naïve façade ø") == "naive facade o"


def test_unique_slug_numbers_duplicates():
    assert unique_slug("Hello World", []) == "hello-world"
    assert unique_slug("Hello World", ["hello-world", "hello-world-2"]) == "hello-world-3"
    assert unique_slug("Hello World", ["hello_world"], separator="_") == "hello_world_2"


def test_unique_slug_respects_max_length():
    assert unique_slug("Hello World", ["hello-world"], max_length=11) == "hello-2"
