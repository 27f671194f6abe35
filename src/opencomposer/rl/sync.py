"""The synchronous rollout source (``SyncRollouts``): the step's groups sampled now, by this
process, with the weights of the step before; the asynchronous one is ``services.async_rl``."""

from __future__ import annotations

import time
from typing import Any

from opencomposer.rl.evaluate import evaluate
from opencomposer.rl.rollouts import RolloutBatch, episode_seed, make_sampler, run_groups


class SyncRollouts:
    """The synchronous rollout source (``protocols.RolloutSource``): each step samples the next B
    tasks of the stream, G episodes each, on a sampler of this process holding the weights of the
    step before, and training waits for them; the new weights go into the sampler right after the
    step. The policy that samples is always the one being trained (staleness 0, no importance
    correction needed), and evaluations run at once on the same sampler."""

    def open(self, run: Any) -> None:
        self.run = run
        self.batcher = make_sampler(run.config, run.trainer.full_model(), run.tokenizer, run.state.step)
        self._done: list[tuple[int, dict[str, float]]] = []

    def next_batch(self, step: int) -> RolloutBatch:
        run, rl = self.run, self.run.rl
        started = time.perf_counter()
        indices = list(range(run.state.cursor, run.state.cursor + rl.batch_tasks))
        seeds = [[episode_seed(run.config.run.seed, "train", i, j) for j in range(rl.group_size)] for i in indices]
        calls, rows = self.batcher.stats.calls, self.batcher.stats.rows
        hits = run.grades.hits if run.grades else 0
        groups = run_groups([run.stream.task(i) for i in indices], self.batcher, run.tokenizer, run.config,
                            group_size=rl.group_size, seeds=seeds, workers=rl.rollout_workers, grader=run.grader)
        return RolloutBatch(indices, groups, cursor=indices[-1] + 1, metrics={
            "rollout_s": time.perf_counter() - started,
            "engine_calls": float(self.batcher.stats.calls - calls),
            "engine_rows": float(self.batcher.stats.rows - rows),
            "grades_reused": float((run.grades.hits if run.grades else 0) - hits),
        })

    def trained(self, step: int, records: list[Any]) -> None:
        """Nothing to free: the step's groups were sampled for it alone."""

    def checkpointed(self) -> None:
        """Nothing kept on disk between steps."""

    def publish(self, version: int) -> None:
        self.run.trainer.publish(self.batcher, version)

    def versions(self) -> list[int]:
        """Only the version the sampler holds can be evaluated."""
        return [self.batcher.policy_version]

    def evaluate(self, version: int) -> None:
        run = self.run
        metrics = evaluate(run.heldout, self.batcher, run.tokenizer, run.config, grader=run.grader,
                           record=run.run_dir / "eval" / f"step-{version:06d}.jsonl")
        self._done.append((version, metrics))

    def evaluations(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Nothing runs between calls."""
