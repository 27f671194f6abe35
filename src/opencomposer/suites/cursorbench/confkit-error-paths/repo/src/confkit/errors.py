"""Validation errors and the paths that locate them.

A path is a tuple of keys and list indices from the document root, written as
``servers[2].port``. Validation never stops at the first problem: it collects a
:class:`ValidationError` per bad value and raises them together as
:class:`ValidationErrors`.
"""

from __future__ import annotations

from collections.abc import Iterable

PathPart = str | int
Path = tuple[PathPart, ...]


def format_path(path: Path) -> str:
    """``("servers", 2, "port")`` → ``servers[2].port``; the empty path is ``<root>``."""
    if not path:
        return "<root>"
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


class ValidationError(Exception):
    """One invalid value: where it is and what is wrong with it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{format_path(path)}: {message}")
        self.path = path
        self.message = message


class ValidationErrors(Exception):
    """Every error found in a document, sorted by path."""

    def __init__(self, errors: Iterable[ValidationError]) -> None:
        self.errors = sorted(errors, key=lambda e: format_path(e.path))
        if not self.errors:
            raise ValueError("ValidationErrors needs at least one error")
        noun = "error" if len(self.errors) == 1 else "errors"
        lines = [f"{len(self.errors)} configuration {noun}:"]
        lines.extend(f"  {error}" for error in self.errors)
        super().__init__("\n".join(lines))

    def __iter__(self):
        return iter(self.errors)

    def __len__(self) -> int:
        return len(self.errors)

    def paths(self) -> list[str]:
        """The formatted path of every error, in order."""
        return [format_path(error.path) for error in self.errors]


class ErrorCollector:
    """Gathers errors during validation so every problem is reported at once."""

    def __init__(self) -> None:
        self.errors: list[ValidationError] = []

    def add(self, path: Path, message: str) -> None:
        self.errors.append(ValidationError(path, message))

    def extend(self, errors: Iterable[ValidationError]) -> None:
        self.errors.extend(errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise ValidationErrors(self.errors)
