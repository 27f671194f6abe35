"""Where RL's tasks come from: the single-epoch training stream and the held-out suite.

The training stream is a fixed sequence: position ``i`` yields the same task on every run with the
same seed, which is what lets a resumed run continue exactly where its checkpoint stopped (and lets
``rl.checkpoint`` record trained tasks by position). Sources:

- a folder of task folders (``rl.train_tasks``): every task once, in an order shuffled by
  ``run.seed``; the stream ends with the folder;
- a built-in family (``rl.task_family``): task ``i`` of the family's ``train`` split, written to
  ``{run}/tasks/train`` when first needed; the stream ends after one round of the split, each
  distinct prompt once (``tasks.generators.tiny.split_size``).

With ``rl.task_pass_rate_band`` the pool is first screened (``rl.screening``): the stream is then
the candidates the starting policy solves at a rate inside the band, in the same order.

Single epoch (docs/recipe.md §4: a prompt is never trained on twice): both sources are finite and
``check_length`` refuses, at start and before any model is loaded, a recipe whose ``rl.steps × rl.batch_tasks``
exceeds its stream (``opencomposer rl`` exits with status 2 and both counts).

The held-out suite is ``rl.eval_suite``'s first ``rl.eval_tasks`` tasks by id, or the first
``rl.eval_tasks`` tasks of the family's ``heldout`` split (combinations training never shows),
each distinct prompt once; a smaller suite or split is evaluated whole. Generated tiny tasks are
not re-verified here (two grader runs each would double a tiny run's cost): every one instantiates
one of the family's phrasings, and ``tests/rl/test_tiny_family.py`` verifies phrasings through the
real grader (gold resolves, the untouched workspace does not).

**Harder later** (``rl.task_sampling = "harder_later"``; report §4.1: "increasingly harder data
points" later in RL, chosen "using number of turns and thinking tokens of rollouts"). The sources
above are then the *pool*, and stream position ``i`` holds the ``i``-th task *drawn* from it:

- a step before ``rl.harder_from_step`` draws the ``rl.batch_tasks`` remaining tasks first in pool
  order (``drawn_by = "order"``), so until then the stream is the ``in_order`` one;
- from that step on, each step draws them without replacement, one after another, each remaining
  task ``k`` with probability w_k / Σ w over the remaining tasks, where

      w_k = exp(β · z_k),  z_k = (d_k − mean d) / std d  over the remaining tasks,

  β = ``rl.harder_weight`` and d_k the task's estimated difficulty at the start of the step
  (``drawn_by = "harder_later"``). A task with no estimate yet gets z = 0 (the mean), and so does
  every task when the estimates do not differ: the draw is then uniform.

The estimate (``DifficultyEstimator``) is built from the rollouts of the groups trained so far:

      d = (1 − pass rate) + ¼ · turns / (turns + T̄) + ¼ · tokens / (tokens + K̄)

with the pass rate, the mean turns and the mean model-written tokens (thinking included) per
scored episode of the tasks it is estimated from, and T̄, K̄ the means over every group observed.
The pass rate dominates (d in [0, 1.5): a task its group failed outranks any it passed); among
equally passed tasks the longer rollouts rank harder, each heuristic adding ⅛ at the pool's mean.
Single epoch means a drawn task is never drawn again, so what matters for a draw is the estimate
of tasks *not yet seen*: the mean over the observed tasks most alike, at the first level with any
observation: the same task; the same family (and kind and stated difficulty, where the task
folder states them) with the same turn budget ``max_turns`` (a generator's own statement of how
much work a task needs; tiny-long's K notes give K budgets); the same family; the whole pool.

The draws, the estimator's sums and the generator's state are the stream's ``state_dict``, kept in
the checkpoint's ``state.json``: a resumed run replays the steps after its checkpoint with the same
estimates and the same random draws, hence the same tasks. Every record says how its task was
drawn and its estimated difficulty at that moment (``rl.checkpoint.TaskRecord``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from opencomposer.config import Config, ConfigError
from opencomposer.config.rl import RLConfig
from opencomposer.types import Group, Task

DrawnBy = Literal["order", "harder_later"]
HEURISTIC_WEIGHT = 0.25  # of each of turns and tokens in the difficulty (module doc)
POOL = "*"  # the level of likeness every task shares


@dataclass(frozen=True)
class Draw:
    """How stream position ``i`` came to hold pool task ``pool_index``."""

    pool_index: int
    drawn_by: DrawnBy = "order"
    difficulty: float | None = None  # the estimate when drawn; None: no rollout had informed it


class DifficultyEstimator:
    """Running sums of what the groups observed so far showed, per level of likeness (module doc).

    ``levels`` of a task are its keys, most specific first (``TaskStream.levels``); every level of
    an observed task gets the group's numbers, and the estimate of a task is read at its first
    level with any observation."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}  # key -> [groups, failure rate, turns, model tokens] summed

    def observe(self, levels: tuple[str, ...], group: Group) -> None:
        """Add one group's rollouts; a group with no scored episode (infrastructure) says nothing."""
        scored = [episode for episode in group.episodes if episode.scored]
        if not scored:
            return
        failure = sum(not (e.grade is not None and e.grade.resolved) for e in scored) / len(scored)
        turns = sum(len(e.turns) for e in scored) / len(scored)
        tokens = sum(len(t.token_ids) for e in scored for t in e.turns) / len(scored)
        for key in (*levels, POOL):
            total = self.sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate((1.0, failure, turns, tokens)):
                total[i] += value

    def difficulty(self, levels: tuple[str, ...]) -> float | None:
        """d of a task with these levels, or None when nothing alike (nor anything) was observed."""
        return self.difficulties([levels])[0]

    def difficulties(self, tasks: list[tuple[str, ...]]) -> list[float | None]:
        """``difficulty`` of each task (its levels), the pool's means computed once."""
        if POOL not in self.sums:
            return [None] * len(tasks)
        pool_groups, _, pool_turns, pool_tokens = self.sums[POOL]
        mean_turns, mean_tokens = pool_turns / pool_groups, pool_tokens / pool_groups
        by_key: dict[str, float] = {}  # many tasks share the level they are estimated at

        def estimate(key: str) -> float:
            if key not in by_key:
                groups, failure, turns, tokens = self.sums[key]
                by_key[key] = (failure / groups + HEURISTIC_WEIGHT * _relative(turns / groups, mean_turns)
                               + HEURISTIC_WEIGHT * _relative(tokens / groups, mean_tokens))
            return by_key[key]

        def first_observed(levels: tuple[str, ...]) -> str:
            return next((key for key in levels if key in self.sums), POOL)

        return [estimate(first_observed(levels)) for levels in tasks]


