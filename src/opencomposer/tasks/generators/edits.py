"""Text edits located by the AST: change Python source in place, keeping every other byte.

Generators find what to change with ``ast`` and change it by splicing the source text at the
nodes' positions, so a gold patch is exactly the injected bug, the deleted feature or the refactor,
never a reformatted file (``ast.unparse`` would rewrite comments and layout). ``Source`` converts
the AST's (line, UTF-8 byte column) positions to string offsets; ``apply_edits`` applies
non-overlapping replacements; the helpers remove whole statements, prune names from imports and
strip tests out of a test module.

Not here: deciding what to edit (the generators), diffs (``sandbox.patch``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass

from opencomposer.pysource import parse


@dataclass(frozen=True)
class Edit:
    """Replace ``source[start:end]`` with ``text`` (string offsets)."""

    start: int
    end: int
    text: str


class Source:
    """A module's text, its AST, and position conversions."""

    def __init__(self, text: str):
        self.text = text
        self.tree = parse(text)
        self.lines = text.splitlines(keepends=True)
        self._starts = [0]
        for line in self.lines:
            self._starts.append(self._starts[-1] + len(line))

    def offset(self, lineno: int, col_byte: int) -> int:
        """String offset of an AST position (1-based line, UTF-8 byte column)."""
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self._starts[lineno - 1] + len(line.encode("utf-8")[:col_byte].decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def line_start(self, lineno: int) -> int:
        return self._starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just after line ``lineno``'s newline."""
        return self._starts[min(lineno, len(self.lines))]

    def indent_of(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip())]


def apply_edits(text: str, edits: list[Edit]) -> str:
    """Apply replacements; they must not overlap (``ValueError`` names the two that do)."""
    ordered = sorted(edits, key=lambda e: (e.start, e.end))
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.end:
            raise ValueError(f"overlapping edits {before} and {after}")
    for edit in reversed(ordered):
        text = text[: edit.start] + edit.text + text[edit.end :]
    return text


def first_line(node: ast.AST) -> int:
    """The first line of a statement, decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def remove_statement(source: Source, node: ast.stmt, parent_body: list[ast.stmt]) -> Edit:
    """Delete a whole statement with the blank lines before it; a body left empty gets ``pass``."""
    start_line = first_line(node)
    while start_line > 1 and not source.lines[start_line - 2].strip():
        start_line -= 1
    start = source.line_start(start_line)
    end = source.line_end(node.end_lineno)
    if len(parent_body) == 1:
        return Edit(source.line_start(first_line(node)), end, source.indent_of(node.lineno) + "pass\n")
    if parent_body[0] is node:  # keep the line break between the block header and what follows
        start = source.line_start(first_line(node))
        while end < len(source.text) and source.text[end] == "\n":
            end += 1
    return Edit(start, end, "")


def names_used(tree: ast.AST) -> set[str]:
    """Every identifier read or written (``Name`` nodes and attribute names)."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return used


def prune_import(source: Source, node: ast.ImportFrom | ast.Import, drop: set[str]) -> Edit | None:
    """Remove the names in ``drop`` from an import statement (the whole statement if none is left)."""
    kept = [a for a in node.names if (a.asname or a.name).split(".")[0] not in drop]
    if len(kept) == len(node.names):
        return None
    start, end = source.span(node)
    if not kept:
        line_start, line_end = source.line_start(node.lineno), source.line_end(node.end_lineno)
        if source.text[line_start:start].strip() == "" and source.text[end:line_end].strip() == "":
            return Edit(line_start, line_end, "")
        return Edit(start, end, "pass")
    clone = ast.ImportFrom(module=node.module, names=kept, level=node.level) if isinstance(node, ast.ImportFrom) \
        else ast.Import(names=kept)
    return Edit(start, end, ast.unparse(clone))


def function_of(node_id: str) -> str:
    """``tests/test_x.py::TestA::test_b[case]`` -> ``TestA.test_b``; a plain test -> ``test_b``."""
    parts = node_id.split("::")[1:]
    parts[-1] = parts[-1].split("[", 1)[0]
    return ".".join(parts)


