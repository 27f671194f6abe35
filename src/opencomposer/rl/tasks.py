"""Where RL's tasks come from: the single-epoch training stream and the held-out suite.

The training stream is a fixed sequence: position ``i`` yields the same task on every run with the
same seed, which is what lets a resumed run continue exactly where its checkpoint stopped (and lets
``rl.checkpoint`` record trained tasks by position). Sources:

- a folder of task folders (``rl.train_tasks``): every task once, in an order shuffled by
  ``run.seed``; the stream ends with the folder;
- a built-in family (``rl.task_family``): task ``i`` of the family's ``train`` split, written to
  ``{run}/tasks/train`` when first needed; the stream ends after one round of the split, each
  distinct prompt once (``tasks.generators.tiny.split_size``).

Single epoch (docs/recipe.md §4: a prompt is never trained on twice): both sources are finite and
``check_length`` refuses, at start and before any model is loaded, a recipe whose ``rl.steps × rl.batch_tasks``
exceeds its stream (``opencomposer rl`` exits with status 2 and both counts).

The held-out suite is ``rl.eval_suite``'s first ``rl.eval_tasks`` tasks by id, or the first
``rl.eval_tasks`` tasks of the family's ``heldout`` split (combinations training never shows),
each distinct prompt once; a smaller suite or split is evaluated whole. Generated tiny tasks are
not re-verified here (two grader runs each would double a tiny run's cost): every one instantiates
one of the family's phrasings, and ``tests/rl/test_tiny_family.py`` verifies phrasings through the
real grader (gold resolves, the untouched workspace does not).
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
            from opencomposer.tasks.generators.tiny import split_size

            self.size = split_size("train", rl.task_family)  # one round: every training prompt once
            return
        if not rl.train_tasks:
            raise ConfigError('rl: no training tasks; set rl.train_tasks = FOLDER or rl.task_family = "tiny"')
        from opencomposer.tasks.format import load_suite

        tasks = load_suite(rl.train_tasks)
        order = np.random.default_rng([config.run.seed, 0x7A5C]).permutation(len(tasks))
        self._tasks = [tasks[i] for i in order]
        self.size = len(self._tasks)  # every task of the folder once

    def task(self, index: int) -> Task:
        if not 0 <= index < self.size:
            raise IndexError(f"the task stream holds {self.size} tasks; position {index} is outside it")
        if self._tasks is not None:
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
        if self.size >= needed:
            return
        rl = self.config.rl
        source = (f"rl.task_family = {rl.task_family!r}: its training split holds {self.size} distinct prompts"
                  if rl.task_family else f"rl.train_tasks: {self.size} tasks")
        raise ConfigError(
            f"{source}, but rl.steps × rl.batch_tasks = {rl.steps} × {rl.batch_tasks} = {needed}; each prompt "
            f"is trained on once (single epoch), so lower rl.steps or rl.batch_tasks to fit {self.size} "
            f"tasks, or {'use a family with more prompts' if rl.task_family else 'add tasks'}"
        )


def heldout_tasks(config: Config, run_dir: Path) -> list[Task]:
    """The held-out suite, or an empty list when the run has none."""
    rl = config.rl
    if rl.task_family:
        from opencomposer.tasks.generators.tiny import split_size, write_tiny_suite

        count = min(rl.eval_tasks, split_size("heldout", rl.task_family))  # each distinct prompt once
        return write_tiny_suite(Path(run_dir) / "tasks" / "heldout", count, seed=config.run.seed,
                                split="heldout", verify=False, family_name=rl.task_family)
    if not rl.eval_suite:
        return []
    from opencomposer.tasks.format import load_suite

    return load_suite(rl.eval_suite)[: rl.eval_tasks]
