"""Tasks mined from a git repository's history (``opencomposer tasks mine REPO_DIR --out DIR``).

Every commit with one parent that changes both code (a non-test ``.py`` file) and tests is a
candidate. For each, the tree at the parent is the task repository, the commit's non-test changes
are the gold patch, and the commit's versions of the test files it changed or added are the hidden
tests; the prompt is the commit message without its trailers. The tests run in the sandbox on the
parent's code and on the commit's code, both with the commit's tests in place (as grading will
have them): FAIL_TO_PASS are the tests that pass only at the commit, PASS_TO_PASS those that pass
at both. Then the task folder is verified through the grader like every generated task
(``generators.common.realize``).

Trees are read with ``git archive``, so a task repository is a plain snapshot of the parent: no
``.git``, no later history, nothing that leaks the fix. Commits that cannot make a task are
reported with the reason (root or merge commit, no test or no code changed, a binary change, no
test that fails before the change, tests that hang, a gold state that breaks other tests, ...) and
nothing is written for them.

**Environment.** A repository with packaging files (``pyproject.toml``, ``setup.cfg``,
``setup.py``) or a src layout gets an ``[environment]`` (``detect_environment``): its declared
dependencies installed into a task environment (``sandbox.venv``; at the parent commit, the
task's starting point) and its own code imported from the workspace (``src`` for a src layout), so
the default ``python -m pytest -q`` works on a src-layout package without a hand-written test
command. Commits whose dependencies are the same share one environment. ``mine(...,
environment=SPEC)`` gives the base of that table (``find_links``, ``pip_args`` for an offline or
mirrored index; ``EnvironmentSpec`` itself with ``install_repo`` forces it on every commit).

**Criteria for a benchmark** (``Criteria``, the realbench suite: docs/realbench.md). By default
every commit with a parent that changes code and tests is tried. ``Criteria`` narrows that to the
changes a CursorBench-style benchmark wants and adds the checks it needs:

- size: at least ``min_files`` non-test files (one of them Python) and ``min_lines`` non-test lines
  changed (added plus removed), at most ``max_lines``;
- ``merges``: the first-parent history is visited and a merge (a merged pull request) is its change
  against its first parent, the message of the request as its prompt;
- ``focus_tests``: the task's test command runs only the test modules the change touches, as
  SWE-bench does, so grading and mutants run in seconds on a large suite;
- the prompt is the message as a developer writes a request (``developer_prompt``): title and first
  paragraph, without trailers, issue numbers and pull-request boilerplate, at most about 400
  characters; it must name every new public name the hidden tests use (``unnamed_test_names``),
  which it may append as one short line; a change that needs more is refused as unsolvable;
- ``mutation_limit`` mutants of the gold change (``tasks.mutation``) run against the task's tests
  and a task whose score is under ``mutation_floor`` is refused;
- ``validations``: the task folder is checked through the grader that many times in all, after the
  run of both states that computed its test lists; any difference (a flaky test) refuses it. So
  ``validations=2`` runs each state three times.

Each task records ``metadata.kind`` (fix, feature or refactor, from the message and the change),
``metadata.api_change`` (the change removes or adds public names), ``metadata.date`` (the commit's
date) and ``metadata.mutation_score``.

Known limit: a test file the commit deletes stays in the task (grading restores the parent's test
folders), so such a commit is kept only when that file still passes at the commit. A commit that
adds a dependency its tests need fails in the parent's environment and is rejected.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opencomposer.config import SandboxConfig, TasksConfig
from opencomposer.pysource import parse
from opencomposer.sandbox.venv import (
    REQUIREMENT_FILES,
    SETUP_FILES,
    EnvironmentSpec,
    detect_repo_environment,
)
from opencomposer.tasks import mutation
from opencomposer.tasks.generators.common import Candidate, Lab, Rejected, realize
from opencomposer.tasks.generators.source import SourceRepo, Tree, is_skipped, is_test_path

TRAILER = re.compile(r"^[A-Za-z][A-Za-z-]*: .+$")
FIX_WORDS = re.compile(r"^\s*(fix|bug|repair|correct|resolve|patch)", re.IGNORECASE)
FIX_ANYWHERE = re.compile(r"\b(fix(es|ed)?|bug|crash(es)?|regression|incorrect(ly)?|wrong(ly)?|broken)\b",
                          re.IGNORECASE)
REFACTOR_WORDS = re.compile(r"\b(refactor\w*|rename[sd]?|move[sd]?|clean ?up|simplif\w+|reorgani[sz]e\w*|"
                            r"deprecat\w+|extract\w*|restructur\w+)\b", re.IGNORECASE)
MERGE_SUBJECT = re.compile(r"^Merge (pull request|branch|remote-tracking branch) ")
ISSUE_REFS = re.compile(r"\s*\((?:(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?|refs?|see|gh)[: ]*)?"
                        r"(?:[\w.-]+/[\w.-]+)?(?:#|GH-|gh-)\d+(?:,\s*#\d+)*\)"
                        r"|\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?|refs?|see)[: ]+(?:[\w.-]+/[\w.-]+)?#\d+"
                        r"|(?<![\w/])(?:#|GH-|gh-)\d+\b|https?://github\.com/\S+", re.IGNORECASE)
KNOWN_TRAILER = re.compile(r"^([A-Za-z-]+-by|Change-Id|Fixes|Closes|Resolves|Refs?|See-also|Cc|Link|Issue|PR)"
                           r": .+$", re.IGNORECASE)
MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
PROMPT_CHARS = 400
TEST_MODULE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")


@dataclass(frozen=True)
class Criteria:
    """Which commits ``mine`` turns into tasks and what it checks on them (the module docstring,
    "Criteria for a benchmark"). The default keeps the plain miner's behaviour."""

    min_files: int = 1  # non-test files changed, at least one of them Python
    min_lines: int = 0  # non-test lines added plus removed
    max_lines: int | None = None  # larger changes are not one request
    merges: bool = False  # walk the first-parent history; a merge is its change against its first parent
    focus_tests: bool = False  # the task runs only the test modules the change touches
    developer_prompts: bool = False  # title and first paragraph, cleaned (``developer_prompt``)
    max_named: int = 4  # new names the tests use that the prompt may append on one line
    mutation_limit: int = 0  # mutants of the gold change per task; 0: no mutation score
    mutation_floor: float = mutation.MUTATION_FLOOR
    validations: int = 1  # checks through the grader in all (realize does the first)

    @classmethod
    def benchmark(cls, **changes: object) -> Criteria:
        """The realbench criteria (docs/realbench.md): changes of 2+ files and 60-1,200 lines,
        merges as their first-parent change, the changed test modules only, developer prompts with
        the solvability check, up to 12 mutants with the floor, each state run three times."""
        base = cls(min_files=2, min_lines=60, max_lines=1200, merges=True, focus_tests=True,
                   developer_prompts=True, mutation_limit=12, validations=2)
        return dataclasses.replace(base, **changes)


