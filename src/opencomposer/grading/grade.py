"""Grading a finished episode: apply the agent's diff to a fresh copy, run the hidden tests, score.

Order (docs/task-format.md, "Grading order"):

1. a fresh sandbox is made from the task's ``repo/`` and the agent's diff is applied to it;
2. every protected path is restored from ``repo/`` (removed if ``repo/`` lacks it), then
   ``tests/files/`` is overlaid, so editing or deleting tests gains the agent nothing; then
   ``grading.integrity.secure_workspace`` puts back the task's pytest configuration and conftest
   files and removes interpreter startup hooks and modules that shadow the test stack;
3. the task's ``test_command`` runs in the sandbox through ``grading.testrun.run_tests`` (outcomes by
   node id streamed out of pytest by a recording plugin, the tests and their configuration
   read-only, hidden test sources unreadable by the code under test, a per-test timeout when
   pytest-timeout is installed, no cache);
4. per-test outcomes give the FAIL_TO_PASS and PASS_TO_PASS fractions; the rubric is checked;
   the diff is measured (``sandbox.patch.diff_stats``: files and lines changed, TODO/FIXME/XXX and
   comment lines added; ruff findings added on touched Python files). The result is a ``Grade``
   (``types.Grade``), written as ``reward.json`` by ``Grade.to_json``. The hack monitor
   (``grading.hack_monitor``) scans the diff statically and sets ``hack_suspected`` with its reasons;
   it never changes ``resolved``.

Resolution follows the listed tests: failures of unrelated tests do not block it (the exit code
is recorded as ``test_exit_code``), and a listed test without a result fails. A change that
tampers with the run (a planted startup hook or a module named like pytest, or a run whose records
break the stream's rules or show the test machinery replaced: ``grading.testrun``) is graded
``tampered``: unresolved, both test fractions 0, whatever the tests reported.
A test command that runs past ``grading.timeout_s`` scores as failing tests (hanging code is the
agent's doing). Only failures of the harness itself (the sandbox cannot start, the diff produced by
our own sandbox does not apply, ruff is missing or runs past its limit) raise ``GradingInfraError``.
A diff our sandbox makes is checked to rebuild the workspace as it is made; one that does not is a
harness bug (``sandbox.patch.DiffRoundTripError``), never an infrastructure error that would drop
the rollout: ``run_episode`` grades the agent's workspace itself (``grade(..., workspace=...)``)
and the grade says ``diff_round_trip_failed``.

``GradeCache`` reuses the grade of an identical change to the same task (``grading.cache``), keyed on
everything grading reads: the task folder's content, the diff, the final message and the settings.

**Task environments.** A task with an ``[environment]`` (``sandbox.venv``) is graded in its
environment, built on first use by ``sandbox.venv.prepare_task_environment`` and bound read-only
(``sandbox.workspace``); a build that fails raises ``GradingInfraError`` naming the kept build log,
never a zero, and a task is never graded on opencomposer's own interpreter in its place.

**Harbor verifiers.** A task folder with ``verifier/test.sh`` is graded the way Harbor grades: its
``verifier/`` folder is mounted read-only at ``/tests``, a fresh writable ``/logs/verifier`` beside it,
``bash /tests/test.sh`` runs from the workdir (the network closed, ``grading.timeout_s``), and the
reward is read from ``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (``{"reward": x}``,
or a single named number). ``fail_to_pass`` is that reward (clamped to [0, 1]) and the task is
resolved at 1. A script that writes no readable reward scores 0 (logged): the agent's code may be
what stopped it. Known limit, as in Harbor: code under test that runs during the script can write
the reward file itself.

Known limit: the tests run the agent's code in the same process as pytest. The defences above
stop every hack in ``tests/grading/test_red_team.py``; code written to find the recording plugin in
memory, or a child process that reads the hidden tests, could still get around them
(docs/harness.md, "Grading integrity").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from opencomposer.config import GradingConfig, SandboxConfig
from opencomposer.grading.hack_monitor import scan_diff
from opencomposer.grading.integrity import Secured, secure_workspace
from opencomposer.grading.testrun import TestRun, run_tests
from opencomposer.sandbox.patch import (
    DiffStats,
    PatchError,
    apply_patch,
    copy_tree,
    diff_stats,
    is_ignored_name,
    read_entry,
)
from opencomposer.sandbox.venv import EnvironmentBuildError, prepare_task_environment
from opencomposer.sandbox.workspace import Mount, Sandbox, SandboxError, TaskEnvironment
from opencomposer.types import Grade, Task

RUFF_TIMEOUT_S = 120.0
MAX_HACK_REASONS = 20  # reward.json keeps the first ones and a count of the rest
VERIFIER_DIR = "verifier"
VERIFIER_SCRIPT = "test.sh"
log = logging.getLogger(__name__)


class GradingInfraError(RuntimeError):
    """Grading could not be carried out; the episode is an infrastructure error, never a zero."""


def task_environment(task: Task, sandbox_config: SandboxConfig | None = None) -> TaskEnvironment | None:
    """The sandbox environment of ``task`` (built on first use), or None when it has none; a failed
    build raises ``GradingInfraError`` (with the build log's path)."""
    try:
        return prepare_task_environment(task, sandbox_config)
    except EnvironmentBuildError as e:
        raise GradingInfraError(f"the task's environment could not be built: {e}") from e


def verifier_dir(task: Task) -> Path | None:
    """The task folder's Harbor verifier (``verifier/`` holding ``test.sh``), or None."""
    if task.path is None:
        return None
    folder = Path(task.path) / VERIFIER_DIR
    return folder if (folder / VERIFIER_SCRIPT).is_file() else None


def grade(
    task: Task,
    diff: str,
    final_message: str | None = None,
    sandbox_config: SandboxConfig | None = None,
    config: GradingConfig | None = None,
    out_dir: Path | None = None,
    *,
    workspace: Path | None = None,
) -> Grade:
    """Score the agent's ``diff`` on ``task``; writes ``reward.json`` into ``out_dir`` if given.

    ``workspace``, the agent's workspace, is for a diff that failed its round trip (a harness bug,
    ``sandbox.patch.DiffRoundTripError``): the grading copy is then made from the workspace itself,
    ``diff`` is only measured (as far as it can be), and the grade says ``diff_round_trip_failed``."""
    config = config or GradingConfig()
    started = time.monotonic()
    try:
        stats = diff_stats(diff)
    except PatchError as e:
        if workspace is None:
            raise GradingInfraError(f"the agent's diff cannot be parsed: {e}") from e
        log.error("task %s: the harness's diff cannot be measured (%s); its sizes count as 0", task.id, e)
        stats = DiffStats()
    environment = task_environment(task, sandbox_config)
    verifier = verifier_dir(task)
    # removed when it goes out of scope, whatever way grading ends
    holder = tempfile.TemporaryDirectory(prefix="opencomposer-verifier-") if verifier is not None else None
    logs = Path(holder.name) if holder is not None else None
    mounts = [] if verifier is None else [Mount(str(verifier), "/tests"), Mount(str(logs), "/logs/verifier", True)]
    try:
        sandbox = Sandbox(task.repo if workspace is None else workspace, sandbox_config, workdir=task.workdir,
                          environment=environment, mounts=mounts)
    except SandboxError as e:
        raise GradingInfraError(f"the grading sandbox could not start: {e}") from e
    with sandbox:
        try:
            if workspace is None:
                apply_patch(sandbox.workspace, diff)
        except (PatchError, OSError) as e:  # sandbox diffs are checked as they are made: this one came from elsewhere
            raise GradingInfraError(f"the agent's diff does not apply to a fresh copy of the repo: {e}") from e
        touched_py = [p for p in stats.paths if p.endswith(".py")]
        lint_added = _lint_added(task.repo, sandbox.workspace, touched_py) if config.lint else 0
        _restore_protected(task, sandbox.workspace)
        if task.tests_dir is not None:
            copy_tree(task.tests_dir, sandbox.workspace)
        secured = secure_workspace(sandbox.workspace, task.repo, task.tests_dir, task.protected_paths)
        if verifier is None:
            run = _run_tests(task, sandbox, config, secured)
        else:
            run, reward = _run_verifier(task, sandbox, config, secured, logs)

    def fraction(ids: list[str]) -> float:
        return 1.0 if not ids else sum(run.outcomes.get(i) == "passed" for i in ids) / len(ids)

    tampering = secured.tampering + run.tampering
    if tampering:
        log.warning("task %s: the change tampered with the test run: %s", task.id, "; ".join(tampering))
    if verifier is not None:  # Harbor's verifier: one reward in [0, 1]
        fail_to_pass, pass_to_pass = (0.0, 0.0) if tampering else (reward, 1.0)
    else:
        fail_to_pass, pass_to_pass = (0.0, 0.0) if tampering else (fraction(task.fail_to_pass),
                                                                     fraction(task.pass_to_pass))
    rubric_ok = _rubric_ok(task, stats.paths, final_message)
    hack_reasons = scan_diff(diff, task)  # a signal for the reward and the reports; resolved stays
    if len(hack_reasons) > MAX_HACK_REASONS:
        hack_reasons[MAX_HACK_REASONS:] = [f"... and {len(hack_reasons) - MAX_HACK_REASONS} more"]
    verdict = Grade(
        resolved=fail_to_pass == 1.0 and pass_to_pass == 1.0 and rubric_ok and not tampering,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        tests_passed=run.count("passed"),
        tests_failed=run.count("failed"),
        tests_errored=run.count("error"),
        test_exit_code=run.exit_code,
        test_timed_out=run.timed_out,
        tampered=bool(tampering),
        diff_round_trip_failed=workspace is not None,
        hack_suspected=bool(hack_reasons),
        hack_reasons=tuple(hack_reasons),
        rubric_ok=rubric_ok,
        files_changed=stats.files_changed,
        lines_added=stats.lines_added,
        lines_removed=stats.lines_removed,
        lines_changed=stats.lines_changed,
        todo_added=stats.todo_lines_added(),
        comment_lines_added=stats.comment_lines_added(),
        lint_added=lint_added,
        grading_s=time.monotonic() - started,
    )
    _write_reward(out_dir, verdict)
    return verdict


def _write_reward(out_dir: Path | None, verdict: Grade) -> None:
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "reward.json").write_text(json.dumps(verdict.to_json(), indent=2, sort_keys=True) + "\n")


