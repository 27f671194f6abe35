"""Run a test command in a sandbox and get the outcome of every test by pytest node id.

This is the one test runner. Grading (``envs.grading``) runs a task's hidden tests with it; the
generators and the miner (``tasks.generators.common.Lab``) run the tests of the gold and the broken
state with it to list FAIL_TO_PASS and PASS_TO_PASS; the checks of the built-in suites
(``tests/suites``) run the projects' tests with it. One runner means the node ids a generator
writes are the ids grading looks up.

pytest is asked, through ``PYTEST_ADDOPTS`` (so any ``test_command`` that runs pytest works), for:

- a JUnit XML report with xunit1 names in ``.opencomposer/`` of the workspace, which a diff never
  includes, read back from the host after the command (at most ``MAX_REPORT_BYTES``);
- a per-test limit (``--timeout``) when pytest-timeout is installed, so a test that hangs fails on
  its own instead of taking the whole run past its wall-clock limit;
- no cache provider, so a run leaves nothing in the repository but the report;
- no plugin autoloading unless ``autoload_plugins``: a large environment's plugins cost seconds per
  run (hypothesis alone about one); pytest-timeout is then loaded by name.

Node ids are rebuilt from the report's ``file``/``classname``/``name`` attributes
(``junit_node_id``). A command that runs past its limit, crashes before pytest starts or hangs is
not an error here: it comes back as an exit code, ``timed_out`` and whatever the report holds
(nothing, if pytest never wrote it). Only a sandbox that cannot run the command raises
(``SandboxError``).

Not here: what the outcomes mean for a task (``envs.grading``, ``tasks.generators.common``).
"""

from __future__ import annotations

import importlib.util
import uuid
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from opencomposer.sandbox.workspace import Sandbox

REPORT_DIR = ".opencomposer"
MAX_REPORT_BYTES = 64 << 20
OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass
class TestRun:
    """What one test command did.

    ``outcomes`` maps each pytest node id in the report to passed, failed, error or skipped (empty
    when pytest wrote no report); ``collected`` is the number of tests the report says pytest ran
    (its ``tests`` count, collection errors included), None without a report."""

    __test__ = False  # not a pytest class, whatever the name says

    outcomes: dict[str, str]
    exit_code: int
    timed_out: bool
    duration_s: float
    collected: int | None = None
    output: str = field(repr=False, default="")

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


def pytest_environment(report: str, per_test_timeout_s: float, autoload_plugins: bool = False) -> dict[str, str]:
    """The environment that makes pytest write ``report`` (a path as the command sees it) the way
    this module reads it, with the per-test limit and without the cache."""
    addopts = [f"--junitxml={report}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    env: dict[str, str] = {}
    if importlib.util.find_spec("pytest_timeout") is not None:
        addopts += [] if autoload_plugins else ["-p", "pytest_timeout"]
        addopts.append(f"--timeout={per_test_timeout_s:g}")
    if not autoload_plugins:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTEST_ADDOPTS"] = " ".join(addopts)
    return env


def run_tests(
    sandbox: Sandbox,
    test_command: str,
    *,
    timeout_s: float,
    per_test_timeout_s: float,
    autoload_plugins: bool = False,
) -> TestRun:
    """Run ``test_command`` in ``sandbox`` (from its workspace root) and read the report.

    ``timeout_s`` limits the whole command (the sandbox kills its process tree), ``per_test_timeout_s``
    each test (pytest-timeout). Raises ``SandboxError`` only when the sandbox cannot run it."""
    report = f"{REPORT_DIR}/junit-{uuid.uuid4().hex[:8]}.xml"
    env = pytest_environment(sandbox.command_path(report), per_test_timeout_s, autoload_plugins)
    result = sandbox.run(test_command, timeout_s=timeout_s, env=env)
    path = sandbox.workspace / report
    outcomes: dict[str, str] = {}
    collected = None
    if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_REPORT_BYTES:
        outcomes, collected = parse_junit(path.read_bytes())
    return TestRun(outcomes, result.exit_code, result.timed_out, result.duration_s, collected, result.output)


def parse_junit(data: bytes) -> tuple[dict[str, str], int | None]:
    """(outcome by node id, tests reported) of an xunit1 JUnit report; ({}, None) if unreadable.

    A test whose teardown errors is reported twice (its call, then the error); the worse outcome
    is kept."""
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return {}, None
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
            continue
        results[node] = outcome
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = [suite.get("tests") for suite in suites]
    collected = sum(int(c) for c in counts) if counts and all(c and c.isdigit() for c in counts) else None
    return results, collected


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
