"""Where RL's tasks come from: the single-epoch training stream and the held-out suite.

The training stream is a fixed sequence: position ``i`` yields the same task on every run with the
same seed, which is what lets a resumed run continue exactly where its checkpoint stopped (and lets
``rl.checkpoint`` record trained tasks by position). Sources:

- a folder of task folders (``rl.train_tasks``): every task once, in an order shuffled by
  ``run.seed``; the stream ends with the folder;
- a built-in family (``rl.task_family``): task ``i`` of the family's ``train`` split, written to
  ``{run}/tasks/train`` when first needed; unbounded.

The held-out suite is ``rl.eval_suite``'s first ``rl.eval_tasks`` tasks by id, or the family's
``heldout`` split (combinations training never shows). Generated tiny tasks are not re-verified
here (two grader runs each would double a tiny run's cost): every one instantiates the family's
few phrasings, and ``tests/rl/test_tiny_family.py`` verifies each phrasing through the real grader
(gold resolves, the untouched workspace does not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from opencomposer.config import Config, ConfigError
from opencomposer.types import Task


class TaskStream:
    """The ordered training tasks of a run (see module doc)."""

    def __init__(self, config: Config, run_dir: Path):
        self.config = config
        self.root = Path(run_dir) / "tasks" / "train"
        self._tasks: list[Task] | None = None
        rl = config.rl
        if rl.task_family:
            return
        if not rl.train_tasks:
            raise ConfigError('rl: no training tasks; set rl.train_tasks = FOLDER or rl.task_family = "tiny"')
        from opencomposer.tasks.format import load_suite

        tasks = load_suite(rl.train_tasks)
        order = np.random.default_rng([config.run.seed, 0x7A5C]).permutation(len(tasks))
        self._tasks = [tasks[i] for i in order]

    @property
    def size(self) -> int | None:
        """Tasks in the stream; None when unbounded."""
        return None if self._tasks is None else len(self._tasks)

    def task(self, index: int) -> Task:
        if self._tasks is not None:
            if index >= len(self._tasks):
                raise IndexError(f"the task stream holds {len(self._tasks)} tasks; position {index} is past its end")
            return self._tasks[index]
        from opencomposer.tasks.format import load_task
        from opencomposer.tasks.generators.tiny import tiny_spec, write_tiny_task

        spec = tiny_spec(self.config.run.seed, "train", index, self.config.rl.task_family)
        folder = self.root / spec.task_id
        if (folder / "task.toml").is_file():
            return load_task(folder)
        partial = self.root / f".{spec.task_id}.partial"
        write_tiny_task(partial, spec, overwrite=True)
        partial.replace(folder)
        return load_task(folder)

    def check_length(self, needed: int) -> None:
        """Fail at start, not mid-run, when the stream cannot feed every step (single epoch)."""
        if self.size is not None and self.size < needed:
            rl = self.config.rl
            raise ConfigError(
                f"rl.train_tasks: {self.size} tasks, but rl.steps × rl.batch_tasks = {rl.steps} × {rl.batch_tasks} "
                f"= {needed}; each task is trained on once, so add tasks or lower rl.steps"
            )


def heldout_tasks(config: Config, run_dir: Path) -> list[Task]:
    """The held-out suite, or an empty list when the run has none."""
    rl = config.rl
    if rl.task_family:
        from opencomposer.tasks.generators.tiny import write_tiny_suite

        return write_tiny_suite(Path(run_dir) / "tasks" / "heldout", rl.eval_tasks, seed=config.run.seed,
                                split="heldout", verify=False, family_name=rl.task_family)
    if not rl.eval_suite:
        return []
    from opencomposer.tasks.format import load_suite

    return load_suite(rl.eval_suite)[: rl.eval_tasks]
