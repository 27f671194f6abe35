"""Filters for templates: ``{{ value|name }}`` or ``{{ value|name:argument }}``.

A filter is a function of the value and at most one argument. Register new ones with
:func:`register`; the template engine looks names up in :data:`FILTERS` at render time.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sized
from typing import Any

from . import case, slug, wrapping

Filter = Callable[..., Any]
FILTERS: dict[str, Filter] = {}


def register(name: str | None = None) -> Callable[[Filter], Filter]:
    """Decorator that adds a filter under ``name`` (default: the function's name)."""

    def decorate(func: Filter) -> Filter:
        FILTERS[name or func.__name__.rstrip("_")] = func
        return func

    return decorate


def get_filter(name: str) -> Filter:
    try:
        return FILTERS[name]
    except KeyError:
        known = ", ".join(sorted(FILTERS))
        raise KeyError(f"unknown filter {name!r}; known filters: {known}") from None


@register()
def upper(value: Any) -> str:
    return str(value).upper()


@register()
def lower(value: Any) -> str:
    return str(value).lower()


@register()
def title(value: Any) -> str:
    """Capitalise the first letter of each space-separated word, leaving the rest alone."""
    return " ".join(word[:1].upper() + word[1:] for word in str(value).split(" "))


@register()
def default(value: Any, fallback: Any = "") -> Any:
    """``fallback`` when the value is None or an empty string."""
    return fallback if value is None or value == "" else value


@register()
def length(value: Iterable[Any]) -> int:
    return len(value) if isinstance(value, Sized) else sum(1 for _ in value)


@register()
def join(value: Iterable[Any], separator: str = ", ") -> str:
    return separator.join(str(item) for item in value)


@register()
def truncate(value: Any, width: int = 30) -> str:
    """Shorten to ``width`` columns at a word boundary, ending with an ellipsis."""
    return wrapping.shorten(str(value), int(width))


@register()
def escape(value: Any) -> str:
    """HTML-escape ``&``, ``<``, ``>`` and quotes."""
    return html.escape(str(value), quote=True)


@register("slugify")
def slugify_(value: Any) -> str:
    return slug.slugify(str(value))


@register()
def snake(value: Any) -> str:
    return case.to_snake(str(value))


@register()
def kebab(value: Any) -> str:
    return case.to_kebab(str(value))


@register()
def camel(value: Any) -> str:
    return case.to_camel(str(value))


@register()
def first(value: Iterable[Any]) -> Any:
    return next(iter(value), None)


@register()
def last(value: Iterable[Any]) -> Any:
    items = list(value)
    return items[-1] if items else None
