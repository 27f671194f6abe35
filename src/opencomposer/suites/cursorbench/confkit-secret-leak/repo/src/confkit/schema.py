"""Schemas: named fields, validated together.

:meth:`Schema.validate` returns a new plain ``dict`` with every value coerced and every
default filled in, or raises :class:`~confkit.errors.ValidationErrors` listing every
problem in the document.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ErrorCollector, Path, format_path
from .fields import INVALID, MISSING, Field, Nested


@dataclass(frozen=True)
class FieldInfo:
    """One row of :meth:`Schema.describe`."""

    path: str
    type_name: str
    required: bool
    default: Any
    description: str
    secret: bool


class Schema:
    """A mapping of field names to :class:`~confkit.fields.Field` objects.

    Keys not in the schema are errors unless ``allow_unknown`` is true, in which case
    they are passed through unchanged.
    """

    def __init__(self, fields: Mapping[str, Field], *, allow_unknown: bool = False) -> None:
        for name in fields:
            if not name or "." in name:
                raise ValueError(f"field names must be non-empty and contain no dots, got {name!r}")
        self.fields = dict(fields)
        self.allow_unknown = allow_unknown

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def validate(self, data: Any) -> dict[str, Any]:
        errors = ErrorCollector()
        result = self.validate_at(data, (), errors)
        errors.raise_if_any()
        return result

    def validate_at(self, data: Any, path: Path, errors: ErrorCollector) -> dict[str, Any]:
        """Validate ``data`` found at ``path`` of a larger document, recording errors."""
        if not isinstance(data, Mapping):
            errors.add(path, f"expected a mapping, got {type(data).__name__}")
            return {}
        result: dict[str, Any] = {}
        for name, field in self.fields.items():
            field_path = (*path, name)
            if name in data:
                value = field.validate(data[name], field_path, errors)
            elif field.default is not MISSING:
                value = field.validate(field.default, field_path, errors)
            elif field.required:
                errors.add(field_path, "is required")
                continue
            else:
                value = None
            if value is not INVALID:
                result[name] = value
        unknown = [key for key in data if key not in self.fields]
        if self.allow_unknown:
            result.update({key: data[key] for key in unknown})
        else:
            allowed = ", ".join(self.fields)
            for key in unknown:
                errors.add((*path, str(key)), f"unknown key (allowed: {allowed})")
        return result

    def describe(self, prefix: Path = ()) -> list[FieldInfo]:
        """Every field, nested ones flattened to dotted paths, for generating documentation."""
        rows: list[FieldInfo] = []
        for name, field in self.fields.items():
            path = (*prefix, name)
            if isinstance(field, Nested):
                rows.extend(field.schema.describe(path))
                continue
            default = field.default
            if field.secret and default is not MISSING:
                default = "***"
            rows.append(
                FieldInfo(
                    path=format_path(path),
                    type_name=field.type_name,
                    required=field.required,
                    default=None if default is MISSING else default,
                    description=field.description,
                    secret=field.secret,
                )
            )
        return rows
