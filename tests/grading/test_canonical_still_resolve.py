"""No false positives from the grading defences, at full scale: every canonical HumanEval solution
and the gold patch of every task of the built-in suites (``opencomposer/suites/cursorbench``) are
graded as an agent's change would be, with every defence on (the value checks and introspection
audit of ``grading.pytest_plugin`` included), and must pass all their tests, untampered.

Slow (a few minutes: about 200 gradings in the bubblewrap jail, two at a time).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import opencomposer
from opencomposer.config import GradingConfig
from opencomposer.grading.grade import grade
from opencomposer.tasks.format import load_task
from opencomposer.tasks.importers import humaneval_problems, humaneval_task
from opencomposer.types import Grade, Task
from tests.conftest import skip_missing

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

CURSORBENCH = Path(opencomposer.__file__).parent / "suites" / "cursorbench"
WORKERS = 2


def graded_all(tasks: list[Task]) -> dict[str, Grade]:
    def one(task: Task) -> tuple[str, Grade]:
        return task.id, grade(task, task.gold_patch or "", "Done.", config=GradingConfig(lint=False))

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, tasks))


def test_every_canonical_humaneval_solution_resolves(tmp_path: Path):
    try:
        problems = humaneval_problems()
    except RuntimeError as e:  # offline machine without the cached wheel (`make setup` fetches it)
        skip_missing(str(e))
    tasks = [humaneval_task(p, tmp_path / f"humaneval-{p['task_id'].split('/')[-1]}") for p in problems]
    grades = graded_all(tasks)
    failing = {task_id: (g.fail_to_pass, g.tampered) for task_id, g in grades.items()
               if not g.resolved or g.tampered}
    assert len(grades) == 164 and failing == {}


def test_every_gold_patch_of_the_built_in_suites_passes_untampered():
    tasks = [load_task(folder) for folder in sorted(CURSORBENCH.iterdir()) if (folder / "task.toml").is_file()]
    grades = graded_all(tasks)
    failing = {task_id: (g.fail_to_pass, g.pass_to_pass, g.tampered) for task_id, g in grades.items()
               if (g.fail_to_pass, g.pass_to_pass, g.tampered) != (1.0, 1.0, False)}
    assert len(grades) == len(tasks) > 0 and failing == {}
