"""**FreshBench-like QA** (``freshbench_accuracy``, higher is better). Questions about the internals
of the installed versions of this project's own dependencies (``importlib.metadata`` requirements
of ``opencomposer``, or the packages named), answerable only from their source, generated with
``ast`` and checked automatically (``verify_question`` re-derives every answer from the file).
Four kinds, each written as the code a reader of the source would see, closed-book:

- ``default``: the default value of parameter P of function F: ``def F(a, P=`` → ``None,``;
- ``base``: the (first) base class of class C: ``class C(`` → ``Base)``;
- ``raises``: an exception F raises: F's code up to one of its ``raise`` statements, then
  ``raise `` → ``ValueError(`` (earlier lines may hint at it: reading the source);
- ``caller``: which function in the module calls G: ``# The function that calls `G()`:`` /
  ``def `` → ``F(``.

Small models cannot write exact answers, so each question has ``candidates`` fixed choices: the
answer and distractors drawn from the same module that the source shows are wrong (another
parameter's default, a base of another class, an exception raised elsewhere, a function that
does not call G). Every candidate is followed by the delimiter that ends the answer in the
source (``,`` or ``)`` after a default, ``(`` after a called exception, ...), the same for all,
so the **total** log-likelihood of candidate + delimiter is the model's probability of that
exact answer, and the model's choice is the candidate where it is highest. Per-byte
normalisation (lm-eval's ``acc_norm``), meant for continuations without a delimiter, is
reported too (``accuracy_per_byte``) but is not the headline: measured here, it favours long
candidates whose later tokens follow from their first (SmolLM2 picked long distractor
exception names over ``ValueError``), and put briefly pretrained tiny models, whose 4096-token
BPE cuts identifiers into many predictable pieces, at chance.
Chance is ``1 / candidates``; an untrained model is not exactly at chance (its scores still
depend on the candidates' tokens: 0.25-0.32 over four seeds on 96 questions), and a model
pretrained for minutes beats it by little (0.33 against 0.28 on the same questions), while
SmolLM2-135M reaches about 0.47: the check separates models that know code, not the briefest
runs. Generation is deterministic given the seed and the installed versions; the package and
version head every prompt (``# transformers 5.2.0, transformers/x.py``), which is what makes
the questions fresh: a model knows them only if it read that code.
"""

from __future__ import annotations

import ast
import functools
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from opencomposer.bench.basecheck.common import BasecheckError, model_device, start_id
from opencomposer.pysource import literal_eval, parse

KINDS = ("default", "base", "raises", "caller")  # question kinds, in quota order
MAX_ANSWER_CHARS = 60  # longer defaults or base expressions are skipped (multi-line literals, calls)
MAX_MODULE_BYTES = 200_000  # larger modules are skipped: generated tables, vendored bundles


@dataclass
class Question:
    """One multiple-choice question about a module's source; ``candidates[answer_index]`` is right."""

    kind: str  # one of KINDS
    package: str  # distribution name
    version: str
    module: str  # path relative to its site-packages folder (POSIX)
    file: str  # absolute path of the source read
    subject: str  # "F" / "Class.method" / class name / called function G
    parameter: str  # the parameter of a "default" question, else ""
    prompt: str
    candidates: list[str]
    answer_index: int
    suffix: str  # the delimiter scored after every candidate

    @property
    def answer(self) -> str:
        return self.candidates[self.answer_index]

    @property
    def distractors(self) -> list[str]:
        return [c for i, c in enumerate(self.candidates) if i != self.answer_index]


@dataclass(frozen=True)
class ModuleSource:
    package: str
    version: str
    module: str
    file: Path


