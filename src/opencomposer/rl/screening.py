"""The pass-rate band (``rl.task_pass_rate_band = [LOW, HIGH]``; off by default): RL on the tasks
the policy it starts from solves sometimes but not always.

Advantages are rewards minus the group mean (docs/recipe.md §4), so a group whose G rollouts all
pass or all fail teaches next to nothing (only the small reward terms differ). A weak starting
policy on hard tasks, or a strong one on easy tasks, spends most of a step's sampling on such
groups. With a band, before its first step, the run screens its pool:

- each candidate task, in the stream's order (``run.seed``'s shuffle, or the family's order), gets
  ``rl.task_pass_rate_samples`` episodes of the policy RL starts from (``{run}/initial``, also on
  a resume), on seeds of their own: ``episode_seed(run seed, "screen", pool index, j)``;
- its pass rate is resolved / scored episodes; it is kept when LOW ≤ rate ≤ HIGH. A candidate
  with no scored episode (every one an infrastructure error) has no rate and is not kept;
- screening goes ``rl.batch_tasks`` candidates at a time and stops once it has kept
  ``rl.steps × rl.batch_tasks`` tasks (all the run can train on, each once) or the pool ends.
  The stream is then the kept tasks in that order, so single epoch holds as before, and
  ``harder_later`` draws among them.

``{run}/tasks/pass_rates.json`` records every screened candidate (pool index, id, resolved and
scored episodes, rate, kept) and the screen's seconds, rewritten after each chunk. A restart screens only the candidates it
lacks; the rates do not depend on the band, so a band changed before the first checkpoint selects
anew from them (after one, the resume check refuses a stream that changed). A record made with
another ``rl.task_pass_rate_samples`` is screened again on a fresh run and refused on a resume.
Every screened episode is left out of training: the screen only chooses tasks. Its cost is
``samples`` episodes per screened task, paid once: printed with what was kept, and counted in the
run's ``cost.json`` as sampling (a screen cut short by a crash is not counted again on the restart,
which reuses its record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opencomposer.config import Config, ConfigError
from opencomposer.io import atomic_write_text
from opencomposer.types import Group, InfrastructureDown

RECORD = Path("tasks") / "pass_rates.json"


@dataclass(frozen=True)
class Screened:
    """One candidate's screen: ``resolved`` of its ``scored`` episodes (infrastructure errors are
    not scored)."""

    pool_index: int
    task_id: str
    resolved: int
    scored: int

    @property
    def rate(self) -> float | None:
        return self.resolved / self.scored if self.scored else None

    def in_band(self, band: list[float]) -> bool:
        rate = self.rate
        return rate is not None and band[0] <= rate <= band[1]


def screened_from_group(pool_index: int, group: Group) -> Screened:
    scored = [episode for episode in group.episodes if episode.scored]
    return Screened(pool_index, group.task.id, sum(bool(e.grade and e.grade.resolved) for e in scored), len(scored))


def read_record(run_dir: Path, samples: int, resumed: bool) -> tuple[dict[int, Screened], float]:
    """The candidates screened so far, by pool index, and the seconds the screen took; nothing
    when there is no record, or when it was made with another number of samples on a fresh run
    (screened again). On a resume such a record is refused: the run's tasks were chosen by it."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return {}, 0.0
    try:
        record = json.loads(path.read_text())
        rows = [Screened(r["pool_index"], r["task_id"], r["resolved"], r["scored"]) for r in record["tasks"]]
        recorded_samples, seconds = int(record["samples"]), float(record["seconds"])
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path}: not a pass-rate record ({error}); remove it to screen again") from None
    if recorded_samples != samples:
        if resumed:
            raise ConfigError(f"{path} was screened with rl.task_pass_rate_samples = {recorded_samples}, and this "
                              f"resumed run asks for {samples}: restore it, or start a new run folder")
        return {}, 0.0
    return {row.pool_index: row for row in rows}, seconds


def write_record(run_dir: Path, config: Config, screened: dict[int, Screened], kept: list[int], seconds: float) -> None:
    rl = config.rl
    rows = [{**asdict(row), "rate": row.rate, "kept": index in kept} for index, row in sorted(screened.items())]
    path = Path(run_dir) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({
        "band": list(rl.task_pass_rate_band), "samples": rl.task_pass_rate_samples, "screened": len(rows),
        "kept": len(kept), "needed": rl.steps * rl.batch_tasks, "seconds": round(seconds, 1), "tasks": rows,
    }, indent=1) + "\n")


