"""Identifier case conversion.

:func:`split_words` understands every common style (``camelCase``, ``PascalCase``,
``snake_case``, ``kebab-case``, ``CONSTANT_CASE``, words separated by spaces) and keeps
acronyms together: ``"parseHTTPResponse"`` is ``parse``, ``HTTP``, ``Response``. The
``to_*`` functions re-join those words, so any style converts to any other.
"""

from __future__ import annotations

import re

_BOUNDARY = re.compile(
    r"""
    [A-Z]+(?=[A-Z][a-z])   # an acronym followed by a capitalised word: HTTP in HTTPResponse
    | [A-Z]?[a-z]+         # a lowercase word, possibly capitalised
    | [A-Z]+               # an acronym at the end or before a separator
    | \d+                  # a run of digits
    """,
    re.VERBOSE,
)


def split_words(identifier: str) -> list[str]:
    """The words of an identifier in their original case."""
    return _BOUNDARY.findall(identifier)


def to_snake(identifier: str) -> str:
    """``parseHTTPResponse`` → ``parse_http_response``."""
    return "_".join(word.lower() for word in split_words(identifier))


def to_kebab(identifier: str) -> str:
    """``parseHTTPResponse`` → ``parse-http-response``."""
    return "-".join(word.lower() for word in split_words(identifier))


def to_constant(identifier: str) -> str:
    """``parseHTTPResponse`` → ``PARSE_HTTP_RESPONSE``."""
    return "_".join(word.upper() for word in split_words(identifier))


def to_pascal(identifier: str) -> str:
    """``parse_http_response`` → ``ParseHttpResponse``; acronyms become capitalised words."""
    return "".join(word.capitalize() for word in split_words(identifier))


def to_camel(identifier: str) -> str:
    """``parse_http_response`` → ``parseHttpResponse``."""
    pascal = to_pascal(identifier)
    return pascal[:1].lower() + pascal[1:]


def detect_case(identifier: str) -> str:
    """Name the style of ``identifier``: snake, kebab, constant, camel, pascal or mixed."""
    if re.fullmatch(r"[a-z0-9]+(?:_[a-z0-9]+)*", identifier):
        return "snake"
    if re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)+", identifier):
        return "kebab"
    if re.fullmatch(r"[A-Z0-9]+(?:_[A-Z0-9]+)*", identifier):
        return "constant"
    if re.fullmatch(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+", identifier):
        return "camel"
    if re.fullmatch(r"(?:[A-Z][a-z0-9]*)+", identifier):
        return "pascal"
    return "mixed"