def dependency_names() -> list[str]:
    """The installed ``opencomposer``'s own requirements (extras left out), sorted."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        requirements = requires("opencomposer") or []
    except PackageNotFoundError as e:
        raise BasecheckError("--package: opencomposer is not installed, so its dependencies are unknown; "
                             "name the packages to ask about") from e
    names = set()
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or "extra" not in str(requirement.marker):
            names.add(requirement.name)
    return sorted(names)


def package_modules(packages: list[str]) -> list[ModuleSource]:
    """Python modules of the named distributions (tests left out), sorted by package and path."""
    from importlib.metadata import PackageNotFoundError, distribution

    modules = []
    for name in sorted(set(packages)):
        try:
            dist = distribution(name)
        except PackageNotFoundError as e:
            raise BasecheckError(f"--package {name}: not installed in this environment") from e
        package, version = dist.metadata["Name"], dist.version
        for entry in sorted(dist.files or [], key=str):
            rel = PurePosixPath(str(entry))
            if rel.suffix != ".py" or rel.parts[0].endswith((".dist-info", ".data")) or ".." in rel.parts:
                continue
            if any(part in ("tests", "test", "testing") for part in rel.parts) or rel.name.startswith("test_"):
                continue
            modules.append(ModuleSource(package, version, str(rel), Path(dist.locate_file(entry))))
    return modules


def _segment(lines: list[bytes], start: tuple[int, int], end: tuple[int, int]) -> str:
    """Source text between two (line, byte column) positions, as ``ast`` reports them."""
    (l1, c1), (l2, c2) = start, end
    if l1 == l2:
        return lines[l1 - 1][c1:c2].decode("utf-8")
    return (lines[l1 - 1][c1:] + b"".join(lines[l1 : l2 - 1]) + lines[l2 - 1][:c2]).decode("utf-8")


def _next_char(lines: list[bytes], line: int, col: int) -> str:
    """The first non-blank character at or after (line, byte column)."""
    rest = lines[line - 1][col:] + b"".join(lines[line:])
    stripped = rest.decode("utf-8", errors="replace").lstrip()
    return stripped[:1]


def _functions(module: ast.Module, unique: bool = False) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef,
                                                                      str | None]]:
    """(qualified name, node, class name) of module-level functions and methods of top-level classes;
    ``unique`` leaves out names defined more than once (``@overload`` stubs, property setters),
    which a question could not name unambiguously."""
    found = []
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.name, node, None))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((f"{node.name}.{item.name}", item, node.name))
    if unique:
        counts = Counter(qualname for qualname, _, _ in found)
        found = [entry for entry in found if counts[entry[0]] == 1]
    return found


def _defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    args = fn.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return [(a.arg, d) for a, d in pairs]


def _value_key(text: str) -> str:
    """What makes two default texts the same answer: ``'a'`` and ``"a"``, ``0`` and ``0``."""
    try:
        node = parse(text, mode="eval").body
    except SyntaxError:
        return text
    try:
        value = literal_eval(node)
        return f"{type(value).__name__}:{value!r}"
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.dump(node)


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """Nodes of a function's body, not descending into nested functions, classes or lambdas."""
    out, stack = [], list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _raised(nodes: list[ast.AST], parsed: _Parsed) -> dict[str, bool]:
    """Exception expressions raised in ``nodes`` (text → raised as a call), class-like names only."""
    found: dict[str, bool] = {}
    for node in nodes:
        if isinstance(node, ast.Raise) and node.exc is not None:
            call = isinstance(node.exc, ast.Call)
            expr = node.exc.func if call else node.exc
            if isinstance(expr, (ast.Name, ast.Attribute)):
                text = parsed.text(expr)
                if text and text.split(".")[-1][:1].isupper() and "\n" not in text:
                    found.setdefault(text, call)
    return found


def _called(fn: ast.AST) -> set[str]:
    """Simple names of everything called anywhere inside ``fn`` (``g()``, ``x.g()``)."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


@dataclass
class _Parsed:
    source: str
    lines: list[bytes]
    tree: ast.Module


    def text(self, node: ast.AST) -> str:
        """The node's source text (``ast.get_source_segment`` splits the whole file per call)."""
        return _segment(self.lines, (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))