def folder_digest(folder: Path | None) -> str:
    """The content digest of a folder's tree (every file and link by relative path, caches and
    ``.git`` left out as the sandbox's copy leaves them), "absent" when there is no such folder.

    Computed once per state of the tree: a walk ``lstat``s every entry, and the contents are read
    and hashed only when that walk's signature (paths, sizes, modes, mtimes and ctimes) is new to
    this process. A file cannot change without changing its ctime, which no tool sets back, so the
    signature misses no edit; except that the clock behind those times ticks coarsely (milliseconds),
    so a tree with an entry changed in the last ``RACY_S`` seconds is hashed again on every call
    (git's "racy clean" rule). A copy of the same tree elsewhere gets the same digest."""
    if folder is None or not Path(folder).is_dir():
        return "absent"
    walked_ns = time.time_ns()
    entries = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(n for n in dirnames if not is_ignored_name(n))
        for name in sorted(filenames) + [n for n in dirnames if os.path.islink(os.path.join(dirpath, n))]:
            if is_ignored_name(name):
                continue
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            entries.append((os.path.relpath(path, folder), info.st_size, info.st_mode, info.st_mtime_ns,
                            info.st_ctime_ns))
    signature = (str(folder), hashlib.sha256(repr(sorted(entries)).encode()).hexdigest())
    with _DIGEST_LOCK:
        known = _DIGESTS.get(signature)
    if known is not None:
        return known
    content = hashlib.sha256()
    for rel, *_ in sorted(entries):
        entry = read_entry(Path(folder) / rel)
        content.update(f"{rel}\0{entry.mode if entry else '-'}\0{len(entry.data) if entry else 0}\0".encode())
        content.update(entry.data if entry else b"")
    digest = content.hexdigest()
    if all(walked_ns - max(mtime, ctime) > RACY_S * 1e9 for *_, mtime, ctime in entries):
        with _DIGEST_LOCK:
            _DIGESTS[signature] = digest
    return digest


