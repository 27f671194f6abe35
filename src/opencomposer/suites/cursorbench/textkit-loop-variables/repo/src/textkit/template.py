"""A small template language.

Syntax: ``{{ expr }}`` prints, ``{% if %}``/``{% else %}``/``{% endif %}`` and
``{% for name in expr %}``/``{% endfor %}`` control, ``{# ... #}`` comments. An
expression is a dotted path, a quoted string or a number, then filters separated by
``|``, each with an optional ``:argument``.

Templates are parsed once into a tree of nodes and rendered any number of times. This is
not a sandbox: a path can reach any attribute of the objects passed in, though never one
starting with an underscore.
"""

from __future__ import annotations

import re
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import filters as filter_registry
from .errors import TemplateSyntaxError, UndefinedError

_TAG = re.compile(r"({{.*?}}|{%.*?%}|{#.*?#})", re.DOTALL)
_EXPR_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>-?\d+(?:\.\d+)?)
      | (?P<path>[A-Za-z_]\w*(?:\.\w+)*)
      | (?P<op>[|:])
    )""",
    re.VERBOSE,
)
_MISSING = object()


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class Path:
    parts: tuple[str, ...]


@dataclass(frozen=True)
class Expression:
    """A value (literal or path) and the filters applied to it, left to right."""

    source: Literal | Path
    filters: tuple[tuple[str, Literal | Path | None], ...] = ()
    line: int = 1


@dataclass
class Text:
    text: str


@dataclass
class Output:
    expression: Expression


@dataclass
class If:
    condition: Expression
    negated: bool
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


@dataclass
class For:
    target: str
    iterable: Expression
    body: list[Node] = field(default_factory=list)


Node = Text | Output | If | For


def _parse_atom(kind: str, text: str) -> Literal | Path:
    if kind == "string":
        return Literal(bytes(text[1:-1], "utf-8").decode("unicode_escape"))
    if kind == "number":
        return Literal(float(text) if "." in text else int(text))
    return Path(tuple(text.split(".")))


def parse_expression(source: str, line: int = 1) -> Expression:
    """Parse ``value|filter:arg|filter`` into an :class:`Expression`."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    source = source.strip()
    while pos < len(source):
        match = _EXPR_TOKEN.match(source, pos)
        if match is None or match.end() == pos:
            raise TemplateSyntaxError(f"unexpected {source[pos:]!r} in expression {source!r}", line)
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    if not tokens or tokens[0][0] == "op":
        raise TemplateSyntaxError(f"expected a value in expression {source!r}", line)
    value = _parse_atom(*tokens[0])
    applied: list[tuple[str, Literal | Path | None]] = []
    rest = tokens[1:]
    while rest:
        if rest[0] != ("op", "|") or len(rest) < 2 or rest[1][0] != "path":
            raise TemplateSyntaxError(f"expected '|filter' in expression {source!r}", line)
        name = rest[1][1]
        rest = rest[2:]
        argument = None
        if rest and rest[0] == ("op", ":"):
            if len(rest) < 2 or rest[1][0] == "op":
                raise TemplateSyntaxError(f"filter {name!r} is missing its argument", line)
            argument = _parse_atom(*rest[1])
            rest = rest[2:]
        applied.append((name, argument))
    return Expression(value, tuple(applied), line)


