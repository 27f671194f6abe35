"""Episode workers: each rolls out the G episodes of one group at a time (sandbox, agent loop,
grading) against the inference service, and reports the group or dies trying.

A worker rolls its group out with ``rl.rollouts.rollout_group``, the same group rollout as the
synchronous loop (every episode in a thread of its own, each with its own session of the inference
service, so the group's turns batch together and its G first turns share one prefill; an
infrastructure failure retried up to ``services.max_retries`` times, an episode past
``services.episode_timeout_s`` abandoned). What a worker adds is its lifetime: it beats a heartbeat
every ``services.heartbeat_s`` while alive; the driver (``services.async_rl``) declares it dead
after ``services.worker_timeout_s`` of silence, samples the group again on another worker and
never uses what the dead one produced. It also hosts the fault points of ``services.faults``
(``kill_worker``, ``crash_grader``, ``hang_sandbox``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from opencomposer.config import Config
from opencomposer.grading.grade import grade
from opencomposer.rl.rollouts import EpisodeHooks, SessionPolicy, in_thread, rollout_group
from opencomposer.services.faults import FaultPlan, WorkerDied, fire
from opencomposer.types import Context, Group, PolicyOutput, Task


class _WorkerPolicy:
    """The episode's policy, as long as its worker lives (a dead worker's episodes fail)."""

    def __init__(self, inner: SessionPolicy, worker: EpisodeWorker, index: int, sample: int, attempt: int):
        self.inner, self.worker = inner, worker
        self.index, self.sample, self.attempt = index, sample, attempt
        self.name, self.tokenizer, self.max_context = inner.name, inner.tokenizer, inner.max_context

    def act(self, context: Context) -> PolicyOutput:
        if fire(self.worker.faults, "kill_worker", self.index, self.sample, self.attempt):
            self.worker.alive = False
        if not self.worker.alive:
            self.inner.session.close()
            raise WorkerDied(f"episode worker {self.worker.worker_id} died")
        return self.inner.act(context)


class EpisodeWorker:
    """One episode worker of the embedded backend (threads of this process)."""

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
        self._beating = threading.Thread(target=self._beat, name=f"episodes-{worker_id}-heartbeat", daemon=True)
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
        return in_thread(lambda: self.run_group(index, task, seeds, attempt), f"episodes-{self.worker_id}-group-{index}")

    def run_group(self, index: int, task: Task, seeds: list[int], attempt: int) -> Group:
        hooks = EpisodeHooks(
            policy=lambda policy, sample, attempt: _WorkerPolicy(policy, self, index, sample, attempt),
            grader=lambda grader, sample, attempt: self._grader(grader, index, sample, attempt),
            alive=lambda: self.alive,
        )
        # every session opens before the first turn, so the batcher waits for all G first turns
        sessions = [self.inference.session() for _ in seeds]
        group = rollout_group(task, seeds, self.inference, self.tokenizer, self.config, grader=self.grader,
                              sessions=sessions, attempt=attempt, hooks=hooks)
        if not self.alive:
            threading.Event().wait()  # a dead process reports nothing; its thread idles until exit
        return group

    def _grader(self, grader: Callable[..., Any], index: int, sample: int, attempt: int) -> Callable[..., Any]:
        """``grader`` with this worker's grading report and fault points around it."""

        def graded(*args: Any, **kwargs: Any) -> Any:
            if self.on_grading is not None:
                self.on_grading(index)
            if fire(self.faults, "crash_grader", index, sample, attempt):
                raise RuntimeError("the grader crashed (injected fault)")
            fire(self.faults, "hang_sandbox", index, sample, attempt)
            return grader(*args, **kwargs)

        return graded
