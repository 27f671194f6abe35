"""Greedy word wrapping, paragraph filling and justification.

Unlike :mod:`textwrap`, widths count characters as the reader sees them: a wide East
Asian character takes two columns. Words longer than the width are split unless
``break_long_words`` is false, in which case they stand alone on an over-long line.
"""

from __future__ import annotations

import re
import unicodedata


def display_width(text: str) -> int:
    """Columns ``text`` occupies in a terminal: wide and full-width characters count twice."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _take(word: str, room: int) -> tuple[str, str]:
    """The longest head of ``word`` that fits ``room`` columns (at least one character), and the rest."""
    end = 1
    while end < len(word) and display_width(word[: end + 1]) <= room:
        end += 1
    return word[:end], word[end:]


def wrap(
    text: str,
    width: int = 70,
    *,
    indent: str = "",
    subsequent_indent: str | None = None,
    break_long_words: bool = True,
) -> list[str]:
    """Wrap ``text`` into lines of at most ``width`` columns, indent included.

    Runs of whitespace (newlines too) collapse to one space. ``indent`` prefixes the
    first line, ``subsequent_indent`` (default: ``indent``) the others.
    """
    later_indent = indent if subsequent_indent is None else subsequent_indent
    if width <= max(display_width(indent), display_width(later_indent)):
        raise ValueError(f"width {width} leaves no room after the indent")
    lines: list[str] = []
    prefix = indent
    current: list[str] = []
    used = display_width(prefix)

    def flush() -> None:
        nonlocal prefix, current, used
        lines.append(prefix + " ".join(current))
        prefix = later_indent
        current = []
        used = display_width(prefix)

    for word in text.split():
        needed = display_width(word) + (1 if current else 0)
        if used + needed <= width:
            current.append(word)
            used += needed
            continue
        if current:
            flush()
        while break_long_words and len(word) > 1 and display_width(word) > width - used:
            head, word = _take(word, width - used)
            current.append(head)
            flush()
        current.append(word)
        used += display_width(word)
    if current:
        flush()
    return lines


def fill(
    text: str,
    width: int = 70,
    *,
    indent: str = "",
    subsequent_indent: str | None = None,
    break_long_words: bool = True,
) -> str:
    """:func:`wrap` joined with newlines."""
    lines = wrap(
        text,
        width,
        indent=indent,
        subsequent_indent=subsequent_indent,
        break_long_words=break_long_words,
    )
    return "\n".join(lines)


def fill_paragraphs(text: str, width: int = 70) -> str:
    """Fill each blank-line separated paragraph on its own, keeping one blank line between."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(fill(p, width) for p in paragraphs)


def justify(line: str, width: int) -> str:
    """Stretch ``line`` to ``width`` by widening the gaps between words, leftmost gaps first."""
    words = line.split()
    if len(words) < 2:
        return line
    gaps = len(words) - 1
    spaces = width - sum(display_width(w) for w in words)
    if spaces < gaps:
        raise ValueError(f"line is wider than {width} columns: {line!r}")
    base, extra = divmod(spaces, gaps)
    out = words[0]
    for i, word in enumerate(words[1:]):
        out += " " * (base + (1 if i < extra else 0)) + word
    return out


def shorten(text: str, width: int, *, placeholder: str = "…") -> str:
    """Collapse whitespace and cut ``text`` at a word boundary to fit ``width``, adding ``placeholder``."""
    collapsed = " ".join(text.split())
    if display_width(collapsed) <= width:
        return collapsed
    room = width - display_width(placeholder)
    if room <= 0:
        raise ValueError(f"width {width} is too small for the placeholder {placeholder!r}")
    kept: list[str] = []
    for word in collapsed.split(" "):
        candidate = " ".join([*kept, word])
        if display_width(candidate) > room:
            break
        kept.append(word)
    return " ".join(kept) + placeholder if kept else collapsed[:room] + placeholder
