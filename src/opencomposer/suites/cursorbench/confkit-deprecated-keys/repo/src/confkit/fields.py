"""Field types: how one configuration value is coerced and checked.

``Field.validate`` never raises for a bad value: it records the problem in an
:class:`~confkit.errors.ErrorCollector` under the value's path and returns
:data:`INVALID`, so that one pass over a document finds every error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingABC
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import coerce
from .errors import ErrorCollector, Path
from .validators import Validator

if TYPE_CHECKING:
    from .schema import Schema


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


MISSING: Any = _Sentinel("MISSING")
"""Default of a field that has none: the key is required."""

INVALID: Any = _Sentinel("INVALID")
"""What ``validate`` returns for a value it rejected."""


class Field:
    """Base class. ``default`` makes a field optional; ``secret`` hides its value in :meth:`describe`.

    ``required=False`` without a default makes a field optional with value ``None``.
    """

    type_name = "any"

    def __init__(
        self,
        *,
        default: Any = MISSING,
        required: bool | None = None,
        description: str = "",
        secret: bool = False,
        validators: Iterable[Validator] = (),
    ) -> None:
        self.default = default
        self.required = default is MISSING if required is None else required
        self.description = description
        self.secret = secret
        self.validators = list(validators)

    def coerce(self, value: Any) -> Any:
        """Convert ``value`` to this field's type or raise :class:`ValueError`."""
        return value

    def constraints(self, value: Any) -> Iterable[str]:
        """Messages for each built-in constraint (minimum, pattern, ...) the coerced value breaks."""
        return ()

    def validate(self, value: Any, path: Path, errors: ErrorCollector) -> Any:
        """Coerce and check ``value``; record problems under ``path``."""
        try:
            converted = self.coerce(value)
        except ValueError as exc:
            errors.add(path, str(exc))
            return INVALID
        problems = list(self.constraints(converted))
        for validator in self.validators:
            try:
                validator(converted)
            except ValueError as exc:
                problems.append(str(exc))
        for problem in problems:
            errors.add(path, problem)
        return INVALID if problems else converted


class String(Field):
    type_name = "string"

    def __init__(
        self,
        *,
        min_length: int | None = None,
        max_length: int | None = None,
        pattern: str | None = None,
        strip: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.min_length = min_length
        self.max_length = max_length
        self.pattern = pattern
        self._compiled = re.compile(pattern) if pattern is not None else None
        self.strip = strip

    def coerce(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__} {value!r}")
        return value.strip() if self.strip else value

    def constraints(self, value: str) -> Iterable[str]:
        if self.min_length is not None and len(value) < self.min_length:
            yield f"must be at least {self.min_length} characters long, got {len(value)}"
        if self.max_length is not None and len(value) > self.max_length:
            yield f"must be at most {self.max_length} characters long, got {len(value)}"
        if self._compiled is not None and not self._compiled.fullmatch(value):
            yield f"does not match {self.pattern}: {value!r}"


class _Number(Field):
    def __init__(self, *, minimum: float | None = None, maximum: float | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.minimum = minimum
        self.maximum = maximum

    def constraints(self, value: float) -> Iterable[str]:
        if self.minimum is not None and value < self.minimum:
            yield f"must be at least {self.minimum}, got {value}"
        if self.maximum is not None and value > self.maximum:
            yield f"must be at most {self.maximum}, got {value}"


class Integer(_Number):
    type_name = "integer"

    def coerce(self, value: Any) -> int:
        return coerce.to_int(value)


class Float(_Number):
    type_name = "float"

    def coerce(self, value: Any) -> float:
        return coerce.to_float(value)


class Boolean(Field):
    type_name = "boolean"

    def coerce(self, value: Any) -> bool:
        return coerce.to_bool(value)


class Duration(Field):
    """A :class:`~datetime.timedelta` from ``"90s"``, ``"1h30m"`` or a number of seconds."""

    type_name = "duration"

    def __init__(self, *, minimum: timedelta | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.minimum = minimum

    def coerce(self, value: Any) -> timedelta:
        return coerce.parse_duration(value)

    def constraints(self, value: timedelta) -> Iterable[str]:
        if self.minimum is not None and value < self.minimum:
            yield f"must be at least {self.minimum}, got {value}"


class Size(Field):
    """A byte count from ``"10MB"``, ``"1.5GiB"`` or an integer."""

    type_name = "size"

    def coerce(self, value: Any) -> int:
        return coerce.parse_size(value)


class Choice(Field):
    """One of a fixed set of strings; matching ignores case and returns the canonical spelling."""

    type_name = "choice"

    def __init__(self, choices: Iterable[str], **options: Any) -> None:
        super().__init__(**options)
        self.choices = list(choices)
        if not self.choices:
            raise ValueError("Choice needs at least one choice")

    def coerce(self, value: Any) -> str:
        if isinstance(value, str):
            for choice in self.choices:
                if choice.lower() == value.strip().lower():
                    return choice
        raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")


class List(Field):
    """A list whose items all follow ``item``; a string is split on commas."""

    type_name = "list"

    def __init__(
        self,
        item: Field,
        *,
        min_items: int | None = None,
        max_items: int | None = None,
        unique: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.item = item
        self.min_items = min_items
        self.max_items = max_items
        self.unique = unique

    def validate(self, value: Any, path: Path, errors: ErrorCollector) -> Any:
        try:
            items = coerce.to_list(value)
        except ValueError as exc:
            errors.add(path, str(exc))
            return INVALID
        before = len(errors.errors)
        if self.min_items is not None and len(items) < self.min_items:
            errors.add(path, f"must have at least {self.min_items} item(s), got {len(items)}")
        if self.max_items is not None and len(items) > self.max_items:
            errors.add(path, f"must have at most {self.max_items} item(s), got {len(items)}")
        result = [self.item.validate(item, (*path, index), errors) for index, item in enumerate(items)]
        if self.unique:
            seen: list[Any] = []
            for index, item in enumerate(result):
                if item is not INVALID and item in seen:
                    errors.add((*path, index), f"duplicate item {item!r}")
                seen.append(item)
        return INVALID if len(errors.errors) > before else result


class Mapping(Field):
    """A mapping from string keys to values that follow ``value``."""

    type_name = "mapping"

    def __init__(self, value: Field, **options: Any) -> None:
        super().__init__(**options)
        self.value = value

    def validate(self, value: Any, path: Path, errors: ErrorCollector) -> Any:
        if not isinstance(value, MappingABC):
            errors.add(path, f"expected a mapping, got {type(value).__name__}")
            return INVALID
        before = len(errors.errors)
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                errors.add(path, f"keys must be strings, got {key!r}")
                continue
            result[key] = self.value.validate(item, (*path, key), errors)
        return INVALID if len(errors.errors) > before else result


class Nested(Field):
    """A sub-document validated by its own :class:`~confkit.schema.Schema`."""

    type_name = "object"

    def __init__(self, schema: Schema, **options: Any) -> None:
        options.setdefault("default", {})
        super().__init__(**options)
        self.schema = schema

    def validate(self, value: Any, path: Path, errors: ErrorCollector) -> Any:
        before = len(errors.errors)
        result = self.schema.validate_at(value, path, errors)
        return INVALID if len(errors.errors) > before else result


def custom(type_name: str, convert: Callable[[Any], Any], **options: Any) -> Field:
    """A field from a plain conversion function that raises :class:`ValueError` on bad input."""

    class Custom(Field):
        def coerce(self, value: Any) -> Any:
            return convert(value)

    field = Custom(**options)
    field.type_name = type_name
    return field