RACY_S = 2.0
_DIGESTS: dict[tuple[str, str], str] = {}
_DIGEST_LOCK = threading.Lock()


def task_digest(task: Task) -> str:
    """Everything of ``task`` that grading reads, as one digest: its task folder, its repository and
    hidden tests (``folder_digest``, each counted once when it lies inside the task folder) and the
    task's record (test command, test lists, protected paths, rubric, workdir, metadata)."""
    path = getattr(task, "path", None)
    folders = [path]
    for extra in (getattr(task, "repo", None), getattr(task, "tests_dir", None)):
        if extra is not None and (path is None or not Path(extra).is_relative_to(path)):
            folders.append(extra)
    record = {name: getattr(task, name, None) for name in (
        "id", "test_command", "fail_to_pass", "pass_to_pass", "protected_paths", "rubric", "workdir", "metadata")}
    parts = [repr(sorted(record.items(), key=lambda kv: kv[0]))] + [folder_digest(f) for f in folders]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class GradeCache:
    """Grades already computed in this process, keyed by everything grading reads, so an identical
    change to the same task is tested once: the G rollouts of an RL group often end in the same
    diff, and evaluations grade the same held-out tasks again and again.

    The key (``key``): the task's content (``task_digest``: its folder, repository, hidden tests and
    record, so an edited hidden test or ``task.toml`` is graded afresh), the diff, the final message
    (a rubric may read it), and the grading and sandbox settings.

    Thread-safe: when several threads ask for the same key at once, one grades and the others wait
    for its result. A grading that raises is not remembered (each waiter gets the error; the next
    request grades afresh). The newest ``max_entries`` grades are kept. Grading is assumed to be a
    function of its key: a flaky test gets graded once per distinct change (``grading.cache =
    false`` grades every episode). ``grading_s`` of a reused grade is the time the caller waited.
    """

    def __init__(self, max_entries: int = 4096):
        from collections import OrderedDict

        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def key(task: Task, diff: str, final_message: str | None, sandbox_config: SandboxConfig | None,
            config: GradingConfig | None) -> tuple[str, str, str, str]:
        """(the task's content, the change, the grading settings, the sandbox settings); no settings
        and the default settings are the same key."""
        change = hashlib.sha256(f"{len(diff)}\0{diff}\0{final_message!r}".encode()).hexdigest()
        return (task_digest(task), change, repr(config or GradingConfig()), repr(sandbox_config or SandboxConfig()))

    def grade(
        self,
        task: Task,
        diff: str,
        final_message: str | None = None,
        sandbox_config: SandboxConfig | None = None,
        config: GradingConfig | None = None,
        out_dir: Path | None = None,
        *,
        workspace: Path | None = None,
    ) -> Grade:
        """``grade(...)``, or the grade an earlier call with the same key computed. A grade of the
        ``workspace`` itself is never cached: its diff does not say what was graded."""
        if workspace is not None:
            return grade(task, diff, final_message, sandbox_config, config, out_dir, workspace=workspace)
        started = time.monotonic()
        key = self.key(task, diff, final_message, sandbox_config, config)
        with self._lock:
            future = self._entries.get(key)
            owner = future is None
            if owner:
                future = self._entries[key] = Future()
                self.misses += 1
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
                self.hits += 1
        if owner:
            try:
                future.set_result(grade(task, diff, final_message, sandbox_config, config, out_dir))
            except BaseException as e:
                with self._lock:
                    if self._entries.get(key) is future:
                        del self._entries[key]
                future.set_exception(e)
                raise
            return future.result()
        reused = dataclasses.replace(future.result(), grading_s=time.monotonic() - started)
        _write_reward(out_dir, reused)
        return reused


