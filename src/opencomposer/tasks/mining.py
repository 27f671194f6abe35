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

Known limit: a test file the commit deletes stays in the task (grading restores the parent's test
folders), so such a commit is kept only when that file still passes at the commit. A commit that
adds a dependency its tests need fails in the parent's environment and is rejected.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opencomposer.config import SandboxConfig, TasksConfig
from opencomposer.sandbox.venv import (
    REQUIREMENT_FILES,
    SETUP_FILES,
    EnvironmentSpec,
    detect_repo_environment,
)
from opencomposer.tasks.generators.common import Candidate, Lab, Rejected, realize
from opencomposer.tasks.generators.source import SourceRepo, Tree, is_skipped, is_test_path

TRAILER = re.compile(r"^[A-Za-z][A-Za-z-]*: .+$")
FIX_WORDS = re.compile(r"^\s*(fix|bug|repair|correct|resolve|patch)", re.IGNORECASE)


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


def candidate_for(repo: Path, sha: str, test_command: str,
                  environment: EnvironmentSpec | None = None) -> tuple[Candidate | None, str, str]:
    """The candidate of commit ``sha`` (or None and the reason), and the commit's subject."""
    parents = git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]
    subject, prompt = commit_message(repo, sha)
    if not parents:
        return None, "root commit: there is no earlier state to start from", subject
    if len(parents) > 1:
        return None, "merge commit: its change is not one developer's step", subject
    parent = parents[0]
    paths, binary = changed_files(repo, parent, sha)
    tests = [p for p in paths if is_test_path(p)]
    code = [p for p in paths if not is_test_path(p) and p.endswith(".py")]
    if not tests:
        return None, "changes no tests: nothing can tell a fix from a non-fix", subject
    if not code:
        return None, "changes no code (only tests, docs or data)", subject
    if [p for p in binary if not is_test_path(p)]:
        return None, f"binary change in {sorted(set(binary))[0]}: a gold patch cannot carry it", subject
    if not prompt:
        return None, "empty commit message: no request to give the agent", subject
    before, after = commit_tree(repo, parent), commit_tree(repo, sha)
    source = SourceRepo(Path(repo).resolve().name, Path(repo), before, test_command)
    grading_tests = {p: d for p, d in before.items() if is_test_path(p)}
    grading_tests.update({p: d for p, d in after.items() if is_test_path(p) and p in tests})
    kind = "fix" if FIX_WORDS.match(subject) else "feature"
    candidate = Candidate(
        source=source,
        gold_code={p: d for p, d in after.items() if not is_test_path(p)},
        broken_code={p: d for p, d in before.items() if not is_test_path(p)},
        grading_tests=grading_tests,
        visible_tests={p: d for p, d in before.items() if is_test_path(p)},
        instruction=prompt,
        metadata={"source": "mined", "kind": kind, "commit": sha, "base_commit": parent, "subject": subject},
        label=f"{sha[:10]} {subject}",
        environment=detect_environment(before, environment),
    )
    return candidate, "", subject


def mine_commit(repo: Path, sha: str, out: Path, lab: Lab, test_command: str,
                environment: EnvironmentSpec | None = None) -> MinedCommit:
    try:
        candidate, reason, subject = candidate_for(repo, sha, test_command, environment)
    except MiningError as e:
        return MinedCommit(sha, "", reason=f"git failed: {e}")
    if candidate is None:
        return MinedCommit(sha, subject, reason=reason)
    task_id = task_id_for(repo, sha)
    try:
        task = realize(candidate, lab, Path(out) / task_id, task_id)
    except Rejected as e:
        return MinedCommit(sha, subject, reason=str(e))
    return MinedCommit(sha, subject, task_id=task.id, fail_to_pass=task.fail_to_pass)


def commits_to_mine(repo: Path, rev: str = "HEAD", limit: int | None = None) -> list[str]:
    """The commits ``mine`` visits: every one reachable from ``rev``, oldest first; the newest
    ``limit`` if given."""
    if not (Path(repo) / ".git").exists():
        raise MiningError(f"{repo} is not a git repository (no .git); pass the root of a clone")
    shas = git(Path(repo), "rev-list", "--reverse", "--topo-order", rev).split()
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
) -> list[MinedCommit]:
    """Mine every commit of ``commits_to_mine(repo, rev, limit)`` into task folders under ``out``;
    returns one record per commit and writes ``mining.json``. ``on_done(record)`` runs in this
    thread as each commit is done (the command's progress display). ``environment``: the base of
    every task's ``[environment]`` (``detect_environment``)."""
    repo, out = Path(repo), Path(out)
    shas = commits_to_mine(repo, rev, limit)
    out.mkdir(parents=True, exist_ok=True)
    # A commit may break most tests before its fix (an import it adds): only gold passing and at
    # least one FAIL_TO_PASS matter here, not the generators' share of tests kept green.
    lab = Lab(dataclasses.replace(config or TasksConfig(), min_pass_to_pass=0.0), sandbox)
    records: dict[str, MinedCommit] = {}

    def one(sha: str) -> MinedCommit:
        record = mine_commit(repo, sha, out, lab, test_command, environment)
        records[sha] = record
        return record

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for record in pool.map(one, shas):
            if on_done is not None:
                on_done(record)
    result = [records[sha] for sha in shas]
    (out / "mining.json").write_text(json.dumps([asdict(r) for r in result], indent=1) + "\n")
    return result
