"""Loading configuration from layers: defaults, files, the environment.

Layers are plain mappings merged in order, later layers winning; mappings merge key by
key, everything else (lists included) is replaced whole. The merged document is then
validated by the schema, so values from the environment (always strings) are coerced
like any other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .fields import Nested
from .schema import Schema

REDACTED = "***"


class LoadError(Exception):
    """A configuration source that cannot be read."""


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def env_layer(environ: Mapping[str, str], prefix: str, *, separator: str = "__") -> dict[str, Any]:
    """Variables starting with ``prefix`` as a nested mapping.

    ``APP_DB__PORT=5432`` with prefix ``APP_`` becomes ``{"db": {"port": "5432"}}``: the
    prefix is removed, the rest lowercased and split on ``separator``.
    """
    if not prefix:
        raise ValueError("an environment prefix is required, or every variable would be read")
    layer: dict[str, Any] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix:
            continue
        parts = name[len(prefix) :].lower().split(separator)
        if not all(parts):
            continue
        node = layer
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[parts[-1]] = value
    return layer


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file that holds an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoadError(f"configuration file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise LoadError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise LoadError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def load(
    schema: Schema,
    *layers: Mapping[str, Any],
    files: tuple[Path, ...] = (),
    environ: Mapping[str, str] | None = None,
    env_prefix: str | None = None,
) -> dict[str, Any]:
    """Merge ``layers``, then ``files`` in order, then the environment, and validate the result."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = merge(merged, layer)
    for path in files:
        merged = merge(merged, read_json(path))
    if environ is not None and env_prefix:
        merged = merge(merged, env_layer(environ, env_prefix))
    return schema.validate(merged)


def redact(config: Mapping[str, Any], schema: Schema) -> dict[str, Any]:
    """A copy of a validated ``config`` with the values of secret fields replaced by ``***``."""
    result = dict(config)
    for name, field in schema.fields.items():
        if name not in result:
            continue
        if field.secret and result[name] is not None:
            result[name] = REDACTED
        elif isinstance(field, Nested) and isinstance(result[name], Mapping):
            result[name] = redact(result[name], field.schema)
    return result