def strip_tests(text: str, remove: set[str], unimport: frozenset[str] = frozenset()) -> str | None:
    """``text`` without the functions named in ``remove`` (``test_b``, ``TestA.test_b``, or a
    module-level helper or fixture) and
    without the names in ``unimport`` in its imports. ``None`` when no test would be left, or when
    the module still refers to an ``unimport`` name (it could not run without it)."""
    source = Source(text)
    edits: list[Edit] = []
    remaining = 0
    for node in source.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in remove:
                edits.append(remove_statement(source, node, source.tree.body))
            elif node.name.startswith("test"):
                remaining += 1
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                       and m.name.startswith("test")]
            gone = [m for m in methods if f"{node.name}.{m.name}" in remove]
            if gone and len(gone) == len(methods):
                edits.append(remove_statement(source, node, source.tree.body))
            else:
                edits += [remove_statement(source, m, node.body) for m in gone]
                remaining += len(methods) - len(gone)
        elif isinstance(node, ast.ImportFrom | ast.Import) and unimport:
            edit = prune_import(source, node, set(unimport))
            if edit is not None:
                edits.append(edit)
    if remaining == 0:
        return None
    stripped = apply_edits(text, edits)
    if unimport and names_used(parse(stripped)) & unimport:
        return None
    return prune_unused_imports(text, stripped)


def _imported_names(tree: ast.Module) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
            for a in node.names}


def prune_unused_imports(before: str, after: str) -> str:
    """Drop top-level imports of ``after`` that ``before`` used and ``after`` no longer uses (an
    import left behind says what was taken out)."""
    old_tree, source = parse(before), Source(after)
    old_used = names_used(ast.Module(body=[n for n in old_tree.body if not isinstance(n, ast.Import | ast.ImportFrom)],
                                     type_ignores=[]))
    body = [n for n in source.tree.body if not isinstance(n, ast.Import | ast.ImportFrom)]
    used = names_used(ast.Module(body=body, type_ignores=[])) | _all_names(source.tree)
    dead = {name for name in _imported_names(source.tree) if name in old_used and name not in used}
    if not dead:
        return after
    edits = [e for n in source.tree.body if isinstance(n, ast.Import | ast.ImportFrom)
             if (e := prune_import(source, n, dead)) is not None]
    return apply_edits(after, edits)


def _all_names(tree: ast.Module) -> set[str]:
    """Names listed in ``__all__`` (they count as used)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            if isinstance(node.value, ast.List | ast.Tuple):
                return {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def mentioning(text: str, names: set[str] | frozenset[str]) -> set[str]:
    """Module-level functions and test methods (``TestA.test_b``) of a test module that use one of
    ``names``, directly or through a module-level helper or fixture that does."""
    tree = parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    methods = {f"{c.name}.{m.name}": m for c in tree.body if isinstance(c, ast.ClassDef)
               for m in c.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
    tainted = set(names)
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, node in functions.items():
            args = {a.arg for a in node.args.args + node.args.kwonlyargs}  # fixtures arrive as arguments
            if name not in found and (names_used(node) | args) & tainted:
                found.add(name)
                tainted.add(name)
                changed = True
    found |= {name for name, node in methods.items()
              if (names_used(node) | {a.arg for a in node.args.args}) & tainted}
    return found


def name_tokens(text: str, name: str) -> list[tuple[int, int]]:
    """String offsets ``(start, end)`` of every NAME token equal to ``name`` (not in strings or comments)."""
    source = Source(text)
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string == name:
            start = source._starts[token.start[0] - 1] + token.start[1]
            found.append((start, start + len(name)))
    return found


def string_tokens(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, token text)`` of every string literal token."""
    source = Source(text)
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING:
            start = source._starts[token.start[0] - 1] + token.start[1]
            end = source._starts[token.end[0] - 1] + token.end[1]
            found.append((start, end, token.string))
    return found


def humanize(identifier: str) -> str:
    """``test_percent_off_rounds_half_up`` -> ``percent off rounds half up``."""
    name = identifier.split(".")[-1].split("[", 1)[0]
    name = re.sub(r"^test_?", "", name)
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return " ".join(part for part in name.lower().split("_") if part)
