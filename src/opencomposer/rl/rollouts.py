"""Rollouts for a step: G episodes of each of B tasks in the real harness, their model calls batched.

Each episode is ``episode.run_episode`` (sandbox, agent loop, grading) in a thread of its
own, with an ``EnginePolicy`` over a ``BatchingSession``, so the turns that episodes ask for at
the same time go through one ``generate`` call, and the first turns of a task's G rollouts (one
identical prompt) share one prefill. Every episode has its own seed, so what it samples does not
depend on which other episodes ran beside it.

``run_groups`` contract:
- consumes: tasks, one seed per (task, sample), a ``BatchingEngine`` nobody else uses meanwhile;
- waits for: every episode to end (``run_episode`` returns harness failures as ``INFRA_ERROR``
  episodes, so only a bug raises);
- unblocks: each episode's session is closed when its loop stops asking (after the turn that ends
  it, or when the episode returns), so the others never wait for it;
- shuts down: the thread pool is joined before returning; an exception raised in any episode
  thread is re-raised here after the others finished, never swallowed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.protocol import parse_turn
from opencomposer.config import Config
from opencomposer.grading.grade import grade
from opencomposer.episode import run_episode
from opencomposer.inference.batching import BatchingEngine, BatchingSession
from opencomposer.types import Context, Episode, Grade, Group, PolicyOutput, Task


def episode_seed(*key: int | str) -> int:
    """A 62-bit seed from a key such as (run seed, "train", stream index, sample index)."""
    words = [int.from_bytes(str(k).encode(), "little") % (1 << 63) if isinstance(k, str) else int(k) for k in key]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))


class SessionPolicy:
    """``EnginePolicy`` over one batching session; after the turn that ends the episode (a
    readable ``finish`` call, or the last turn the budget allows) it closes the session so the
    other episodes stop waiting for it."""

    def __init__(self, session: BatchingSession, tokenizer: Any, config: Config, max_turns: int | None):
        self.session = session
        self.inner = EnginePolicy(session, tokenizer, config.sampling, name="local")
        self.name = self.inner.name
        self.tokenizer = tokenizer
        self.max_context = self.inner.max_context
        self.max_turns = max_turns

    def act(self, context: Context) -> PolicyOutput:
        try:
            output = self.inner.act(context)
        except BaseException:
            self.session.close()
            raise
        if self._ends_episode(output, context):
            self.session.close()
        return output

    def _ends_episode(self, output: PolicyOutput, context: Context) -> bool:
        if self.max_turns is not None and context.turn_index + 1 >= self.max_turns:
            return True
        parsed = parse_turn(output.text, context.turn_index)
        return parsed.error is None and any(call.name == "finish" for call in parsed.calls)


def _run_one(task: Task, session: BatchingSession | None, batcher: BatchingEngine, tokenizer: Any,
             config: Config, seed: int, sample_index: int, out_dir: Path | None, grader: Callable) -> Episode:
    session = session or batcher.session()
    try:
        policy = SessionPolicy(session, tokenizer, config, task.budgets.max_turns)
        return run_episode(task, policy, config, seed=seed, sample_index=sample_index, out_dir=out_dir,
                           grader=grader)
    finally:
        session.close()


def run_groups(
    tasks: list[Task],
    batcher: BatchingEngine,
    tokenizer: Any,
    config: Config,
    *,
    group_size: int,
    seeds: list[list[int]],
    out_dir: Path | None = None,
    workers: int = 0,
    grader: Callable[..., Grade] = grade,
) -> list[Group]:
    """``group_size`` episodes of every task (``seeds[t][j]`` for sample j of task t), in parallel;
    ``grader`` as in ``run_episode``."""
    jobs = [(t, j) for t in range(len(tasks)) for j in range(group_size)]
    workers = workers or len(jobs)
    # With every job running at once, open all sessions first: the batcher then waits for all G
    # first turns of a task and samples them from one prefill.
    sessions = {job: batcher.session() for job in jobs} if workers >= len(jobs) else {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout") as pool:
        futures = {
            (t, j): pool.submit(
                _run_one, tasks[t], sessions.get((t, j)), batcher, tokenizer, config, seeds[t][j], j,
                None if out_dir is None else out_dir / tasks[t].id / f"sample-{j}", grader,
            )
            for t, j in jobs
        }
        episodes = {job: future.result() for job, future in futures.items()}
    return [Group(task=task, episodes=[episodes[(t, j)] for j in range(group_size)]) for t, task in enumerate(tasks)]