@functools.lru_cache(maxsize=256)
def _parse(path: str) -> _Parsed | None:
    """A module's source, lines and tree; None when unreadable, not Python 3, or too large."""
    try:
        if Path(path).stat().st_size > MAX_MODULE_BYTES:
            return None
        source = Path(path).read_text(encoding="utf-8")
        tree = parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return None
    return _Parsed(source, source.encode("utf-8").splitlines(keepends=True), tree)


def _header(ms: ModuleSource) -> str:
    return f"# {ms.package} {ms.version}, {ms.module}\n"


def _choose(rng: random.Random, answer: str, pool: list[str], k: int) -> tuple[list[str], int] | None:
    """The candidates, shuffled, and the answer's index: ``k - 1`` distractors drawn uniformly from
    the distinct texts of the pool. (Drawing them matched to the answer's length was tried and
    dropped: untrained tiny models then scored further above chance, 0.30-0.46 on 96 questions
    over four seeds, not closer to it.)"""
    distinct = sorted(set(pool) - {answer})
    if len(distinct) < k - 1:
        return None
    choices = rng.sample(distinct, k - 1) + [answer]
    rng.shuffle(choices)
    return choices, choices.index(answer)


def _question(ms: ModuleSource, kind: str, subject: str, parameter: str, prompt: str, answer: str,
              pool: list[str], suffix: str, k: int, rng: random.Random, max_chars: int) -> Question | None:
    if len(prompt) > max_chars or not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    chosen = _choose(rng, answer, [p for p in pool if p and "\n" not in p and len(p) <= MAX_ANSWER_CHARS], k)
    if chosen is None:
        return None
    candidates, index = chosen
    return Question(kind, ms.package, ms.version, ms.module, str(ms.file), subject, parameter, prompt,
                    candidates, index, suffix)


def module_questions(ms: ModuleSource, kind: str, k: int, rng: random.Random,
                     max_chars: int = 1200) -> list[Question]:
    """Every question of ``kind`` the module supports (at most a few per module, seeded choices)."""
    parsed = _parse(str(ms.file))
    if parsed is None:
        return []
    lines, tree = parsed.lines, parsed.tree
    header, out = _header(ms), []
    functions = _functions(tree)
    if kind == "default":
        every = {}  # value key → one text, over the whole module
        for _, fn, _ in functions:
            for _, default in _defaults(fn):
                text = parsed.text(default)
                every.setdefault(_value_key(text), text)
        for qualname, fn, cls in _functions(tree, unique=True):
            for name, default in _defaults(fn):
                answer = parsed.text(default)
                suffix = _next_char(lines, default.end_lineno, default.end_col_offset)
                if suffix not in (",", ")"):
                    continue
                prefix = _segment(lines, (fn.lineno, 0), (default.lineno, default.col_offset))
                prompt = header + (f"class {cls}:\n" if cls else "") + prefix
                key = _value_key(answer)
                pool = [text for value, text in every.items() if value != key]
                question = _question(ms, kind, qualname, name, prompt, answer, pool, suffix, k, rng, max_chars)
                if question:
                    out.append(question)
    elif kind == "base":
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        names = [c.name for c in classes]
        bases = [parsed.text(b) for c in classes for b in c.bases]
        for cls in classes:
            if not cls.bases:
                continue
            first = cls.bases[0]
            answer = parsed.text(first)
            own = {parsed.text(b) for b in cls.bases} | {cls.name}
            suffix = _next_char(lines, first.end_lineno, first.end_col_offset)
            if suffix not in (",", ")"):
                continue
            pool = [b for b in bases + names if b not in own]
            question = _question(ms, kind, cls.name, "", f"{header}class {cls.name}(", answer, pool, suffix,
                                 k, rng, max_chars)
            if question:
                out.append(question)
    elif kind == "raises":
        every: dict[str, bool] = {}
        for _, fn, _ in functions:
            every.update(_raised(list(ast.walk(fn)), parsed))
        for qualname, fn, cls in _functions(tree, unique=True):
            raises = [node for node in _own_nodes(fn) if isinstance(node, ast.Raise) and _raised([node], parsed)]
            if not raises:
                continue
            node = rng.choice(sorted(raises, key=lambda n: (n.lineno, n.col_offset)))
            ((answer, call),) = _raised([node], parsed).items()
            # the function's code up to this raise: what a reader of the source sees before the answer
            before = _segment(lines, (fn.lineno, 0), (node.lineno, node.col_offset))
            prompt = header + (f"class {cls}:\n" if cls else "") + before + "raise "
            everything_in_fn = _raised(list(ast.walk(fn)), parsed)
            pool = [e for e in every if e not in everything_in_fn]
            question = _question(ms, kind, qualname, "", prompt, answer, pool, "(" if call else "\n",
                                 k, rng, max_chars)
            if question:
                out.append(question)
    elif kind == "caller":
        calls = {qualname: _called(fn) for qualname, fn, _ in functions}
        simple = {qualname: qualname.split(".")[-1] for qualname in calls}
        targets = sorted({name for name in simple.values() if not name.startswith("__")})
        for target in targets:
            callers = sorted(q for q, called in calls.items() if target in called and simple[q] != target)
            if not callers:
                continue
            caller_names = {simple[q] for q in callers}
            pool = sorted({simple[q] for q in calls if simple[q] not in caller_names and simple[q] != target
                           and not simple[q].startswith("__")})
            answer = simple[rng.choice(callers)]
            prompt = f"{header}# The function that calls `{target}()`:\ndef "
            question = _question(ms, kind, target, "", prompt, answer, pool, "(", k, rng, max_chars)
            if question:
                out.append(question)
    return out