def kept_indices(screened: dict[int, Screened], band: list[float], needed: int) -> list[int]:
    """The in-band candidates in pool order, at most ``needed``, stopping at the first candidate
    not screened yet (those after it are the screen's to decide)."""
    kept = []
    for index in range(len(screened) + 1):
        if index not in screened or len(kept) >= needed:
            break
        if screened[index].in_band(band):
            kept.append(index)
    return kept


def screen_pool(stream: Any, config: Config, run_dir: Path, policy: Callable[[], Any], tokenizer: Any, *, resumed: bool,
                progress: bool = True, grader: Any = None,
                observe: Callable[[list[Group]], Any] | None = None) -> list[int]:
    """Screen ``stream``'s pool with the model ``policy()`` gives (called only when a candidate is
    left to screen: a restart that has its rates loads nothing), restrict the stream to the kept tasks
    and return their pool indices. ``grader`` as in ``rl.rollouts.run_groups`` (the real one when
    None); ``observe`` is given each chunk's groups (the run counts their cost)."""
    from opencomposer.grading.grade import grade
    from opencomposer.rl.rollouts import episode_seed, make_sampler, run_groups
    from opencomposer.training.progress import ProgressBar

    rl = config.rl
    band, samples, needed = list(rl.task_pass_rate_band), rl.task_pass_rate_samples, rl.steps * rl.batch_tasks
    screened, before = read_record(run_dir, samples, resumed)
    kept = kept_indices(screened, band, needed)
    started, batcher, episodes = time.perf_counter(), None, 0
    next_index = 0  # the candidates are screened in order
    while next_index in screened:
        next_index += 1
    try:
        with ProgressBar("screen", needed, status="{screened} screened, {kept} kept", completed=len(kept),
                         enabled=progress) as bar:
            while len(kept) < needed and next_index < stream.pool_size:
                chunk = [k for k in range(next_index, min(next_index + rl.batch_tasks, stream.pool_size))]
                if batcher is None:
                    batcher = make_sampler(config, policy(), tokenizer, 0)
                seeds = [[episode_seed(config.run.seed, "screen", k, j) for j in range(samples)] for k in chunk]
                groups = run_groups([stream.candidate(k) for k in chunk], batcher, tokenizer, config,
                                    group_size=samples, seeds=seeds, workers=rl.rollout_workers,
                                    grader=grader or grade)
                _check_not_all_failed(groups)
                if observe is not None:
                    observe(groups)
                episodes += len(chunk) * samples
                screened.update((k, screened_from_group(k, g)) for k, g in zip(chunk, groups, strict=True))
                next_index = chunk[-1] + 1
                kept = kept_indices(screened, band, needed)
                write_record(run_dir, config, screened, kept, before + time.perf_counter() - started)
                bar.update(len(kept), screened=len(screened), kept=len(kept))
    finally:
        close = getattr(getattr(batcher, "engine", None), "close", None)
        if close is not None:  # an engine holding a device's memory (vLLM) gives it back now
            close()
    if not (Path(run_dir) / RECORD).is_file() or not episodes:  # the band's selection, also when nothing was screened
        write_record(run_dir, config, screened, kept, before)
    stream.restrict(kept, screened=len(screened))
    if progress:
        rates = [row.rate for row in screened.values() if row.rate is not None]
        print(f"rl.task_pass_rate_band = {band}: kept {len(kept)} of {len(screened)} tasks screened "
              f"({sum(r < band[0] for r in rates)} below, {sum(r > band[1] for r in rates)} above, "
              f"{len(screened) - len(rates)} without a scored episode); {episodes} episodes screened now in "
              f"{time.perf_counter() - started:.0f} s; {Path(run_dir) / RECORD}", flush=True)
    return kept


def _check_not_all_failed(groups: list[Group]) -> None:
    """Stop the screen when a whole chunk failed on infrastructure (``rollouts.infrastructure_down``):
    recording it would leave its tasks out for good."""
    from opencomposer.rl.rollouts import infrastructure_down

    first = infrastructure_down(groups)
    if first is not None:
        raise InfrastructureDown(f"every screening episode of {len(groups)} tasks failed on infrastructure; the "
                                 f"first: {first.error}. Fix the cause and run the same command again")
