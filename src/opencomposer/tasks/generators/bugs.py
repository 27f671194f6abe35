"""Bug injection: break working code the way people do, and ask for the fix.

Over any Python repository with tests, ``find_mutations`` lists every place inside a function
where one of these operators applies (found with ``ast``, applied by splicing the text):

==================== =========================================================================
operator             change
==================== =========================================================================
binary_operator      ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``*``, ``%`` -> ``//``, ``+=`` <-> ``-=``
comparison           ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``,
                     ``is`` <-> ``is not``
boolean_operator     ``and`` <-> ``or``
off_by_one           an integer in an index, a slice, ``range()``, a comparison or arithmetic ±1
constant             another integer or float elsewhere, ``True`` <-> ``False``, a numeric
                     string (``Decimal("0.01")``) with its last digit changed
dropped_condition    a guard ``if`` (body ends in raise/return/continue/break, no else) removed,
                     or one side of a two-operand ``and``/``or`` dropped
dropped_return       a return inside a branch or loop replaced by ``pass``
swapped_arguments    two adjacent positional arguments of a call exchanged
==================== =========================================================================

A task injects one bug, or two or three in different files (``tasks.multi_bug_fraction``); each
bug of a multi-file task must break a test on its own, so none of them is dead weight in the gold
patch. The operator is drawn first and the site second, so operators are balanced however many
sites each has; sites inside functions the tests mention are drawn three times as often.

The tests that catch the bug are taken out of the visible test files (the whole file when nothing
else is left) and come back as hidden tests at grading, like a regression that slipped past CI.
The prompt is a developer's bug report: the broken behaviours, read from the names of the failing
tests, and, for easier tasks, the function or module at fault; never the test itself.

Not here: mutations at module level (they break imports rather than behaviour), in decorators,
annotations, default values or f-strings.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

from opencomposer.pysource import parse
from opencomposer.tasks.generators.common import Candidate, Lab, Rejected
from opencomposer.tasks.generators.edits import (
    Edit,
    Source,
    apply_edits,
    function_of,
    humanize,
    remove_statement,
    strip_tests,
)
from opencomposer.tasks.generators.source import SourceRepo, Tree

OPERATORS = ("binary_operator", "comparison", "boolean_operator", "off_by_one", "constant", "dropped_condition",
             "dropped_return", "swapped_arguments")
BINARY_SWAPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
                ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "//")}
COMPARE_SWAPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
                 ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
GUARD_ENDS = (ast.Raise, ast.Return, ast.Continue, ast.Break)
LOW_PRECEDENCE = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)
NUMERIC_STRING = re.compile(r"^-?\d+(\.\d+)?$")


@dataclass(frozen=True)
class Mutation:
    """One injectable bug: replace ``edits`` in file ``path``; ``function`` is where it sits."""

    path: str
    operator: str
    line: int
    function: str
    edits: tuple[Edit, ...]
    before: str
    after: str

    @property
    def key(self) -> tuple:
        return (self.path, self.edits)


def _operator_edit(source: Source, left: ast.AST, right: ast.AST, old: str, new: str) -> Edit | None:
    """Replace operator ``old`` found between two operands (parentheses may surround it)."""
    start, _ = source.span(right)
    _, end = source.span(left)
    gap = source.text[end:start]
    if "#" in gap:
        return None
    if old[0].isalpha():
        pattern = r"\b" + r"\s+".join(map(re.escape, old.split())) + r"\b"
    else:
        pattern = r"(?<![*/<>=!+\-%])" + re.escape(old) + r"(?![*/=<>])"
    match = re.search(pattern, gap)
    if match is None:
        return None
    return Edit(end + match.start(), end + match.end(), new)


class _Finder:
    """Walks the function bodies of one module and collects mutations."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.source = Source(text)
        self.found: list[Mutation] = []

    def add(self, operator: str, node: ast.AST, function: str, edits: list[Edit]) -> None:
        edits = [e for e in edits if e is not None]
        if not edits:
            return
        text = self.source.text
        start = min(e.start for e in edits)
        end = max(e.end for e in edits)
        mutated = apply_edits(text, edits)  # parsed when applied (``apply_mutations``), not here: cheap
        delta = len(mutated) - len(text)
        self.found.append(Mutation(self.path, operator, node.lineno, function, tuple(edits),
                                   text[start:end], mutated[start : end + delta]))

    def run(self) -> list[Mutation]:
        self.scope(self.source.tree.body, "")
        return self.found

    def scope(self, body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{node.name}"
                self.function(node, name)
                self.scope(node.body, f"{name}.")
            elif isinstance(node, ast.ClassDef):
                self.scope(node.body, f"{prefix}{node.name}.")

    def function(self, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
        for stmt in func.body:
            self.statement(stmt, name, top_level=True, parent=func.body)

    def statement(self, stmt: ast.stmt, function: str, top_level: bool, parent: list[ast.stmt]) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return  # nested definitions are walked as scopes of their own
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            return  # a docstring
        if isinstance(stmt, ast.Return) and not top_level:
            self.add("dropped_return", stmt, function, [Edit(*self.source.span(stmt), "pass")])
        if isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], GUARD_ENDS):
            self.add("dropped_condition", stmt, function, [remove_statement(self.source, stmt, parent)])
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in (ast.Add, ast.Sub):
            old, new = BINARY_SWAPS[type(stmt.op)]
            self.add("binary_operator", stmt, function,
                     [_operator_edit(self.source, stmt.target, stmt.value, old + "=", new + "=")])
        for child_field, value in ast.iter_fields(stmt):
            if child_field in ("body", "orelse", "finalbody", "handlers", "cases"):
                continue
            for expr in value if isinstance(value, list) else [value]:
                if isinstance(expr, ast.expr):
                    self.expression(expr, function, context=None)
        blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(stmt, "handlers", [])] + [c.body for c in getattr(stmt, "cases", [])]
        for block in blocks:
            for child in block:
                self.statement(child, function, top_level=False, parent=block)

    def expression(self, node: ast.expr, function: str, context: str | None) -> None:
        source = self.source
        if isinstance(node, ast.JoinedStr | ast.Lambda):
            return
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY_SWAPS:
            strings = (ast.JoinedStr,)
            is_text = any(isinstance(side, strings) or (isinstance(side, ast.Constant) and isinstance(side.value, str))
                          for side in (node.left, node.right))
            if not is_text:
                old, new = BINARY_SWAPS[type(node.op)]
                self.add("binary_operator", node, function, [_operator_edit(source, node.left, node.right, old, new)])
        elif isinstance(node, ast.Compare):
            old, new = COMPARE_SWAPS[type(node.ops[0])]
            self.add("comparison", node, function, [_operator_edit(source, node.left, node.comparators[0], old, new)])
        elif isinstance(node, ast.BoolOp):
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            self.add("boolean_operator", node, function,
                     [_operator_edit(source, node.values[0], node.values[1], old, new)])
            if len(node.values) == 2:
                for kept in node.values:
                    text = source.segment(kept)
                    text = f"({text})" if isinstance(kept, LOW_PRECEDENCE) else text
                    self.add("dropped_condition", node, function, [Edit(*source.span(node), text)])
        elif isinstance(node, ast.Call):
            self.call(node, function)
        elif isinstance(node, ast.Constant):
            self.constant(node, function, context)
        child_context = None
        if isinstance(node, ast.Subscript | ast.Slice | ast.Compare | ast.BinOp):
            child_context = "index"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            child_context = "index"
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child, function, child_context)

    def call(self, node: ast.Call, function: str) -> None:
        args = node.args
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                continue
            text_a, text_b = self.source.segment(a), self.source.segment(b)
            if text_a != text_b:
                self.add("swapped_arguments", node, function,
                         [Edit(*self.source.span(a), text_b), Edit(*self.source.span(b), text_a)])

    def constant(self, node: ast.Constant, function: str, context: str | None) -> None:
        value = node.value
        span = self.source.span(node)
        if isinstance(value, bool):
            self.add("constant", node, function, [Edit(*span, repr(not value))])
        elif type(value) is int and context == "index":
            self.add("off_by_one", node, function, [Edit(*span, repr(value + 1))])
            if value > 0:
                self.add("off_by_one", node, function, [Edit(*span, repr(value - 1))])
        elif type(value) is int:
            self.add("constant", node, function, [Edit(*span, repr(1 - value if value in (0, 1) else value * 2))])
        elif type(value) is float:
            self.add("constant", node, function, [Edit(*span, repr(value * 2 if value else 1.0))])
        elif isinstance(value, str) and NUMERIC_STRING.match(value):
            text = self.source.segment(node)
            quote = text[-1]
            changed = value[:-1] + str((int(value[-1]) + 1) % 10)
            if text.endswith(value + quote):
                self.add("constant", node, function, [Edit(span[1] - 1 - len(value), span[1] - 1, changed)])


