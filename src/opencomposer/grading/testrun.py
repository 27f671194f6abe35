"""Run a test command in a sandbox and get the outcome of every test by pytest node id.

This is the one test runner. Grading (``grading.grade``) runs a task's hidden tests with it; the
generators and the miner (``tasks.generators.common.Lab``) run the tests of the gold and the broken
state with it to list FAIL_TO_PASS and PASS_TO_PASS; the checks of the built-in suites
(``tests/suites``) run the projects' tests with it. One runner means the node ids a generator
writes are the ids grading looks up.

Outcomes come from a small pytest plugin (``grading.pytest_plugin``), loaded through
``PYTEST_ADDOPTS`` (so any ``test_command`` that runs pytest works) under a module name drawn for
the run from a folder only this command sees. It writes each test's outcome, under pytest's own
node id, to a pipe this process reads while the command runs, with a nonce the code under test is
not given. Asking pytest for its node ids, instead of rebuilding them from a report, is what makes
ids of tests inherited from a base class in another file, or parametrised with any characters,
come out as pytest prints them. pytest also gets a per-test limit (``--timeout``) when
pytest-timeout is installed, no cache provider, and no plugin autoloading unless
``autoload_plugins`` (a large environment's plugins cost seconds per run; pytest-timeout is then
loaded by name).

``protected`` paths (grading passes the task's tests and test configuration) are mounted
read-only for the command and are the code the plugin trusts; ``hidden`` test sources may not be
read by the code under test. With ``guard_values`` (the default) the plugin also routes the
comparisons and truth tests of the trusted tests' asserts through its value checks and makes
introspection of the run by untrusted code a violation; ``guard_values=False`` is for the red
team's controls, which show what those checks stop. The record stream is checked (``read_records``), and what breaks its
rules comes back as ``TestRun.tampering``; grading scores a tampered run as unresolved.

A command that runs past its limit, crashes before pytest starts or hangs is not an error here: it
comes back as an exit code, ``timed_out`` and whatever records arrived. Only a sandbox that cannot
run the command raises (``SandboxError``).

Not here: what the outcomes mean for a task (``grading.grade``, ``tasks.generators.common``); what
grading restores before the run (``grading.integrity``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import select
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opencomposer.sandbox.workspace import Sandbox

MAX_RECORD_BYTES = 64 << 20
OUTCOMES = ("passed", "failed", "error", "skipped")
PLUGIN_SOURCE = Path(__file__).with_name("pytest_plugin.py")
SETTINGS_VARIABLE = "OPENCOMPOSER_TESTRUN"  # the plugin reads (and removes) it


@dataclass
class TestRun:
    """What one test command did.

    ``outcomes`` maps each pytest node id to passed, failed, error (a failing setup or teardown, or
    a module that failed to import) or skipped; ``collected`` is the number of tests pytest
    collected plus the modules it could not import, None when pytest never finished collecting.
    ``tampering`` lists every way the run broke the rules of the record stream or of the test
    machinery's integrity (empty for a clean run)."""

    __test__ = False  # not a pytest class, whatever the name says

    outcomes: dict[str, str]
    exit_code: int
    timed_out: bool
    duration_s: float
    collected: int | None = None
    output: str = field(repr=False, default="")
    tampering: list[str] = field(default_factory=list)

    @property
    def tampered(self) -> bool:
        return bool(self.tampering)

    @property
    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}

    def not_passed(self) -> dict[str, str]:
        """Outcome of every test that did not pass, by node id."""
        return {node: outcome for node, outcome in self.outcomes.items() if outcome != "passed"}

    def count(self, outcome: str) -> int:
        """How many tests ended with ``outcome`` (one of ``OUTCOMES``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown test outcome {outcome!r}; expected one of {OUTCOMES}")
        return sum(value == outcome for value in self.outcomes.values())

    def tail(self, chars: int = 1500) -> str:
        return self.output[-chars:]


def run_tests(
    sandbox: Sandbox,
    test_command: str,
    *,
    timeout_s: float,
    per_test_timeout_s: float,
    autoload_plugins: bool = False,
    protected: Sequence[str] | None = None,
    hidden: Sequence[str] = (),
    guard_values: bool = True,
    unchanged: Mapping[str, str] | None = None,
) -> TestRun:
    """Run ``test_command`` in ``sandbox`` (from its workspace root) and collect its records.

    ``timeout_s`` limits the whole command (the sandbox kills its process tree), ``per_test_timeout_s``
    each test (pytest-timeout). ``protected``: workspace paths (relative) mounted read-only whose
    code is trusted; None trusts every file (for code we wrote ourselves). ``hidden``: test sources
    (relative) the code under test may not open. ``guard_values``: the value checks and the
    introspection audit (``grading.pytest_plugin``). ``unchanged``: the repository's own files the
    change left as they were (relative path -> sha256), whose code may introspect on the tests'
    behalf (``grading.integrity.Secured.unchanged``). Raises ``SandboxError`` only when the sandbox
    cannot run it."""
    token = secrets.token_hex(8)
    nonce = secrets.token_hex(16)
    plugin_dir = sandbox.root / f"testrun-{token}"
    plugin_dir.mkdir()
    module = f"_opencomposer_records_{token}"
    shutil.copyfile(PLUGIN_SOURCE, plugin_dir / f"{module}.py")
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, nonce.encode())
    os.close(nonce_write)
    channel = _Channel()
    readonly = sorted(set(protected or ()) | set(hidden))
    (plugin_dir / "unchanged.json").write_text(json.dumps(
        {sandbox.command_path(rel): digest for rel, digest in sorted((unchanged or {}).items())}))
    settings = {
        "results_fd": channel.write_fd,
        "nonce_fd": nonce_read,
        "trusted": None if protected is None else [sandbox.command_path(rel) for rel in readonly],
        "hidden": [sandbox.command_path(rel) for rel in hidden],
        "guard_values": guard_values,
        "unchanged": str(plugin_dir / "unchanged.json") if unchanged else None,  # ro_binds: the same path inside
    }
    env = _pytest_environment(module, str(plugin_dir), per_test_timeout_s, autoload_plugins)
    env[SETTINGS_VARIABLE] = json.dumps(settings)
    try:
        result = sandbox.run(test_command, timeout_s=timeout_s, env=env, pass_fds=(channel.write_fd, nonce_read),
                             readonly=readonly, ro_binds=[str(plugin_dir)])
    finally:
        os.close(nonce_read)
        data, overflowed = channel.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    outcomes, collected, tampering = read_records(data, nonce, result.exit_code, result.timed_out)
    if overflowed:
        tampering.append(f"the results channel carried more than {MAX_RECORD_BYTES} bytes")
    return TestRun(outcomes, result.exit_code, result.timed_out, result.duration_s, collected, result.output,
                   tampering)


def _pytest_environment(module: str, plugin_dir: str, per_test_timeout_s: float,
                        autoload_plugins: bool) -> dict[str, str]:
    """The environment that loads the recording plugin ``module`` from ``plugin_dir``, with the
    per-test limit and without the cache."""
    addopts = ["-p", module, "-p", "no:cacheprovider"]
    env = {"PYTHONPATH": plugin_dir, "PYTHONNOUSERSITE": "1"}
    if importlib.util.find_spec("pytest_timeout") is not None:
        addopts += [] if autoload_plugins else ["-p", "pytest_timeout"]
        addopts.append(f"--timeout={per_test_timeout_s:g}")
    if not autoload_plugins:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTEST_ADDOPTS"] = " ".join(addopts)
    return env


class _Channel:
    """The pipe the plugin writes its records to, drained on a thread while the command runs (a
    full pipe would block the tests). ``close()`` waits for the writers to go (the sandbox has
    ended every process of the command by then), at most ``grace_s``, and returns what came."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.grace_s = grace_s
        self._data = bytearray()
        self._overflowed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="testrun-records", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self.read_fd], [], [], 0.1)
                if not ready:
                    continue
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    return
                if len(self._data) + len(chunk) > MAX_RECORD_BYTES:
                    self._overflowed = True
                else:
                    self._data += chunk
        finally:
            os.close(self.read_fd)

    def close(self) -> tuple[bytes, bool]:
        os.close(self.write_fd)
        self._thread.join(self.grace_s)
        self._stop.set()
        self._thread.join()
        return bytes(self._data), self._overflowed


