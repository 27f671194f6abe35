"""Environment workers: each rolls out the G episodes of one group at a time (sandbox, agent
loop, grading) against the inference service, and reports the group or dies trying.

A worker runs every episode of its group in a thread of its own, each with its own session of
the inference service (``services.inference``), so the group's turns batch together and its G
first turns share one prefill. It beats a heartbeat every ``services.heartbeat_s`` while alive;
the driver (``services.async_rl``) declares it dead after ``services.worker_timeout_s`` of
silence, samples the group again on another worker and never uses what the dead one produced.

Inside a live worker, an episode that ends in an infrastructure failure (a grader that crashed,
a sandbox that would not start, an episode past ``services.episode_timeout_s``: a hung sandbox)
is run again with the same seed, up to ``services.max_retries`` times; what still fails stays an
unscored ``INFRA_ERROR`` episode, never a zero reward.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from opencomposer.config import Config
from opencomposer.grading.grade import grade
from opencomposer.episode import run_episode
from opencomposer.rl.rollouts import SessionPolicy
from opencomposer.services.faults import FaultPlan, WorkerDied, fire
from opencomposer.types import Context, Episode, EpisodeStatus, Group, PolicyOutput, Task


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


class _WorkerPolicy:
    """The episode's policy, as long as its worker lives (a dead worker's episodes fail)."""

    def __init__(self, inner: SessionPolicy, worker: EnvWorker, index: int, sample: int, attempt: int):
        self.inner, self.worker = inner, worker
        self.index, self.sample, self.attempt = index, sample, attempt
        self.name, self.tokenizer, self.max_context = inner.name, inner.tokenizer, inner.max_context

    def act(self, context: Context) -> PolicyOutput:
        if fire(self.worker.faults, "kill_worker", self.index, self.sample, self.attempt):
            self.worker.alive = False
        if not self.worker.alive:
            self.inner.session.close()
            raise WorkerDied(f"environment worker {self.worker.worker_id} died")
        return self.inner.act(context)


class EnvWorker:
    """One environment worker of the embedded backend (threads of this process)."""

    def __init__(self, worker_id: int, inference: Any, tokenizer: Any, config: Config, *,
                 grader: Callable[..., Any] = grade, faults: FaultPlan | None = None,
                 on_grading: Callable[[int], None] | None = None):
        self.worker_id = worker_id
        self.inference = inference
        self.tokenizer = tokenizer
        self.config = config
        self.grader = grader
        self.faults = faults
        self.on_grading = on_grading
        self.alive = True
        self.last_beat = time.monotonic()
        self.retries = 0  # episodes run again after an infrastructure failure
        self.timeouts = 0  # episodes abandoned past services.episode_timeout_s
        self._beating = threading.Thread(target=self._beat, name=f"env-{worker_id}-heartbeat", daemon=True)
        self._beating.start()

    def _beat(self) -> None:
        while self.alive:
            self.last_beat = time.monotonic()
            time.sleep(self.config.services.heartbeat_s)

    def close(self) -> None:
        self.alive = False

    def start(self, index: int, task: Task, seeds: list[int], attempt: int) -> Future:
        """The group's episodes, in the background; the future holds the ``Group`` (a dead worker's
        future never completes: the driver notices the silence)."""
        return in_thread(lambda: self.run_group(index, task, seeds, attempt), f"env-{self.worker_id}-group-{index}")

    def run_group(self, index: int, task: Task, seeds: list[int], attempt: int) -> Group:
        # every session opens before the first turn, so the batcher waits for all G first turns
        sessions = [self.inference.session() for _ in seeds]
        episodes = self._episodes(index, task, list(enumerate(seeds)), sessions, attempt)
        retries = 0
        while retries < self.config.services.max_retries and self.alive:
            failed = [j for j, e in enumerate(episodes) if e.status == EpisodeStatus.INFRA_ERROR]
            if not failed:
                break
            retries += 1
            self.retries += len(failed)
            again = self._episodes(index, task, [(j, seeds[j]) for j in failed],
                                   [self.inference.session() for _ in failed], attempt + retries)
            for j, episode in zip(failed, again, strict=True):
                episode.metrics["infra_retries"] = float(retries)
                episodes[j] = episode
        if not self.alive:
            threading.Event().wait()  # a dead process reports nothing; its thread idles until exit
        return Group(task=task, episodes=episodes)

    def _episodes(self, index: int, task: Task, jobs: list[tuple[int, int]], sessions: list[Any],
                  attempt: int) -> list[Episode]:
        config = self.config

        def grader(*args: Any, **kwargs: Any) -> Any:
            if self.on_grading is not None:
                self.on_grading(index)
            sample = kwargs.pop("_sample", -1)
            if fire(self.faults, "crash_grader", index, sample, attempt):
                raise RuntimeError("the grader crashed (injected fault)")
            fire(self.faults, "hang_sandbox", index, sample, attempt)
            return self.grader(*args, **kwargs)

        def one(sample: int, seed: int, session: Any) -> Episode:
            policy = _WorkerPolicy(SessionPolicy(session, self.tokenizer, config, task.budgets.max_turns),
                                   self, index, sample, attempt)
            try:
                return run_episode(task, policy, config, seed=seed, sample_index=sample,
                                   grader=lambda *a, **k: grader(*a, _sample=sample, **k))
            finally:
                session.close()

        futures = [in_thread(lambda s=s, seed=seed, session=session: one(s, seed, session),
                             f"env-{self.worker_id}-episode-{index}-{s}")
                   for (s, seed), session in zip(jobs, sessions, strict=True)]
        limit = config.services.episode_timeout_s or None
        deadline = None if limit is None else time.monotonic() + limit
        episodes = []
        for (sample, _), session, future in zip(jobs, sessions, futures, strict=True):
            try:
                episodes.append(future.result(None if deadline is None else max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                session.close()  # its turns no longer hold the batch back
                self.timeouts += 1
                episodes.append(Episode(task_id=task.id, sample_index=sample, status=EpisodeStatus.INFRA_ERROR,
                                        error=f"the episode ran past services.episode_timeout_s = {limit:g} s "
                                              "(a hung sandbox or grader); abandoned"))
        return episodes