class MiningError(RuntimeError):
    """The repository itself cannot be read (not a git repository, bad revision)."""


@dataclass
class MinedCommit:
    """What became of one commit: ``task_id`` when it made a task, else ``reason``."""

    sha: str
    subject: str
    task_id: str | None = None
    reason: str = ""
    fail_to_pass: list[str] = field(default_factory=list)


def git(repo: Path, *args: str, binary: bool = False) -> str | bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=300)
    if proc.returncode != 0:
        raise MiningError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.decode(errors='replace')[-400:]}")
    return proc.stdout if binary else proc.stdout.decode("utf-8", errors="replace")


def commit_tree(repo: Path, sha: str) -> Tree:
    """The files of commit ``sha`` (``git archive``; never ``.git`` or caches)."""
    data = git(repo, "archive", "--format=tar", sha, binary=True)
    tree: Tree = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.isfile() and not is_skipped(member.name):
                tree[member.name] = archive.extractfile(member).read()
    return tree


def commit_message(repo: Path, sha: str) -> tuple[str, str]:
    """(subject, prompt): the message without trailers (Signed-off-by, Co-authored-by, ...)."""
    message = git(repo, "log", "-1", "--format=%B", sha).strip()
    lines = message.splitlines()
    while lines and (TRAILER.match(lines[-1].strip()) or not lines[-1].strip()):
        lines.pop()
    return (lines[0].strip() if lines else ""), "\n".join(lines).strip()