def find_mutations(path: str, text: str) -> list[Mutation]:
    """Every mutation of the module ``text`` (file ``path``), in source order."""
    return _Finder(path, text).run()


def apply_mutations(tree: Tree, mutations: list[Mutation]) -> Tree:
    """``tree`` with every mutation applied (several per file allowed if they do not overlap);
    ``Rejected`` if a changed file no longer parses."""
    changed = dict(tree)
    by_file: dict[str, list[Edit]] = {}
    for mutation in mutations:
        by_file.setdefault(mutation.path, []).extend(mutation.edits)
    for path, edits in by_file.items():
        text = apply_edits(tree[path].decode("utf-8"), edits)
        try:
            parse(text)
        except SyntaxError as e:
            raise Rejected(f"{path}: the mutation does not parse ({e.msg}, line {e.lineno})") from None
        changed[path] = text.encode("utf-8")
    return changed


class BugGenerator:
    """Proposes bug-injection candidates over one source repository."""

    kind = "bugs"

    def __init__(self, lab: Lab):
        self.lab = lab
        self._sites: dict[str, list[Mutation]] = {}
        self._tested_names: dict[str, str] = {}

    def sites(self, source: SourceRepo) -> list[Mutation]:
        if source.digest not in self._sites:
            found: list[Mutation] = []
            for path in source.code_files:
                try:
                    found += find_mutations(path, source.tree[path].decode("utf-8"))
                except (SyntaxError, UnicodeDecodeError):
                    continue
            self._sites[source.digest] = found
            self._tested_names[source.digest] = "\n".join(
                source.tree[p].decode("utf-8", errors="replace") for p in source.test_files)
        return self._sites[source.digest]

    def draw(self, source: SourceRepo, rng: random.Random, exclude_files: set[str]) -> Mutation | None:
        sites = [m for m in self.sites(source) if m.path not in exclude_files]
        operators = sorted({m.operator for m in sites})
        if not operators:
            return None
        operator = rng.choice(operators)
        pool = [m for m in sites if m.operator == operator]
        tests_text = self._tested_names[source.digest]
        weights = [3 if m.function.split(".")[-1] in tests_text else 1 for m in pool]
        return rng.choices(pool, weights=weights)[0]

    def propose(self, source: SourceRepo, rng: random.Random) -> Candidate:
        multi = rng.random() < self.lab.config.multi_bug_fraction
        if not multi:
            mutation = self.draw(source, rng, set())
            if mutation is None:
                raise Rejected(f"{source.name}: no place to inject a bug")
            return self.candidate(source, [mutation], rng)
        count = rng.choice((2, 3))
        chosen: list[Mutation] = []
        for _ in range(4 * count):
            if len(chosen) == count:
                break
            mutation = self.draw(source, rng, {m.path for m in chosen})
            if mutation is None:
                break
            try:  # each bug must be caught on its own (the run is cached across tasks)
                self.lab.outcome(source.tree, apply_mutations(source.tree, [mutation]), source.task_command)
            except Rejected:
                continue
            chosen.append(mutation)
        if len(chosen) < 2:
            raise Rejected(f"{source.name}: found fewer than two bugs in different files that tests catch")
        return self.candidate(source, chosen, rng)

    def candidate(self, source: SourceRepo, mutations: list[Mutation], rng: random.Random) -> Candidate:
        mutations = sorted(mutations, key=lambda m: (m.path, m.line))
        broken = apply_mutations(source.tree, mutations)
        tests = source.tests_tree()
        style = rng.choice(self.lab.config.bug_styles) if len(mutations) == 1 else "several"
        template = rng.randrange(3)
        label = ", ".join(f"{m.path}:{m.line} {m.operator}" for m in mutations)

        def visible(fail_to_pass: list[str]) -> Tree:
            return hide_tests(tests, failing_by_file(fail_to_pass))

        def instruction(fail_to_pass: list[str]) -> str:
            return bug_report(source, mutations, fail_to_pass, style, template)

        difficulty = {"function": "easy", "module": "medium", "behaviour": "hard", "several": "hard"}[style]
        return Candidate(
            source=source,
            gold_code=source.code_tree(),
            broken_code={p: d for p, d in broken.items() if p in source.code_tree()},
            grading_tests=tests,
            visible_tests=visible,
            instruction=instruction,
            metadata={"source": "bug_injection", "kind": "fix", "difficulty": difficulty,
                      "operators": [m.operator for m in mutations], "files": sorted({m.path for m in mutations})},
            label=label,
        )


