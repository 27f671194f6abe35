"""The inference service: one sampler serving every episode of every environment worker.

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
import threading
from collections.abc import Callable
from typing import Any

import torch

from opencomposer.inference.batching import BatchingEngine, BatchingSession
from opencomposer.inference.factory import make_engine
from opencomposer.model.attention import restore_attention
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
        return BatchingEngine(engine)

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
                state_dict, version = self.weights()
                model = restore_attention(copy.deepcopy(self.template)).eval()
                model.load_state_dict(state_dict)
                self.batcher = self._build(model, version)
                self.restarts += 1
                log.warning("inference engine died; restarted at policy version %d", version)
            return self.batcher


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
