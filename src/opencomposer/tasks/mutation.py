"""Mutation score of a task: how many small wrong versions of the gold change its hidden tests reject.

Audits of SWE-bench Verified and R2E-Gym found that about a quarter of their tasks accept incorrect
patches, because the tests check too little of the change. A task whose tests cannot tell the gold
change from a slightly broken copy of it rewards the agent for guessing. So each task is measured
the way mutation testing measures a test suite:

1. the lines the gold change adds to each non-test Python file (``added_lines``, a line diff of
   the file before and after the change) are the only places mutated;
2. ``mutants`` walks the gold file's syntax tree (``ast``) and, for every node that starts on one
   of those lines, makes one mutant per operator below; each replaces only that node's source
   text (``ast.unparse`` of the changed node), so the rest of the file keeps its formatting:

   - ``compare``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``,
     ``is`` <-> ``is not``;
   - ``arith``: ``+`` <-> ``-``, ``*`` <-> ``/`` (``//`` -> ``*``), ``%`` -> ``*``;
   - ``bool``: ``and`` <-> ``or``;
   - ``constant``: an integer ``n`` -> ``n + 1``, ``True`` <-> ``False``, a non-empty string ->
     ``""``;
   - ``negate``: the test of an ``if``/``while``/``assert``/conditional expression -> ``not (...)``;
   - ``drop``: a one-line statement (an assignment, a call, a ``return`` value, ``raise``) ->
     ``pass`` (a ``return x`` becomes ``return None``);

   mutants whose text does not compile, or equals the gold text, are left out. A deterministic
   draw (``rng_for``) keeps at most ``limit`` of them, spread over the operators;
3. ``score`` runs the task's tests on the gold state with each mutant in place (the caller's
   ``run``, the sandbox in ``tasks.mining``) and counts a mutant as *rejected* when any test the
   task lists (FAIL_TO_PASS or PASS_TO_PASS) does not pass. The mutation score is the share of
   mutants rejected.

Departures from textbook mutation testing: only the gold change's own lines are mutated (the task
measures the change, not the repository), and equivalent mutants are not detected, so a score
below 1.0 can be the mutants' fault as well as the tests'. The floor applied to the suite
(``MUTATION_FLOOR``) is set with that in mind (docs/realbench.md).

Not here: finding tasks (``tasks.mining``), running tests (``generators.common.Lab``).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from opencomposer.pysource import parse
from opencomposer.tasks.generators.common import rng_for
from opencomposer.tasks.generators.source import Tree, is_test_path

MUTATION_FLOOR = 0.5
"""Tasks whose tests reject fewer than half the mutants of their gold change are refused: an agent
could then pass with a change that is wrong in most of the ways the change could be wrong."""

COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
ARITH_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
               ast.Mod: ast.Mult}


@dataclass(frozen=True)
class Mutant:
    """One wrong version of a gold file: ``path`` with ``source`` in place of the gold text."""

    path: str
    line: int
    operator: str  # compare, arith, bool, constant, negate, drop
    description: str
    source: str


@dataclass
class MutationResult:
    """What ``score`` found: every mutant tried and the ones the tests let through."""

    mutants: int
    rejected: int
    survivors: list[str] = field(default_factory=list)  # descriptions of the mutants that passed

    @property
    def score(self) -> float:
        return self.rejected / self.mutants if self.mutants else 0.0


def added_lines(before: str, after: str) -> set[int]:
    """1-based numbers of the lines of ``after`` that are not in ``before`` (a line diff)."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    lines: set[int] = set()
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
    return lines


def _segment_offsets(source: str) -> list[int]:
    offsets, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def _replace(source: str, offsets: list[int], node: ast.AST, text: str) -> str:
    # ast's columns are UTF-8 byte offsets; convert through the line's bytes
    def position(lineno: int, col: int) -> int:
        line = source[offsets[lineno - 1]:offsets[lineno]]
        return offsets[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="replace"))

    start = position(node.lineno, node.col_offset)
    end = position(node.end_lineno, node.end_col_offset)
    return source[:start] + text + source[end:]