def failing_by_file(fail_to_pass: list[str]) -> dict[str, set[str]]:
    """Test names (``test_b`` or ``TestA.test_b``) of FAIL_TO_PASS ids, by test file."""
    by_file: dict[str, set[str]] = {}
    for node in fail_to_pass:
        by_file.setdefault(node.split("::", 1)[0], set()).add(function_of(node))
    return by_file


def hide_tests(tests: Tree, remove: dict[str, set[str]], unimport: frozenset[str] = frozenset()) -> Tree:
    """The visible test files: each loses the tests named in ``remove`` (and the imported names in
    ``unimport``), and is left out entirely when no test would remain in it."""
    visible = dict(tests)
    for path, data in tests.items():
        names = remove.get(path, set())
        if not path.endswith(".py") or (not names and not unimport):
            continue
        try:
            stripped = strip_tests(data.decode("utf-8"), names, unimport)
        except SyntaxError:
            stripped = None
        if stripped is None:
            if names or path.rsplit("/", 1)[-1].startswith("test"):
                visible.pop(path)
        elif stripped != data.decode("utf-8"):
            visible[path] = stripped.encode("utf-8")
    return visible


def behaviours(fail_to_pass: list[str], limit: int) -> list[str]:
    """Distinct readable behaviours from the failing tests' names, at most ``limit``."""
    seen: list[str] = []
    for node in fail_to_pass:
        phrase = humanize(function_of(node))
        if phrase and phrase not in seen:
            seen.append(phrase)
    return seen[:limit]


