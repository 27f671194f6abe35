"""What every generator shares: a candidate task, the lab that runs its tests, and the steps that
turn a verified candidate into a task folder.

A generator proposes a ``Candidate``: the code before and after the change (``broken_code``, the
agent's starting point; ``gold_code``, the reference), the test files as grading will see them,
the test files the agent may see, and the prompt. ``realize`` then

1. runs the tests on the gold and the broken state in the sandbox (``Lab.run``, cached by content,
   so the untouched source project is run once per session);
2. computes FAIL_TO_PASS (pass in gold, not in broken) and PASS_TO_PASS (pass in both) from those
   runs, and rejects the candidate when nothing fails, when the broken state hangs or breaks
   most of the suite (an import error), or when the gold state times out;
3. writes the task folder (docs/task-format.md) with ``tasks.write_task``: the starting repository
   is the broken code plus the visible tests (for a built-in source project, stored as ``[repo] base``
   plus ``setup.patch``; for a user's repository, as a whole ``repo/``), ``tests/files/`` every test
   file whose graded version differs from the visible one, ``solution/gold.patch`` the code-only
   diff, the test folders protected;
4. verifies the folder through the real grader (``tasks.validation.check_task``: the gold patch
   resolves it, the untouched repository does not, every FAIL_TO_PASS test fails and every
   PASS_TO_PASS test passes there) and checks the repository for traces (bytecode, caches, VCS
   folders). Only then is the folder moved into place; a rejected candidate leaves nothing.

Randomness comes from ``rng_for(*keys)``, a ``random.Random`` seeded by a hash of the keys, so
task ``i`` of a stream is a pure function of (seed, i).

Not here: how candidates are made (``bugs``, ``deletion``, ``refactor``), streams and splits
(``registry``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencomposer.config import GradingConfig, SandboxConfig, TasksConfig
from opencomposer.grading.testrun import TestRun, run_tests
from opencomposer.sandbox.patch import file_diff
from opencomposer.sandbox.workspace import Sandbox, TaskEnvironment
from opencomposer.sandbox.venv import EnvironmentSpec, prepare_environment
from opencomposer.tasks.format import PROJECTS_DIR, write_task
from opencomposer.tasks.generators.source import (
    SourceRepo,
    Tree,
    find_traces,
    protected_roots,
    tree_digest,
    write_tree,
)
from opencomposer.types import Task


def rng_for(*keys: Any) -> random.Random:
    """A generator seeded by ``keys`` alone: the same keys give the same draws on every machine."""
    digest = hashlib.sha256(repr(keys).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class Rejected(Exception):
    """A candidate that did not become a task; the message says why."""


@dataclass
class Candidate:
    """A proposed task, before any test has run.

    ``gold_code``/``broken_code`` hold the non-test files of the two states; ``grading_tests``
    every test file as the grader runs it; ``visible_tests`` the test files in ``repo/`` (or a
    function of the FAIL_TO_PASS ids giving them); ``instruction`` the prompt (or a function of the
    FAIL_TO_PASS ids giving it)."""

    source: SourceRepo
    gold_code: Tree
    broken_code: Tree
    grading_tests: Tree
    visible_tests: Tree | Callable[[list[str]], Tree]
    instruction: str | Callable[[list[str]], str]
    metadata: dict[str, Any]
    label: str
    environment: EnvironmentSpec | None = None
    """The task's ``[environment]`` (``sandbox.venv``); None runs on opencomposer's Python."""

    def gold_state(self) -> Tree:
        return {**self.gold_code, **self.grading_tests}

    def broken_state(self) -> Tree:
        return {**self.broken_code, **self.grading_tests}


@dataclass
class Outcome:
    """FAIL_TO_PASS and PASS_TO_PASS of a candidate, from real runs."""

    fail_to_pass: list[str]
    pass_to_pass: list[str]
    gold: TestRun
    broken: TestRun


class Lab:
    """Runs tests in the sandbox with the generation settings, caching runs by tree content.

    Mutated or mined code is untrusted (it may loop forever, fork, fill the disk), so every run
    writes its tree into a fresh sandbox and goes through ``grading.testrun.run_tests``, the runner
    grading uses: the node ids listed here are the ids grading looks up.

    Thread-safe: parallel workers asking for the same tree wait for one run."""

    def __init__(self, config: TasksConfig | None = None, sandbox: SandboxConfig | None = None):
        self.config = config or TasksConfig()
        self.sandbox = sandbox or SandboxConfig()
        self.grading = GradingConfig(lint=False, timeout_s=self.config.test_timeout_s,
                                     per_test_timeout_s=self.config.per_test_timeout_s)
        self._runs: dict[tuple[str, str, str], TestRun] = {}
        self._pending: dict[tuple[str, str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self.runs_done = 0

    def environment(self, tree: Tree, spec: EnvironmentSpec | None) -> TaskEnvironment | None:
        """The sandbox environment ``spec`` gives for the repository ``tree`` (built on first use and
        cached by ``sandbox.venv``); None without a spec. A failed build raises
        ``EnvironmentBuildError``."""
        if spec is None:
            return None
        with tempfile.TemporaryDirectory(prefix="opencomposer-env-") as tmp:
            return prepare_environment(spec, write_tree(tree, Path(tmp) / "repo"), self.sandbox)[0]

    def run(self, tree: Tree, test_command: str, environment: TaskEnvironment | None = None) -> TestRun:
        key = (tree_digest(tree), test_command, repr(environment))
        with self._lock:
            if key in self._runs:
                return self._runs[key]
            pending = self._pending.setdefault(key, threading.Lock())
        with pending:
            with self._lock:
                if key in self._runs:
                    return self._runs[key]
            with Sandbox(None, self.sandbox, environment=environment) as sandbox:
                write_tree(tree, sandbox.workspace)
                result = run_tests(sandbox, test_command, timeout_s=self.config.test_timeout_s,
                                   per_test_timeout_s=self.config.per_test_timeout_s)
            with self._lock:
                self._runs[key] = result
                self._pending.pop(key, None)
                self.runs_done += 1
        return result

    def outcome(self, gold_state: Tree, broken_state: Tree, test_command: str,
                environment: EnvironmentSpec | None = None) -> Outcome:
        """Run both states and compare; raises ``Rejected`` when the pair cannot make a task. With an
        ``environment``, both run in the one built from the broken state (the task's starting
        repository), as grading will run them; a build that fails rejects the candidate."""
        from opencomposer.sandbox.venv import EnvironmentBuildError

        try:
            bound = self.environment(broken_state, environment)
        except EnvironmentBuildError as e:
            raise Rejected(f"the task environment could not be built: {e}") from e
        gold = self.run(gold_state, test_command, bound)
        if gold.timed_out:
            raise Rejected(f"the gold state's tests ran past {self.config.test_timeout_s:g} s")
        if not gold.passed:
            raise Rejected(f"no test passes in the gold state (exit {gold.exit_code}): {gold.tail(300)!r}")
        broken = self.run(broken_state, test_command, bound)
        if broken.timed_out:
            raise Rejected(f"the broken state's tests ran past {self.config.test_timeout_s:g} s (it hangs)")
        if broken.duration_s > 3 * gold.duration_s + 10:
            raise Rejected(f"the broken state's tests took {broken.duration_s:.1f} s against "
                           f"{gold.duration_s:.1f} s for gold (tests time out one by one)")
        regressed = sorted(broken.passed - gold.passed)
        if regressed:
            raise Rejected(f"the gold state fails {len(regressed)} test(s) that pass before the change, "
                           f"e.g. {regressed[0]}")
        fail_to_pass = sorted(gold.passed - broken.passed)
        pass_to_pass = sorted(gold.passed & broken.passed)
        if not fail_to_pass:
            raise Rejected("no test fails in the broken state (the change is not covered by any test)")
        kept = len(pass_to_pass) / len(gold.passed)
        if kept < self.config.min_pass_to_pass:
            raise Rejected(f"the broken state passes only {kept:.0%} of the tests that pass in gold "
                           f"(tasks.min_pass_to_pass = {self.config.min_pass_to_pass:g}); it breaks too much")
        return Outcome(fail_to_pass, pass_to_pass, gold, broken)


def code_patch(before: Tree, after: Tree) -> str:
    """Unified diff (a/ b/ prefixes) from ``before`` to ``after``, files in path order."""
    chunks = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        chunks.append(file_diff(rel, None if old is None else old.decode("utf-8"),
                                None if new is None else new.decode("utf-8")))
    return "".join(chunks)


def builtin_base(source: SourceRepo) -> str | None:
    """The ``[repo] base`` of tasks made from ``source``: its name when it is a built-in project (the
    task folder then stores only the change), None for a user's repository (stored whole)."""
    root = source.root.resolve()
    return root.name if root.parent == PROJECTS_DIR.resolve() else None


