"""``services.backend = "ray"``: inference, episode workers and evaluation as Ray actors.

``RayServices`` is ``async_rl.EmbeddedServices`` with the services moved out of the trainer's
process: the same attributes and methods (``inference.load_weights``, ``evaluation``,
``new_worker``, ``inference_restarts``, ``shutdown``), so ``AsyncRollouts`` drives either backend
with the same code. The trainer stays in this process (the Ray driver). Each actor hosts the
embedded backend's own service object, not a second implementation of it:

- **inference**: one threaded actor holding an ``InferenceHost`` (an ``InferenceService``:
  ``LocalEngine`` behind a ``BatchingEngine``, as the embedded backend's inference process
  holds), so the remote ``generate`` calls of every episode of every worker batch together. A new policy version travels through the weight store, not through Ray: the trainer
  publishes it there, and ``inference.load_weights(state_dict, version)`` only tells the actor to
  move its ``Subscriber`` to ``version`` (applying the deltas it lacks) and switch in flight, as
  the embedded service does. The actor restarts if its process dies (``max_restarts``): it comes
  back at the newest published version and Ray re-issues the ``generate`` calls in flight, which
  carry their seeds, so an episode never sees the failure (``inference_restarts`` counts these
  restarts, as it counts engine restarts on the embedded backend).
- **episode workers**: one threaded actor per worker, each holding an ``EpisodeWorker`` whose
  inference service is a proxy (``RayInference``) making remote calls to the inference actor.
  A finished ``Group`` goes back through the Ray object store; ``start`` returns a
  ``concurrent.futures.Future`` for it. A daemon thread of this process pings the actor every
  ``services.heartbeat_s``; ``last_beat`` moves only when a ping answers within
  ``services.worker_timeout_s``, so a killed or hung actor goes silent and the dispatcher
  (``AsyncRollouts._dispatch``) declares it dead and samples its group again elsewhere. A dead
  actor's group future never completes (as a dead embedded worker's), so the one route to
  "dead" is the silence. The ping also carries the indices whose grading started, which this
  process hands to the reconciler.
- **evaluation**: one actor holding an ``EvaluationService`` that loads each version it is asked
  for from the weight store; ``submit`` and ``poll`` are remote calls.

**What travels.** No weights through Ray. The actors that hold a model (inference, evaluation)
build it from the run's ``initial`` folder (the architecture and tokenizer) and take the version
they serve from the weight store, so their constructor arguments are a few strings and the
recipe (``Config``, a tree of dataclasses): a restarted inference actor needs nothing that
lived in the object store. An episode worker needs only the tokenizer, put in the object
store once; tasks go with the calls, finished groups come back through the object store. On a
multi-node cluster the run folder and ``services.weight_store`` must therefore be readable from
every node (the default store, ``{run}/weights``, is a local folder), and every node needs
opencomposer installed.

**Not here.** Fault injection (``services.faults``): a ``FaultPlan`` is an in-process object
(locks, events) that does not cross into actors, so the fault tests run on the embedded backend;
what this backend adds, actors killed with ``ray.kill`` (a worker, the inference actor), is
tested here. Ray is imported only by this module.

**GPUs.** The inference and evaluation actors ask Ray for ``services.ray_inference_gpus`` and
``services.ray_evaluation_gpus`` GPUs (0 by default: they sample on their node's CPU, whatever
GPUs it has); Ray schedules each on a node with that many free and sets its
``CUDA_VISIBLE_DEVICES``, and the actor's policy goes to ``run.device``
(``services.inference.load_policy``). A request beyond
the cluster's GPUs is refused before any actor starts (``check_gpu_requests``); the
inference actor's ``placement()`` says where it landed (logged at start).

**Lifetime.** ``RayServices(run)`` joins ``services.ray_address`` or, when empty, starts a local
cluster (``services.ray_num_cpus`` CPUs, no dashboard, actor logs kept out of the driver's
output); ``shutdown()``, once the driver's dispatchers have stopped and closed their workers,
kills every actor it made, newest first, waits for the Ray calls that other threads have in flight
(``RayGate``), and stops Ray only if it started it: a normal run ends without a traceback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from opencomposer.config import Config, ConfigError
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.services.inference import RemoteInference, load_policy
from opencomposer.types import Completion, Group, SamplingParams, Task

log = logging.getLogger(__name__)

# CPUs each actor asks Ray for. Episode workers mostly wait (on the sandbox, on inference) and
# evaluation runs now and then, so they take none, and 2+ workers fit beside inference on a
# 2-core machine; the process scheduler shares the cores.
INFERENCE_CPUS = 1
ENV_WORKER_CPUS = 0
EVALUATION_CPUS = 0
STARTUP_TIMEOUT_S = 300.0  # an actor's first answer (a new process importing torch on a busy machine)
CONTROL_CALLS = 4  # inference threads kept for sessions and weights, never held by a generate


def _grader(config: Config) -> Any:
    """A grader of this process, as ``rl.loop.RLRun`` builds it (a ``GradeCache`` holds locks: not picklable)."""
    from opencomposer.grading.grade import GradeCache, grade

    return GradeCache().grade if config.grading.cache else grade


class RayGate:
    """Ray calls made from threads other than the trainer's (dispatchers, heartbeats) happen only
    while Ray is up. Any Ray call after ``ray.shutdown`` would quietly start a new local cluster
    (Ray connects on first use), left running when the process exits; so each such call runs
    inside ``open()``, which refuses once ``close`` is called, and ``drain`` waits for the calls
    in flight (shutdown kills the actors they talk to first, so they end at once)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.closed = False
        self._active = 0

    @contextmanager
    def open(self) -> Iterator[bool]:
        """Yields whether Ray is up; while the block runs, ``drain`` waits for it."""
        with self._cond:
            entered = not self.closed
            if entered:
                self._active += 1
        try:
            yield entered
        finally:
            if entered:
                with self._cond:
                    self._active -= 1
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True

    def drain(self, timeout: float) -> bool:
        """Wait for the calls in flight; False if some still run after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0, timeout)


def actor_lost(error: BaseException | None) -> bool:
    """Whether ``error`` says the called actor died or cannot be reached (not that the call raised;
    Ray's error for a call that raised one of these derives from it too)."""
    return isinstance(error, RayActorError) and not isinstance(error, RayTaskError)


def owner(worker_id: int) -> str:
    """The inference actor's name for the sessions of episode worker ``worker_id``."""
    return f"env-{worker_id}"


# ---------------------------------------------------------------------------------------------
# Inference


@ray.remote(num_cpus=INFERENCE_CPUS, max_restarts=-1, max_task_retries=-1,
            concurrency_groups={"control": CONTROL_CALLS})
class InferenceActor:
    """An ``InferenceHost`` (``services.inference``) in an actor: the generate calls run in the
    default group, everything else in a group of its own, never stuck behind a batch."""

    def __init__(self, folder: str, config: Config, store_url: str, version: int):
        from opencomposer.services.inference import InferenceHost

        if ray.get_runtime_context().was_current_actor_reconstructed:
            version = None  # a restart serves the newest version, as the embedded service's
        # an actor Ray gave no GPU still sees the node's (Ray >= 2.49 leaves CUDA_VISIBLE_DEVICES): the CPU
        self.host = InferenceHost(folder, config, store_url, version, gpu=bool(ray.get_gpu_ids()))

    @ray.method(concurrency_group="control")
    def max_positions(self) -> int:
        """The model's position limit (answered once the engine is built)."""
        return self.host.max_positions()

    @ray.method(concurrency_group="control")
    def restarts(self) -> int:
        """Restarts of this actor's process (Ray's count, the one ``was_current_actor_reconstructed``
        reads), plus engine restarts inside the current process."""
        from ray._private.state import actors

        process_restarts = actors(actor_id=ray.get_runtime_context().get_actor_id())["NumRestarts"]
        return process_restarts + self.host.restarts()

    @ray.method(concurrency_group="control")
    def placement(self) -> dict[str, Any]:
        """Where this actor runs: its node, the GPUs Ray gave it, and the device of its policy (the
        local sampler's; for vLLM the CPU template, vLLM itself taking the GPUs)."""
        return {"node": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "device": str(self.host.device)}

    @ray.method(concurrency_group="control")
    def policy_version(self) -> int:
        return self.host.policy_version()

    @ray.method(concurrency_group="control")
    def load_version(self, version: int) -> None:
        self.host.load_version(version)

    @ray.method(concurrency_group="control")
    def open_session(self, owner: str, session_id: str) -> None:
        self.host.open_session(owner, session_id)

    def generate(self, owner: str, session_id: str, prompts: list[list[int]], params: SamplingParams,
                 n: int) -> list[Completion]:
        return self.host.generate(owner, session_id, prompts, params, n)

    @ray.method(concurrency_group="control")
    def close_session(self, session_id: str) -> None:
        self.host.close_session(session_id)

    @ray.method(concurrency_group="control")
    def close_owner(self, owner: str) -> None:
        self.host.close_owner(owner)


class RayInference(RemoteInference):
    """The inference actor as a process sees it (``RemoteInference`` over Ray calls)."""

    def __init__(self, actor: Any, owner: str, tokenizer: Any):
        self.actor = actor
        super().__init__(self._call, owner, tokenizer)

    def _call(self, method: str, *args: Any) -> Any:
        return _ask(getattr(self.actor, method).remote(*args))


def _ask(call: Any) -> Any:
    """``ray.get`` of a call to the inference actor. Ray re-issues calls to a restarting actor; one
    gone for good raises a RuntimeError, which an episode's policy reports as an infrastructure
    failure (retried)."""
    try:
        return ray.get(call)
    except RayActorError as e:
        if not actor_lost(e):
            raise
        raise RuntimeError(f"the inference actor is gone: {e}") from e


# ---------------------------------------------------------------------------------------------
# Episode workers


@ray.remote(num_cpus=ENV_WORKER_CPUS, concurrency_groups={"heartbeat": 1})
class EpisodeWorkerActor:
    """An ``EpisodeWorker`` in an actor: ``run_group`` rolls out one group at a time, ``ping`` answers
    the heartbeat (in a thread of its own, never behind a group)."""

    def __init__(self, worker_id: int, inference: Any, tokenizer: Any, config: Config):
        from opencomposer.services.episodes import EpisodeWorker

        apply_run_settings(config.run)
        remote = RayInference(inference, owner(worker_id), tokenizer)
        self._grading: list[int] = []  # indices whose grading started since the last ping
        self._lock = threading.Lock()
        self.worker = EpisodeWorker(worker_id, remote, tokenizer, config, grader=_grader(config),
                                on_grading=self._grading_started)

    def _grading_started(self, index: int) -> None:
        with self._lock:
            self._grading.append(index)

    @ray.method(concurrency_group="heartbeat")
    def ping(self) -> list[int]:
        """Alive; the indices whose grading started since the last ping."""
        with self._lock:
            grading, self._grading = self._grading, []
        return grading

    def run_group(self, index: int, task: Task, seeds: list[int], attempt: int) -> Group:
        return self.worker.run_group(index, task, seeds, attempt)


class RemoteEpisodeWorker:
    """This process's handle on one episode worker actor: the ``EpisodeWorker`` interface the
    dispatcher uses (``worker_id``, ``last_beat``, ``start``, ``close``)."""

    def __init__(self, worker_id: int, actor: Any, inference: RayInference, config: Config,
                 on_grading: Callable[[int], None], gate: RayGate):
        self.worker_id, self.actor, self.inference = worker_id, actor, inference
        self.heartbeat_s, self.timeout_s = config.services.heartbeat_s, config.services.worker_timeout_s
        self.on_grading, self.gate = on_grading, gate
        self.running: int | None = None  # the stream index of the group in flight
        self.lost = False  # a group's result is lost with the actor: silent from then on
        try:
            ray.get(actor.ping.remote(), timeout=STARTUP_TIMEOUT_S)  # silence counts from a started actor
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        self.last_beat = time.monotonic()
        self._closed = threading.Event()
        self.beating = threading.Thread(target=self._beat, name=f"ray-env-{worker_id}-heartbeat", daemon=True)
        self.beating.start()

    def _beat(self) -> None:
        """Contract: pings the actor every ``heartbeat_s`` until ``close``; a ping answered within
        ``timeout_s`` moves ``last_beat`` and hands its grading indices to ``on_grading``; one that
        fails or times out leaves ``last_beat`` where it was (the dispatcher judges the silence).
        A worker whose group's result was lost stops beating even if the actor still answers: its
        group can never complete, so only its silence gets the group sampled again."""
        while not self._closed.wait(self.heartbeat_s):
            with self.gate.open() as up:
                if not up:
                    return
                try:
                    grading = ray.get(self.actor.ping.remote(), timeout=self.timeout_s)
                except RayError:  # dead, or too busy to answer: silent either way
                    continue
            if self._closed.is_set() or self.lost:
                return
            self.last_beat = time.monotonic()
            for index in grading:
                self.on_grading(index)

    def start(self, index: int, task: Task, seeds: list[int], attempt: int) -> Future:
        """The group, rolled out by the actor and fetched from the object store; a dead actor's
        future never completes (nor does one started after shutdown), any other failure is raised
        by ``result()``."""
        future: Future = Future()
        self.running = index

        def finished(done: Future) -> None:
            error = done.exception()
            if actor_lost(error):
                self.lost = True  # silence, as from a dead embedded worker (``_beat``)
                return
            self.running = None
            if error is None:
                future.set_result(done.result())
            else:
                future.set_exception(error)

        with self.gate.open() as up:
            if up:
                self.actor.run_group.remote(index, task, seeds, attempt).future().add_done_callback(finished)
        return future

    def close(self) -> None:
        """Kill the actor and close the inference sessions it left open (idempotent; after
        shutdown, which killed every actor, nothing is left to do)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self.gate.open() as up:
            if up:
                ray.kill(self.actor, no_restart=True)
                try:  # awaited: an unread call to an actor killed meanwhile is printed as an unhandled error
                    ray.get(self.inference.actor.close_owner.remote(owner(self.worker_id)), timeout=self.timeout_s)
                except RayError:
                    pass  # the inference actor is gone or restarting: its sessions went with it


# ---------------------------------------------------------------------------------------------
# Evaluation


@ray.remote(num_cpus=EVALUATION_CPUS)
class EvaluationActor:
    """An ``EvaluationService`` in an actor, loading versions from the weight store. One call at a
    time (the service's own thread runs the evaluations), so submits and polls keep their order."""

    def __init__(self, folder: str, config: Config, tasks: list[Task], store_url: str):
        from opencomposer.services.evaluation import EvaluationService
        from opencomposer.services.weights import WeightStore

        apply_run_settings(config.run)
        model, tokenizer = load_policy(folder, config, gpu=bool(ray.get_gpu_ids()))
        self.service = EvaluationService(model, tokenizer, config, tasks, WeightStore(store_url).load,
                                         _grader(config))

    def submit(self, version: int) -> None:
        self.service.submit(version)

    def poll(self, wait: bool) -> list[tuple[int, dict[str, float]]]:
        return self.service.poll(wait=wait)


class EvaluationClient:
    """This process's handle on the evaluation actor (``EvaluationService``'s interface). A failed
    evaluation raises from ``poll`` as a ``RuntimeError`` naming the version, as embedded."""

    def __init__(self, actor: Any):
        self.actor = actor
        self.pending = 0

    def submit(self, version: int) -> None:
        self.pending += 1
        self.actor.submit.remote(version)

    def poll(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]:
        """Finished evaluations, oldest first; ``wait`` blocks until none is pending."""
        if not self.pending:
            return []
        done = ray.get(self.actor.poll.remote(wait))
        self.pending -= len(done)
        return done

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)


# ---------------------------------------------------------------------------------------------


def _init_ray(config: Config) -> bool:
    """Join ``services.ray_address`` or start a local cluster; True when this call started Ray."""
    if ray.is_initialized():
        return False
    # A new local cluster uses token authentication (Ray's default, which it logs once). Setting
    # RAY_AUTH_MODE=token here to silence that would break it: Ray reads the mode at import.
    services = config.services
    local = not services.ray_address
    ray.init(address=services.ray_address or None,
             num_cpus=(services.ray_num_cpus or None) if local else None,
             num_gpus=(services.ray_num_gpus or None) if local else None,
             include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    return True


def check_gpu_requests(config: Config, node_gpus: list[float], evaluation: bool) -> None:
    """Refuse GPU requests Ray could never place (``node_gpus``: each node's GPUs): Ray would keep
    the actor pending, and the run would wait for an engine that never starts. An actor's GPUs are
    on one node; the inference and evaluation actors together need the cluster to hold both."""
    services = config.services
    asked = {"ray_inference_gpus": services.ray_inference_gpus,
             "ray_evaluation_gpus": services.ray_evaluation_gpus if evaluation else 0.0}
    largest, total = max(node_gpus, default=0.0), sum(node_gpus)
    for name, gpus in asked.items():
        if gpus > largest:
            raise ConfigError(f"services.{name} = {gpus:g}, but no node of the Ray cluster has that many GPUs "
                              f"(the most on one: {largest:g}); lower it, or join a cluster with GPUs (services.ray_address)")
    if sum(asked.values()) > total:
        raise ConfigError(f"services.ray_inference_gpus + ray_evaluation_gpus = {sum(asked.values()):g}, but the Ray "
                          f"cluster has {total:g} GPUs: the evaluation actor would never start; share one with "
                          "fractions (0.5 each) or give the cluster more")
    tp = config.inference.tensor_parallel_size
    if config.inference.backend == "vllm" and 0 < services.ray_inference_gpus < tp:
        raise ConfigError(f"services.ray_inference_gpus = {services.ray_inference_gpus:g} is fewer than the "
                          f"{tp} GPUs of inference.tensor_parallel_size")
    trains_on_gpu = resolve_device(config.run.device).type == "cuda"  # the driver's device, the trainer's
    if trains_on_gpu and config.inference.backend == "local" and not services.ray_inference_gpus:
        log.warning("services.ray_inference_gpus = 0: the inference actor asks Ray for no GPU and samples on the "
                    "CPU of its node; set it to 1 to sample on a GPU")


class RayServices:
    """See module doc; ``source`` is the ``AsyncRollouts`` whose services these are."""

    def __init__(self, source: Any):
        if source.faults is not None:
            raise ValueError(
                "fault injection (a FaultPlan) runs on services.backend = \"embedded\" only: the plan "
                "does not cross into Ray actors; to kill a worker under Ray, ray.kill its actor"
            )
        self.source = source
        run = source.run
        config = run.config
        self.started_ray = _init_ray(config)
        self.workers: list[RemoteEpisodeWorker] = []  # every worker made, dead or alive
        self.evaluation: EvaluationClient | None = None
        self.gate = RayGate()
        self._lock = threading.Lock()  # ``workers``, the two fields below, and the gate's closing
        self._actors: list[Any] = []  # every actor made, killed at shutdown
        self._starting: dict[int, Any] = {}  # the first workers' actors, started with the others
        try:
            self.tokenizer = ray.put(run.tokenizer)
            initial = str(run.run_dir / "initial")
            # every episode of every worker may wait in generate at once, and a dead worker's calls
            # may still be draining
            concurrency = 2 * source.workers_count * config.rl.group_size + 8
            services = config.services
            nodes = [node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node.get("Alive")]
            check_gpu_requests(config, nodes, evaluation=bool(run.heldout))
            inference = InferenceActor.options(max_concurrency=concurrency, num_gpus=services.ray_inference_gpus)
            inference = inference.remote(initial, config, source.store.url, run.state.step)
            self._actors.append(inference)
            if run.heldout:
                evaluation = EvaluationActor.options(num_gpus=services.ray_evaluation_gpus).remote(
                    initial, config, run.heldout, source.store.url)
                self._actors.append(evaluation)
                self.evaluation = EvaluationClient(evaluation)
            with self._lock:
                self._starting = {i: self._worker_actor(i, inference) for i in range(source.workers_count)}
            self.inference = RayInference(inference, "trainer", run.tokenizer)
            ray.get(inference.max_positions.remote(), timeout=STARTUP_TIMEOUT_S)  # its engine is built
            log.info("inference actor: %s", ray.get(inference.placement.remote()))
        except BaseException:
            self.shutdown()
            raise

    def new_worker(self, worker_id: int) -> RemoteEpisodeWorker:
        """A new episode worker actor, returned once it answers its first ping."""
        with self.gate.open() as up:
            with self._lock:
                if not up or self.gate.closed:
                    raise RuntimeError(f"episode worker {worker_id}: the Ray services are shut down")
                actor = self._starting.pop(worker_id, None)
                actor = actor or self._worker_actor(worker_id, self.inference.actor)
            worker = RemoteEpisodeWorker(worker_id, actor, self.inference, self.source.run.config,
                                         self.source.reconciler.grading, self.gate)
        with self._lock:
            self.workers.append(worker)
        return worker

    def _worker_actor(self, worker_id: int, inference: Any) -> Any:
        """A new worker actor, recorded for shutdown (the caller holds the lock)."""
        actor = EpisodeWorkerActor.remote(worker_id, inference, self.tokenizer, self.source.run.config)
        self._actors.append(actor)
        return actor

    @property
    def inference_restarts(self) -> int:
        return self.inference.restarts

    def shutdown(self) -> None:
        """Kill every actor, newest first (the episode workers before the inference actor they
        call), and stop Ray if ``__init__`` started it, once no other thread is calling it. The
        driver stops its dispatchers first (``AsyncRollouts.close``), so a normal run ends with no
        call in flight and nothing printed."""
        with self._lock:
            self.gate.close()
            actors = list(self._actors)
        for actor in reversed(actors):
            ray.kill(actor, no_restart=True)
        if not self.gate.drain(timeout=30.0):
            log.warning("Ray calls of the episode dispatchers still running 30 s after shutdown began")
        if self.started_ray:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------
# Independent jobs (``opencomposer ablate --backend ray``)


@ray.remote(max_retries=0)
def _call(fn: Callable[[Any], Any], item: Any, cwd: str) -> Any:
    """``fn(item)`` in a Ray worker, from the driver's working folder where this node has it (a
    recipe's relative paths are relative to it)."""
    import os

    if os.path.isdir(cwd):
        os.chdir(cwd)
    return fn(item)


def map_tasks(config: Config, fn: Callable[[Any], Any], stages: list[list[Any]],
              cpus: float) -> Iterator[tuple[int, int, BaseException | None]]:
    """Run ``fn(item)`` for every item of every stage as a Ray task of ``cpus`` CPUs, a stage's
    tasks once the stage before has ended, on the cluster ``services.ray_address`` names (a local
    one of ``services.ray_num_cpus`` CPUs when empty, stopped at the end if this call started it).
    Yields ``(stage, index, error)`` as each task ends, ``error`` None when it returned (its
    result stays with the worker: ``fn`` leaves what it makes on disk). ``fn`` must be importable
    by the workers (a module-level function of opencomposer); a task is not retried."""
    import os

    started = _init_ray(config)
    try:
        for stage, items in enumerate(stages):
            pending = {_call.options(num_cpus=cpus).remote(fn, item, os.getcwd()): index
                       for index, item in enumerate(items)}
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                index = pending.pop(done[0])
                try:
                    ray.get(done[0])
                    error = None
                except RayTaskError as e:  # the task raised: its own exception, where Ray kept it
                    error = e.cause if isinstance(e.cause, Exception) else e
                except RayError as e:  # the worker died
                    error = e
                yield stage, index, error
    finally:
        if started:
            ray.shutdown()
