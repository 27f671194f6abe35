"""A policy backed by an in-process ``Engine`` (the ``LocalEngine`` sampler, or any other).

Token in, token out: it samples a turn from the exact context ids the loop keeps and returns the
sampled ids with their logprobs, routes (of the sampled tokens, and of the context's prefill) and
the policy version of every token (an engine that
takes new weights in flight can switch inside a turn), so the episode can be trained on as is.
Sampling settings come from the recipe's ``[sampling]``; the token cap of a work turn is the
smaller of ``sampling.max_new_tokens`` and what the episode's budgets leave, that of a summary the
loop's (``agent.summary_max_tokens``; ``agent.policy.turn_token_cap``). Generation is
serialised with a lock, so one engine can serve parallel episodes; given a ``BatchingEngine``
instead, each thread calls it through a session of its own and the turns of parallel episodes
share its calls (``opencomposer eval --workers N`` with a local model: ``local_policy``). The time
a turn waits for the lock or in the batching queue is reported as ``PolicyOutput.wait_s``, which
the agent loop does not charge to the episode's wall-time budget.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opencomposer.agent.policy import PolicyError, turn_token_cap
from opencomposer.config import Config, SamplingConfig
from opencomposer.inference.batching import BatchingEngine
from opencomposer.model.tokenizer import stop_token_ids
from opencomposer.protocols import Engine
from opencomposer.types import Context, PolicyOutput, SamplingParams


class EnginePolicy:
    """Samples turns from ``engine`` (``max_context``: the model's position limit, for budgets)."""

    def __init__(self, engine: Engine, tokenizer: Any, sampling: SamplingConfig | None = None,
                 name: str = "local", max_context: int = 0):
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingConfig()
        self.name = name
        self.max_context = max_context or int(getattr(engine, "max_positions", 0) or 0)
        self._stop_ids = stop_token_ids(tokenizer)
        self._lock = threading.Lock()
        self._thread = threading.local()  # each thread's session of a BatchingEngine

    def act(self, context: Context) -> PolicyOutput:
        if context.token_ids is None:
            raise PolicyError("EnginePolicy needs the context's token ids (the loop keeps them when the policy has a tokenizer)")
        params = SamplingParams(
            max_new_tokens=turn_token_cap(self.sampling.max_new_tokens, context),
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            speculative=self.sampling.speculative,
            stop_token_ids=list(self._stop_ids),
            seed=(context.seed * 1_000_003 + context.turn_index) % (1 << 62),
        )
        asked = time.monotonic()
        try:
            if isinstance(self.engine, BatchingEngine):
                lock_wait = 0.0  # the session's queue wait comes back as the completion's queue_wait_s
                completion = self._session().generate([context.token_ids], params, n=1)[0]
            else:
                with self._lock:
                    lock_wait = time.monotonic() - asked  # behind another episode's call to this engine
                    completion = self.engine.generate([context.token_ids], params, n=1)[0]
        except (RuntimeError, ValueError) as e:
            raise PolicyError(f"the engine failed to generate: {e}") from e
        return PolicyOutput(
            text=self.tokenizer.decode(completion.token_ids, skip_special_tokens=False),
            token_ids=list(completion.token_ids),
            logprobs=list(completion.logprobs),
            routes=completion.routed_experts,
            prompt_routes=completion.prompt_routed_experts,
            finish_reason=completion.finish_reason,
            completion_tokens=len(completion.token_ids),
            prompt_tokens=len(context.token_ids),
            policy_version=completion.policy_version,
            token_versions=None if completion.token_versions is None else list(completion.token_versions),
            wait_s=lock_wait + completion.queue_wait_s,
        )

    def _session(self):
        """This thread's session of the batching engine, opened on its first turn and kept open:
        between its turns (a tool call, grading) the batcher waits at most ``max_wait_s`` for it."""
        session = getattr(self._thread, "session", None)
        if session is None:
            session = self._thread.session = self.engine.session()
        return session


def local_policy(argument: str, config: Config) -> EnginePolicy:
    """``local`` uses the recipe's model; ``local:PATH`` a checkpoint folder. The engine is the
    recipe's ``[inference] backend`` (``inference.factory.make_engine``); ``[run]`` settings
    (threads, determinism) apply to this process."""
    from opencomposer.inference.factory import make_engine
    from opencomposer.model import load_model
    from opencomposer.model.device import apply_run_settings, resolve_device

    apply_run_settings(config.run)
    spec = argument or config.model
    model, tokenizer = load_model(spec, seed=config.run.seed, device=resolve_device(config.run.device))
    engine = make_engine(config, model, tokenizer)
    if config.eval.workers > 1 and config.inference.backend == "local":
        # parallel episodes share decode steps; batch-invariant decoding keeps each one's tokens
        # what it samples alone (inference.invariant), so --workers changes speed, not results
        engine = BatchingEngine(engine, max_wait_s=config.inference.batch_wait_s)
    name = f"local:{argument}" if argument else f"local:{config.model.kind}"
    return EnginePolicy(engine, tokenizer, config.sampling, name=name)