def realize(candidate: Candidate, lab: Lab, folder: Path, task_id: str,
            budgets: dict[str, Any] | None = None) -> Task:
    """Run, write and verify ``candidate`` as the task folder ``folder``; ``Rejected`` if it fails."""
    from opencomposer.tasks.validation import check_task

    source = candidate.source
    outcome = lab.outcome(candidate.gold_state(), candidate.broken_state(), source.task_command,
                          candidate.environment)
    visible = candidate.visible_tests
    visible = visible(outcome.fail_to_pass) if callable(visible) else visible
    unknown = sorted(set(visible) - set(candidate.grading_tests))
    if unknown:
        raise ValueError(f"visible tests {unknown} are not among the graded test files; grading would "
                         "restore them unseen")
    hidden = {rel: data for rel, data in candidate.grading_tests.items() if visible.get(rel) != data}
    instruction = candidate.instruction
    instruction = instruction(outcome.fail_to_pass) if callable(instruction) else instruction
    gold_patch = code_patch(candidate.broken_code, candidate.gold_code)
    metadata = {**candidate.metadata, "family": source.name, "label": candidate.label}
    folder = Path(folder)
    partial = folder.parent / f".{folder.name}.partial"
    with tempfile.TemporaryDirectory(prefix="opencomposer-gen-") as tmp:
        repo = write_tree({**candidate.broken_code, **visible}, Path(tmp) / "repo")
        hidden_dir = write_tree(hidden, Path(tmp) / "hidden")
        task = write_task(
            partial,
            task_id=task_id,
            instruction=instruction,
            repo=repo,
            fail_to_pass=outcome.fail_to_pass,
            pass_to_pass=outcome.pass_to_pass,
            hidden_tests=hidden_dir,
            test_command=source.task_command,
            protected_paths=protected_roots(set(candidate.grading_tests) | set(visible)),
            metadata=metadata,
            budgets=budgets,
            gold_patch=gold_patch,
            base=builtin_base(source),
            overwrite=True,
            environment=candidate.environment,
        )
    try:
        traces = find_traces(task.repo)
        if traces:
            raise Rejected(f"the task repository holds traces of code: {traces}")
        check = check_task(task, lab.sandbox, lab.grading)
        if check.problems:
            raise Rejected("verification through the grader failed: " + "; ".join(check.problems))
        if folder.exists():
            shutil.rmtree(folder)
        partial.replace(folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    from opencomposer.tasks.format import load_task

    return load_task(folder)


@dataclass
class Attempt:
    """One candidate tried for a task index, kept for the generation report."""

    label: str
    reason: str = ""  # empty when it became the task


@dataclass
class GenerationResult:
    """The task made for one index of a stream (``task`` None when every attempt was rejected)."""

    index: int
    task: Task | None
    attempts: list[Attempt] = field(default_factory=list)
    seconds: float = 0.0