def developer_prompt(message: str, limit: int = PROMPT_CHARS) -> str:
    """A request as a developer writes it, from a commit or merge message: the title (for a merged
    pull request, the request's own title, the message's second paragraph) and the first paragraph
    that is prose, without trailers, issue and pull-request numbers or links, cut at a sentence
    or line end near ``limit`` characters."""
    lines = [line.rstrip() for line in message.strip().splitlines()]
    lines = [MARKDOWN_LINK.sub(r"\1", line) for line in lines if not KNOWN_TRAILER.match(line.strip())]
    paragraphs, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(current)
            current = []
    if paragraphs and MERGE_SUBJECT.match(paragraphs[0][0]):
        branch = re.search(r" from [^/\s]+/(\S+)$", paragraphs[0][0])
        paragraphs = paragraphs[1:]
        if not paragraphs and branch:  # no request title in the message: the branch's name is the request
            words = re.sub(r"[-_/]+", " ", branch[1]).strip()
            paragraphs = [[words[:1].upper() + words[1:]]] if words else []
    cleaned = []
    for paragraph in paragraphs:
        text = [_tidy(ISSUE_REFS.sub("", line)) for line in paragraph]
        text = [line for line in text if line and not line.startswith(("```", "<!--", "---", "==="))]
        bullets = sum(line.startswith(("* ", "- ")) for line in text)
        if text and not (cleaned and bullets * 2 > len(text)):  # a squash log of commit titles
            cleaned.append(" ".join(text))
    if not cleaned:
        return ""
    title = cleaned[0]
    prompt = title if title.endswith((".", "!", "?")) else title + "."
    for paragraph in cleaned[1:2]:
        if len(prompt) + 1 + len(paragraph) <= limit:
            prompt += "\n\n" + paragraph
        else:
            sentences = re.split(r"(?<=[.!?])\s+", paragraph)
            taken = ""
            for sentence in sentences:
                if len(prompt) + 2 + len(taken) + len(sentence) + 1 > limit:
                    break
                taken = f"{taken} {sentence}".strip()
            if taken:
                prompt += "\n\n" + taken
    return prompt.strip()


def _tidy(line: str) -> str:
    """A line with references cut out: no space before punctuation, no doubled spaces or stops."""
    line = re.sub(r"\s+([,.;:])", r"\1", re.sub(r"\s{2,}", " ", line))
    return re.sub(r"[,;:]+([.;:])", r"\1", line).strip(" ,;:-")


def defined_names(code: Tree) -> set[str]:
    """Names the Python files of ``code`` define: functions, classes, their parameters, and names
    assigned at module or class level (what a test can import, call or pass by keyword)."""
    names: set[str] = set()
    for path, data in code.items():
        if not path.endswith(".py") or is_test_path(path):
            continue
        try:
            tree = parse(data)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
                if not isinstance(node, ast.ClassDef):
                    arguments = node.args
                    names.update(a.arg for a in arguments.args + arguments.kwonlyargs + arguments.posonlyargs)
            if isinstance(node, ast.Module | ast.ClassDef):
                for statement in node.body:
                    targets = statement.targets if isinstance(statement, ast.Assign) else \
                        [statement.target] if isinstance(statement, ast.AnnAssign) else []
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def used_names(tests: Tree) -> set[str]:
    """Names Python test files use: imported, read, looked up as attributes, passed as keywords."""
    names: set[str] = set()
    for path, data in tests.items():
        if not path.endswith(".py"):
            continue
        try:
            tree = parse(data)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    return names


def new_test_names(before: Tree, after: Tree, tests: list[str]) -> list[str]:
    """New public names the hidden tests use: defined by the change's code (``after``) and not
    anywhere in the code before it, and used by the changed test files where they were not before."""
    new = defined_names(after) - defined_names(before)
    used = used_names({p: after[p] for p in tests if p in after}) - \
        used_names({p: before[p] for p in tests if p in before})
    return sorted(n for n in new & used if not n.startswith("_"))


