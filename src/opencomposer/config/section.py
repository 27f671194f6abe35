"""What every recipe section is: a dataclass whose fields are checked whenever one is made.

``Section.__post_init__`` runs on every construction, whether by ``load_recipe``, by a call in
code or by ``dataclasses.replace``. It first checks each field against its annotation (an integer
for ``int``, a finite number for ``float``, one of the choices of a ``Literal``, a list of such,
the right section class for a subsection), then runs the section's ``validate()``, the rules
between its fields. So a config object that exists broke no rule when it was made. Assigning to a
field afterwards is not checked; code that does so and wants the check calls ``validate()``.

Not here: reading TOML and overrides (``loader``), the sections themselves (one module per layer).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from typing import Any, ClassVar, Literal

from opencomposer.pysource import parse


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message names the key and the fix."""


class Section:
    """Base of every config dataclass. A subclass sets ``section``, its dotted place in a recipe
    (``"agent.http"``; empty for the whole recipe), and overrides ``validate``."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, tp in field_types(type(self)).items():
            setattr(self, name, convert(tp, getattr(self, name), self.key(name)))
        self.validate()

    def validate(self) -> None:
        """The rules between fields (types are checked already); raise ConfigError naming the key."""

    @classmethod
    def key(cls, name: str) -> str:
        """The recipe key of field ``name``: ``"agent.http.base_url"``."""
        return f"{cls.section}.{name}" if cls.section else name


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name → resolved annotation, for the fields of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → its docstring (the string under the field in the class body), whitespace
    collapsed: what a recipe key means, in one place, also the help text of a flag derived from it."""
    (node,) = parse(textwrap.dedent(inspect.getsource(cls))).body
    docs = {}
    for field, doc in zip(node.body, node.body[1:]):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and isinstance(doc, ast.Expr) \
                and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
            docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def convert(tp: Any, value: Any, key: str) -> Any:
    """``value`` as a field annotated ``tp`` holds it (an integer widens to a float), or a
    ConfigError that names ``key``, the value and what was expected."""
    if is_section(tp):
        if not isinstance(value, tp):
            raise ConfigError(f"{key}: expected a {tp.__name__} (the [{key}] table), got {show(value)}")
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        if not any(type(value) is type(choice) and value == choice for choice in args):
            raise ConfigError(f"{key}: {show(value)} is not one of " + ", ".join(repr(a) for a in args))
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {show(value)}")
        return [convert(args[0], item, f"{key}[{i}]") for i, item in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {show(value)}")
        if not -(2**63) <= value < 2**63:
            raise ConfigError(f"{key}: {value} does not fit in 64 bits (what TOML integers hold)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {show(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {show(value)}")
        try:
            value.encode("utf-8")  # a lone surrogate: no TOML file (nor log) could hold it
        except UnicodeEncodeError:
            raise ConfigError(f"{key}: {value!r} is not valid Unicode text") from None
        return value
    raise TypeError(f"{key}: a config field may not be annotated {tp!r}; use bool, int, float, str, "
                    "a Literal of strings, a list of those, or a Section")


def show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
