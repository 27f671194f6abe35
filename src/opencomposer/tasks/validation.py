"""Re-check task folders through the real grader: does the gold state still resolve, does the
untouched repository still fail? (``opencomposer tasks validate DIR``)

``check_task`` grades a task twice with ``grading.grade.grade``, in the sandbox:

- **gold**: the gold patch (with ``solution/answer.md`` as the final message for tasks that must
  not edit code) must resolve the task;
- **broken**: no change at all must not resolve it; every FAIL_TO_PASS test must fail and every
  PASS_TO_PASS test must pass.

A task that breaks one of these has *drifted*: its repository, hidden tests or lists no longer
agree (a dependency changed, a test became flaky, a file was edited by hand). Generators call
``check_task`` on every task before keeping it; ``validate_suite`` runs it over a suite with
parallel workers and a progress bar.

Not here: the format checks of ``tasks check`` (``tasks.format.load_suite`` does those first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from opencomposer.config import GradingConfig, SandboxConfig
from opencomposer.types import Grade, Task


@dataclass
class Check:
    """What grading the gold and the untouched state of one task gave."""

    task_id: str
    problems: list[str] = field(default_factory=list)
    gold: Grade | None = None  # None when grading could not be carried out (see ``problems``)
    broken: Grade | None = None
    seconds: float = 0.0

    @property
    def drifted(self) -> bool:
        return bool(self.problems)


def reference_answer(task: Task) -> str | None:
    """``solution/answer.md`` of a task folder: the reference final message of a no-edit task."""
    if task.path is None:
        return None
    answer = task.path / "solution" / "answer.md"
    return answer.read_text(encoding="utf-8") if answer.is_file() else None


def check_task(task: Task, sandbox: SandboxConfig | None = None, grading: GradingConfig | None = None) -> Check:
    """Grade the gold and the untouched state of ``task``; ``problems`` lists every disagreement."""
    from opencomposer.grading.grade import GradingInfraError, grade

    grading = grading or GradingConfig(lint=False)
    started = time.monotonic()
    check = Check(task.id)
    answer = reference_answer(task)
    if not task.gold_patch and answer is None:
        check.problems.append("no solution/gold.patch and no solution/answer.md: nothing to check the task against")
        return check
    try:
        check.gold = grade(task, task.gold_patch or "", answer, sandbox, grading)
        check.broken = grade(task, "", None, sandbox, grading)
    except GradingInfraError as e:
        check.problems.append(f"grading failed: {e}")
        return check
    gold, broken = check.gold, check.broken
    if not gold.resolved:
        check.problems.append(
            f"gold does not resolve: FAIL_TO_PASS {gold.fail_to_pass:.2f}, PASS_TO_PASS "
            f"{gold.pass_to_pass:.2f}, rubric {'ok' if gold.rubric_ok else 'failed'}"
            + (", timed out" if gold.test_timed_out else "")
        )
    if broken.resolved:
        check.problems.append("the untouched repository already resolves the task")
    if task.fail_to_pass and broken.fail_to_pass != 0.0:
        check.problems.append(f"{broken.fail_to_pass:.0%} of FAIL_TO_PASS already pass without any change")
    if broken.pass_to_pass != 1.0:
        check.problems.append(f"only {broken.pass_to_pass:.0%} of PASS_TO_PASS pass without any change")
    if broken.test_timed_out:
        check.problems.append("the untouched repository's tests time out")
    check.seconds = time.monotonic() - started
    return check


def validate_suite(
    tasks: list[Task],
    sandbox: SandboxConfig | None = None,
    grading: GradingConfig | None = None,
    workers: int = 1,
    on_done: Callable[[Check], None] | None = None,
) -> list[Check]:
    """``check_task`` for every task, ``workers`` at a time; results in the order of ``tasks``.
    ``on_done(check)`` runs in this thread as each task's check finishes (the command's progress)."""
    results: dict[str, Check] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(check_task, task, sandbox, grading): task for task in tasks}
        for future in as_completed(futures):
            check = future.result()
            results[check.task_id] = check
            if on_done is not None:
                on_done(check)
    return [results[task.id] for task in tasks]
