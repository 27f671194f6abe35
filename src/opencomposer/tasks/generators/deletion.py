"""Feature deletion (docs/recipe.md §9): take a tested feature out of working code and ask for it back.

A *feature* is a public function, method or class, plus what only it needs:

- the private module-level helpers that nothing else uses;
- when exactly one other public function (in the same or another module) calls it and nothing
  calls that one, the caller too, so the feature spans files (a helper and its entry point);
- its imports where they become unused, its re-export in the package ``__init__`` and its
  ``__all__`` entry.

Features that module-level code refers to (a registry, a decorator, a default) or that other code
calls in several places are not deleted: the repository must still import and the rest of the
suite stay green (``Lab.outcome`` checks both by running it). The tests that exercise the feature
are FAIL_TO_PASS; they are taken out of the visible test files (with their imports of deleted
names) and return as hidden tests.

No trace of the deleted code may stay in the task repository: it is written from an in-memory
tree that never holds bytecode, ``__pycache__``, type-checker or linter caches or ``.git``
(``generators.source``), the ``def``/``class`` line appears nowhere, and ``realize`` scans the
written folder again. The prompt asks for the feature by its signature and the first paragraph
of its docstring, in a developer's words.

Not here: deleting features whose removal needs a rewrite of their callers (those are refactors).
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass, field

from opencomposer.pysource import parse
from opencomposer.tasks.generators.bugs import failing_by_file, hide_tests
from opencomposer.tasks.generators.common import Candidate, Lab, Rejected
from opencomposer.tasks.generators.edits import (
    Edit,
    Source,
    apply_edits,
    first_line,
    mentioning,
    names_used,
    prune_import,
    prune_unused_imports,
    remove_statement,
)
from opencomposer.tasks.generators.source import SourceRepo, Tree

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
MAX_LINES = 90  # a feature, not a subsystem: larger deletions are left out


@dataclass
class Unit:
    """One definition to delete: ``qualname`` is ``name`` or ``Class.method``."""

    path: str
    qualname: str
    node: Definition
    parent: list[ast.stmt]  # the body it sits in

    @property
    def name(self) -> str:
        return self.qualname.split(".")[-1]

    @property
    def is_method(self) -> bool:
        return "." in self.qualname

    @property
    def lines(self) -> int:
        return self.node.end_lineno - first_line(self.node) + 1


@dataclass
class Feature:
    """What one deletion removes: ``units[0]`` is the feature, the rest what only it needed."""

    units: list[Unit]
    callers: list[Unit] = field(default_factory=list)  # public entry points deleted with it

    @property
    def public(self) -> list[Unit]:
        return [self.units[0], *self.callers]

    @property
    def all_units(self) -> list[Unit]:
        return [*self.public, *self.units[1:]]

    @property
    def label(self) -> str:
        return " + ".join(f"{u.path}:{u.qualname}" for u in self.public)


class _Index:
    """Definitions and references across the code modules of one source."""

    def __init__(self, source: SourceRepo):
        self.source = source
        self.modules = {}
        for path in source.code_files:
            try:
                self.modules[path] = Source(source.tree[path].decode("utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
        # names each top-level statement mentions, computed once: the analysis asks for every name
        self.mentions = {id(node): names_used(node) for module in self.modules.values()
                         for node in module.tree.body}
        self.occurrences: dict[str, list[tuple[str, ast.AST]]] = {}
        for path, module in self.modules.items():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Name):
                    self.occurrences.setdefault(node.id, []).append((path, node))
                elif isinstance(node, ast.Attribute):
                    self.occurrences.setdefault(node.attr, []).append((path, node))
        self.top: dict[tuple[str, str], Unit] = {}
        self.methods: list[Unit] = []
        for path, module in self.modules.items():
            for node in module.tree.body:
                if isinstance(node, Definition):
                    self.top[(path, node.name)] = Unit(path, node.name, node, module.tree.body)
                    if isinstance(node, ast.ClassDef) and not _is_protocol(node):
                        self.methods += [Unit(path, f"{node.name}.{m.name}", m, node.body) for m in node.body
                                         if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")
                                         and not _is_stub(m)]

    def is_init(self, path: str) -> bool:
        return path.endswith("__init__.py")

    def references(self, name: str, exclude: Definition) -> tuple[set[tuple[str, str]], bool]:
        """Top-level definitions (path, name) whose code mentions ``name``, and whether module-level
        code (outside imports and ``__init__`` re-exports) mentions it."""
        users: set[tuple[str, str]] = set()
        module_level = False
        for path, module in self.modules.items():
            for node in module.tree.body:
                if node is exclude:
                    continue
                if isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                if self.is_init(path) and _is_all(node):
                    continue
                if name in self.mentions[id(node)]:
                    if isinstance(node, Definition):
                        users.add((path, node.name))
                    else:
                        module_level = True
        return users, module_level

    def attribute_used(self, name: str, unit: Unit) -> bool:
        """Whether ``name`` is read as a name or attribute anywhere outside ``unit``."""
        return any(path != unit.path or not _inside(node, unit.node) for path, node in self.occurrences.get(name, []))

    def private_helpers(self, units: list[Unit]) -> list[Unit]:
        """Private module-level definitions used only by ``units`` (followed transitively)."""
        chosen = {(u.path, u.qualname) for u in units}
        helpers: list[Unit] = []
        changed = True
        while changed:
            changed = False
            for (path, name), unit in self.top.items():
                if not name.startswith("_") or (path, name) in chosen:
                    continue
                users, module_level = self.references(name, unit.node)
                if module_level or not users:
                    continue
                if users <= chosen | {(path, name)} and all(u[0] == path for u in users):
                    chosen.add((path, name))
                    helpers.append(unit)
                    changed = True
        return helpers


def _inside(node: ast.AST, container: ast.AST) -> bool:
    return (container.lineno, container.col_offset) <= (node.lineno, node.col_offset) and \
        (node.end_lineno, node.end_col_offset) <= (container.end_lineno, container.end_col_offset)


def _is_all(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id in ("Protocol", "ABC") for b in node.bases)


def _is_stub(node: ast.FunctionDef) -> bool:
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return not body or all(isinstance(s, ast.Pass) for s in body)


def find_features(source: SourceRepo) -> list[Feature]:
    """Every deletable feature of ``source``, in path order."""
    index = _Index(source)
    features: list[Feature] = []
    for (path, name), unit in sorted(index.top.items()):
        if name.startswith("_") or name == "main" or index.is_init(path):
            continue
        users, module_level = index.references(name, unit.node)
        if module_level:
            continue
        callers: list[Unit] = []
        if users:
            if len(users) != 1:
                continue
            caller = index.top[next(iter(users))]
            if caller.name.startswith("_") or not isinstance(caller.node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            caller_users, caller_module_level = index.references(caller.name, caller.node)
            if caller_users or caller_module_level:
                continue
            callers = [caller]
        helpers = index.private_helpers([unit, *callers])
        features.append(Feature([unit, *helpers], callers))
    for unit in index.methods:
        if not index.attribute_used(unit.name, unit):
            features.append(Feature([unit]))
    return [f for f in features if sum(u.lines for u in f.all_units) <= MAX_LINES]


def remove_from_all(source: Source, names: set[str]) -> list[Edit]:
    """Edits taking ``names`` out of an ``__all__`` list or tuple."""
    edits = []
    for node in source.tree.body:
        if not _is_all(node) or not isinstance(node.value, ast.List | ast.Tuple):
            continue
        for element in node.value.elts:
            if not (isinstance(element, ast.Constant) and element.value in names):
                continue
            start, end = source.span(element)
            line_start, line_end = source.line_start(element.lineno), source.line_end(element.lineno)
            before, after = source.text[line_start:start], source.text[end:line_end]
            if not before.strip() and after.strip() in (",", ""):
                edits.append(Edit(line_start, line_end, ""))
            else:
                match = re.match(r"\s*,\s*", source.text[end:])
                edits.append(Edit(start, end + (match.end() if match else 0), ""))
    return edits


def delete_feature(source: SourceRepo, feature: Feature) -> Tree:
    """The code tree without the feature (tests untouched)."""
    index = _Index(source)
    deleted_names = {u.name for u in feature.all_units if not u.is_method}
    tree = source.code_tree()
    for path, module in index.modules.items():
        units = [u for u in feature.all_units if u.path == path]
        edits = [remove_statement(module, u.node, u.parent) for u in units]
        imports = [e for n in module.tree.body if isinstance(n, ast.Import | ast.ImportFrom)
                   if (e := prune_import(module, n, deleted_names)) is not None]
        if index.is_init(path):
            edits += remove_from_all(module, deleted_names)
        if not edits and not imports:
            continue
        text = apply_edits(module.text, edits + imports)
        try:
            text = prune_unused_imports(module.text, text)  # parses what is left
        except SyntaxError as e:
            raise Rejected(f"{path}: the deletion leaves code that does not parse ({e.msg}, line {e.lineno})") from None
        tree[path] = text.encode("utf-8")
    for unit in feature.all_units:
        if unit.is_method:
            continue
        header = re.compile(rf"^(async\s+def|def|class)\s+{re.escape(unit.name)}\b", re.M)
        for path, data in tree.items():
            if header.search(data.decode("utf-8", errors="replace")):
                raise Rejected(f"{path} still defines {unit.name!r} after the deletion")
    return tree


def signature(unit: Unit) -> str:
    """``name(args) -> returns`` for a function or method (without ``self``), ``Name(fields)`` for a
    class (its ``__init__`` arguments or its dataclass fields)."""
    node = unit.node
    if isinstance(node, ast.ClassDef):
        init = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
        if init is not None:
            return f"{node.name}({_arguments(init, drop_first=True)})"
        fields = [ast.unparse(s.target) + (f": {ast.unparse(s.annotation)}") + (f" = {ast.unparse(s.value)}"
                  if s.value is not None else "") for s in node.body if isinstance(s, ast.AnnAssign)]
        return f"{node.name}({', '.join(fields)})"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async " if isinstance(node, ast.AsyncFunctionDef) else ""
    return f"{prefix}{unit.qualname}({_arguments(node, drop_first=unit.is_method)}){returns}"


def _arguments(node: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> str:
    args = node.args
    if drop_first and (args.posonlyargs or args.args):
        args = ast.arguments(posonlyargs=args.posonlyargs[1:] if args.posonlyargs else [],
                             args=args.args if args.posonlyargs else args.args[1:], vararg=args.vararg,
                             kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                             defaults=args.defaults)
    return ast.unparse(args)


def summary(unit: Unit, limit: int = 260) -> str:
    """The first paragraph of the docstring, on one line, cut at a sentence near ``limit``."""
    doc = ast.get_docstring(unit.node) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    paragraph = paragraph.replace("``", "`").replace(":func:", "").replace(":class:", "").replace(":mod:", "")
    if len(paragraph) > limit:
        cut = paragraph.rfind(". ", 0, limit)
        paragraph = paragraph[: cut + 1] if cut > 40 else paragraph[:limit].rsplit(" ", 1)[0] + "…"
    return paragraph


class DeletionGenerator:
    """Proposes feature-deletion candidates from a finite pool of features (``registry`` walks it
    in a seeded order, so a stream repeats a feature only after using them all)."""

    kind = "deletion"

    def __init__(self, lab: Lab):
        self.lab = lab
        self._features: dict[str, list[Feature]] = {}

    def features(self, source: SourceRepo) -> list[Feature]:
        if source.digest not in self._features:
            self._features[source.digest] = find_features(source)
        return self._features[source.digest]

    def pool(self, sources: list[SourceRepo]) -> list[tuple[SourceRepo, Feature]]:
        """Every (source, feature) a task could delete: a finite pool the stream walks through."""
        return [(source, feature) for source in sources for feature in self.features(source)]

    def build(self, item: tuple[SourceRepo, Feature], rng: random.Random) -> Candidate:
        source, feature = item
        broken = delete_feature(source, feature)
        exported = _exported(source, broken, feature)
        deleted_names = frozenset(u.name for u in feature.all_units if not u.is_method)
        tests = source.tests_tree()
        template = rng.randrange(3)
        lines = sum(u.lines for u in feature.all_units)
        difficulty = "easy" if lines < 15 and not feature.callers else "medium" if lines < 45 else "hard"
        return Candidate(
            source=source,
            gold_code=source.code_tree(),
            broken_code=broken,
            grading_tests=tests,
            visible_tests=lambda fail_to_pass: visible_tests(tests, fail_to_pass, deleted_names),
            instruction=feature_request(source, feature, exported, template),
            metadata={"source": "feature_deletion", "kind": "feature", "difficulty": difficulty,
                      "deleted": [f"{u.path}:{u.qualname}" for u in feature.all_units]},
            label=feature.label,
        )


def visible_tests(tests: Tree, fail_to_pass: list[str], deleted: frozenset[str]) -> Tree:
    """Test files without the tests of the deleted feature. A module importing a deleted name fails
    to collect in the broken state, so all its tests are FAIL_TO_PASS; there only the tests (and
    helpers and fixtures) that use the feature go, and the rest stay visible."""
    remove = failing_by_file(fail_to_pass)
    for path, data in tests.items():
        if not path.endswith(".py"):
            continue
        tree = parse(data.decode("utf-8"))
        imported = {(a.asname or a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if imported & deleted:
            remove[path] = mentioning(data.decode("utf-8"), deleted)
    return hide_tests(tests, remove, deleted)


def _exported(source: SourceRepo, broken: Tree, feature: Feature) -> bool:
    """Whether the package ``__init__`` lost a re-export of the feature."""
    names = {u.name for u in feature.public if not u.is_method}
    for path in source.code_files:
        if path.endswith("__init__.py") and broken.get(path) != source.tree[path]:
            text = source.tree[path].decode("utf-8")
            if any(re.search(rf"\b{re.escape(n)}\b", text) for n in names):
                return True
    return False


def feature_request(source: SourceRepo, feature: Feature, exported: bool, template: int) -> str:
    """The prompt: what to add, where, with its signature and what it does."""
    main = feature.units[0]
    what = "class" if isinstance(main.node, ast.ClassDef) else "method" if main.is_method else "function"
    doc = summary(main)
    described = f" {doc}" if doc else ""
    text = (
        f"Add `{signature(main)}` to `{main.path}`.{described}",
        f"We need a `{main.qualname}` {what} in `{main.path}`: `{signature(main)}`.{described}",
        f"Implement `{signature(main)}` in {main.path}.{described}",
    )[template]
    decorators = [f"@{ast.unparse(d)}" for d in main.node.decorator_list]
    if decorators and not doc:
        text += f" Decorate it with `{' '.join(decorators)}` like its neighbours."
    for caller in feature.callers:
        caller_doc = summary(caller, limit=160)
        text += f" Then build `{signature(caller)}` in `{caller.path}` on top of it." + (
            f" {caller_doc}" if caller_doc else "")
    if exported:
        text += f" Export it from `{source.package}`."
    return text
