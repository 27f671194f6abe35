"""The inference service: one sampler serving every episode of every episode worker.

``InferenceService`` holds the recipe's engine (``[inference] backend``, built by
``inference.factory.make_engine``: a ``LocalEngine`` by default) behind a ``BatchingEngine`` (the
turns that episodes ask for at the same time go through one ``generate`` call) and hands each
episode a session. ``load_weights`` switches the sampler to a new policy version **in flight**:
between two decode steps of whatever is generating (``inference.local``; ``inference.vllm``
between two engine steps), so one episode can span versions and every token records the version
that sampled it.

**Restarts.** When the engine dies (``faults.EngineDied``, or any engine whose process is gone), the
service builds a new one from the newest published version in the weight store and re-issues
the requests that were in flight: a session retries its ``generate`` on the new engine with the
same seeds, so no episode and no group is started twice, and the episode never sees the failure.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import torch

from opencomposer.inference.batching import BatchingEngine, BatchingSession
from opencomposer.inference.factory import make_engine
from opencomposer.model.attention import restore_attention
from opencomposer.model.device import apply_run_settings
from opencomposer.services.faults import EngineDied, FaultPlan, fire
from opencomposer.types import Completion, SamplingParams

log = logging.getLogger(__name__)


class _FaultyEngine:
    """An engine that dies when the fault plan says so (tests only)."""

    def __init__(self, engine: Any, faults: FaultPlan):
        self.engine, self.faults, self.dead = engine, faults, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, *args: Any, **kwargs: Any) -> list[Completion]:
        if self.dead or fire(self.faults, "kill_inference"):
            self.dead = True
            raise EngineDied("the inference engine died (injected fault)")
        return self.engine.generate(*args, **kwargs)


class InferenceService:
    """See module doc. ``model`` is the template the engine is built from (its weights are
    replaced by ``weights()`` on a restart): ``weights()`` returns ``(state_dict, version)`` of the
    newest published version. ``inference``: the recipe (or its ``InferenceConfig``) whose
    ``[inference] backend`` builds the engine; None: the default, ``LocalEngine``."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, version: int,
                 weights: Callable[[], tuple[dict[str, torch.Tensor], int]], *,
                 faults: FaultPlan | None = None, inference: Any = None):
        from opencomposer.config.inference import InferenceConfig

        self.inference = inference if inference is not None else InferenceConfig()
        self.template = model
        self.tokenizer = tokenizer
        self.weights = weights
        self.faults = faults
        self.restarts = 0
        self._lock = threading.Lock()
        self.batcher = self._build(restore_attention(copy.deepcopy(model)).eval(), version)

    def _build(self, model: torch.nn.Module, version: int) -> BatchingEngine:
        engine: Any = make_engine(self.inference, model, self.tokenizer, policy_version=version, for_training=True)
        if self.faults is not None:
            engine = _FaultyEngine(engine, self.faults)
        section = getattr(self.inference, "inference", self.inference)  # a whole recipe or its [inference]
        return BatchingEngine(engine, max_wait_s=section.batch_wait_s)

    @property
    def policy_version(self) -> int:
        return self.batcher.policy_version

    @property
    def max_positions(self) -> int:
        return self.batcher.max_positions

    def session(self) -> ServiceSession:
        return ServiceSession(self)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Switch to ``version`` in flight (between decode steps of running generations)."""
        with self._lock:
            batcher = self.batcher
        batcher.load_weights(state_dict, version)

    def restart(self, dead: BatchingEngine) -> BatchingEngine:
        """A new engine from the newest published weights, unless another caller already made one."""
        with self._lock:
            if self.batcher is dead:
                _release(dead.engine)
                state_dict, version = self.weights()
                model = restore_attention(copy.deepcopy(self.template)).eval()
                model.load_state_dict(state_dict)
                self.batcher = self._build(model, version)
                self.restarts += 1
                log.warning("inference engine died; restarted at policy version %d", version)
            return self.batcher


def _release(engine: Any) -> None:
    """Free what a dead engine holds before the next one starts (``VLLMEngine.close``: vLLM's
    process state and GPU memory); engines without ``close`` hold nothing that outlives them."""
    close = getattr(engine, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception as e:  # noqa: BLE001 - it died already; the restart goes on
        log.warning("the dead inference engine did not close cleanly: %s", e)


class ServiceSession:
    """One episode's session (``BatchingSession``'s interface); survives engine restarts."""

    def __init__(self, service: InferenceService):
        self.service = service
        self._batcher = service.batcher
        self._inner: BatchingSession | None = self._batcher.session()
        self.tokenizer = service.tokenizer
        self.max_positions = service.max_positions

    @property
    def policy_version(self) -> int:
        return self._batcher.policy_version

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Completion]:
        for _ in range(3):
            if self._inner is None:
                self._inner = self._batcher.session()
            try:
                return self._inner.generate(prompts, params, n)
            except EngineDied:
                dead, self._inner = self._batcher, None
                self._batcher = self.service.restart(dead)
        raise EngineDied("the inference engine died three times under one request")

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.service.load_weights(state_dict, version)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

    def __enter__(self) -> ServiceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# The service in another process (a Ray actor, or the embedded backend's child process)


def load_policy(folder: str, config: Any, gpu: bool = True) -> tuple[torch.nn.Module, Any]:
    """In a service's own process: the model and tokenizer saved in ``folder`` (the run's
    ``initial``), converted to the ``[numerics]`` format as ``RLRun`` converts the policy that the
    in-process services copy (the state dict is the same either way). On ``run.device`` when the
    engine is the in-process sampler (``inference.backend = "local"``) and the process may use a
    GPU (``gpu``: False for a Ray actor that Ray gave none), as the trainer's own copy would be;
    on the CPU otherwise (for vLLM it is only the template vLLM loads from)."""
    from opencomposer.config import ModelConfig
    from opencomposer.model.device import resolve_device
    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import convert_model

    local = config.inference.backend == "local" and gpu
    device = resolve_device(config.run.device) if local else torch.device("cpu")
    model, tokenizer = load_model(ModelConfig(kind="hf", path=folder, dtype=config.model.dtype), device=device)
    convert_model(model, config.numerics)
    return model, tokenizer


class InferenceHost:
    """An ``InferenceService`` serving callers in other processes (the Ray inference actor, the
    embedded backend's inference process). It builds the policy from the run's ``initial`` folder
    and takes every version from the weight store at ``store_url`` (no weights travel with the
    calls); ``version`` None starts at the newest published one (a restart). Sessions are named by
    their callers and grouped by owner (an episode worker), so a dead worker's sessions can be
    closed for it; a name it does not know (opened before a restart of this process) opens now."""

    def __init__(self, folder: str, config: Any, store_url: str, version: int | None, gpu: bool = True):
        from opencomposer.services.weights import WeightStore

        apply_run_settings(config.run)  # this process's threads and determinism
        model, tokenizer = load_policy(folder, config, gpu)
        self.device = next(model.parameters()).device
        self.store = WeightStore(store_url)
        self.subscriber = self.store.subscribe()
        version = self.store.latest() if version is None else version
        model.load_state_dict(self.subscriber.update(version))
        self.service = InferenceService(model, tokenizer, version, self._newest, inference=config)
        self._loading = threading.Lock()  # the subscriber
        self._lock = threading.Lock()  # the fields below
        self._sessions: dict[str, ServiceSession] = {}  # session id → its session
        self._owned: dict[str, set[str]] = {}  # owner → its open session ids
        self._closed_owners: set[str] = set()

    def _newest(self) -> tuple[dict[str, torch.Tensor], int]:
        version = self.store.latest()
        return self.store.load(version), version

    def pid(self) -> int:
        return os.getpid()

    def max_positions(self) -> int:
        return self.service.max_positions

    def policy_version(self) -> int:
        return self.service.policy_version

    def restarts(self) -> int:
        """Engine restarts inside this process."""
        return self.service.restarts

    def load_version(self, version: int) -> None:
        """Move to ``version`` from the weight store (the deltas since the subscriber's version),
        switching in flight; a version it already serves is a no-op."""
        with self._loading:
            self.subscriber.load_into(self.service, version)

    def _session(self, owner: str, session_id: str) -> ServiceSession:
        with self._lock:
            if owner in self._closed_owners:
                raise RuntimeError(f"inference session {session_id}: its worker {owner} was declared dead")
            session = self._sessions.get(session_id)
            if session is None:
                session = self._sessions[session_id] = self.service.session()
                self._owned.setdefault(owner, set()).add(session_id)
            return session

    def open_session(self, owner: str, session_id: str) -> None:
        self._session(owner, session_id)

    def generate(self, owner: str, session_id: str, prompts: list[list[int]], params: SamplingParams,
                 n: int) -> list[Completion]:
        completions = self._session(owner, session_id).generate(prompts, params, n)
        if owner in self._closed_owners:  # closed while it generated: it must not hold the batcher
            self.close_session(session_id)
        return completions

    def close_session(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
            for owned in self._owned.values():
                owned.discard(session_id)
        if session is not None:
            session.close()

    def close_owner(self, owner: str) -> None:
        """Close every session of ``owner`` (a worker declared dead cannot close its own), so the
        batcher stops waiting for them, and refuse any it still sends."""
        with self._lock:
            self._closed_owners.add(owner)
            owned = self._owned.pop(owner, set())
        for session_id in owned:
            self.close_session(session_id)


class RemoteInference:
    """An ``InferenceHost`` in another process as this one sees it: an ``InferenceService``
    (``protocols``) whose sessions and weight loads are calls through ``call(method, *args)``
    (a Ray call, a call to the inference process). ``owner`` names the caller's sessions (an
    episode worker's, or the trainer's)."""

    def __init__(self, call: Callable[..., Any], owner: str, tokenizer: Any):
        self.call, self.owner, self.tokenizer = call, owner, tokenizer
        self._max_positions: int | None = None

    @property
    def max_positions(self) -> int:
        if self._max_positions is None:
            self._max_positions = self.call("max_positions")
        return self._max_positions

    @property
    def policy_version(self) -> int:
        return self.call("policy_version")

    def session(self) -> RemoteSession:
        return RemoteSession(self)

    def for_owner(self, owner: str) -> RemoteInference:
        """The same host, with sessions named by ``owner`` (an episode worker)."""
        return RemoteInference(self.call, owner, self.tokenizer)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Switch the host to ``version``, which the trainer has already published: the host reads
        it from the weight store (``state_dict`` does not travel). Returns once the engine has it
        (in flight, under a running batch), so the reconciler admits nothing older after it."""
        self.call("load_version", version)

    @property
    def restarts(self) -> int:
        return self.call("restarts")


class RemoteSession:
    """One episode's session over an ``InferenceHost`` (an ``Engine``, as ``ServiceSession``)."""

    def __init__(self, inference: RemoteInference):
        self.inference = inference
        self.id = uuid.uuid4().hex
        self.tokenizer = inference.tokenizer
        self.max_positions = inference.max_positions
        # opened now, not at the first turn: the batcher waits for every open session's request
        inference.call("open_session", inference.owner, self.id)

    @property
    def policy_version(self) -> int:
        return self.inference.policy_version

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Completion]:
        inference = self.inference
        return inference.call("generate", inference.owner, self.id, prompts, params, n)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.inference.load_weights(state_dict, version)

    def close(self) -> None:
        self.inference.call("close_session", self.id)
