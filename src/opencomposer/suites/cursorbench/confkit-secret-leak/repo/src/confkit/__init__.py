"""Declarative configuration schemas: type coercion, validation with error paths, layered loading."""

from . import coerce, fields, validators
from .errors import ValidationError, ValidationErrors, format_path
from .loader import LoadError, env_layer, load, merge, read_json, redact
from .schema import FieldInfo, Schema

__all__ = [
    "FieldInfo",
    "LoadError",
    "Schema",
    "ValidationError",
    "ValidationErrors",
    "coerce",
    "env_layer",
    "fields",
    "format_path",
    "load",
    "merge",
    "read_json",
    "redact",
    "validators",
]