def generate_questions(count: int, seed: int = 0, candidates: int = 4, packages: list[str] | None = None,
                       max_chars: int = 1200, progress: bool = False) -> list[Question]:
    """``count`` questions, a quarter of each kind, a function of ``seed`` and of the installed
    versions: modules are visited in a seeded order (round robin over packages), and each gives at
    most one question of each kind still short of its quota."""
    from opencomposer.training.progress import ProgressBar

    modules = package_modules(packages or dependency_names())
    if not modules:
        raise BasecheckError(f"--package: no Python modules in {', '.join(packages or []) or 'the dependencies'}")
    rng = random.Random(f"basecheck-questions-{seed}")
    by_package: dict[str, list[ModuleSource]] = {}
    for ms in modules:
        by_package.setdefault(ms.package, []).append(ms)
    queues = []
    for package in sorted(by_package):
        queue = by_package[package]
        rng.shuffle(queue)
        queues.append(queue)
    # round robin over packages, so torch's and transformers' thousands of files do not crowd out
    # the small packages
    order = [queue[i] for i in range(max(map(len, queues))) for queue in queues if i < len(queue)]
    quota = {kind: count // len(KINDS) + (i < count % len(KINDS)) for i, kind in enumerate(KINDS)}
    chosen: dict[str, list[Question]] = {kind: [] for kind in KINDS}
    with ProgressBar("FreshBench questions", count, enabled=progress, every=max(count // 4, 1)) as bar:
        for ms in order:
            if all(len(chosen[kind]) >= quota[kind] for kind in KINDS):
                break
            module_rng = random.Random(f"{seed}-{ms.package}-{ms.module}")
            for kind in KINDS:
                if len(chosen[kind]) < quota[kind]:
                    found = module_questions(ms, kind, candidates, module_rng, max_chars)
                    if found:
                        chosen[kind].append(module_rng.choice(found))
                        bar.update(sum(len(v) for v in chosen.values()))
    # kinds short of their quota (few classes with bases, say) leave room to the others
    questions = [q for kind in KINDS for q in chosen[kind]]
    if len(questions) < count:
        raise BasecheckError(f"--questions: only {len(questions)} questions could be made from "
                             f"{len(modules)} modules (asked for {count})")
    return questions


def verify_question(question: Question) -> bool:
    """Re-derive the question from its source file: the answer is right and every distractor wrong."""
    parsed = _parse(question.file)
    if parsed is None:
        return False
    tree = parsed.tree
    functions = {qualname: fn for qualname, fn, _ in _functions(tree, unique=True)}
    distractors = question.distractors
    if question.kind == "default":
        fn = functions.get(question.subject)
        defaults = dict(_defaults(fn)) if fn else {}
        if question.parameter not in defaults:
            return False
        truth = _value_key(parsed.text(defaults[question.parameter]))
        return _value_key(question.answer) == truth and all(_value_key(d) != truth for d in distractors)
    if question.kind == "base":
        classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == question.subject]
        if not classes:
            return False
        bases = [parsed.text(b) for b in classes[0].bases]
        return bool(bases) and bases[0] == question.answer and not set(distractors) & set(bases)
    if question.kind == "raises":
        fn = functions.get(question.subject)
        if fn is None:
            return False
        return question.answer in _raised(_own_nodes(fn), parsed) and \
            not set(distractors) & set(_raised(list(ast.walk(fn)), parsed))
    if question.kind == "caller":
        def callers(name: str) -> list[bool]:
            return [question.subject in _called(fn) for q, fn, _ in _functions(tree) if q.split(".")[-1] == name]
        return any(callers(question.answer)) and all(callers(d) and not any(callers(d)) for d in distractors)
    return False


def continuation_logprobs(model: Any, tokenizer: Any, prompt: str, continuations: list[str]) -> list[float]:
    """Log-likelihood of each continuation after ``prompt`` (after the start token): the prompt
    runs once, each continuation from its cache, which is cropped back after it."""
    import torch

    ids = [start_id(tokenizer), *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    device = model_device(model)
    scores = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
        cache, first = out.cache, out.logits[0, -1].float().log_softmax(-1)
        for text in continuations:
            cont = tokenizer(text, add_special_tokens=False)["input_ids"]
            total = first[cont[0]].item()
            if len(cont) > 1:
                more = model(input_ids=torch.tensor([cont[:-1]], device=device), cache=cache, use_cache=True)
                logprobs = more.logits[0].float().log_softmax(-1)
                total += logprobs.gather(1, torch.tensor(cont[1:], device=device)[:, None]).sum().item()
                cache.crop(-(len(cont) - 1))  # back to the prompt (a negative count removes tokens)
            scores.append(total)
    return scores


def freshbench(model: Any, tokenizer: Any, questions: list[Question], progress: bool = False) -> dict:
    """Accuracy by total log-likelihood of candidate + delimiter (the headline, module doc), and by
    log-likelihood per UTF-8 byte; chance and per-kind accuracy alongside."""
    from opencomposer.training.progress import ProgressBar

    rows = []
    with ProgressBar("FreshBench", len(questions), status="accuracy {acc:.2f}", enabled=progress) as bar:
        for n, q in enumerate(questions, 1):
            texts = [c + q.suffix for c in q.candidates]
            totals = continuation_logprobs(model, tokenizer, q.prompt, texts)
            per_byte = [t / len(text.encode()) for t, text in zip(totals, texts)]
            chosen = totals.index(max(totals))
            rows.append({"kind": q.kind, "package": q.package, "module": q.module, "subject": q.subject,
                         "answer": q.answer, "chosen": q.candidates[chosen], "correct": chosen == q.answer_index,
                         "correct_per_byte": per_byte.index(max(per_byte)) == q.answer_index,
                         "logprobs": dict(zip(q.candidates, totals))})
            bar.update(n, acc=sum(r["correct"] for r in rows) / n)
    by_kind = {}
    for kind in KINDS:
        of_kind = [r["correct"] for r in rows if r["kind"] == kind]
        if of_kind:
            by_kind[kind] = sum(of_kind) / len(of_kind)
    return {"accuracy": sum(r["correct"] for r in rows) / len(rows),
            "accuracy_per_byte": sum(r["correct_per_byte"] for r in rows) / len(rows),
            "chance": sum(1 / len(q.candidates) for q in questions) / len(questions),
            "by_kind": by_kind, "questions": rows}

