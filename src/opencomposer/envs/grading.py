"""Grading a finished episode: apply the agent's diff to a fresh copy, run the hidden tests, score.

Order (docs/task-format.md, "Grading order"):

1. a fresh sandbox is made from the task's ``repo/`` and the agent's diff is applied to it;
2. every protected path is restored from ``repo/`` (removed if ``repo/`` lacks it), then
   ``tests/files/`` is overlaid, so editing or deleting tests gains the agent nothing;
3. the task's ``test_command`` runs in the sandbox; pytest is asked (through ``PYTEST_ADDOPTS``)
   for a JUnit XML report, a per-test timeout when pytest-timeout is installed, and no cache;
4. per-test outcomes give the FAIL_TO_PASS and PASS_TO_PASS fractions; the rubric is checked;
   the diff is measured (files and lines changed, TODO/FIXME/XXX and comment lines added, ruff
   findings added on touched Python files); ``reward.json`` gets the named numbers.

Resolution follows the listed tests: failures of unrelated tests do not block it (the exit code
is recorded as ``test_exit_code``), and a missing or unreadable report fails every listed test.
A test command that runs past ``grading.timeout_s`` scores as failing tests (hanging code is the
agent's doing). Only failures of the harness itself (the sandbox cannot start, the diff produced by
our own sandbox does not apply, ruff is missing) raise ``GradingInfraError``.

``GradeCache`` reuses the grade of an identical change to the same task (``grading.cache``).

Known limit: the tests run the agent's code in the same process as pytest, so a determined agent
could forge the report; the exit code is recorded beside it, and tasks should keep conftest files
among their protected paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
from concurrent.futures import Future
from pathlib import Path

from opencomposer.config import GradingConfig, SandboxConfig
from opencomposer.sandbox.patch import PatchError, apply_patch, copy_tree, diff_stats
from opencomposer.sandbox.workspace import Sandbox, SandboxError
from opencomposer.types import Task

REPORT_DIR = ".opencomposer"
MAX_REPORT_BYTES = 64 << 20
TODO_MARKER = re.compile(r"\b(TODO|FIXME|XXX)\b")
COMMENT_PREFIX = {
    ".py": "#", ".sh": "#", ".toml": "#", ".yaml": "#", ".yml": "#", ".cfg": "#", ".rb": "#", ".pl": "#",
    ".js": "//", ".ts": "//", ".tsx": "//", ".jsx": "//", ".c": "//", ".h": "//", ".cc": "//", ".cpp": "//",
    ".go": "//", ".rs": "//", ".java": "//", ".kt": "//", ".swift": "//",
}


class GradingInfraError(RuntimeError):
    """Grading could not be carried out; the episode is an infrastructure error, never a zero."""


def grade(
    task: Task,
    diff: str,
    final_message: str | None = None,
    sandbox_config: SandboxConfig | None = None,
    config: GradingConfig | None = None,
    out_dir: Path | None = None,
) -> dict[str, float]:
    """Score the agent's ``diff`` on ``task``; writes ``reward.json`` into ``out_dir`` if given."""
    config = config or GradingConfig()
    started = time.monotonic()
    try:
        stats = diff_stats(diff)
    except PatchError as e:
        raise GradingInfraError(f"the agent's diff cannot be parsed: {e}") from e
    reward: dict[str, float] = {
        "files_changed": float(stats.files_changed),
        "lines_added": float(stats.lines_added),
        "lines_removed": float(stats.lines_removed),
        "lines_changed": float(stats.lines_added + stats.lines_removed),
        "todo_added": float(sum(bool(TODO_MARKER.search(line)) for lines in stats.added_lines.values()
                                for line in lines)),
        "comment_lines_added": float(_comment_lines(stats.added_lines)),
    }
    try:
        sandbox = Sandbox(task.repo, sandbox_config, workdir=task.workdir)
    except SandboxError as e:
        raise GradingInfraError(f"the grading sandbox could not start: {e}") from e
    with sandbox:
        try:
            apply_patch(sandbox.workspace, diff)
        except (PatchError, OSError) as e:
            raise GradingInfraError(f"the agent's diff does not apply to a fresh copy of the repo: {e}") from e
        touched_py = [p for p in stats.paths if p.endswith(".py")]
        reward["lint_added"] = float(_lint_added(task.repo, sandbox.workspace, touched_py) if config.lint else 0)
        _restore_protected(task, sandbox.workspace)
        if task.tests_dir is not None:
            copy_tree(task.tests_dir, sandbox.workspace)
        results, exit_code, timed_out = _run_tests(task, sandbox, config)
    reward.update(_test_scores(task, results, exit_code, timed_out))
    reward["rubric_ok"] = float(_rubric_ok(task, stats.paths, final_message))
    reward["resolved"] = float(
        reward["fail_to_pass"] == 1.0 and reward["pass_to_pass"] == 1.0 and reward["rubric_ok"] == 1.0
    )
    reward["grading_s"] = time.monotonic() - started
    _write_reward(out_dir, reward)
    return reward