def bug_report(source: SourceRepo, mutations: list[Mutation], fail_to_pass: list[str], style: str,
               template: int) -> str:
    """A terse bug report in a developer's voice; never the failing test's code."""
    package = source.package
    if style == "several":
        per_bug = []
        for mutation in mutations:
            related = [n for n in fail_to_pass if mutation.function.split(".")[-1].lower() in n.lower()]
            per_bug += behaviours(related or fail_to_pass, 1)
        found = list(dict.fromkeys(per_bug + behaviours(fail_to_pass, 3)))[: len(mutations)]
        listing = "; ".join(f'"{b}"' for b in found)
        return (
            f"A few regressions slipped into {package} with the last merge: {listing} are broken again. "
            "Find the bugs and fix them (the tests are right).",
            f"{package} is broken in several places after the refactor. Failing areas: {listing}. Please fix.",
            f"Several things in {package} stopped working: {listing}. Track the bugs down and fix the code.",
        )[template]
    mutation = mutations[0]
    behaviour = behaviours(fail_to_pass, 1)[0]
    module = source.module_name(mutation.path)
    if style == "function":
        return (
            f"`{mutation.function}` in `{mutation.path}` has a bug: the \"{behaviour}\" case comes out wrong. "
            "Fix it.",
            f"Something's off in `{module}.{mutation.function}`; \"{behaviour}\" doesn't work anymore. "
            "Can you fix it?",
            f"Bug in `{mutation.function}` ({mutation.path}): \"{behaviour}\" is broken. Please fix.",
        )[template]
    if style == "module":
        return (
            f"Regression in `{module}`: \"{behaviour}\" doesn't work anymore. Please find and fix it.",
            f"Something in {mutation.path} broke \"{behaviour}\". Can you track it down?",
            f"`{module}` has a bug since the last change: \"{behaviour}\" fails. Fix the code, not the tests.",
        )[template]
    return (
        f"\"{behaviour}\" is broken in {package} since the last merge. Please fix.",
        f"Users report that \"{behaviour}\" no longer works in {package}. Track it down and fix it.",
        f"Something broke \"{behaviour}\" in {package}. Can you find the bug and fix it?",
    )[template]
