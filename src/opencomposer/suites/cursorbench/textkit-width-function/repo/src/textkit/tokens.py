"""Splitting text into words, sentences and n-grams.

Words keep internal apostrophes and hyphens ("don't", "well-known") and numbers with a
decimal point ("3.14"). Sentences end at ``.``, ``!`` or ``?`` followed by whitespace and
a capital letter, digit or quote, except after a known abbreviation.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"\d+(?:[.,]\d+)*|\w+(?:['’-]\w+)*")
_SENTENCE_END = re.compile(r"([.!?]+)([\"'”’)]*)\s+(?=[\"'“‘(]?[A-Z0-9])")

ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd", "no"}
)


def words(text: str, *, lower: bool = False) -> list[str]:
    """The words of ``text`` in order; ``lower`` case-folds them."""
    found = _WORD.findall(text)
    return [w.casefold() for w in found] if lower else found


def sentences(text: str) -> list[str]:
    """Split ``text`` into sentences, stripped of surrounding whitespace."""
    result: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        candidate = text[start : match.start(1)]
        last_word = candidate.rsplit(None, 1)[-1] if candidate.split() else ""
        if match.group(1) == "." and last_word.casefold().rstrip(".") in ABBREVIATIONS:
            continue
        result.append(text[start : match.end(2)].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        result.append(tail)
    return result


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """Consecutive ``n``-tuples of ``tokens``: ``ngrams("abc", 2) == [("a","b"), ("b","c")]``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def word_frequencies(text: str, *, stopwords: Iterable[str] = ()) -> Counter[str]:
    """Case-folded word counts, leaving out ``stopwords``."""
    excluded = {w.casefold() for w in stopwords}
    return Counter(w for w in words(text, lower=True) if w not in excluded)
