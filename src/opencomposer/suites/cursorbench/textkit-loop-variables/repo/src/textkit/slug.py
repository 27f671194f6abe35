"""URL slugs from arbitrary Unicode text.

Accented letters lose their accents (NFKD decomposition, then combining marks dropped),
a few letters that do not decompose are transliterated (ß → ss, æ → ae, ø → o, ...), and
anything that is not a letter or digit becomes a single separator.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

TRANSLITERATIONS = {
    "ß": "ss",
    "æ": "ae",
    "Æ": "AE",
    "œ": "oe",
    "Œ": "OE",
    "ø": "o",
    "Ø": "O",
    "ł": "l",
    "Ł": "L",
    "đ": "d",
    "Đ": "D",
    "þ": "th",
    "Þ": "TH",
}

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]+")


def to_ascii(text: str) -> str:
    """Drop accents and transliterate what does not decompose; other non-ASCII is removed."""
    text = "".join(TRANSLITERATIONS.get(ch, ch) for ch in text)
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if ord(ch) < 128)


def slugify(
    text: str,
    *,
    separator: str = "-",
    max_length: int | None = None,
    lowercase: bool = True,
    stopwords: Iterable[str] = (),
) -> str:
    """Turn ``text`` into a slug.

    ``max_length`` cuts at a word boundary so no word is split (a single word longer than
    the limit is cut); ``stopwords`` are dropped unless that would leave nothing.
    """
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    ascii_text = to_ascii(text)
    if lowercase:
        ascii_text = ascii_text.lower()
    parts = [p for p in _NON_ALNUM.split(ascii_text) if p]
    excluded = {w.lower() for w in stopwords}
    kept = [p for p in parts if p.lower() not in excluded] or parts
    slug = separator.join(kept)
    if max_length is not None and len(slug) > max_length:
        slug = _truncate(kept, separator, max_length)
    return slug


def _truncate(parts: list[str], separator: str, max_length: int) -> str:
    result = ""
    for part in parts:
        candidate = f"{result}{separator}{part}" if result else part
        if len(candidate) > max_length:
            break
        result = candidate
    return result or parts[0][:max_length]


def unique_slug(
    text: str, taken: Iterable[str], *, separator: str = "-", max_length: int | None = None
) -> str:
    """A slug for ``text`` that is not in ``taken``, adding ``-2``, ``-3``, ... if needed.

    With ``max_length`` the stem is shortened so that the numbered slug still fits.
    """
    existing = set(taken)
    candidate = slugify(text, separator=separator, max_length=max_length)
    n = 1
    while candidate in existing:
        n += 1
        suffix = f"{separator}{n}"
        stem_length = None if max_length is None else max(1, max_length - len(suffix))
        candidate = slugify(text, separator=separator, max_length=stem_length) + suffix
    return candidate
