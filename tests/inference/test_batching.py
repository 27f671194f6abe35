"""The batching front-end: concurrent sessions get what lone calls would give, in fewer engine calls."""

from __future__ import annotations

import threading
import time

import pytest

from opencomposer.config import ModelConfig
from opencomposer.inference.batching import BatchingEngine
from opencomposer.types import SamplingParams

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
                    top_k=2, moe_intermediate_size=64)


@pytest.fixture(scope="module")
def engine(tiny_tokenizer):
    from opencomposer.inference.local import LocalEngine
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model(SMALL, tiny_tokenizer, seed=1)
    return LocalEngine(model, tokenizer)


def run_threads(batcher, requests):
    """Each request (prompt, params) from its own session and thread, all opened first."""
    sessions = [batcher.session() for _ in requests]
    out: list = [None] * len(requests)

    def work(i):
        with sessions[i]:
            try:
                out[i] = sessions[i].generate([requests[i][0]], requests[i][1])[0]
            except Exception as e:  # noqa: BLE001 - the test inspects what each caller got
                out[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out


def assert_same(batched, lone):
    assert batched.token_ids == lone.token_ids
    assert batched.finish_reason == lone.finish_reason
    assert max(abs(a - b) for a, b in zip(batched.logprobs, lone.logprobs, strict=True)) < 1e-4
    assert (batched.routed_experts == lone.routed_experts).all()
    assert (batched.prompt_index, batched.sample_index) == (0, 0)


def test_concurrent_sessions_sample_what_lone_calls_sample_in_one_engine_call(engine):
    prompts = [[5, 17, 300, 42, 7], [9, 9, 1000], list(range(200, 230)), [77, 78]]
    requests = [(p, SamplingParams(max_new_tokens=6 + 3 * i, temperature=1.0, seed=100 + i, ignore_eos=True))
                for i, p in enumerate(prompts)]
    batcher = BatchingEngine(engine, max_wait_s=60.0)  # only "everyone is waiting" can dispatch
    batched = run_threads(batcher, requests)
    assert batcher.stats.calls == 1 and batcher.stats.rows == 4 and batcher.stats.requests == 4
    for (prompt, params), result in zip(requests, batched, strict=True):
        assert len(result.token_ids) == params.max_new_tokens  # cut back to its own cap
        assert_same(result, engine.generate([prompt], params)[0])


def test_identical_first_prompts_share_one_prefill_and_keep_their_own_seeds(engine):
    prompt = list(range(300, 340))
    requests = [(prompt, SamplingParams(max_new_tokens=8, temperature=1.0, seed=7 + j, ignore_eos=True))
                for j in range(5)]
    batcher = BatchingEngine(engine, max_wait_s=60.0)
    batched = run_threads(batcher, requests)
    assert batcher.stats.calls == 1 and batcher.stats.prompts == 1 and batcher.stats.shared_prompt_rows == 5
    for (prompt, params), result in zip(requests, batched, strict=True):
        assert_same(result, engine.generate([prompt], params)[0])
    assert len({tuple(r.token_ids) for r in batched}) == 5  # five different samples


def test_different_sampling_settings_go_to_separate_calls(engine):
    requests = [([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=1.0, seed=1, ignore_eos=True)),
                ([5, 6, 8], SamplingParams(max_new_tokens=4, temperature=0.0, seed=2, ignore_eos=True))]
    batcher = BatchingEngine(engine, max_wait_s=60.0)
    batched = run_threads(batcher, requests)
    assert batcher.stats.calls == 2
    for (prompt, params), result in zip(requests, batched, strict=True):
        assert_same(result, engine.generate([prompt], params)[0])


def test_a_closed_session_no_longer_holds_the_batch(engine):
    batcher = BatchingEngine(engine, max_wait_s=3600.0)  # only the close can release the batch in time
    idle = batcher.session()  # opened, never asks
    asking = batcher.session()
    result = {}

    def work():
        result["completion"] = asking.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, seed=1))[0]

    thread = threading.Thread(target=work)
    thread.start()
    time.sleep(0.5)
    assert "completion" not in result  # still waiting for the idle session
    idle.close()
    thread.join(timeout=300)  # a guard against hanging; the wait alone would last an hour
    assert not thread.is_alive() and "completion" in result


def test_engine_errors_are_raised_in_every_caller(engine):
    bad = [engine.vocab_size + 5]  # an id outside the vocabulary
    requests = [(bad, SamplingParams(max_new_tokens=3, seed=1)), ([1, 2], SamplingParams(max_new_tokens=3, seed=2))]
    batcher = BatchingEngine(engine, max_wait_s=60.0)
    results = run_threads(batcher, requests)
    assert all(isinstance(r, ValueError) and "outside" in str(r) for r in results)
    # the batcher is usable afterwards
    ok = run_threads(batcher, [([1, 2], SamplingParams(max_new_tokens=3, seed=2))])
    assert ok[0].token_ids == engine.generate([[1, 2]], SamplingParams(max_new_tokens=3, seed=2))[0].token_ids


class SlowEngine:
    """``engine`` whose every call takes ``seconds`` longer: a batch long enough for the sessions
    it left behind to queue up behind it."""

    def __init__(self, engine, seconds: float):
        self.engine, self.seconds = engine, seconds

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.engine.generate(*args, **kwargs)


@pytest.mark.parametrize("from_batch_end", [True, False])
def test_a_request_queued_behind_a_batch_waits_for_the_sessions_that_batch_served(engine, monkeypatch,
                                                                                 from_batch_end: bool):
    """Episode A asks while B is still in a tool call, so A's turn starts alone after ``max_wait_s``;
    B asks while it runs. When it ends, A is in its next tool call (0.1 s). The wait counts from
    the end of that batch, so B waits for A and their turns share the next call: calls of 1 and 2
    rows. Control: counted from B's arrival alone, B's wait is long over, it starts alone, and A's
    next turn queues behind it: the two episodes take turns at the engine (1, 1, 1)."""
    if not from_batch_end:
        monkeypatch.setattr(BatchingEngine, "_waiting_since", lambda self: self._pending[0].arrived)
    batcher = BatchingEngine(SlowEngine(engine, 1.5), max_wait_s=0.5)
    params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=3, ignore_eos=True)
    a, b = batcher.session(), batcher.session()

    def episode_a():
        with a:
            a.generate([[1, 2, 3]], params)
            time.sleep(0.1)  # a tool call
            a.generate([[1, 2, 3, 4, 5]], params)

    def episode_b():
        with b:
            time.sleep(0.8)  # in a tool call while A's first turn starts
            b.generate([[7, 8, 9]], params)

    threads = [threading.Thread(target=episode_a), threading.Thread(target=episode_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert batcher.stats.call_sizes == ([1, 2] if from_batch_end else [1, 1, 1])
