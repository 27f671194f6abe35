"""``opencomposer rl`` with ``rl.mode = "async"``: the four services at once (docs/services.md).

The synchronous loop (``rl.loop``) alternates: sample a step's groups, then train on them. Here
the services overlap:

- **environment workers** (``services.env_workers``, each behind a dispatcher thread of this
  process) take groups from the reconciler as soon as its staleness bound admits them and roll
  them out against the **inference service**, which switches to every new policy version in
  flight;
- every finished group is checkpointed on disk (``services.groups``) and marked scored;
- the **trainer** (this thread) takes B scored groups per step (``services.reconciler``), scores
  and trains them exactly as the synchronous loop does, checkpoints, then publishes the new
  version to the **weight store** (``services.weights``) and the inference service;
- the **evaluation service** runs the held-out suite on the versions ``rl.eval_every`` names, from
  the weight store, without holding training up.

``rl.max_staleness = 0`` admits a step's groups only once the version that trains them is
published, so it samples and trains exactly what the synchronous loop does (a test compares
rollouts and weights bit for bit); 1 or 2 let sampling run that many versions ahead.

**Exactly once, across crashes.** The record of trained and dropped tasks is the synchronous
loop's (``rl.checkpoint``), written only inside training checkpoints. A checkpoint's state also
holds the stream position sampling had reached; on resume, every index below it that the record
does not hold is either restored from its group checkpoint (a finished rollout is never lost) or
sampled again. A group sampled by a version newer than the checkpoint (one the crash lost) is
sampled again rather than trained off a policy that no longer exists. A checkpoint is written
before its version is published, so with ``rl.checkpoint_every = 1`` that never happens.

**Infrastructure down.** Failed episodes are retried (``services.max_retries``) and otherwise
dropped, as in the synchronous loop. A step whose every episode, over two tasks or more, failed on
infrastructure stops the run with ``InfrastructureDown`` before anything of it is trained or
recorded (``rl.loop.check_not_all_failed``); on resume, a checkpointed group in which nothing ran
(every episode an infrastructure failure) is sampled again rather than restored.

**More processes** (``trainer.world_size > 1``, ``parallel.cp``/``ep``): rank 0 runs all of the
above with the policy sharded (``DataParallelAsyncRLRun``), the other ranks only train.

**Backends.** ``services.backend = "embedded"`` runs the services as threads of this process;
``"ray"`` runs inference, environment workers and evaluation as Ray actors with the same
interfaces (``services.ray_backend``), the trainer staying in this process (the driver).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config
from opencomposer.distributed.runtime import World
from opencomposer.rl.checkpoint import TaskRecord, latest_checkpoint
from opencomposer.rl.distributed import DataParallelRLRun, follow_rl
from opencomposer.rl.loop import RLRun, RLSummary, check_not_all_failed, step_records
from opencomposer.rl.rollouts import episode_seed
from opencomposer.services.faults import FaultPlan, TrainerKilled, fire
from opencomposer.services.groups import GroupStore, StoredGroup
from opencomposer.services.reconciler import Reconciler, Slot
from opencomposer.training.progress import ProgressBar
from opencomposer.types import EpisodeStatus

log = logging.getLogger(__name__)


def cpu_split(trainer_cpus: list[int]) -> tuple[set[int], set[int]] | None:
    """``services.trainer_cpus``: (the trainer's CPUs, the services' CPUs) out of those this
    process may run on; None when the list is empty."""
    if not trainer_cpus:
        return None
    available = os.sched_getaffinity(0)
    trainer = set(trainer_cpus)
    if not trainer < available:
        from opencomposer.config import ConfigError

        raise ConfigError(f"services.trainer_cpus = {sorted(trainer)}: this process runs on CPUs {sorted(available)}; "
                          "name some of them and leave at least one for the services")
    return trainer, available - trainer


class EmbeddedServices:
    """Inference, environment workers and evaluation as threads of this process; with
    ``services.inference_process``, inference runs in a child process (module ``services.inference_process``)."""

    def __init__(self, run: AsyncRLRun):
        from opencomposer.services.inference import InferenceService

        self.run = run
        self.process = None
        if run.config.services.inference_process:
            from opencomposer.services.inference_process import InferenceProcess

            self.process = InferenceProcess(str(run.run_dir / "initial"), run.config, run.store.url,
                                            run.state.step, run.tokenizer, faults=run.faults)
            self.inference: Any = self.process
        else:
            self.inference = InferenceService(run.model, run.tokenizer, run.state.step, run.published_weights,
                                              faults=run.faults, inference=run.config)
        self.evaluation = None
        if run.heldout:
            from opencomposer.services.evaluation import EvaluationService

            try:
                self.evaluation = EvaluationService(run.model, run.tokenizer, run.config, run.heldout,
                                                    run.store.load, run.grader)
            except BaseException:
                self.shutdown()  # the inference process must not outlive a failed start
                raise

    def new_worker(self, worker_id: int) -> Any:
        from opencomposer.services.environments import EnvWorker

        run = self.run
        # in the inference process, a worker's sessions are named after it
        inference = self.process.for_owner(f"env-{worker_id}") if self.process else self.inference
        return EnvWorker(worker_id, inference, run.tokenizer, run.config, grader=run.grader, faults=run.faults,
                         on_grading=run.reconciler.grading)

    @property
    def inference_restarts(self) -> int:
        return self.inference.restarts

    def shutdown(self) -> None:
        if self.evaluation is not None:
            self.evaluation.close()
        if self.process is not None:
            self.process.close()


class AsyncRLRun(RLRun):
    """One ``opencomposer rl`` run in async mode: set up (fresh or resumed), then ``run()``."""

    def __init__(self, config: Config, progress: bool = True, faults: FaultPlan | None = None):
        self.faults = faults
        super().__init__(config, progress=progress)

    def _setup(self, config: Config) -> None:
        from opencomposer.services.weights import WeightStore

        super()._setup(config)
        services = config.services
        self.store = WeightStore(services.weight_store or self.run_dir / "weights", full_every=services.full_every,
                                 keep_versions=services.keep_versions)
        self.groups = GroupStore(self.run_dir)
        self._reconcile_store()
        self.reconciler = self._build_reconciler()
        self.workers_count = services.env_workers or self.rl.batch_tasks
        self.errors: list[BaseException] = []
        self.worker_deaths = 0
        self.detect_s: list[float] = []
        self._stop = threading.Event()
        self._recorded = {record.index for record in self.state.trained}

    # -- setup -------------------------------------------------------------------------------------
    def _sampler(self) -> None:
        return None  # the inference service (started by run) replaces the synchronous loop's sampler

    def _check_stream_matches_record(self, checkpoint: Path) -> None:
        """As the synchronous loop's, except that sampling may have run ahead of the steps."""
        for record in self.state.trained:
            task_id = self.stream.task(record.index).id if record.index < self.stream.size else None
            if task_id != record.task_id:
                from opencomposer.config import ConfigError

                raise ConfigError(
                    f"cannot resume {checkpoint}: stream position {record.index} held task {record.task_id!r} "
                    f"then and holds {task_id!r} now. The recipe's task stream changed (run.seed, rl.train_tasks "
                    "or rl.task_family); restore it, or start a new run folder"
                )

    def _reconcile_store(self) -> None:
        """The weight store holds exactly the versions up to the run's step (a resume drops the
        versions of the steps the crash lost, and publishes the checkpoint's if it is missing)."""
        step = self.state.step
        latest = self.store.latest()
        if latest is not None and latest > step:
            self.store.truncate(step)
            latest = self.store.latest()
        if latest is None or latest < step:
            self.store.publish(self._state_dict(), step)

    def _build_reconciler(self) -> Reconciler:
        rl, state = self.rl, self.state
        total = rl.steps * rl.batch_tasks
        stored = [i for i in self.groups.indices() if i not in {r.index for r in state.trained}]
        high_water = max([state.cursor, *[i + 1 for i in stored]])
        recorded = {r.index for r in state.trained}
        owed = [i for i in range(high_water) if i not in recorded and i < total]
        reconciler = Reconciler(rl.batch_tasks, rl.max_staleness, rl.stale_policy, total,
                                first_index=min(high_water, total), pending=owed)
        reconciler.version = state.step
        self.lost_version_groups = 0
        for index in stored:
            if index >= total:
                continue
            item = self.groups.load(index)
            versions = [v for e in item.group.episodes for v in e.policy_versions]  # every token's
            if versions and max(versions) > state.step:
                self.lost_version_groups += 1  # sampled by a version the crash lost: sample it again
                continue
            episodes = item.group.episodes
            if episodes and all(e.status == EpisodeStatus.INFRA_ERROR for e in episodes):
                continue  # every episode failed on infrastructure: sample it again, not drop it
            reconciler.restore(index, item.group, item.admitted_version)
        self.groups.remove([i for i in stored if i not in reconciler.slots])
        return reconciler

    def _state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def published_weights(self) -> tuple[dict[str, torch.Tensor], int]:
        """The newest published version (what a restarted inference engine starts from)."""
        version = self.store.latest()
        return self.store.load(version), version

    # -- services ----------------------------------------------------------------------------------
    def _start_services(self) -> None:
        if self.config.services.backend == "ray":
            from opencomposer.services.ray_backend import RayServices

            self.services: Any = RayServices(self)
        else:
            self.services = EmbeddedServices(self)
        self._dispatchers = [threading.Thread(target=self._dispatch_guarded, args=(i,), name=f"dispatch-{i}",
                                              daemon=True) for i in range(self.workers_count)]
        for thread in self._dispatchers:
            thread.start()

    def _dispatch_guarded(self, slot_id: int) -> None:
        try:
            self._dispatch(slot_id)
        except BaseException as e:  # noqa: BLE001 (the trainer thread raises it)
            self.errors.append(e)

    def _dispatch(self, slot_id: int) -> None:
        """One environment worker's lifetime: take an admitted group, run it, watch the heartbeat;
        a silent worker is declared dead, replaced, and its group sampled again."""
        services, reconciler = self.config.services, self.reconciler
        worker_ids = iter(range(slot_id, 1 << 30, self.workers_count))
        worker = self.services.new_worker(next(worker_ids))
        try:
            while not self._stop.is_set():
                slot = reconciler.admit(timeout=0.2)
                if slot is None:
                    if reconciler.done() or self._stop.is_set():
                        return
                    continue
                task = self.stream.task(slot.index)
                seeds = [episode_seed(self.config.run.seed, "train", slot.index, j) for j in range(self.rl.group_size)]
                future = worker.start(slot.index, task, seeds, slot.attempts)
                group = None
                while group is None and not self._stop.is_set():
                    try:
                        group = future.result(timeout=services.heartbeat_s)
                    except TimeoutError:
                        silent = time.monotonic() - worker.last_beat
                        if silent > services.worker_timeout_s:
                            self.worker_deaths += 1
                            self.detect_s.append(silent)
                            log.warning("environment worker %s silent for %.1f s: declared dead; group %d "
                                        "goes to another worker", worker.worker_id, silent, slot.index)
                            worker.close()
                            worker = self.services.new_worker(next(worker_ids))
                            reconciler.requeue(slot.index, f"worker {worker.worker_id} died")
                            break
                if group is None or self._stop.is_set():
                    continue  # a stopped run (or a killed trainer's process) keeps nothing
                self.groups.save(StoredGroup(slot.index, task.id, slot.admitted_version, slot.attempts, group))
                reconciler.scored(slot.index, group)
        finally:
            worker.close()

    def _stop_services(self) -> None:
        self._stop.set()
        self.reconciler.close()
        if getattr(self, "services", None) is not None:
            self.services.shutdown()

    # -- the trainer -------------------------------------------------------------------------------
    def run(self) -> RLSummary:
        started = time.perf_counter()
        split = cpu_split(self.config.services.trainer_cpus)
        try:
            if split is not None:  # every thread and process the services start inherits this mask
                os.sched_setaffinity(0, split[1])
            self._start_services()
            if split is not None:
                os.sched_setaffinity(0, split[0])  # this thread, the trainer, alone on its CPUs
            self._resubmit_missing_evaluations()
            with ProgressBar("rl async", self.rl.steps, status="reward {reward:.3f}  resolved {passed:.2f}",
                             completed=self.state.step, enabled=self.progress) as bar:
                while self.state.step < self.rl.steps:
                    metrics = self.step()
                    bar.update(self.state.step, reward=metrics.get("reward_mean", float("nan")),
                               passed=metrics.get("resolved_rate", float("nan")))
                    if self.state.step % self.rl.checkpoint_every == 0 or self.state.step == self.rl.steps:
                        self.checkpoint()
                    self._publish()
                    if self._eval_due(self.state.step):
                        self.services.evaluation.submit(self.state.step)
                    self._log_evaluations(wait=False)
                self._log_evaluations(wait=True)
        finally:
            self._stop_services()
            self.log.close()
            self._lock.close()
            if split is not None:
                os.sched_setaffinity(0, split[0] | split[1])
        return self._summary(time.perf_counter() - started)

    def _summary(self, seconds: float) -> RLSummary:
        import json

        from opencomposer.io import atomic_write_text

        self.evaluations.sort(key=lambda row: row["step"])
        summary = RLSummary(self.state.step, seconds, self.evaluations, self.run_dir)
        final = latest_checkpoint(self.run_dir)
        atomic_write_text(self.run_dir / "summary.json", json.dumps({
            "steps": summary.steps, "evaluations": summary.evaluations, "mode": "async",
            "final_model": str(final / "model") if final else None,
        }, indent=1) + "\n")
        return summary

    def _resubmit_missing_evaluations(self) -> None:
        """Evaluations due at versions up to the current step that no logged row holds (the first
        one on a fresh run; any a crash cut short on a resume)."""
        if self.services.evaluation is None:
            return
        logged = {row["step"] for row in self.evaluations}
        for version in range(self.state.step + 1):
            if self._eval_due(version) and version not in logged and version in self.store.versions():
                self.services.evaluation.submit(version)

    def _log_evaluations(self, wait: bool) -> None:
        if self.services.evaluation is None:
            return
        for version, metrics in self.services.evaluation.poll(wait=wait):
            self.log.log(version, "eval", metrics)
            self.evaluations.append({"step": version, **metrics})

    def _next_batch(self) -> tuple[list[Slot], float]:
        waited = time.perf_counter()
        while True:
            if self.errors:
                raise RuntimeError(f"an environment dispatcher failed: {self.errors[0]!r}") from self.errors[0]
            slots = self.reconciler.next_batch(self.state.step, timeout=0.2)
            if slots is not None:
                return slots, time.perf_counter() - waited
            self._log_evaluations(wait=False)

    def step(self) -> dict[str, float]:
        """Wait for B scored groups, train on them, record them; the caller checkpoints and publishes."""
        state = self.state
        slots, waited_s = self._next_batch()
        if not slots:
            raise RuntimeError(
                f"step {state.step + 1}: the task stream ran out ({self.reconciler.stats.stale_dropped} groups dropped "
                "as stale); lower rl.steps, or use rl.stale_policy = \"wait\" or \"recompute\""
            )
        started = time.perf_counter()
        version = state.step
        groups = [slot.group for slot in slots]
        indices = [slot.index for slot in slots]
        check_not_all_failed(groups, state.step + 1)  # a resume samples these again (_build_reconciler)
        scored = self.trainer.score(groups)
        loss, train_metrics = self.trainer.train(scored, version=version)
        if fire(self.faults, "kill_trainer", state.step + 1):
            raise TrainerKilled(f"trainer killed after step {state.step + 1}, before its checkpoint (injected fault)")
        state.step += 1
        records = step_records(indices, groups, state.step, skipped=bool(train_metrics["skipped"])) if slots else []
        stale = [TaskRecord(s.index, self.stream.task(s.index).id, state.step, "dropped", s.reason)
                 for s in self.reconciler.dropped_since(self._recorded)]
        state.trained += records + stale
        self._recorded |= {r.index for r in records + stale}
        state.cursor = max(state.cursor, self.reconciler.high_water)
        self._consumed = (slots, {r.index: r.status == "trained" for r in records})  # freed when published
        self._write_rollouts(groups)
        stats = self.reconciler.stats
        metrics = {
            **scored.metrics,
            "loss": loss,
            **train_metrics,
            "policy_version": float(state.step),
            "trainer_wait_s": waited_s,
            "train_s": time.perf_counter() - started,
            "groups_outstanding": float(self.reconciler.outstanding()),
            "groups_dropped_stale": float(stats.stale_dropped),
            "groups_recomputed": float(stats.recomputed),
            "groups_reassigned": float(stats.reassigned),
            "groups_restored": float(stats.restored),
            "groups_lost_version": float(self.lost_version_groups),
            "worker_deaths": float(self.worker_deaths),
            "inference_restarts": float(self.services.inference_restarts),
        }
        self.log.log(state.step, "train", metrics)
        return metrics

    def _publish(self) -> None:
        """The new version to the weight store, then in flight to the sampler and the reconciler."""
        state_dict = self._state_dict()
        self.store.publish(state_dict, self.state.step)
        self.services.inference.load_weights(state_dict, self.state.step)
        self.reconciler.publish(self.state.step, *self._consumed)

    def checkpoint(self) -> Path:
        path = super().checkpoint()
        self.groups.remove(sorted(self._recorded))
        return path


class DataParallelAsyncRLRun(DataParallelRLRun, AsyncRLRun):
    """Rank 0 of a multi-process async run (``trainer.world_size > 1``): the policy is sharded over
    the ranks (``rl.distributed``), so the services are built from, and the weight store fed with,
    the policy gathered whole; the other ranks train in ``rl.distributed.follow_rl``."""

    def _state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.trainer.full_model().state_dict().items()}

    def _start_services(self) -> None:
        self._whole(super()._start_services)


def async_worker(world: World, config: Config) -> RLSummary | None:
    """``distributed.launch``'s function for ``opencomposer rl`` with ``rl.mode = "async"``: rank
    0's summary, None elsewhere."""
    if not world.distributed:
        return run_async(config)
    if world.main:
        return DataParallelAsyncRLRun(config, world).run()
    follow_rl(config, world)
    return None


def run_async(config: Config, progress: bool = True, faults: FaultPlan | None = None,
              on_run: Callable[[AsyncRLRun], None] | None = None) -> RLSummary:
    """Run (or resume) ``config`` in async mode; see the module doc."""
    run = AsyncRLRun(config, progress=progress, faults=faults)
    if on_run is not None:
        on_run(run)
    return run.run()