def _variants(node: ast.AST) -> list[tuple[str, str, ast.AST]]:
    """(operator, description, replacement node) for one node; the node itself is not changed."""
    import copy

    out: list[tuple[str, str, ast.AST]] = []
    if isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARE_SWAPS:
        new = copy.deepcopy(node)
        new.ops[0] = COMPARE_SWAPS[type(node.ops[0])]()
        out.append(("compare", f"{type(node.ops[0]).__name__} -> {type(new.ops[0]).__name__}", new))
    elif isinstance(node, ast.BinOp) and type(node.op) in ARITH_SWAPS:
        new = copy.deepcopy(node)
        new.op = ARITH_SWAPS[type(node.op)]()
        out.append(("arith", f"{type(node.op).__name__} -> {type(new.op).__name__}", new))
    elif isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("bool", f"{type(node.op).__name__} -> {type(new.op).__name__}", new))
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            out.append(("constant", f"{value} -> {not value}", ast.Constant(not value)))
        elif isinstance(value, int):
            out.append(("constant", f"{value} -> {value + 1}", ast.Constant(value + 1)))
        elif isinstance(value, str) and value:
            out.append(("constant", f"{value[:20]!r} -> ''", ast.Constant("")))
    elif isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
        out.append(("negate", f"{type(node).__name__} condition negated",
                    ast.UnaryOp(ast.Not(), copy.deepcopy(node.test))))
    return out


def _is_docstring(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    parent = parents.get(id(node))
    grand = parents.get(id(parent)) if parent is not None else None
    return (isinstance(parent, ast.Expr) and isinstance(grand, ast.Module | ast.ClassDef | ast.FunctionDef
                                                       | ast.AsyncFunctionDef) and grand.body[0] is parent)


def file_mutants(path: str, source: str, lines: set[int]) -> list[Mutant]:
    """Every mutant of ``source`` at a node starting on one of ``lines`` (see the module docstring)."""
    try:
        tree = parse(source)
    except SyntaxError:
        return []
    offsets = _segment_offsets(source)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found: list[Mutant] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) not in lines or _is_docstring(node, parents):
            continue
        if isinstance(parents.get(id(node)), ast.JoinedStr | ast.FormattedValue):
            continue  # the pieces of an f-string are not separate expressions in the source
        edits: list[tuple[str, str, ast.AST, str]] = []
        for operator, description, new in _variants(node):
            target = node.test if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert) else node
            edits.append((operator, description, target, f"({ast.unparse(new)})"))
        if (isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Expr | ast.Raise | ast.Return)
                and node.lineno == node.end_lineno and not _is_docstring(getattr(node, "value", node), parents)):
            if isinstance(node, ast.Return):
                if node.value is not None:
                    edits.append(("drop", "return value dropped", node, "return None"))
            else:
                edits.append(("drop", f"{type(node).__name__} statement dropped", node, "pass"))
        for operator, description, target, text in edits:
            mutated = _replace(source, offsets, target, text)
            if mutated == source:
                continue
            try:
                compile(mutated, path, "exec")
            except (SyntaxError, ValueError):
                continue
            found.append(Mutant(path, node.lineno, operator, f"{path}:{node.lineno} {description}", mutated))
    return found


def mutants(before: Tree, after: Tree, limit: int = 12, seed: object = 0) -> list[Mutant]:
    """At most ``limit`` mutants of the non-test Python files ``after`` changes against ``before``,
    drawn deterministically (by ``seed``) round-robin over the operators so no kind crowds out
    the rest."""
    pool: dict[str, list[Mutant]] = {}
    for path in sorted(after):
        if not path.endswith(".py") or is_test_path(path) or after[path] == before.get(path):
            continue
        text = after[path].decode("utf-8", errors="replace")
        lines = added_lines(before.get(path, b"").decode("utf-8", errors="replace"), text)
        for mutant in file_mutants(path, text, lines):
            pool.setdefault(mutant.operator, []).append(mutant)
    rng = rng_for("mutants", seed)
    for group in pool.values():
        rng.shuffle(group)
    chosen: list[Mutant] = []
    groups = [pool[k] for k in sorted(pool)]
    while len(chosen) < limit and any(groups):
        for group in groups:
            if group and len(chosen) < limit:
                chosen.append(group.pop())
    return chosen


def score(gold_state: Tree, chosen: list[Mutant], required: set[str],
          run: Callable[[Tree], set[str]], floor: float | None = None) -> MutationResult:
    """Run ``run(state)`` (the node ids that pass) on ``gold_state`` with each mutant in place; a
    mutant is rejected when one of the ``required`` tests does not pass. With ``floor``, stop as
    soon as so many mutants survived that the score of all of them would be under it (the result
    then counts only the mutants run, and its score is under the floor too)."""
    result = MutationResult(mutants=0, rejected=0)
    for mutant in chosen:
        passed = run({**gold_state, mutant.path: mutant.source.encode("utf-8")})
        result.mutants += 1
        if required - passed:
            result.rejected += 1
        else:
            result.survivors.append(mutant.description)
        if floor is not None and (len(chosen) - len(result.survivors)) < floor * len(chosen):
            break
    return result