def _relative(value: float, mean: float) -> float:
    """value / (value + mean): ½ at the mean, towards 0 below it and 1 above it."""
    return value / (value + mean) if value + mean > 0 else 0.5


def harder_weights(difficulties: list[float | None], beta: float) -> np.ndarray:
    """exp(β z) per task, z standardised over the tasks with an estimate; z = 0 without one, and
    for all when the estimates do not differ (module doc)."""
    known = np.array([d for d in difficulties if d is not None], dtype=np.float64)
    spread = known.std() if known.size else 0.0
    if spread <= 1e-12:
        return np.ones(len(difficulties))
    mean = known.mean()
    z = np.array([0.0 if d is None else (d - mean) / spread for d in difficulties])
    return np.exp(beta * z)


class TaskStream:
    """The ordered training tasks of a run, drawn from its pool (see module doc)."""

    def __init__(self, config: Config, run_dir: Path):
        self.config = config
        self.root = Path(run_dir) / "tasks" / "train"
        self._tasks: list[Task] | None = None
        rl = config.rl
        if rl.task_family:
            from opencomposer.tasks.generators.tiny import split_size

            self.size = split_size("train", rl.task_family)  # one round: every training prompt once
        elif not rl.train_tasks:
            raise ConfigError('rl: no training tasks; set rl.train_tasks = FOLDER or rl.task_family = "tiny"')
        else:
            from opencomposer.tasks.format import load_suite

            tasks = load_suite(rl.train_tasks)
            order = np.random.default_rng([config.run.seed, 0x7A5C]).permutation(len(tasks))
            self._tasks = [tasks[i] for i in order]
            self.size = len(self._tasks)  # every task of the folder once
        self.pool_size = self.size  # the candidates; ``restrict`` may keep fewer (rl.screening)
        self.kept: list[int] | None = None
        self.screened = 0
        self.harder = rl.task_sampling == "harder_later"
        if self.harder:
            self.levels = [self._levels(k) for k in range(self.size)]
            self.estimator = DifficultyEstimator()
            self.draws: list[Draw] = []
            self.rng = np.random.default_rng([config.run.seed, 0x4A8D])

    def restrict(self, kept: list[int], screened: int) -> None:
        """Make the pool the candidates ``kept`` (their indices, in their order) of the ``screened``
        first: ``rl.task_pass_rate_band``'s screen (``rl.screening``). Called before any draw."""
        if self.harder and self.draws:
            raise RuntimeError("TaskStream.restrict after a draw: the screen runs before the first step")
        self.kept, self.screened, self.size = list(kept), screened, len(kept)
        if self.harder:
            self.levels = [self._levels(k) for k in range(self.size)]

    def task(self, index: int) -> Task:
        """The task at stream position ``index`` (under ``harder_later``, once drawn)."""
        if not 0 <= index < self.size:
            raise IndexError(f"the task stream holds {self.size} tasks; position {index} is outside it")
        return self._pool_task(self.drawn(index).pool_index)

    def drawn(self, index: int) -> Draw:
        """How position ``index`` was drawn: in order (``in_order`` always), or as ``draws`` says."""
        if not self.harder:
            return Draw(index)
        if index >= len(self.draws):
            raise IndexError(f"stream position {index} is not drawn yet ({len(self.draws)} are); "
                             "RLRun draws a step's tasks (TaskStream.draw) before sampling them")
        return self.draws[index]

    def _pool_task(self, k: int) -> Task:
        return self.candidate(k if self.kept is None else self.kept[k])

    def candidate(self, k: int) -> Task:
        """Candidate ``k`` of the pool before any screen (``pool_size`` of them)."""
        if self._tasks is not None:
            return self._tasks[k]
        from opencomposer.tasks.format import load_task
        from opencomposer.tasks.generators.tiny import tiny_spec, write_tiny_task

        spec = tiny_spec(self.config.run.seed, "train", k, self.config.rl.task_family)
        folder = self.root / spec.task_id
        if (folder / "task.toml").is_file():
            return load_task(folder)
        partial = self.root / f".{spec.task_id}.partial"
        write_tiny_task(partial, spec, overwrite=True)
        partial.replace(folder)
        return load_task(folder)

    def _levels(self, k: int) -> tuple[str, ...]:
        """Pool task ``k``'s keys of likeness, most specific first (module doc), read without
        writing a generated task: its id; family (kind, stated difficulty) and turn budget; family."""
        k = k if self.kept is None else self.kept[k]
        if self._tasks is not None:
            task = self._tasks[k]
            family = "/".join(str(task.metadata.get(name, "")) for name in ("family", "kind", "difficulty"))
            return f"task:{task.id}", f"{family}/max_turns={task.budgets.max_turns}", f"family:{family}"
        from opencomposer.tasks.generators.long import LongSpec
        from opencomposer.tasks.generators.tiny import BUDGETS, tiny_spec

        spec = tiny_spec(self.config.run.seed, "train", k, self.config.rl.task_family)
        turns = spec.budgets["max_turns"] if isinstance(spec, LongSpec) else BUDGETS["max_turns"]
        return f"task:{spec.task_id}", f"{spec.family}/max_turns={turns}", f"family:{spec.family}"

    def draw(self, step: int) -> list[Draw]:
        """Draw the tasks of ``step`` (1-based; ``rl.batch_tasks`` of them, fewer at the end of the
        pool) unless drawn already (a step replayed after a resume is not: the checkpoint holds the
        draws up to its own step only). A no-op under ``in_order``."""
        rl = self.config.rl
        end = min(step * rl.batch_tasks, self.size)
        if not self.harder or len(self.draws) >= end:
            return []
        taken = {d.pool_index for d in self.draws}
        remaining = [k for k in range(self.size) if k not in taken]  # in pool order
        difficulties = self.estimator.difficulties([self.levels[k] for k in remaining])
        count = end - len(self.draws)
        if step < rl.harder_from_step:
            new = [Draw(remaining[j], "order", difficulties[j]) for j in range(count)]
        else:
            weights = harder_weights(difficulties, rl.harder_weight)
            new = []
            for _ in range(count):
                j = int(self.rng.choice(len(remaining), p=weights / weights.sum()))
                new.append(Draw(remaining[j], "harder_later", difficulties[j]))
                weights[j] = 0.0  # without replacement: single epoch
        self.draws += new
        return new

    def observe(self, index: int, group: Group) -> None:
        """Feed the rollouts of stream position ``index`` to the difficulty estimates."""
        if self.harder:
            self.estimator.observe(self.levels[self.drawn(index).pool_index], group)

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs to draw the same tasks again: the draws, the estimator, the RNG.
        Empty under ``in_order`` (the order is a function of ``run.seed``)."""
        if not self.harder:
            return {}
        return {"draws": [asdict(d) for d in self.draws], "estimator": self.estimator.sums,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any], cursor: int) -> None:
        """Restore ``state_dict()``. A checkpoint without one (written under ``in_order``) drew its
        ``cursor`` positions in order, and nothing was observed."""
        if not self.harder:
            return
        if not state:
            self.draws = [Draw(i) for i in range(cursor)]
            return
        self.draws = [Draw(**d) for d in state["draws"]]
        self.estimator.sums = {key: [float(v) for v in values] for key, values in state["estimator"].items()}
        self.rng.bit_generator.state = state["rng"]

    def check_length(self, needed: int) -> None:
        """Fail at start, not mid-run, when the stream cannot feed every step (single epoch)."""
        if self.size >= needed:
            return
        rl = self.config.rl
        if self.kept is not None:
            raise ConfigError(
                f"rl.task_pass_rate_band = {list(rl.task_pass_rate_band)} kept {self.size} of the {self.screened} "
                f"candidate tasks (all of the pool's {self.pool_size} screened), but rl.steps × rl.batch_tasks = "
                f"{rl.steps} × {rl.batch_tasks} = {needed}; widen the band, lower rl.steps or rl.batch_tasks, or add "
                f"tasks. The rates are kept in tasks/pass_rates.json of the run folder: the same command screens no "
                f"task twice")
        raise too_few_tasks(rl, self.size, needed)


def too_few_tasks(rl: RLConfig, size: int, needed: int) -> ConfigError:
    """The error of a run whose ``rl.steps × rl.batch_tasks`` exceeds the ``size`` tasks it can draw."""
    source = (f"rl.task_family = {rl.task_family!r}: its training split holds {size} distinct prompts"
              if rl.task_family else f"rl.train_tasks: {size} tasks")
    return ConfigError(
        f"{source}, but rl.steps × rl.batch_tasks = {rl.steps} × {rl.batch_tasks} = {needed}; each prompt "
        f"is trained on once (single epoch), so lower rl.steps or rl.batch_tasks to fit {size} "
        f"tasks, or {'use a family with more prompts' if rl.task_family else 'add tasks'}"
    )


def check_family_length(config: Config) -> None:
    """``TaskStream.check_length`` for a recipe whose tasks come from a family, without a run
    folder: what a command that plans many runs (``opencomposer ablate``) checks for each before
    any runs. A folder of tasks, or a pool the pass-rate band screens, is checked at its run's start."""
    rl = config.rl
    if not rl.task_family or rl.task_pass_rate_band:
        return
    from opencomposer.tasks.generators.tiny import split_size

    size, needed = split_size("train", rl.task_family), rl.steps * rl.batch_tasks
    if size < needed:
        raise too_few_tasks(rl, size, needed)


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