# ----------------------------------------------------------------------------------------------


def _restore_protected(task: Task, workspace: Path) -> None:
    for rel in task.protected_paths:
        target = workspace / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        source = task.repo / rel
        if source.is_dir():
            copy_tree(source, target)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _run_tests(task: Task, sandbox: Sandbox, config: GradingConfig, secured: Secured) -> TestRun:
    if not task.fail_to_pass and not task.pass_to_pass:
        return TestRun({}, 0, False, 0.0)  # nothing to look up: a task judged by its rubric alone
    try:
        return run_tests(sandbox, task.test_command, timeout_s=config.timeout_s,
                         per_test_timeout_s=config.per_test_timeout_s, autoload_plugins=config.autoload_plugins,
                         protected=secured.protected, hidden=secured.hidden, unchanged=secured.unchanged)
    except SandboxError as e:
        raise GradingInfraError(f"the test command could not be started: {e}") from e


def _run_verifier(task: Task, sandbox: Sandbox, config: GradingConfig, secured: Secured,
                  logs: Path) -> tuple[TestRun, float]:
    """Run the task's Harbor ``test.sh`` (mounted at ``/tests``) and read its reward from ``logs``
    (mounted at ``/logs/verifier``): (the run as one test, the reward in [0, 1])."""
    try:
        result = sandbox.run(f"bash /tests/{VERIFIER_SCRIPT}", timeout_s=config.timeout_s,
                             readonly=secured.protected)
    except SandboxError as e:
        raise GradingInfraError(f"the verifier could not be started: {e}") from e
    reward, problem = read_reward(logs)
    if problem:
        log.warning("task %s: %s (test.sh exited %d%s); scored 0", task.id, problem, result.exit_code,
                    ", timed out" if result.timed_out else "")
    outcome = "passed" if reward >= 1.0 else "failed"
    run = TestRun({f"/tests/{VERIFIER_SCRIPT}": outcome}, result.exit_code, result.timed_out, result.duration_s,
                  1, result.output)
    return run, reward


