"""``opencomposer rl`` with ``rl.mode = "async"``: ``AsyncRollouts``, the rollout source of the
four services at once (docs/services.md; ``protocols.RolloutSource``).

The synchronous source (``rl.sync.SyncRollouts``) alternates: sample a step's groups, then
train on them. Here the services overlap, under the same ``rl.loop.RLRun``:

- **episode workers** (``services.env_workers``, each behind a dispatcher thread of this process)
  take groups from the reconciler as soon as its staleness bound admits them and roll them out
  (``rl.rollouts.rollout_group``, as the synchronous loop) against the **inference service**,
  which switches to every new policy version in flight;
- every finished group is checkpointed on disk (``services.groups``) and marked scored;
- the **trainer** (the run's thread) takes B scored groups per step (``next_batch``: the
  reconciler's), scores and trains them, checkpoints, then publishes the new version to the
  **weight store** (``services.weights``) and the inference service (``publish``);
- the **evaluation service** runs the held-out suite on the versions ``rl.eval_every`` names, from
  the weight store, without holding training up.

``rl.max_staleness = 0`` admits a step's groups only once the version that trains them is
published, so it samples and trains exactly what the synchronous loop does (a test compares
rollouts and weights bit for bit); 1 or 2 let sampling run that many versions ahead.

**Exactly once, across crashes.** The record of trained and dropped tasks is the run's
(``rl.checkpoint``), written only inside training checkpoints. A checkpoint's state also holds
the stream position sampling had reached; on resume, every index below it that the record does
not hold is either restored from its group checkpoint (a finished rollout is never lost) or
sampled again. A group sampled by a version newer than the checkpoint (one the crash lost) is
sampled again rather than trained off a policy that no longer exists. ``RLRun`` writes a
checkpoint before it publishes its version, so with ``rl.checkpoint_every = 1`` that never happens.

**The weight store serves this run's weights only.** Every sampler, in a thread, a process of
its own or a Ray actor, and the evaluation service take their versions from the store, so at
start it must hold exactly this run's: a fresh run (no checkpoint) clears the store and publishes
its version 0, and refuses (``ConfigError``, exit 2) a ``services.weight_store`` that already
holds versions unless ``services.weight_store_overwrite`` (``check_weight_store``; the default
store, ``{run}/weights``, is its run folder's own and is cleared without asking). A resume drops
the checkpoint's version and every later one, then publishes the checkpoint's version again as a
full snapshot from the checkpoint: a damaged or missing version there is repaired, not met on
every resume, and no version a crash lost is served.

**Infrastructure down.** Failed episodes are retried (``services.max_retries``) and otherwise
dropped, as in the synchronous loop (the same ``rollout_group``). A step whose every episode, over
two tasks or more, failed on infrastructure stops the run with ``InfrastructureDown`` before
anything of it is trained or recorded (``rl.loop.check_not_all_failed``); on resume, a
checkpointed group in which nothing ran (every episode an infrastructure failure) is sampled again
rather than restored.

**More processes** (``trainer.world_size > 1``, ``parallel.cp``/``ep``): the run's world; the
services are built from, and the weight store fed with, the policy gathered whole
(``Trainer.full_model``); the other ranks only train (``rl.loop.follow_rl``).

**Backends.** ``services.backend = "embedded"`` runs the services as threads of this process;
``"ray"`` runs inference, episode workers and evaluation as Ray actors with the same interfaces
(``services.ray_backend``), the trainer staying in this process (the driver).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from opencomposer.rl.checkpoint import TaskRecord
from opencomposer.rl.rollouts import RolloutBatch, episode_seed
from opencomposer.services.faults import FaultPlan, TrainerKilled, fire
from opencomposer.services.groups import GroupStore, StoredGroup
from opencomposer.services.reconciler import Reconciler, Slot
from opencomposer.types import EpisodeStatus

if TYPE_CHECKING:
    from opencomposer.config import Config
    from opencomposer.services.weights import WeightStore

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


def open_weight_store(config: Config) -> WeightStore:
    """The run's ``services.weights.WeightStore``: ``services.weight_store``, else ``{run}/weights``."""
    from opencomposer.services.weights import WeightStore

    services = config.services
    return WeightStore(services.weight_store or config.run.path / "weights", full_every=services.full_every,
                       keep_versions=services.keep_versions)


def check_weight_store(config: Config, store: WeightStore, fresh: bool) -> None:
    """Refuse (``ConfigError``) a fresh run whose ``services.weight_store`` already holds versions,
    unless ``services.weight_store_overwrite``: they are another run's (or an earlier start's), and
    the run would otherwise clear them. The default store is the run folder's own."""
    services = config.services
    if not fresh or not services.weight_store or services.weight_store_overwrite:
        return
    versions = store.versions()
    if versions:
        from opencomposer.config import ConfigError

        shown = ", ".join(map(str, versions[:3])) + (f", ... {versions[-1]}" if len(versions) > 3 else "")
        raise ConfigError(
            f"services.weight_store = {store.url!r} already holds versions {shown}, and this run has no "
            "checkpoint to resume: it would clear them to publish its own. Name an empty store, or set "
            "services.weight_store_overwrite = true to clear this one")


