"""Run a repository's tests in the sandbox and get the outcome of every test by node id.

Generators and the miner decide FAIL_TO_PASS and PASS_TO_PASS by running the tests of two states
of a repository (the working one and the broken one) and comparing outcomes. Mutated or mined code
is untrusted (it may loop forever, fork, fill the disk), so it always runs in the real sandbox
(``sandbox.workspace.Sandbox``) with a wall-clock limit and, when pytest-timeout is installed, a limit
per test. pytest is invoked exactly as the grader invokes it (JUnit XML report, xunit1 names, no
cache, no plugin autoloading), so the node ids computed here are the ids grading will look up.

Not here: grading a task folder end to end (``envs.grading.grade``; ``tasks.validation`` uses it).
"""

from __future__ import annotations

import importlib.util
import uuid
from dataclasses import dataclass, field

from opencomposer.config import SandboxConfig
from opencomposer.envs.grading import MAX_REPORT_BYTES, REPORT_DIR, parse_junit
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.generators.source import Tree


@dataclass
class TestRun:
    """Outcome of one test command: node id -> passed | failed | error | skipped."""

    __test__ = False  # not a pytest class, whatever the name says

    outcomes: dict[str, str]
    exit_code: int
    timed_out: bool
    duration_s: float
    output: str = field(repr=False, default="")

    @property
    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}

    def tail(self, chars: int = 1500) -> str:
        return self.output[-chars:]


def pytest_environment(per_test_timeout_s: float, report: str) -> dict[str, str]:
    """Environment that makes pytest write ``report`` (JUnit XML) the way the grader asks for it."""
    addopts = [f"--junitxml={report}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        addopts += ["-p", "pytest_timeout", f"--timeout={per_test_timeout_s:g}"]
    return {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": " ".join(addopts)}


def run_tests(
    tree: Tree,
    test_command: str = "python -m pytest -q",
    sandbox_config: SandboxConfig | None = None,
    *,
    timeout_s: float = 120.0,
    per_test_timeout_s: float = 10.0,
) -> TestRun:
    """Write ``tree`` into a fresh sandbox workspace and run ``test_command`` there.

    Raises ``SandboxError`` only when the sandbox itself fails; whatever the code does (crash,
    hang, import error) comes back as outcomes, an exit code and ``timed_out``."""
    with Sandbox(None, sandbox_config) as sandbox:
        for rel, data in tree.items():
            path = sandbox.workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        report = f"{REPORT_DIR}/junit-{uuid.uuid4().hex[:8]}.xml"
        env = pytest_environment(per_test_timeout_s, sandbox.command_path(report))
        result = sandbox.run(test_command, timeout_s=timeout_s, env=env)
        path = sandbox.workspace / report
        outcomes: dict[str, str] = {}
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_REPORT_BYTES:
            outcomes = parse_junit(path.read_bytes())
    return TestRun(outcomes, result.exit_code, result.timed_out, result.duration_s, result.output)
