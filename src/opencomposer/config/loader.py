"""Reading and writing recipes: TOML files, ``--set section.key=value`` overrides, and back to TOML.

Loading is strict: an unknown key fails with the valid keys and the closest one; every value then
goes through the section's own checks (``section.Section``). An override's text is read by the
type of the field it names, not guessed from its look: ``--set run.name=2024`` sets the string
"2024", ``--set model.num_experts=8`` the integer 8, ``--set corpus.sources=['stdlib']`` a list.

``to_toml`` writes any config so that ``load_recipe`` reads back an equal one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
import typing
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from opencomposer.config.recipe import Config
from opencomposer.config.section import ConfigError, Section, field_types, is_section, show


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None,
                packaged: str | None = None) -> Config:
    """Read a TOML recipe and apply dotted overrides. Without ``path``, the recipe named ``packaged``
    that ships inside the package (``opencomposer/recipes/``), or else the defaults."""
    data: dict[str, Any] = {}
    if path is None and packaged is not None:
        data = _read(packaged_recipe(packaged), packaged, ())
    elif path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe not found: {path}")
        data = _read(path, str(path), (str(path.resolve()),))
    for item in overrides or []:
        apply_override(data, item)
    return from_dict(Config, data)


def packaged_recipe(name: str) -> Traversable:
    """The recipe ``name`` shipped inside the package, found through ``importlib.resources`` so that
    an installed wheel has it too, not only a source checkout."""
    resource = resources.files("opencomposer") / "recipes" / name
    if not resource.is_file():
        shipped = sorted(r.name for r in (resources.files("opencomposer") / "recipes").iterdir())
        raise ConfigError(f"no packaged recipe {name!r}; opencomposer/recipes/ holds {', '.join(shipped) or 'none'}")
    return resource


def _read(source: Path | Traversable, name: str, chain: tuple[str, ...]) -> dict[str, Any]:
    """The recipe at ``source`` with the recipe its top-level ``extends`` names (a path relative to
    it) underneath: that recipe's tables merged key by key with this one's, this one's values
    winning (a list or a value replaces, a table merges). Chains are followed; a cycle is an error."""
    data = _parse(name, source.read_text())
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{name}: extends: expected the path of a recipe (relative to this one), got {show(base)}")
    if not isinstance(source, Path):
        raise ConfigError(f"{name}: extends {base!r}: only a recipe file on disk may extend another")
    parent, parent_name = source.parent / base, str(Path(name).parent / base)
    if not parent.is_file():
        raise ConfigError(f"{name}: extends {base!r}: recipe not found: {parent_name}")
    key = str(parent.resolve())
    if key in chain:
        raise ConfigError(f"{name}: extends {base!r}: a cycle ({' -> '.join([*chain, key])})")
    return _merged(_read(parent, parent_name, (*chain, key)), data)


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _parse(name: str, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{name}: not valid TOML: {e}") from None


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` to the nested dict of a recipe. A string field (or a choice of
    strings) takes the text as it is, or the string it spells when it is a quoted TOML string;
    any other field reads it as a TOML value (``8``, ``1e-4``, ``true``, ``[0.9, 0.99]``)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, for example model.num_experts=8")
    key, text = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not part for part in parts):
        raise ConfigError(f"override {item!r}: empty key segment in {key!r}")
    target: Any = Config  # the annotation of what the key names, walked down one part at a time
    for depth, part in enumerate(parts):
        if not is_section(target):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:depth])!r} is a value, not a section")
        if part not in field_types(target):
            raise _unknown_key(target, part)
        target = field_types(target)[part]
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
    node[parts[-1]] = _read_text(target, text)


def _read_text(tp: Any, text: str) -> Any:
    """An override's text as a value for a field annotated ``tp`` (see ``apply_override``)."""
    parsed = _toml_value_or_none(text)
    if tp is str or typing.get_origin(tp) is Literal:  # every Literal of the recipe is one of strings
        return parsed if isinstance(parsed, str) and text.strip()[:1] in ("'", '"') else text
    return text if parsed is None else parsed  # unreadable text: the field's check names it


def _toml_value_or_none(text: str) -> Any:
    try:
        document = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return None
    return document["v"] if list(document) == ["v"] else None


def from_dict(cls: type, data: Any) -> Any:
    """Build section ``cls`` and its subsections from plain data (a parsed TOML table)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.section or 'recipe'}: expected a table, got {show(data)}")
    types = field_types(cls)
    for key in data:
        if key not in types:
            raise _unknown_key(cls, key)
    kwargs = {key: from_dict(types[key], value) if is_section(types[key]) else value for key, value in data.items()}
    return cls(**kwargs)


def _unknown_key(cls: type[Section], key: str) -> ConfigError:
    names = sorted(f.name for f in dataclasses.fields(cls))
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {cls.key(key)!r}{hint}; valid keys in {cls.section or 'the recipe'}: "
                       + ", ".join(names))


def to_toml(obj: Any) -> str:
    """Serialise a config to TOML: one table per section, every field written out; a list of
    sections (``[[pretrain.phases]]``) as an array of tables."""
    lines: list[str] = []

    def is_tables(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)

    def emit(table: dict[str, Any], name: str, header: str | None = None) -> None:
        values = {k: v for k, v in table.items() if not isinstance(v, dict) and not is_tables(v)}
        if values or header:
            if header or name:
                lines.append(header or f"[{name}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in values.items())
            lines.append("")
        for k, v in table.items():
            if isinstance(v, dict):
                emit(v, f"{name}.{k}" if name else k)
        for k, v in table.items():
            if is_tables(v):
                for item in v:
                    path = f"{name}.{k}" if name else k
                    emit(item, path, header=f"[[{path}]]")

    emit(dataclasses.asdict(obj), "")
    return "\n".join(lines)


# TOML basic strings must escape the backslash, the quote and every control character but tab.
_TOML_ESCAPES = {
    **{code: f"\\u{code:04X}" for code in [*range(0x20), 0x7F]},
    ord("\\"): "\\\\", ord('"'): '\\"', ord("\b"): "\\b", ord("\t"): "\\t", ord("\n"): "\\n",
    ord("\f"): "\\f", ord("\r"): "\\r",
}


def toml_value(value: Any) -> str:
    """One value as TOML: a boolean, an integer, a finite float, a string or a list of these."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} as a recipe value: configs hold finite numbers only")
        return repr(value)  # shortest text that reads back as the same double, e.g. 1e-30, 0.1
    if isinstance(value, str):
        return '"' + value.translate(_TOML_ESCAPES) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")