def read_records(data: bytes, nonce: str, exit_code: int, timed_out: bool) -> tuple[dict[str, str], int | None,
                                                                                   list[str]]:
    """(outcome by node id, tests collected, tampering) from the plugin's record stream.

    Rules of the stream (``grading.pytest_plugin``): every line is a JSON record with the run's nonce;
    a session is ``start``, ``collected``, ``collect_error``/``test`` records, ``violation``
    records, then ``finish``; nothing but a new ``start`` follows a ``finish``; no node id is
    reported twice; a finished session has as many ``test`` records as its ``finish`` counts and
    no fewer than it collected (unless it ran none because modules failed to import: without
    ``--continue-on-collection-errors`` pytest stops there); unless the harness stopped the command (``timed_out``), the last
    session finished and the command's exit code is the one pytest finished with, and a command
    that exits 0 ran a session. Each broken rule is one line of the returned tampering list."""
    outcomes: dict[str, str] = {}
    problems: list[str] = []
    collected: int | None = None
    session: dict | None = None  # {"collected", "tests", "finish"} of the latest session
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"an unreadable line on the results channel: {line[:80]!r}")
            continue
        if not isinstance(record, dict) or record.get("nonce") != nonce:
            problems.append(f"a record without this run's nonce: {line[:80]!r}")
            continue
        kind = record.get("kind")
        if kind == "start":
            if session is not None and session["finish"] is None:
                problems.append("a session started before the previous one finished")
            session = {"collected": None, "tests": 0, "collect_errors": 0, "finish": None}
            continue
        if session is None or session["finish"] is not None:
            problems.append(f"a {kind!r} record outside a running session")
            continue
        if kind == "violation":
            problems.append(str(record.get("what")))
        elif kind == "collected":
            session["collected"] = int(record.get("count", 0))
            collected = (collected or 0) + session["collected"]
        elif kind in ("test", "collect_error"):
            node, outcome = str(record.get("nodeid")), record.get("outcome", "error")
            if node in outcomes:
                problems.append(f"{node} was reported twice ({outcomes[node]}, then {outcome})")
                outcomes[node] = "error" if "error" in (outcome, outcomes[node]) else "failed"
                continue
            if outcome not in OUTCOMES:
                problems.append(f"{node}: unknown outcome {outcome!r}")
                outcome = "error"
            outcomes[node] = outcome
            if kind == "test":
                session["tests"] += 1
            else:
                session["collect_errors"] += 1
                collected = (collected or 0) + 1
        elif kind == "finish":
            session["finish"] = int(record.get("exitstatus", -1))
            if record.get("tests") != session["tests"]:
                problems.append(f"the session finished with {record.get('tests')} results, "
                                f"but {session['tests']} arrived")
            stopped_by_collection_errors = session["collect_errors"] and not session["tests"]
            if session["collected"] is not None and session["tests"] < session["collected"] \
                    and not stopped_by_collection_errors:
                problems.append(f"only {session['tests']} of the {session['collected']} collected tests "
                                "have a result")
        else:
            problems.append(f"a record of unknown kind {kind!r}")
    if not timed_out:
        if session is None and exit_code == 0:
            problems.append("the command exited 0 but no pytest session reported")
        elif session is not None and session["finish"] is None:
            problems.append(f"pytest stopped (exit code {exit_code}) before its session finished")
        elif session is not None and session["finish"] != exit_code:
            problems.append(f"the command exited {exit_code}, but pytest finished with {session['finish']}")
    return outcomes, collected, problems
