"""Reusable checks for :class:`confkit.fields.Field`'s ``validators`` argument.

A validator is a callable that takes the already-coerced value and raises
:class:`ValueError` with a user-facing message when the value is not acceptable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sized
from typing import Any
from urllib.parse import urlsplit

Validator = Callable[[Any], None]

_HOSTNAME_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)", re.IGNORECASE)


def one_of(*choices: Any) -> Validator:
    def check(value: Any) -> None:
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ValueError(f"must be one of {allowed}, got {value!r}")

    return check


def in_range(minimum: float | None = None, maximum: float | None = None) -> Validator:
    def check(value: Any) -> None:
        if minimum is not None and value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}, got {value!r}")

    return check


def length(minimum: int | None = None, maximum: int | None = None) -> Validator:
    def check(value: Sized) -> None:
        if minimum is not None and len(value) < minimum:
            raise ValueError(f"must have at least {minimum} item(s), got {len(value)}")
        if maximum is not None and len(value) > maximum:
            raise ValueError(f"must have at most {maximum} item(s), got {len(value)}")

    return check


def matches(pattern: str) -> Validator:
    compiled = re.compile(pattern)

    def check(value: str) -> None:
        if not compiled.fullmatch(value):
            raise ValueError(f"does not match {pattern}: {value!r}")

    return check


def hostname() -> Validator:
    """A DNS hostname: dot-separated labels of letters, digits and inner hyphens."""

    def check(value: str) -> None:
        labels = value.rstrip(".").split(".")
        if len(value) > 253 or not all(_HOSTNAME_LABEL.fullmatch(label) for label in labels):
            raise ValueError(f"not a valid hostname: {value!r}")

    return check


def url(schemes: tuple[str, ...] = ("http", "https")) -> Validator:
    """An absolute URL with one of ``schemes`` and a host."""

    def check(value: str) -> None:
        parts = urlsplit(value)
        if parts.scheme not in schemes or not parts.netloc:
            raise ValueError(f"not a {'/'.join(schemes)} URL: {value!r}")

    return check
