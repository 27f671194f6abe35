"""A thread-safe batching front-end over one ``Engine``: many episodes, one ``generate`` call.

RL runs the G rollouts of a task (and the B tasks of a step) in parallel threads, one agent loop
each. Each loop asks for one turn at a time; on CPU a decode step costs about the same for one
row as for thirty, so answering each request on its own wastes most of the machine, and the
in-process engine is not thread-safe anyway. ``BatchingEngine`` gathers the waiting requests of
all sessions into one call:

- requests with the same sampling settings (apart from seed and token cap) share a call; the call
  samples up to the largest cap and each completion is cut back to its own cap, which gives the
  tokens it would have got alone (sampling is left to right);
- identical prompts (the first turn of the G rollouts of a task) become one prompt sampled with
  ``n``, so they share one prefill;
- every sample keeps its own random stream: a request seeded ``s`` gets the row seeds a lone call
  ``engine.generate([prompt], params(seed=s), n)`` would use (``LocalEngine``'s ``row_seeds``), so
  what an episode samples does not depend on which other episodes shared its batch.

Contract of the gathering (there is no background thread):

- consumes: requests from ``BatchingSession.generate``, called from any number of threads; each
  caller blocks until its own completions are ready.
- waits for: a batch is dispatched once every open session has a request waiting, or once the
  oldest waiting request has waited ``max_wait_s`` since it arrived or since the previous batch
  ended, whichever is later (a session busy in a tool call or in grading does not hold the
  others for longer). Counting from the end of the previous batch matters: the sessions that
  batch served are in their tool calls when it ends, and a request that queued behind it would
  otherwise start the next batch at once without them, so the episodes would split into two
  cohorts that take turns at the engine, each paying a whole batch of decode steps. One batch
  runs at a time.
- unblocks: the thread that finds the batch ready runs it (outside the lock) and hands every
  request its completions, or the engine's exception, which is then raised in every requesting
  thread (never swallowed); all waiters are woken and the next batch may start. Each completion
  carries ``queue_wait_s``: the caller's time in ``generate`` minus the engine call that sampled
  it, i.e. what it spent waiting for other sessions (the agent loop does not charge that to an
  episode's wall-time budget).
- new weights: ``load_weights`` goes to the engine at once, also while a batch runs
  (``LocalEngine`` switches between decode steps and records each token's version; the
  completions handed back keep ``token_versions``); ``in_flight=False`` waits for the batch.
- shuts down: each session is closed by its owner (context manager or ``close()``); closing is
  also the hint "no request is coming", so the others stop waiting for it. A closed session that
  asks again simply reopens. Nothing needs stopping when the last session closes.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opencomposer.inference.local import row_seed
from opencomposer.protocols import Engine
from opencomposer.types import Completion, SamplingParams


@dataclass
class _Request:
    session: int
    prompt: tuple[int, ...]
    params: SamplingParams
    n: int
    row_seeds: list[int]
    arrived: float
    completions: list[Completion] | None = None
    error: BaseException | None = None
    call: tuple[float, float] | None = None  # (start, end) of the engine call that sampled it

    @property
    def done(self) -> bool:
        return self.completions is not None or self.error is not None


@dataclass
class BatchingStats:
    """What the engine was asked to do: calls, prompts per call (after merging), rows sampled."""

    calls: int = 0
    requests: int = 0
    prompts: int = 0
    rows: int = 0
    shared_prompt_rows: int = 0  # rows sampled with n > 1 from one merged prompt
    call_sizes: list[int] = field(default_factory=list)  # rows per engine call


def _shape_key(params: SamplingParams) -> str:
    """Requests with equal keys can share one call (seed and token cap are handled per row)."""
    return repr(dataclasses.replace(params, seed=None, max_new_tokens=0))


class BatchingEngine:
    """Gathers requests of concurrent sessions into batched calls of ``engine`` (see module doc)."""

    def __init__(self, engine: Engine, max_wait_s: float = 0.1):
        self.engine = engine
        self.max_wait_s = max_wait_s
        self.tokenizer = getattr(engine, "tokenizer", None)
        self.max_positions = getattr(engine, "max_positions", 0)
        self.stats = BatchingStats()
        self._cond = threading.Condition()
        self._open: set[int] = set()
        self._pending: list[_Request] = []
        self._busy = False
        self._free_since = 0.0  # when the last batch ended (monotonic clock)
        self._session_ids = itertools.count()
        self._seed_rng = np.random.default_rng()

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def session(self) -> BatchingSession:
        """A new open session (one per episode)."""
        session = BatchingSession(self, next(self._session_ids))
        with self._cond:
            self._open.add(session.id)
        return session

    def load_weights(self, state_dict: dict[str, Any], version: int, in_flight: bool = True) -> None:
        """Give the engine new weights. ``in_flight``: at once, even while a batch runs (an engine
        such as ``LocalEngine`` stages them and switches between two decode steps, so a running
        batch ends on the new version); False waits for the running batch to finish, for engines
        that cannot take weights while they generate. With no batch running the two are the same."""
        if in_flight:
            self.engine.load_weights(state_dict, version)
            return
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = True
        try:
            self.engine.load_weights(state_dict, version)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    # ------------------------------------------------------------------------------------------
    def _reopen(self, session_id: int) -> None:
        with self._cond:
            self._open.add(session_id)

    def _close(self, session_id: int) -> None:
        with self._cond:
            self._open.discard(session_id)
            self._cond.notify_all()  # a waiter may now find the batch complete

    def _submit(self, session_id: int, prompts: Sequence[Sequence[int]], params: SamplingParams,
                n: int) -> list[Completion]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**62))
        now = time.monotonic()
        requests = [
            _Request(session_id, tuple(map(int, prompt)), params, n,
                     [row_seed(seed, i, j) for j in range(n)], now)
            for i, prompt in enumerate(prompts)
        ]
        with self._cond:
            self._open.add(session_id)
            self._pending += requests
            self._cond.notify_all()
            while not all(r.done for r in requests):
                if not self._busy and self._ready():
                    self._run_batch()
                else:
                    self._cond.wait(timeout=self._time_to_deadline())
        for r in requests:
            if r.error is not None:
                raise r.error
        # everything but its own engine call was waiting: for other sessions, a running batch,
        # or the other engine calls of its batch
        own = sum(end - start for start, end in {r.call for r in requests if r.call is not None})
        waited = max(0.0, time.monotonic() - now - own)
        return [dataclasses.replace(c, queue_wait_s=waited) for r in requests for c in r.completions]

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if self._open <= {r.session for r in self._pending}:
            return True
        return time.monotonic() - self._waiting_since() >= self.max_wait_s

    def _waiting_since(self) -> float:
        """Where the wait of the oldest pending request counts from: its arrival, or the end of the
        previous batch if that was later (module doc, "waits for")."""
        return max(self._pending[0].arrived, self._free_since)

    def _time_to_deadline(self) -> float | None:
        if not self._pending or self._busy:
            return None
        return max(1e-3, self.max_wait_s - (time.monotonic() - self._waiting_since()))

    def _run_batch(self) -> None:
        """Called with the lock held; runs every pending request with the lock released."""
        batch, self._pending = self._pending, []
        self._busy = True
        self._cond.release()
        try:
            results = self._generate(batch)
        except BaseException as e:  # delivered to every caller below, re-raised in each thread
            results = None
            error = e
        finally:
            self._cond.acquire()
        for i, request in enumerate(batch):
            if results is None:
                request.error = error
            else:
                request.completions = results[i]
        self._busy = False
        self._free_since = time.monotonic()
        self._cond.notify_all()

    def _generate(self, batch: list[_Request]) -> list[list[Completion]]:
        """One engine call per (sampling settings, rows per prompt); identical prompts merged."""
        out: list[list[Completion] | None] = [None] * len(batch)
        by_shape: dict[str, list[int]] = {}
        for i, request in enumerate(batch):
            by_shape.setdefault(_shape_key(request.params), []).append(i)
        for indices in by_shape.values():
            by_prompt: dict[tuple[int, ...], list[int]] = {}
            for i in indices:
                by_prompt.setdefault(batch[i].prompt, []).append(i)
            by_rows: dict[int, list[tuple[int, ...]]] = {}
            for prompt, members in by_prompt.items():
                by_rows.setdefault(sum(batch[i].n for i in members), []).append(prompt)
            for rows_per_prompt, prompts in by_rows.items():
                members = [by_prompt[p] for p in prompts]
                cap = max(batch[i].params.max_new_tokens for group in members for i in group)
                params = dataclasses.replace(batch[members[0][0]].params, max_new_tokens=cap, seed=0)
                seeds = [s for group in members for i in group for s in batch[i].row_seeds]
                started = time.monotonic()
                completions = self.engine.generate(
                    [list(p) for p in prompts], params, n=rows_per_prompt, row_seeds=seeds
                )
                call = (started, time.monotonic())
                for i in (i for group in members for i in group):
                    batch[i].call = call
                self.stats.calls += 1
                self.stats.call_sizes.append(len(completions))
                self.stats.prompts += len(prompts)
                self.stats.rows += len(completions)
                if rows_per_prompt > 1:
                    self.stats.shared_prompt_rows += len(completions)
                position = 0
                for group in members:
                    for i in group:
                        request = batch[i]
                        mine = completions[position : position + request.n]
                        position += request.n
                        out[i] = [self._as_lone(c, j, request.params.max_new_tokens) for j, c in enumerate(mine)]
        self.stats.requests += len(batch)
        return out  # type: ignore[return-value]

    def _as_lone(self, completion: Completion, sample_index: int, cap: int) -> Completion:
        """The completion as a lone call would return it: indices 0/j, cut back to its own cap."""
        completion = dataclasses.replace(completion, prompt_index=0, sample_index=sample_index)
        if len(completion.token_ids) <= cap:
            return completion
        ids = completion.token_ids[:cap]
        routes = completion.routed_experts
        versions = completion.token_versions
        return dataclasses.replace(
            completion,
            token_ids=ids,
            logprobs=completion.logprobs[:cap],
            token_versions=None if versions is None else versions[:cap],
            routed_experts=None if routes is None else routes[:cap],
            finish_reason="length",
            text=self.tokenizer.decode(ids, skip_special_tokens=False) if self.tokenizer is not None else "",
        )


class BatchingSession:
    """One caller's view of a ``BatchingEngine``; it is an ``Engine`` (``generate``,
    ``load_weights``, ``policy_version``), so any policy that takes an engine can use it."""

    def __init__(self, batcher: BatchingEngine, session_id: int):
        self.batcher = batcher
        self.id = session_id
        self.tokenizer = batcher.tokenizer
        self.max_positions = batcher.max_positions

    @property
    def policy_version(self) -> int:
        return self.batcher.policy_version

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Completion]:
        return self.batcher._submit(self.id, prompts, params, n)

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.batcher.load_weights(state_dict, version)

    def close(self) -> None:
        """No request is coming from this session (for now): the others stop waiting for it."""
        self.batcher._close(self.id)

    def __enter__(self) -> BatchingSession:
        self.batcher._reopen(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