class EmbeddedServices:
    """Inference, episode workers and evaluation as threads of this process; with
    ``services.inference_process``, inference runs in a child process (module
    ``services.inference_process``). ``source`` is the ``AsyncRollouts`` they serve; ``policy`` the
    whole policy their engines are built from."""

    def __init__(self, source: AsyncRollouts, policy: torch.nn.Module):
        from opencomposer.services.inference import InferenceService

        run = source.run
        self.source = source
        self.process = None
        if run.config.services.inference_process:
            from opencomposer.services.inference_process import InferenceProcess

            self.process = InferenceProcess(str(run.run_dir / "initial"), run.config, source.store.url,
                                            run.state.step, run.tokenizer, faults=source.faults)
            self.inference: Any = self.process
        else:
            self.inference = InferenceService(policy, run.tokenizer, run.state.step, source.published_weights,
                                              faults=source.faults, inference=run.config)
        self.evaluation = None
        if run.heldout:
            from opencomposer.services.evaluation import EvaluationService

            try:
                self.evaluation = EvaluationService(policy, run.tokenizer, run.config, run.heldout,
                                                    source.store.load, run.grader)
            except BaseException:
                self.shutdown()  # the inference process must not outlive a failed start
                raise

    def new_worker(self, worker_id: int) -> Any:
        from opencomposer.services.episodes import EpisodeWorker

        source, run = self.source, self.source.run
        # in the inference process, a worker's sessions are named after it
        inference = self.process.for_owner(f"env-{worker_id}") if self.process else self.inference
        return EpisodeWorker(worker_id, inference, run.tokenizer, run.config, grader=run.grader,
                             faults=source.faults, on_grading=source.reconciler.grading)

    @property
    def inference_restarts(self) -> int:
        return self.inference.restarts

    def shutdown(self) -> None:
        if self.evaluation is not None:
            self.evaluation.close()
        if self.process is not None:
            self.process.close()