def unnamed_test_names(prompt: str, before: Tree, after: Tree, tests: list[str]) -> list[str]:
    """The solvability check: new public names the hidden tests use that ``prompt`` does not name
    (an agent cannot guess a name). Empty when the task is solvable in this sense."""
    return [n for n in new_test_names(before, after, tests) if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", prompt)]


def kind_of(subject: str, prompt: str, before: Tree, after: Tree) -> tuple[str, bool]:
    """(kind, api_change): fix, refactor or feature from the message's words; ``api_change`` when the
    change adds or removes public names of the code."""
    public_before = {n for n in defined_names(before) if not n.startswith("_")}
    public_after = {n for n in defined_names(after) if not n.startswith("_")}
    api_change = public_before != public_after
    if FIX_WORDS.match(subject) or FIX_ANYWHERE.search(subject):
        return "fix", api_change
    if REFACTOR_WORDS.search(subject):
        return "refactor", api_change
    return "feature", api_change


def changed_files(repo: Path, parent: str, sha: str) -> tuple[list[str], list[str]]:
    """(paths changed, paths whose change is binary) between two commits."""
    paths, binary = [], []
    for line in git(repo, "diff", "--numstat", "--no-renames", parent, sha).splitlines():
        added, removed, path = line.split("\t", 2)
        paths.append(path)
        if added == "-" and removed == "-":
            binary.append(path)
    return paths, binary


def task_id_for(repo: Path, sha: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(repo).resolve().name) or "repo"
    return f"{name}-{sha[:10]}"


def detect_environment(tree: Tree, base: EnvironmentSpec | None = None) -> EnvironmentSpec | None:
    """The ``[environment]`` of a mined task whose starting repository is ``tree``
    (``sandbox.venv.detect_repo_environment`` on its packaging and requirement files and
    its layout); ``base`` when it has none of them. A ``base`` with ``install_repo`` is used as is."""
    if base is not None and base.install_repo:
        return base
    with tempfile.TemporaryDirectory(prefix="opencomposer-detect-") as tmp:
        root = Path(tmp)
        for rel, data in tree.items():
            if rel in SETUP_FILES or rel in REQUIREMENT_FILES:
                (root / rel).write_bytes(data)
            elif rel.startswith("src/") and rel.count("/") <= 2 and rel.endswith(".py"):
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(b"")  # the layout is all that matters here
        return detect_repo_environment(root, base)


def non_test_size(repo: Path, parent: str, sha: str) -> tuple[int, int]:
    """(non-test files changed, non-test lines added plus removed) between two commits."""
    files = lines = 0
    for line in git(repo, "diff", "--numstat", "--no-renames", parent, sha).splitlines():
        added, removed, path = line.split("\t", 2)
        if not is_test_path(path):
            files += 1
            lines += 0 if added == "-" else int(added) + int(removed)
    return files, lines


def commit_date(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%cs", sha).strip()


def candidate_for(repo: Path, sha: str, test_command: str, environment: EnvironmentSpec | None = None,
                  criteria: Criteria = Criteria()) -> tuple[Candidate | None, str, str]:
    """The candidate of commit ``sha`` (or None and the reason), and the commit's subject."""
    parents = git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]
    subject, prompt = commit_message(repo, sha)
    if not parents:
        return None, "root commit: there is no earlier state to start from", subject
    if len(parents) > 1 and not criteria.merges:
        return None, "merge commit: its change is not one developer's step", subject
    parent = parents[0]  # a merge's change is the one it brings to its first parent
    paths, binary = changed_files(repo, parent, sha)
    tests = [p for p in paths if is_test_path(p)]
    code = [p for p in paths if not is_test_path(p) and p.endswith(".py")]
    if not tests:
        return None, "changes no tests: nothing can tell a fix from a non-fix", subject
    if not code:
        return None, "changes no code (only tests, docs or data)", subject
    if [p for p in binary if not is_test_path(p)]:
        return None, f"binary change in {sorted(set(binary))[0]}: a gold patch cannot carry it", subject
    files, lines = non_test_size(repo, parent, sha)
    if files < criteria.min_files:
        return None, f"changes {files} non-test file(s); at least {criteria.min_files} wanted", subject
    if lines < criteria.min_lines:
        return None, f"changes {lines} non-test line(s); at least {criteria.min_lines} wanted", subject
    if criteria.max_lines is not None and lines > criteria.max_lines:
        return None, f"changes {lines} non-test lines; at most {criteria.max_lines} make one request", subject
    if criteria.developer_prompts:
        prompt = developer_prompt(git(repo, "log", "-1", "--format=%B", sha))
    if not prompt:
        return None, "empty commit message: no request to give the agent", subject
    before, after = commit_tree(repo, parent), commit_tree(repo, sha)
    if criteria.developer_prompts:
        missing = unnamed_test_names(prompt, before, after, tests)
        if len(missing) > criteria.max_named:
            return None, (f"unsolvable from its message: the tests use {len(missing)} new names it does not "
                          f"give ({', '.join(missing[:6])}); at most {criteria.max_named} may be appended"), subject
        if missing:
            prompt += "\n\nThe tests use: " + ", ".join(f"`{n}`" for n in missing) + "."
        if unnamed_test_names(prompt, before, after, tests):
            return None, "unsolvable from its message: new names the tests use are not in the prompt", subject
    command = test_command
    if criteria.focus_tests:
        modules = sorted(p for p in tests if TEST_MODULE.search(p) and p in after)
        if not modules:
            return None, "changes no test module (only helpers or data) to run on its own", subject
        command = f"{test_command} {' '.join(modules)}"
    source = SourceRepo(Path(repo).resolve().name, Path(repo), before, command)
    grading_tests = {p: d for p, d in before.items() if is_test_path(p)}
    grading_tests.update({p: d for p, d in after.items() if is_test_path(p) and p in tests})
    if criteria.developer_prompts:
        kind, api_change = kind_of(subject, prompt, before, after)
        extra = {"api_change": api_change, "date": commit_date(repo, sha), "non_test_files": files,
                 "non_test_lines": lines}
    else:
        kind, extra = ("fix" if FIX_WORDS.match(subject) else "feature"), {}
    candidate = Candidate(
        source=source,
        gold_code={p: d for p, d in after.items() if not is_test_path(p)},
        broken_code={p: d for p, d in before.items() if not is_test_path(p)},
        grading_tests=grading_tests,
        visible_tests={p: d for p, d in before.items() if is_test_path(p)},
        instruction=prompt,
        metadata={"source": "mined", "kind": kind, "commit": sha, "base_commit": parent, "subject": subject,
                  **extra},
        label=f"{sha[:10]} {subject}",
        environment=detect_environment(before, environment),
    )
    return candidate, "", subject


def mine_commit(repo: Path, sha: str, out: Path, lab: Lab, test_command: str,
                environment: EnvironmentSpec | None = None, criteria: Criteria = Criteria()) -> MinedCommit:
    try:
        candidate, reason, subject = candidate_for(repo, sha, test_command, environment, criteria)
    except MiningError as e:
        return MinedCommit(sha, "", reason=f"git failed: {e}")
    if candidate is None:
        return MinedCommit(sha, subject, reason=reason)
    task_id = task_id_for(repo, sha)
    try:
        if criteria.mutation_limit:
            candidate.metadata["mutation_score"] = measure_mutation(candidate, lab, criteria, sha)
        task = realize(candidate, lab, Path(out) / task_id, task_id)
        revalidate(task, lab, criteria.validations - 1)
    except Rejected as e:
        return MinedCommit(sha, subject, reason=str(e))
    return MinedCommit(sha, subject, task_id=task.id, fail_to_pass=task.fail_to_pass)


def measure_mutation(candidate: Candidate, lab: Lab, criteria: Criteria, seed: str) -> float:
    """The candidate's mutation score (``tasks.mutation``) with its tests as grading runs them;
    ``Rejected`` under the floor or when its change offers nothing to mutate."""
    outcome = lab.outcome(candidate.gold_state(), candidate.broken_state(), candidate.source.task_command,
                          candidate.environment)  # cached: realize asks for the same runs
    bound = lab.environment(candidate.broken_state(), candidate.environment)
    chosen = mutation.mutants(candidate.broken_code, candidate.gold_code, criteria.mutation_limit, seed)
    if not chosen:
        raise Rejected("the gold change has no line to mutate (no operator, constant or statement)")

    def run(state: Tree) -> set[str]:
        return lab.run(state, candidate.source.task_command, bound).passed

    result = mutation.score(candidate.gold_state(), chosen, set(outcome.fail_to_pass) | set(outcome.pass_to_pass),
                            run, criteria.mutation_floor)
    if result.score < criteria.mutation_floor:
        raise Rejected(f"weak tests: mutation score {result.score:.2f} ({result.rejected}/{result.mutants} mutants "
                       f"rejected) under the floor {criteria.mutation_floor:g}; survivors: "
                       + "; ".join(result.survivors[:3]))
    return round(result.score, 3)


def revalidate(task, lab: Lab, times: int) -> None:
    """Check ``task`` through the grader ``times`` more; a drift (a flaky test) removes its folder."""
    from opencomposer.tasks.validation import check_task

    for attempt in range(times):
        check = check_task(task, lab.sandbox, lab.grading)
        if check.problems:
            shutil.rmtree(task.path, ignore_errors=True)
            raise Rejected(f"flaky: validation {attempt + 2} disagrees: " + "; ".join(check.problems))


def commits_to_mine(repo: Path, rev: str = "HEAD", limit: int | None = None, first_parent: bool = False) -> list[str]:
    """The commits ``mine`` visits: every one reachable from ``rev`` (only the first-parent chain with
    ``first_parent``), oldest first; the newest ``limit`` if given."""
    if not (Path(repo) / ".git").exists():
        raise MiningError(f"{repo} is not a git repository (no .git); pass the root of a clone")
    chain = ["--first-parent"] if first_parent else []
    shas = git(Path(repo), "rev-list", "--reverse", "--topo-order", *chain, rev).split()
    return shas[-limit:] if limit is not None else shas


def mine(
    repo: Path | str,
    out: Path | str,
    *,
    rev: str = "HEAD",
    limit: int | None = None,
    test_command: str = "python -m pytest -q",
    config: TasksConfig | None = None,
    sandbox: SandboxConfig | None = None,
    workers: int = 1,
    on_done: Callable[[MinedCommit], None] | None = None,
    environment: EnvironmentSpec | None = None,
    criteria: Criteria = Criteria(),
    shas: list[str] | None = None,
) -> list[MinedCommit]:
    """Mine every commit of ``commits_to_mine(repo, rev, limit)`` into task folders under ``out``;
    returns one record per commit and writes ``mining.json``. ``on_done(record)`` runs in this
    thread as each commit is done (the command's progress display). ``environment``: the base of
    every task's ``[environment]`` (``detect_environment``); ``criteria`` which commits make tasks
    and what is checked on them; ``shas`` the commits to visit instead of ``commits_to_mine``'s."""
    repo, out = Path(repo), Path(out)
    shas = shas if shas is not None else commits_to_mine(repo, rev, limit, criteria.merges)
    out.mkdir(parents=True, exist_ok=True)
    # A commit may break most tests before its fix (an import it adds): only gold passing and at
    # least one FAIL_TO_PASS matter here, not the generators' share of tests kept green.
    lab = Lab(dataclasses.replace(config or TasksConfig(), min_pass_to_pass=0.0), sandbox)
    records: dict[str, MinedCommit] = {}

    def one(sha: str) -> MinedCommit:
        record = mine_commit(repo, sha, out, lab, test_command, environment, criteria)
        records[sha] = record
        return record

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for record in pool.map(one, shas):
            if on_done is not None:
                on_done(record)
    result = [records[sha] for sha in shas]
    (out / "mining.json").write_text(json.dumps([asdict(r) for r in result], indent=1) + "\n")
    return result