def read_reward(folder: Path) -> tuple[float, str]:
    """The reward Harbor's verifier left in ``folder``: ``reward.txt`` (a number) or ``reward.json``
    (``{"reward": x}``, or an object with a single number), clamped to [0, 1]; (0.0, why) when there
    is none that can be read."""
    text_file, json_file = folder / "reward.txt", folder / "reward.json"
    try:
        if text_file.is_file():
            value: object = float(text_file.read_text(encoding="utf-8").strip())
        elif json_file.is_file():
            data = json.loads(json_file.read_text(encoding="utf-8"))
            numbers = {k: v for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}
            value = numbers.get("reward", next(iter(numbers.values())) if len(numbers) == 1 else None)
            if value is None:
                return 0.0, f"reward.json has no 'reward' number: {str(data)[:200]}"
        else:
            return 0.0, "the verifier wrote no reward.txt or reward.json"
    except (ValueError, OSError, UnicodeDecodeError) as e:
        return 0.0, f"the verifier's reward cannot be read: {e}"
    number = float(value)
    if number != number:  # NaN
        return 0.0, "the verifier's reward is NaN"
    return min(1.0, max(0.0, number)), ""


def _rubric_ok(task: Task, changed: list[str], final_message: str | None) -> bool:
    rubric = task.rubric or {}
    if rubric.get("expect_no_edit") and changed:
        return False
    if any(re.search(p, final_message or "") is None for p in rubric.get("final_message_must_match", [])):
        return False
    for forbidden in rubric.get("forbidden_paths", []):
        forbidden = forbidden.strip("/")
        if any(p == forbidden or p.startswith(forbidden + "/") for p in changed):
            return False
    return "max_files_changed" not in rubric or len(changed) <= rubric["max_files_changed"]


def ruff_executable() -> str:
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.is_file() else shutil.which("ruff")
    if found is None:
        raise GradingInfraError("ruff is not installed (pip install ruff), and grading.lint = true needs it")
    return found


def ruff_findings(root: Path, paths: list[str]) -> int:
    """Number of ruff findings (default rules, no project config) in ``paths`` under ``root``."""
    existing = [p for p in paths if (root / p).is_file() and not (root / p).is_symlink()]
    if not existing:
        return 0
    try:
        proc = subprocess.run(
            [ruff_executable(), "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json", "--",
             *existing],
            cwd=root, capture_output=True, text=True, timeout=RUFF_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise GradingInfraError(f"ruff timed out: it ran past {RUFF_TIMEOUT_S:g} s on {len(existing)} file(s) "
                                f"({', '.join(existing[:3])}) while measuring lint_added") from e
    try:
        return len(json.loads(proc.stdout or "[]"))
    except json.JSONDecodeError as e:
        raise GradingInfraError(f"ruff printed something that is not JSON: {proc.stderr[-300:]}") from e


def _lint_added(repo: Path, workspace: Path, touched: list[str]) -> int:
    return ruff_findings(workspace, touched) - ruff_findings(repo, touched)