def parse(source: str) -> list[Node]:
    """Parse template source into a list of nodes."""
    root: list[Node] = []
    # Each open block: (tag name, node, the list new nodes go to, line it opened on).
    stack: list[tuple[str, If | For, list[Node], int]] = []

    def target() -> list[Node]:
        return stack[-1][2] if stack else root

    line = 1
    for piece in _TAG.split(source):
        if not piece:
            continue
        piece_line = line
        line += piece.count("\n")
        if piece.startswith("{#"):
            continue
        if piece.startswith("{{"):
            target().append(Output(parse_expression(piece[2:-2], piece_line)))
            continue
        if not piece.startswith("{%"):
            target().append(Text(piece))
            continue
        words = piece[2:-2].split(None, 1)
        if not words:
            raise TemplateSyntaxError("empty tag", piece_line)
        tag, rest = words[0], (words[1] if len(words) > 1 else "")
        if tag == "if":
            negated = rest.startswith("not ")
            condition = parse_expression(rest[4:] if negated else rest, piece_line)
            node = If(condition, negated)
            target().append(node)
            stack.append(("if", node, node.body, piece_line))
        elif tag == "else":
            if not stack or stack[-1][0] != "if" or stack[-1][2] is not stack[-1][1].body:
                raise TemplateSyntaxError("'else' outside of an 'if' block", piece_line)
            _, node, _, opened = stack.pop()
            assert isinstance(node, If)
            stack.append(("if", node, node.orelse, opened))
        elif tag == "for":
            match = re.fullmatch(r"([A-Za-z_]\w*)\s+in\s+(.+)", rest.strip(), re.DOTALL)
            if match is None:
                raise TemplateSyntaxError(f"expected 'for NAME in EXPR', got {rest.strip()!r}", piece_line)
            node = For(match.group(1), parse_expression(match.group(2), piece_line))
            target().append(node)
            stack.append(("for", node, node.body, piece_line))
        elif tag in ("endif", "endfor"):
            if not stack or stack[-1][0] != tag[3:]:
                raise TemplateSyntaxError(f"unexpected '{tag}'", piece_line)
            stack.pop()
        else:
            raise TemplateSyntaxError(f"unknown tag {tag!r}", piece_line)
    if stack:
        kind, _, _, opened = stack[-1]
        raise TemplateSyntaxError(f"'{kind}' block opened here is never closed", opened)
    return root


def _lookup(context: Mapping[str, Any], path: Path) -> Any:
    value: Any = context.get(path.parts[0], _MISSING)
    for part in path.parts[1:]:
        if value is _MISSING:
            break
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif part.isdigit() and isinstance(value, Sequence) and not isinstance(value, str):
            index = int(part)
            value = value[index] if index < len(value) else _MISSING
        elif not part.startswith("_") and hasattr(value, part):
            value = getattr(value, part)
        else:
            value = _MISSING
    return value


class Template:
    """A parsed template. ``strict`` turns missing variables into :class:`UndefinedError`."""

    def __init__(self, source: str, *, strict: bool = False) -> None:
        self.source = source
        self.strict = strict
        self.nodes = parse(source)

    def render(self, context: Mapping[str, Any] | None = None, **values: Any) -> str:
        """Render with ``context`` and keyword values (keywords win)."""
        scope: ChainMap[str, Any] = ChainMap(dict(values), dict(context or {}))
        out: list[str] = []
        self._render_nodes(self.nodes, scope, out)
        return "".join(out)

    def _render_nodes(self, nodes: list[Node], scope: ChainMap[str, Any], out: list[str]) -> None:
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Output):
                value = self._evaluate(node.expression, scope)
                out.append("" if value is None else str(value))
            elif isinstance(node, If):
                truthy = bool(self._evaluate(node.condition, scope))
                branch = node.body if truthy != node.negated else node.orelse
                self._render_nodes(branch, scope, out)
            else:
                for item in self._evaluate(node.iterable, scope) or ():
                    self._render_nodes(node.body, scope.new_child({node.target: item}), out)

    def _resolve(self, atom: Literal | Path, scope: ChainMap[str, Any], line: int) -> Any:
        if isinstance(atom, Literal):
            return atom.value
        value = _lookup(scope, atom)
        if value is _MISSING:
            if self.strict:
                raise UndefinedError(f"line {line}: {'.'.join(atom.parts)!r} is undefined")
            return None
        return value

    def _evaluate(self, expression: Expression, scope: ChainMap[str, Any]) -> Any:
        value = self._resolve(expression.source, scope, expression.line)
        for name, argument in expression.filters:
            func = filter_registry.get_filter(name)
            if argument is None:
                value = func(value)
            else:
                value = func(value, self._resolve(argument, scope, expression.line))
        return value


def render(source: str, context: Mapping[str, Any] | None = None, **values: Any) -> str:
    """Parse and render in one call."""
    return Template(source).render(context, **values)
