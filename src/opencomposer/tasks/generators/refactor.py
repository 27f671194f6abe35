"""Multi-file refactors: the agent starts from working code and is asked to reshape it.

Three operations, each found by ``ast`` in the source and applied by splicing text:

- **rename**: a public module-level function or class that other modules import is renamed
  everywhere (definition, imports, call sites, ``__all__``, backticked mentions in docstrings and
  Markdown). Only names that mean nothing else anywhere in the code or tests qualify (no parameter,
  attribute, keyword or local of the same name), and the new name comes from a table of synonyms
  for the words of the old one. Hidden tests: the existing test files with the name changed, plus
  a test that the new name exists and the old one is gone (no alias).
- **thread**: a function ``f`` has a keyword with a literal default (``width=70``) that a caller
  ``g`` elsewhere in the package cannot pass on; ``g`` (every such caller) gets the same
  keyword-only parameter and passes it to ``f``. Hidden tests: each caller's signature, and a call
  of ``g`` copied from the existing tests with a non-default value, where ``f`` is replaced by a spy
  that records what it receives (and stops the call).
- **default**: a parameter's literal default changes (``70`` -> ``140``, ``True`` -> ``False``) in
  the function and in every function that declares the same default and forwards the parameter
  to it, across modules where the chain crosses them. Hidden tests: each signature, and the
  existing tests with every call that relied on the old default passing it explicitly, so they
  still pin the old behaviour. Candidates whose change breaks other tests are rejected by the run.

FAIL_TO_PASS are the new checks (and renamed tests); everything else must keep passing.

Not here: refactors that need judgement (splitting a module, changing a data model); the
hand-written suite has those.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

from opencomposer.pysource import literal_eval
from opencomposer.tasks.generators.common import Candidate, Lab
from opencomposer.tasks.generators.edits import (
    Edit,
    Source,
    apply_edits,
    name_tokens,
    string_tokens,
)
from opencomposer.tasks.generators.source import SourceRepo, Tree, is_test_path

OPERATIONS = ("rename", "thread", "default")

# Synonyms for the words of identifiers; a rename swaps the first word that has one.
SYNONYMS = {
    "add": "append", "allocate": "distribute", "amount": "value", "apply": "run", "as": "into",
    "balance": "net", "between": "within", "break": "split", "build": "make", "busy": "occupied",
    "calendar": "schedule", "case": "style", "catalog": "product_index", "categories": "groups",
    "category": "group", "check": "verify", "collect": "gather", "compute": "calculate",
    "conflicts": "clashes", "count": "tally", "create": "make", "default": "fallback", "describe": "explain",
    "detect": "guess", "display": "visible", "duration": "span", "elapsed": "passed", "entry": "record",
    "env": "environ", "escape": "quote", "event": "occasion", "events": "occasions", "expenses": "costs",
    "expire": "lapse", "fill": "flow", "find": "search", "fold": "wrap", "format": "render",
    "free": "open", "frequencies": "counts", "get": "fetch", "intervals": "spans", "justify": "align",
    "largest": "biggest", "layer": "source", "line": "row", "lines": "rows", "load": "read",
    "localize": "attach", "make": "build", "matches": "fits", "merge": "combine", "money": "cash",
    "monthly": "per_month", "ngrams": "shingles", "occurrences": "instances", "offset": "shift",
    "order": "purchase", "overlaps": "intersects", "parse": "read", "path": "location", "percent": "pct",
    "period": "span", "price": "cost", "priced": "costed", "read": "load", "redact": "mask",
    "register": "enroll", "render": "format", "reserve": "hold", "rule": "policy", "save": "store",
    "search": "find", "select": "pick", "sentences": "clauses", "shorten": "abbreviate", "size": "extent",
    "slots": "windows", "slug": "handle", "slugify": "sluggify", "split": "separate", "summary": "digest",
    "table": "grid", "tax": "levy", "text": "content", "to": "as", "tokens": "terms", "unique": "distinct",
    "utc": "universal", "validate": "check", "width": "columns", "word": "term", "words": "terms",
    "wrap": "fold", "zone": "tz",
}


def new_name(old: str) -> str | None:
    """A synonym of ``old`` with the same shape (snake_case or CamelCase), or None."""
    if "_" in old or old.islower():
        words = old.split("_")
        for i, word in enumerate(words):
            if word in SYNONYMS:
                return "_".join(words[:i] + [SYNONYMS[word]] + words[i + 1 :])
        return None
    words = re.findall(r"[A-Z][a-z0-9]*", old)
    for i, word in enumerate(words):
        swap = SYNONYMS.get(word.lower())
        if swap:
            camel = "".join(part.capitalize() for part in swap.split("_"))
            return "".join(words[:i] + [camel] + words[i + 1 :])
    return None


@dataclass
class Plan:
    """One refactor: the code and test trees after it, the new hidden checks, prompt variants."""

    operation: str
    label: str
    gold_code: Tree
    grading_tests: Tree
    instructions: tuple[str, ...]
    files: list[str]


# ----------------------------------------------------------------------------------------------
# Shared analysis


class _Package:
    """Parsed code and test modules of a source."""

    def __init__(self, source: SourceRepo):
        self.source = source
        self.code: dict[str, Source] = {}
        self.tests: dict[str, Source] = {}
        for path, data in source.tree.items():
            if not path.endswith(".py"):
                continue
            try:
                parsed = Source(data.decode("utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            (self.tests if is_test_path(path) else self.code)[path] = parsed

    def module_of(self, path: str) -> str:
        return self.source.module_name(path)

    def functions(self) -> list[tuple[str, ast.FunctionDef]]:
        return [(path, node) for path, module in sorted(self.code.items()) for node in module.tree.body
                if isinstance(node, ast.FunctionDef)]


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float | str) and node.value is not None


def _defaults(func: ast.FunctionDef) -> dict[str, tuple[ast.arg, ast.expr, bool]]:
    """Parameters with a default: name -> (arg, default, keyword-only)."""
    args = func.args
    positional = args.posonlyargs + args.args
    found = {a.arg: (a, d, False) for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults)}
    found.update({a.arg: (a, d, True) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    return found


def _param_names(func: ast.FunctionDef) -> list[str]:
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return names + [a.arg for a in (args.vararg, args.kwarg) if a is not None]


def _passes(call: ast.Call, func: ast.FunctionDef, param: str) -> bool:
    """Whether ``call`` (of ``func``) gives ``param`` a value, by keyword or by position."""
    if any(k.arg == param or k.arg is None for k in call.keywords):
        return True
    positional = [a.arg for a in func.args.posonlyargs + func.args.args]
    return param in positional and positional.index(param) < len(call.args) or any(
        isinstance(a, ast.Starred) for a in call.args)


def _insert_keyword(module: Source, call: ast.Call, text: str) -> Edit:
    """Add ``text`` (``name=value``) as the last argument of ``call``."""
    items = list(call.args) + list(call.keywords)
    if items:
        last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))
        end = module.offset(last.end_lineno, last.end_col_offset)
        return Edit(end, end, f", {text}")
    end = module.offset(call.end_lineno, call.end_col_offset) - 1  # just before ")"
    return Edit(end, end, text)


def _add_keyword_only(module: Source, func: ast.FunctionDef, text: str) -> Edit | None:
    """Add ``text`` (``name: T = default``) as a keyword-only parameter of ``func``."""
    args = func.args
    if args.kwarg is not None:
        return None
    nodes = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg,) if a is not None]
    nodes += [d for d in args.defaults + args.kw_defaults if d is not None]
    star = args.vararg is not None or bool(args.kwonlyargs)
    if not nodes:
        return None
    last = max(nodes, key=lambda n: (n.end_lineno, n.end_col_offset))
    end = module.offset(last.end_lineno, last.end_col_offset)
    starts = [a.lineno for a in args.posonlyargs + args.args + args.kwonlyargs]
    if len(set(starts)) == len(starts) and starts[-1] != func.lineno:  # one parameter per line: keep it so
        indent = module.indent_of(last.end_lineno)
        return Edit(end, end, ("" if star else f",\n{indent}*") + f",\n{indent}{text}")
    return Edit(end, end, ("" if star else ", *") + f", {text}")


def _calls_to(node: ast.AST, local_name: str, module_alias: str | None) -> list[ast.Call]:
    calls = []
    for child in ast.walk(node):
        if not isinstance(child, ast.Call):
            continue
        func = child.func
        if isinstance(func, ast.Name) and func.id == local_name:
            calls.append(child)
        elif (module_alias and isinstance(func, ast.Attribute) and func.attr == local_name
              and isinstance(func.value, ast.Name) and func.value.id == module_alias):
            calls.append(child)
    return calls


def _how_imported(module: Source, target_module: str, name: str, package: str) -> tuple[str | None, str | None]:
    """How ``module`` refers to ``target_module.name``: (local name after ``from ... import``,
    alias of the module itself)."""
    short = target_module.rsplit(".", 1)[-1]
    local = alias = None
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            full = base if node.level == 0 else ".".join(filter(None, [package, base]))
            for a in node.names:
                if full == target_module and a.name == name:
                    local = a.asname or a.name
                if (full == target_module.rsplit(".", 1)[0] or (node.level and not base)) and a.name == short:
                    alias = a.asname or a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == target_module:
                    alias = a.asname or a.name
    return local, alias


# ----------------------------------------------------------------------------------------------
# Rename


def _ambiguous_names(package: _Package) -> set[str]:
    """Names that mean more than one thing in the code or tests: defined twice or below module
    level, or also used as a parameter, keyword, assigned variable or attribute, or import alias."""
    definitions: dict[str, int] = {}
    ambiguous: set[str] = set()
    for module in list(package.code.values()) + list(package.tests.values()):
        top = {id(n) for n in module.tree.body}
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                definitions[node.name] = definitions.get(node.name, 0) + 1
                if id(node) not in top:
                    ambiguous.add(node.name)
            elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                ambiguous.add(node.arg)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                ambiguous.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.alias) and node.asname is not None:
                ambiguous |= {node.asname, node.name}
    return ambiguous | {name for name, count in definitions.items() if count > 1}


def _rename_text(text: str, old: str, new: str, in_all: bool) -> str:
    edits = [Edit(s, e, new) for s, e in name_tokens(text, old)]
    for start, end, token in string_tokens(text):
        body = token.strip("rbuRBU")
        if in_all and body in (f'"{old}"', f"'{old}'"):
            edits.append(Edit(start, end, token.replace(old, new)))
        elif f"`{old}" in token:
            renamed = re.sub(rf"(?<=`){re.escape(old)}(?=[`(])", new, token)
            if renamed != token:
                edits.append(Edit(start, end, renamed))
    return apply_edits(text, edits)


def _rename_markdown(text: str, old: str, new: str) -> str:
    if "_" in old or any(c.isupper() for c in old[1:]):  # a distinctive identifier: every mention
        return re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, text)
    return re.sub(rf"(?<=`){re.escape(old)}(?=[`(])|(?<![\w.]){re.escape(old)}(?=\()", new, text)


def rename_plans(source: SourceRepo) -> list[tuple[str, str, str]]:
    """(defining file, old name, new name) for every symbol a rename could take."""
    package = _Package(source)
    words = {path: set(re.findall(r"\w+", module.text)) for path, module in package.code.items()}
    every_word = set().union(*words.values(), *(set(re.findall(r"\w+", m.text)) for m in package.tests.values()))
    ambiguous = _ambiguous_names(package)
    plans = []
    for path, module in sorted(package.code.items()):
        if path.endswith("__init__.py"):
            continue
        for node in module.tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            new = new_name(node.name)
            if new is None or new in every_word or node.name in ambiguous:
                continue
            users = [p for p, m in package.code.items() if p != path and node.name in words[p]
                     and name_tokens(m.text, node.name)]
            if users:
                plans.append((path, node.name, new))
    return plans


def plan_rename(source: SourceRepo, path: str, old: str, new: str) -> Plan:
    gold = source.code_tree()
    files = []
    for rel, data in source.tree.items():
        if is_test_path(rel):
            continue
        text = data.decode("utf-8", errors="replace")
        if rel.endswith(".py"):
            changed = _rename_text(text, old, new, in_all=rel.endswith("__init__.py"))
        elif rel.endswith((".md", ".rst", ".txt")):
            changed = _rename_markdown(text, old, new)
        else:
            continue
        if changed != text:
            gold[rel] = changed.encode("utf-8")
            files.append(rel)
    tests = source.tests_tree()
    for rel, data in source.tests_tree().items():
        if rel.endswith(".py"):
            text = data.decode("utf-8")
            tests[rel] = _rename_text(text, old, new, in_all=False).encode("utf-8")
    module = source.module_name(path)
    exported = any(rel.endswith("__init__.py") for rel in files)
    check = [
        '"""The rename is complete: the new name exists, the old one is gone (no alias)."""\n\n'
        "import importlib\n\n\n"
        f"def test_{new.lower()}_replaces_{old.lower()}():\n"
        f"    module = importlib.import_module({module!r})\n"
        f"    assert hasattr(module, {new!r})\n"
        f"    assert not hasattr(module, {old!r}), \"{old} should be renamed, not kept as an alias\"\n"
    ]
    if exported:
        check.append(
            f"\n\ndef test_package_exports_{new.lower()}_only():\n"
            f"    package = importlib.import_module({source.module_name(files[0]).split('.')[0]!r})\n"
            f"    assert {new!r} in getattr(package, '__all__', dir(package))\n"
            f"    assert not hasattr(package, {old!r})\n"
        )
    tests[f"tests/test_rename_{old.lower()}.py"] = "".join(check).encode("utf-8")
    instruction = (
        f"Rename `{old}` to `{new}` across {source.package}: the definition in `{path}`, every import and call "
        "site, `__all__` and the docs. Don't keep the old name around as an alias.",
        f"`{old}` ({path}) reads badly; call it `{new}` everywhere instead, docs and exports included. "
        "No backwards-compatible alias.",
        f"Please rename `{old}` -> `{new}` throughout {source.package}. Update every caller and the README; "
        "the old name should be gone.",
    )
    return Plan("rename", f"rename {old} -> {new}", gold, tests, instruction, files)


# ----------------------------------------------------------------------------------------------
# Thread a keyword through callers


def _literal_call(tests: dict[str, Source], module_name: str, name: str) -> str | None:
    """Source text of a call ``name(...)`` in the tests whose arguments are all literals."""
    for _, module in sorted(tests.items()):
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called != name:
                continue
            try:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    literal_eval(arg)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
                continue
            return ", ".join([module.segment(a) for a in node.args] + [module.segment(k) for k in node.keywords])
    return None


def _other_value(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value > 1 else value + 2
    if isinstance(value, float):
        return value * 2 if value else 0.5
    return f"{value}-x" if isinstance(value, str) else None


def thread_plans(source: SourceRepo) -> list[Plan]:
    package = _Package(source)
    plans = []
    top = source.package
    for path, func in package.functions():
        if func.name.startswith("_"):
            continue
        target_module = package.module_of(path)
        for param, (arg, default, _) in sorted(_defaults(func).items()):
            if not _literal(default):
                continue
            plan = _thread(source, package, path, func, param, arg, default, target_module, top)
            if plan is not None:
                plans.append(plan)
    return plans


def _thread(source: SourceRepo, package: _Package, path: str, func: ast.FunctionDef, param: str, arg: ast.arg,
            default: ast.expr, target_module: str, top: str) -> Plan | None:
    edits: dict[str, list[Edit]] = {}
    callers: list[tuple[str, ast.FunctionDef, str | None]] = []  # (file, caller, how the caller's module names f)
    for caller_path, module in sorted(package.code.items()):
        local, alias = (func.name, None) if caller_path == path else _how_imported(
            module, target_module, func.name, top)
        if local is None and alias is None:
            continue
        for caller in [n for n in module.tree.body if isinstance(n, ast.FunctionDef)] + [
                m for c in module.tree.body if isinstance(c, ast.ClassDef) for m in c.body
                if isinstance(m, ast.FunctionDef)]:
            if caller is func or caller.name.startswith("_"):
                continue
            calls = _calls_to(caller, local or func.name, alias)
            if not calls or any(_passes(c, func, param) for c in calls) or param in _param_names(caller):
                continue
            annotation = f": {package.code[path].segment(arg.annotation)}" if arg.annotation is not None else ""
            signature_edit = _add_keyword_only(module, caller, f"{param}{annotation} = {ast.unparse(default)}")
            if signature_edit is None:
                return None
            edits.setdefault(caller_path, []).append(signature_edit)
            edits[caller_path] += [_insert_keyword(module, c, f"{param}={param}") for c in calls]
            callers.append((caller_path, caller, local if local else None))
    cross = [c for c in callers if c[0] != path]
    if not cross:
        return None
    gold = source.code_tree()
    for rel, file_edits in edits.items():
        gold[rel] = apply_edits(package.code[rel].text, file_edits).encode("utf-8")
    value = literal_eval(default)
    other = _other_value(value)
    lines = ['"""Callers pass the keyword on instead of dropping it."""\n\n', "import importlib\n",
             "import inspect\n\n", "import pytest\n\n\n", "class _Reached(Exception):\n    pass\n"]
    forwarded = 0
    for caller_path, caller, local in callers:
        owner = _owner(package.code[caller_path], caller)
        module_name = package.module_of(caller_path)
        qual = f"{owner}.{caller.name}" if owner else caller.name
        lines.append(
            f"\n\ndef test_{(owner or '').lower()}{'_' if owner else ''}{caller.name}_takes_{param}():\n"
            f"    module = importlib.import_module({module_name!r})\n"
            f"    parameter = inspect.signature(module.{qual}).parameters[{param!r}]\n"
            f"    assert parameter.default {_equals(value)} {value!r}\n"
        )
        call = _literal_call(package.tests, module_name, caller.name) if owner is None else None
        if call is None:
            continue
        forwarded += 1
        patched = local or func.name
        where = "module" if local else f"importlib.import_module({target_module!r})"
        lines.append(
            f"\n\ndef test_{caller.name}_passes_{param}_to_{func.name}(monkeypatch):\n"
            f"    module = importlib.import_module({module_name!r})\n"
            f"    target = {where}\n"
            f"    real = target.{patched}\n"
            "    seen = []\n\n"
            "    def spy(*args, **kwargs):\n"
            f"        seen.append(inspect.signature(real).bind(*args, **kwargs).arguments.get({param!r}))\n"
            "        raise _Reached\n\n"
            f"    monkeypatch.setattr(target, {patched!r}, spy)\n"
            "    with pytest.raises(_Reached):\n"
            f"        module.{caller.name}({call}, {param}={other!r})\n"
            f"    assert seen == [{other!r}]\n"
        )
    if not forwarded:
        return None
    tests = source.tests_tree()
    tests[f"tests/test_thread_{param}.py"] = "".join(lines).encode("utf-8")
    names = [f"`{_owner(package.code[p], c) + '.' if _owner(package.code[p], c) else ''}{c.name}` ({p})"
             for p, c, _ in callers]
    instruction = (
        f"`{func.name}` in `{path}` takes `{param}` (default {value!r}), but callers can't set it: "
        f"{', '.join(names)} drop it. Give each of them a keyword-only `{param}` with the same default and "
        f"pass it through to `{func.name}`.",
        f"Expose `{param}` on {', '.join(names)}: keyword-only, default {value!r} like `{func.name}`'s, and "
        f"forward it to `{func.name}` instead of dropping it.",
    )
    return Plan("thread", f"thread {param} of {func.name}", gold, tests, instruction, sorted(edits))


def _owner(module: Source, func: ast.FunctionDef) -> str | None:
    for node in module.tree.body:
        if isinstance(node, ast.ClassDef) and func in node.body:
            return node.name
    return None


# ----------------------------------------------------------------------------------------------
# Change a default across the functions that forward it


def default_plans(source: SourceRepo) -> list[Plan]:
    package = _Package(source)
    functions = package.functions()
    plans = []
    chains: list[tuple[str, frozenset, list[tuple[str, ast.FunctionDef]]]] = []
    seen: set[tuple[str, frozenset]] = set()
    for path, func in functions:
        for param, (_, default, _) in sorted(_defaults(func).items()):
            if not _literal(default) or isinstance(literal_eval(default), str):
                continue
            chain = _forwarding_chain(package, functions, path, func, param, literal_eval(default))
            if len(chain) >= 2:
                chains.append((param, frozenset((p, f.name) for p, f in chain), chain))
    for param, members, chain in chains:  # the longest chains only: a sub-chain would leave members behind
        if any(param == other_param and members < other for other_param, other, _ in chains) or \
                (param, members) in seen:
            continue
        seen.add((param, members))
        plans.append(_change_default(source, package, chain, param, literal_eval(_defaults(chain[0][1])[param][1])))
    return plans


def _forwarding_chain(package: _Package, functions: list[tuple[str, ast.FunctionDef]], path: str,
                      func: ast.FunctionDef, param: str, value: object) -> list[tuple[str, ast.FunctionDef]]:
    """``func`` and every function declaring ``param = value`` that passes ``param`` to a member."""
    chain = [(path, func)]
    changed = True
    while changed:
        changed = False
        for other_path, other in functions:
            if (other_path, other) in chain:
                continue
            declared = _defaults(other).get(param)
            if declared is None or not _literal(declared[1]) or literal_eval(declared[1]) != value:
                continue
            for member_path, member in list(chain):
                module = package.code[other_path]
                local, alias = (member.name, None) if other_path == member_path else _how_imported(
                    module, package.module_of(member_path), member.name, package.source.package)
                if local is None and alias is None:
                    continue
                calls = _calls_to(other, local or member.name, alias)
                if any(_forwards(c, member, param) for c in calls):
                    chain.append((other_path, other))
                    changed = True
                    break
    return chain


def _forwards(call: ast.Call, callee: ast.FunctionDef, param: str) -> bool:
    if any(k.arg == param and isinstance(k.value, ast.Name) and k.value.id == param for k in call.keywords):
        return True
    positional = [a.arg for a in callee.args.posonlyargs + callee.args.args]
    if param in positional and positional.index(param) < len(call.args):
        given = call.args[positional.index(param)]
        return isinstance(given, ast.Name) and given.id == param
    return False


def _change_default(source: SourceRepo, package: _Package, chain: list[tuple[str, ast.FunctionDef]], param: str,
                    value: object) -> Plan:
    new_value = _other_value(value)
    edits: dict[str, list[Edit]] = {}
    for path, func in chain:
        default = _defaults(func)[param][1]
        edits.setdefault(path, []).append(Edit(*package.code[path].span(default), repr(new_value)))
    gold = source.code_tree()
    for rel, file_edits in edits.items():
        gold[rel] = apply_edits(package.code[rel].text, file_edits).encode("utf-8")
    tests = source.tests_tree()
    names = {f.name: f for _, f in chain}
    for rel, module in package.tests.items():  # calls that relied on the old default now say so
        pins = []
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else \
                    node.func.attr if isinstance(node.func, ast.Attribute) else None
                if called in names and not _passes(node, names[called], param):
                    pins.append(_insert_keyword(module, node, f"{param}={value!r}"))
        if pins:
            tests[rel] = apply_edits(module.text, pins).encode("utf-8")
    lines = [f'"""`{param}` defaults to {new_value!r} everywhere it is declared."""\n\n', "import importlib\n",
             "import inspect\n"]
    for path, func in chain:
        lines.append(
            f"\n\ndef test_{func.name}_{param}_default():\n"
            f"    module = importlib.import_module({package.module_of(path)!r})\n"
            f"    assert inspect.signature(module.{func.name}).parameters[{param!r}].default {_equals(new_value)} "
            f"{new_value!r}\n"
        )
    tests[f"tests/test_default_{param}.py"] = "".join(lines).encode("utf-8")
    where = ", ".join(f"`{f.name}` ({p})" for p, f in chain)
    instruction = (
        f"Change the default `{param}` from {value!r} to {new_value!r}: {where} all declare it and forward it, "
        "so change it in every one of them. Anything relying on the default should get the new value.",
        f"We want `{param}` to default to {new_value!r} instead of {value!r}. It's declared in {where}; "
        "keep them all in sync.",
    )
    return Plan("default", f"default {param} {value!r} -> {new_value!r}", gold, tests, instruction, sorted(edits))


# ----------------------------------------------------------------------------------------------


class RefactorGenerator:
    """Proposes refactor candidates from the finite pool of every operation's sites (renames are
    the most numerous; ``registry`` walks the pool in a seeded order)."""

    kind = "refactor"

    def __init__(self, lab: Lab):
        self.lab = lab
        self._plans: dict[str, dict[str, list]] = {}

    def plans(self, source: SourceRepo) -> dict[str, list]:
        if source.digest not in self._plans:
            self._plans[source.digest] = {
                "rename": rename_plans(source),
                "thread": thread_plans(source),
                "default": default_plans(source),
            }
        return self._plans[source.digest]

    def pool(self, sources: list[SourceRepo]) -> list[tuple[SourceRepo, str, object]]:
        """Every (source, operation, site) a task could refactor: a finite pool."""
        return [(source, operation, site) for source in sources
                for operation, sites in self.plans(source).items() for site in sites]

    def build(self, item: tuple[SourceRepo, str, object], rng: random.Random) -> Candidate:
        source, operation, site = item
        plan = plan_rename(source, *site) if operation == "rename" else site
        return Candidate(
            source=source,
            gold_code=plan.gold_code,
            broken_code=source.code_tree(),
            grading_tests=plan.grading_tests,
            visible_tests=source.tests_tree(),
            instruction=rng.choice(plan.instructions),
            metadata={"source": "refactor", "kind": "refactor", "operation": plan.operation,
                      "difficulty": "medium" if len(plan.files) > 2 else "easy", "files": plan.files},
            label=plan.label,
        )


def _equals(value: object) -> str:
    return "is" if isinstance(value, bool) else "=="
