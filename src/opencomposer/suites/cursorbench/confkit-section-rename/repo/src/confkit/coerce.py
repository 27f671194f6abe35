"""Turning strings (from environment variables, INI files, command lines) into typed values.

Every function accepts a value that already has the target type and returns it
unchanged; strings are parsed; anything else raises :class:`ValueError` with a message
fit to show the user.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

TRUE_WORDS = frozenset({"true", "yes", "on", "1", "y"})
FALSE_WORDS = frozenset({"false", "no", "off", "0", "n"})

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?", re.IGNORECASE)


def _size_factors() -> dict[str, int]:
    """Unit suffix → bytes: ``k``/``kb`` are powers of 1000, ``ki``/``kib`` powers of 1024."""
    factors = {"": 1, "b": 1}
    for power, letter in enumerate("kmgt", start=1):
        factors[letter] = factors[f"{letter}b"] = 1000**power
        factors[f"{letter}i"] = factors[f"{letter}ib"] = 1024**power
    return factors


_SIZE_FACTORS = _size_factors()


def to_bool(value: Any) -> bool:
    """``yes``/``no``, ``true``/``false``, ``on``/``off``, ``1``/``0`` (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise ValueError(f"not a boolean: {value!r}")


def to_int(value: Any) -> int:
    """Integers, and strings like ``"42"``, ``"-7"`` or ``"1_000"``. Floats are refused."""
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+(?:_\d+)*\s*", value):
        return int(value)
    raise ValueError(f"not an integer: {value!r}")


def to_float(value: Any) -> float:
    """Numbers and numeric strings; booleans, NaN and infinities are refused."""
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    try:
        number = float(value) if isinstance(value, int | float | str) else None
    except ValueError:
        number = None
    if number is None or number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"not a number: {value!r}")
    return number


def parse_duration(value: Any) -> timedelta:
    """``"90s"``, ``"1h30m"``, ``"250ms"``, ``"2d"``; a bare number means seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r}")
    text = value.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    pos = 0
    total = timedelta(0)
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r}")
    return total


def parse_size(value: Any) -> int:
    """Byte sizes: ``"512"``, ``"10KB"`` (10,000), ``"10KiB"`` (10,240), ``"1.5G"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"size must not be negative: {value!r}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a size: {value!r}")
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not a size: {value!r}")
    number, unit = match.groups()
    return int(float(number) * _SIZE_FACTORS[(unit or "").lower()])


def to_list(value: Any) -> list[Any]:
    """Lists and tuples as they are; a string is split on commas, pieces trimmed, empties dropped."""
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str):
        return [piece.strip() for piece in value.split(",") if piece.strip()]
    raise ValueError(f"not a list: {value!r}")