def _write_reward(out_dir: Path | None, reward: dict[str, float]) -> None:
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "reward.json").write_text(json.dumps(reward, indent=2, sort_keys=True) + "\n")


class GradeCache:
    """Grades already computed in this process, keyed by (task, change, final message), so an
    identical change to the same task is tested once: the G rollouts of an RL group often end in
    the same diff, and evaluations grade the same held-out tasks again and again.

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

    def grade(
        self,
        task: Task,
        diff: str,
        final_message: str | None = None,
        sandbox_config: SandboxConfig | None = None,
        config: GradingConfig | None = None,
        out_dir: Path | None = None,
    ) -> dict[str, float]:
        """``grade(...)``, or the grade an earlier call with the same key computed."""
        started = time.monotonic()
        change = hashlib.sha256(f"{diff}\0{final_message}".encode()).hexdigest()
        key = (task.id, str(task.path), change, repr(sandbox_config), repr(config))
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
            return dict(future.result())
        reward = {**future.result(), "grading_s": time.monotonic() - started}
        _write_reward(out_dir, reward)
        return reward


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


def _run_tests(task: Task, sandbox: Sandbox, config: GradingConfig) -> tuple[dict[str, str], int, bool]:
    """Run the test command; returns (outcome by node id, exit code, timed out)."""
    if not task.fail_to_pass and not task.pass_to_pass:
        return {}, 0, False
    report = f"{REPORT_DIR}/junit-{uuid.uuid4().hex[:8]}.xml"
    addopts = [f"--junitxml={sandbox.command_path(report)}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    env = {}
    if importlib.util.find_spec("pytest_timeout") is not None:
        addopts += ([] if config.autoload_plugins else ["-p", "pytest_timeout"])
        addopts.append(f"--timeout={config.per_test_timeout_s:g}")
    if not config.autoload_plugins:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTEST_ADDOPTS"] = " ".join(addopts)
    try:
        result = sandbox.run(task.test_command, timeout_s=config.timeout_s, env=env)
    except SandboxError as e:
        raise GradingInfraError(f"the test command could not be started: {e}") from e
    path = sandbox.workspace / report
    results: dict[str, str] = {}
    if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_REPORT_BYTES:
        results = parse_junit(path.read_bytes())
    return results, result.exit_code, result.timed_out


def parse_junit(data: bytes) -> dict[str, str]:
    """Outcome (passed, failed, error, skipped) of each pytest node id in an xunit1 JUnit report."""
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return {}
    results: dict[str, str] = {}
    for case in root.iter("testcase"):
        node = junit_node_id(case.get("file"), case.get("classname", ""), case.get("name", ""))
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                if outcome != "skipped":
                    break
        if results.get(node) in ("failed", "error"):
            continue  # a teardown error is reported as a second case; keep the worse outcome
        results[node] = outcome
    return results


def junit_node_id(file: str | None, classname: str, name: str) -> str:
    """Rebuild ``path/to/test_x.py::Class::test_name`` from xunit1 attributes."""
    if file:
        module = file[:-3].replace("/", ".") if file.endswith(".py") else file
        rest = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
        return file + ("::" + rest.replace(".", "::") if rest else "") + "::" + name
    parts = classname.split(".")
    for split in range(len(parts), 0, -1):  # no file attribute: guess where the module ends
        if parts[split - 1].startswith("test"):
            path = "/".join(parts[:split]) + ".py"
            return "::".join([path, *parts[split:], name])
    return f"{classname.replace('.', '/')}.py::{name}"


def _test_scores(task: Task, results: dict[str, str], exit_code: int, timed_out: bool) -> dict[str, float]:
    def fraction(ids: list[str]) -> float:
        return 1.0 if not ids else sum(results.get(i) == "passed" for i in ids) / len(ids)

    return {
        "fail_to_pass": fraction(task.fail_to_pass),
        "pass_to_pass": fraction(task.pass_to_pass),
        "tests_passed": float(sum(v == "passed" for v in results.values())),
        "tests_failed": float(sum(v == "failed" for v in results.values())),
        "tests_errored": float(sum(v == "error" for v in results.values())),
        "test_exit_code": float(exit_code),
        "test_timed_out": float(timed_out),
    }


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


def _comment_lines(added: dict[str, list[str]]) -> int:
    count = 0
    for path, lines in added.items():
        prefix = COMMENT_PREFIX.get(Path(path).suffix)
        if prefix:
            count += sum(line.lstrip().startswith(prefix) for line in lines)
    return count


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
    proc = subprocess.run(
        [ruff_executable(), "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json", "--",
         *existing],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    try:
        return len(json.loads(proc.stdout or "[]"))
    except json.JSONDecodeError as e:
        raise GradingInfraError(f"ruff printed something that is not JSON: {proc.stderr[-300:]}") from e


def _lint_added(repo: Path, workspace: Path, touched: list[str]) -> int:
    return ruff_findings(workspace, touched) - ruff_findings(repo, touched)
