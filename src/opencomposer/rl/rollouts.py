"""Rollouts: G episodes of a task in the real harness, their model calls batched; the one group
rollout both rollout sources use (the synchronous one, ``rl.sync.SyncRollouts``, and the
asynchronous services).

``rollout_group`` runs every episode of a group (``episode.run_episode``: sandbox, agent loop,
grading) in a thread of its own, each over its own session of a sampler (a ``BatchingEngine``, or
the async inference service), so the turns that episodes ask for at the same time go through one
``generate`` call, and the first turns of a group (one identical prompt) share one prefill. Every
episode has its own seed, so what it samples does not depend on which other episodes ran beside it.

**Infrastructure failures, one policy for every run.** An episode that ends in an infrastructure
failure (a grader that crashed, a sandbox that would not start, an episode past
``services.episode_timeout_s``: a hung sandbox) is run again with the same seed, up to
``services.max_retries`` times; what still fails stays an unscored ``INFRA_ERROR`` episode, never
a zero reward. The synchronous loop and the asynchronous episode workers (``services.episodes``)
both roll out through here, so a flaky sandbox is handled alike in both modes.

``rollout_group`` contract:
- consumes: a task, one seed per sample, a sampler with ``session()`` (or the group's sessions,
  already open, so the batcher waits for all G first turns);
- waits for: every episode to end or time out (``run_episode`` returns harness failures as
  ``INFRA_ERROR`` episodes, so only a bug raises, and it is raised here);
- unblocks: each episode's session is closed when its loop stops asking (after the turn that ends
  it, when the episode returns, or when it is abandoned), so the others never wait for it;
- shuts down: an abandoned episode's thread is a daemon: a hung sandbox never blocks the exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.protocol import parse_turn
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.grading.grade import grade
from opencomposer.inference.batching import BatchingEngine, BatchingSession
from opencomposer.types import Context, Episode, EpisodeStatus, Grade, Group, PolicyOutput, Task


def episode_seed(*key: int | str) -> int:
    """A 62-bit seed from a key such as (run seed, "train", stream index, sample index)."""
    words = [int.from_bytes(str(k).encode(), "little") % (1 << 63) if isinstance(k, str) else int(k) for k in key]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))


def in_thread(fn: Callable[[], Any], name: str) -> Future:
    """Run ``fn`` in a daemon thread (one that hangs for good never blocks the process's exit)."""
    future: Future = Future()

    def target() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 (handed to whoever waits on the future)
            future.set_exception(e)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


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


def _same_policy(policy: SessionPolicy, sample: int, attempt: int) -> Any:
    return policy


def _same_grader(grader: Callable[..., Grade], sample: int, attempt: int) -> Callable[..., Grade]:
    return grader


def _always() -> bool:
    return True


@dataclass
class EpisodeHooks:
    """What a caller wraps around each attempt of an episode (the async episode workers' fault
    points and liveness); the defaults change nothing. ``sample`` and ``attempt`` (1 for the first
    try of the group, +1 per retry) name the attempt."""

    policy: Callable[[SessionPolicy, int, int], Any] = field(default=_same_policy)
    grader: Callable[[Callable[..., Grade], int, int], Callable[..., Grade]] = field(default=_same_grader)
    alive: Callable[[], bool] = field(default=_always)  # False: retry nothing more


def rollout_group(
    task: Task,
    seeds: list[int],
    sampler: Any,
    tokenizer: Any,
    config: Config,
    *,
    grader: Callable[..., Grade] = grade,
    sessions: list[Any] | None = None,
    out_dir: Path | None = None,
    attempt: int = 1,
    hooks: EpisodeHooks | None = None,
    slots: threading.Semaphore | None = None,
) -> Group:
    """The ``len(seeds)`` episodes of ``task`` (sample j with ``seeds[j]``), retried as the module
    doc says. ``sessions``: one open session of ``sampler`` per sample (else each episode opens its
    own when it starts); ``out_dir``: each sample's files under ``out_dir/sample-j``; ``slots``:
    held by each running episode (a cap on the episodes that run at once)."""
    hooks = hooks or EpisodeHooks()
    play = _Attempts(task, sampler, tokenizer, config, grader, out_dir, hooks, slots)
    episodes = play(list(enumerate(seeds)), sessions, attempt)
    retries = 0
    while retries < config.services.max_retries and hooks.alive():
        failed = [j for j, e in enumerate(episodes) if e.status == EpisodeStatus.INFRA_ERROR]
        if not failed:
            break
        retries += 1
        again = play([(j, seeds[j]) for j in failed], None, attempt + retries)
        for j, episode in zip(failed, again, strict=True):
            episode.metrics["infra_retries"] = float(retries)
            episodes[j] = episode
    return Group(task=task, episodes=episodes)


@dataclass
class _Attempts:
    """One try of some episodes of a group, each in a thread of its own, abandoned past
    ``services.episode_timeout_s`` (``rollout_group``)."""

    task: Task
    sampler: Any
    tokenizer: Any
    config: Config
    grader: Callable[..., Grade]
    out_dir: Path | None
    hooks: EpisodeHooks
    slots: threading.Semaphore | None

    def __call__(self, jobs: list[tuple[int, int]], sessions: list[Any] | None, attempt: int) -> list[Episode]:
        opened: list[Any] = list(sessions) if sessions is not None else [None] * len(jobs)
        futures = [in_thread(lambda k=k, sample=sample, seed=seed: self._one(k, sample, seed, opened, attempt),
                             f"rollout-{self.task.id}-{sample}")
                   for k, (sample, seed) in enumerate(jobs)]
        limit = self.config.services.episode_timeout_s or None
        deadline = None if limit is None else time.monotonic() + limit
        episodes = []
        for k, ((sample, _), future) in enumerate(zip(jobs, futures, strict=True)):
            try:
                episodes.append(future.result(None if deadline is None else max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                if opened[k] is not None:
                    opened[k].close()  # its turns no longer hold the batch back
                episodes.append(Episode(task_id=self.task.id, sample_index=sample, status=EpisodeStatus.INFRA_ERROR,
                                        error=f"the episode ran past services.episode_timeout_s = {limit:g} s "
                                              "(a hung sandbox or grader); abandoned"))
        return episodes

    def _one(self, k: int, sample: int, seed: int, opened: list[Any], attempt: int) -> Episode:
        with self.slots or nullcontext():
            if opened[k] is None:
                opened[k] = self.sampler.session()
            session = opened[k]
            try:
                policy = SessionPolicy(session, self.tokenizer, self.config, self.task.budgets.max_turns)
                return run_episode(self.task, self.hooks.policy(policy, sample, attempt), self.config, seed=seed,
                                   sample_index=sample,
                                   out_dir=None if self.out_dir is None else self.out_dir / f"sample-{sample}",
                                   grader=self.hooks.grader(self.grader, sample, attempt))
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
    """``rollout_group`` of every task at once (``seeds[t][j]`` for sample j of task t) on one
    batcher nobody else uses meanwhile; ``workers`` caps the episodes that run at once (0: all)."""
    at_once = not workers or workers >= len(tasks) * group_size
    # With every episode running at once, open all sessions first: the batcher then waits for all
    # G first turns of a task and samples them from one prefill.
    sessions = [[batcher.session() for _ in range(group_size)] if at_once else None for _ in tasks]
    slots = None if at_once else threading.Semaphore(workers)
    futures = [in_thread(lambda t=t: rollout_group(
        tasks[t], seeds[t], batcher, tokenizer, config, grader=grader, sessions=sessions[t], slots=slots,
        out_dir=None if out_dir is None else out_dir / tasks[t].id), f"rollout-group-{t}")
        for t in range(len(tasks))]
    return [future.result() for future in futures]


def infrastructure_down(groups: list[Group]) -> Episode | None:
    """The first episode when every episode of ``groups``, two groups or more, failed on
    infrastructure: the engine or the sandbox is down, not the policy wrong. None otherwise (one
    group alone may be its own task's broken environment)."""
    episodes = [e for g in groups for e in g.episodes]
    if len(groups) < 2 or not episodes or any(e.status != EpisodeStatus.INFRA_ERROR for e in episodes):
        return None
    return episodes[0]


@dataclass
class RolloutBatch:
    """What a rollout source hands the trainer for one step (``protocols.RolloutSource``)."""

    indices: list[int]  # the stream index of each group
    groups: list[Group]
    cursor: int  # the stream position sampling has reached (the run state's ``cursor`` after the step)
    dropped: list[tuple[int, str]] = field(default_factory=list)  # (index, reason): dropped before training
    metrics: dict[str, float] = field(default_factory=dict)  # logged with the step's train row


def make_sampler(config: Config, model: Any, tokenizer: Any, version: int) -> BatchingEngine:
    """The batching sampler every episode of a synchronous step shares, at policy ``version``.

    The engine is ``[inference] backend``'s (``inference.factory.make_engine``). With ``local``
    it samples a copy of the policy, so with ``[numerics]`` it samples in the trainer's format (a
    converted policy is not decoded batch-invariantly: ``inference.local.LocalEngine``)."""
    from opencomposer.inference.factory import make_engine

    return BatchingEngine(make_engine(config, model, tokenizer, policy_version=version, for_training=True,
                                      copy_model=True), max_wait_s=config.inference.batch_wait_s)