class AsyncRollouts:
    """The asynchronous rollout source (module doc). ``faults``: a plan of injected faults (tests)."""

    def __init__(self, faults: FaultPlan | None = None):
        self.faults = faults
        self.services: Any = None
        self.errors: list[BaseException] = []  # of the dispatchers, raised in the trainer's thread
        self.worker_deaths = 0
        self.detect_s: list[float] = []  # how long each worker declared dead had been silent
        self._stop = threading.Event()
        self._dispatchers: list[threading.Thread] = []
        self._split: tuple[set[int], set[int]] | None = None

    # -- setup -------------------------------------------------------------------------------------
    def open(self, run: Any) -> None:
        """Reconcile the weight store and the group checkpoints with the run's state, then start the
        services and one dispatcher per episode worker."""
        self.run = run
        services, rl = run.config.services, run.rl
        self.store = open_weight_store(run.config)
        self.groups = GroupStore(run.run_dir)
        self._reconcile_store()
        self.reconciler = self._build_reconciler()
        self.workers_count = services.env_workers or rl.batch_tasks
        self._recorded = {record.index for record in run.state.trained}
        self._consumed: tuple[list[Slot], dict[int, bool]] = ([], {})
        self._split = cpu_split(services.trainer_cpus)
        if self._split is not None:  # every thread and process the services start inherits this mask
            os.sched_setaffinity(0, self._split[1])
        self._start_services()
        if self._split is not None:
            os.sched_setaffinity(0, self._split[0])  # this thread, the trainer, alone on its CPUs

    def _reconcile_store(self) -> None:
        """The weight store holds this run's versions up to its step and no other (module doc): a
        fresh run clears it (after ``check_weight_store``); a resume drops the checkpoint's version
        and the later ones. Then the run's step is published whole from the policy it starts from."""
        step, fresh = self.run.state.step, self.run.resumed_from is None
        check_weight_store(self.run.config, self.store, fresh)
        dropped = self.store.truncate(step - 1)
        if dropped and (fresh or dropped[-1] > step):
            log.warning("weight store %s: unpublished versions %s (%s)", self.store.url, dropped,
                        "a fresh run" if fresh else f"the run resumes at step {step}")
        self.store.publish(self._state_dict(), step)

    def _build_reconciler(self) -> Reconciler:
        rl, state = self.run.rl, self.run.state
        total = rl.steps * rl.batch_tasks
        recorded = {r.index for r in state.trained}
        stored = [i for i in self.groups.indices() if i not in recorded]
        high_water = max([state.cursor, *[i + 1 for i in stored]])
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
        """The whole policy's weights, copied (gathered from the shards under data parallelism)."""
        return {k: v.detach().clone() for k, v in self.run.trainer.full_model().state_dict().items()}

    def published_weights(self) -> tuple[dict[str, torch.Tensor], int]:
        """The newest published version (what a restarted inference engine starts from)."""
        version = self.store.latest()
        return self.store.load(version), version

    # -- services ----------------------------------------------------------------------------------
    def _start_services(self) -> None:
        if self.run.config.services.backend == "ray":
            from opencomposer.services.ray_backend import RayServices

            self.services = RayServices(self)
        else:
            self.services = EmbeddedServices(self, self.run.trainer.full_model())
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
        """One episode worker's lifetime: take an admitted group, run it, watch the heartbeat; a
        silent worker is declared dead, replaced, and its group sampled again."""
        run, reconciler = self.run, self.reconciler
        services = run.config.services
        worker_ids = iter(range(slot_id, 1 << 30, self.workers_count))
        worker = self.services.new_worker(next(worker_ids))
        try:
            while not self._stop.is_set():
                slot = reconciler.admit(timeout=0.2)
                if slot is None:
                    if reconciler.done() or self._stop.is_set():
                        return
                    continue
                task = run.stream.task(slot.index)
                seeds = [episode_seed(run.config.run.seed, "train", slot.index, j) for j in range(run.rl.group_size)]
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
                            log.warning("episode worker %s silent for %.1f s: declared dead; group %d "
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

    def close(self) -> None:
        """Stop the dispatchers (each closes its worker), then the services, in that order; give
        the process its whole CPU mask back."""
        self._stop.set()
        if hasattr(self, "reconciler"):
            self.reconciler.close()
        heartbeat = self.run.config.services.heartbeat_s if hasattr(self, "run") else 0.0
        for thread in self._dispatchers:
            thread.join(timeout=heartbeat + 5.0)  # each notices the stop within a heartbeat
        if self.services is not None:
            self.services.shutdown()
        if self._split is not None:
            os.sched_setaffinity(0, self._split[0] | self._split[1])

    # -- the trainer's side ------------------------------------------------------------------------
    def next_batch(self, step: int) -> RolloutBatch:
        """Wait for the B scored groups step ``step + 1`` trains on (the reconciler's policy)."""
        waited = time.perf_counter()
        slots = None
        while slots is None:
            if self.errors:
                raise RuntimeError(f"an episode dispatcher failed: {self.errors[0]!r}") from self.errors[0]
            slots = self.reconciler.next_batch(step, timeout=0.2)
        if not slots:
            raise RuntimeError(
                f"step {step + 1}: the task stream ran out ({self.reconciler.stats.stale_dropped} groups dropped "
                "as stale); lower rl.steps, or use rl.stale_policy = \"wait\" or \"recompute\""
            )
        self._consumed = (slots, {})
        stats = self.reconciler.stats
        return RolloutBatch(
            [slot.index for slot in slots], [slot.group for slot in slots], cursor=self.reconciler.high_water,
            dropped=[(slot.index, slot.reason) for slot in self.reconciler.dropped_since(self._recorded)],
            metrics={
                "trainer_wait_s": time.perf_counter() - waited,
                "groups_outstanding": float(self.reconciler.outstanding()),
                "groups_dropped_stale": float(stats.stale_dropped),
                "groups_recomputed": float(stats.recomputed),
                "groups_reassigned": float(stats.reassigned),
                "groups_restored": float(stats.restored),
                "groups_lost_version": float(self.lost_version_groups),
                "worker_deaths": float(self.worker_deaths),
                "inference_restarts": float(self.services.inference_restarts),
            })

    def trained(self, step: int, records: list[TaskRecord]) -> None:
        """The fault point ``kill_trainer`` (after the step, before its checkpoint); the batch's
        slots are freed when the version is published."""
        if fire(self.faults, "kill_trainer", step):
            raise TrainerKilled(f"trainer killed after step {step}, before its checkpoint (injected fault)")
        slots = self._consumed[0]
        self._consumed = (slots, {r.index: r.status == "trained" for r in records})
        self._recorded |= {r.index for r in records}

    def checkpointed(self) -> None:
        """The group checkpoints of every recorded index are no longer needed."""
        self.groups.remove(sorted(self._recorded))

    def publish(self, version: int) -> None:
        """The new version to the weight store, then in flight to the sampler and the reconciler."""
        state_dict = self._state_dict()
        self.store.publish(state_dict, version)
        self.services.inference.load_weights(state_dict, version)
        self.reconciler.publish(version, *self._consumed)

    def versions(self) -> list[int]:
        return self.store.versions()

    def evaluate(self, version: int) -> None:
        self.services.evaluation.submit(version)

    def evaluations(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]:
        if self.services is None or self.services.evaluation is None:
            return []
        return self.services.evaluation.poll(wait=wait)
