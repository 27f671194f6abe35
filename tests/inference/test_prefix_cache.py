"""Prefix cache of ``LocalEngine`` (``prefix_cache_tokens > 0``): a prompt that extends an earlier
prompt and completion prefills only its new tokens.

Checked end to end against an engine without the cache (a fresh prefill of the whole prompt):
greedy tokens identical, log-probabilities within 1e-4 (reuse changes float rounding only, see
``inference.local``), MoE routes of every prompt position equal; the number of positions reused;
the token bound and LRU eviction; invalidation by new weights, in flight or not; ``n`` samples
sharing one prefill; and that with the cache off, or where it finds nothing to reuse, the engine
is bit for bit what it was. Models: a random tiny MoE (Qwen3-MoE, the batch-invariant decoder's
MoE path) and a random two-layer Llama (its dense path, where a finished row's last token is
never fed back, so it is not stored)."""

from __future__ import annotations

import copy
import dataclasses
import threading

import numpy as np
import pytest
import torch

from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.inference.batching import BatchingEngine
from opencomposer.inference.invariant import InvariantDecoder
from opencomposer.inference.local import MIN_PREFIX_TOKENS, PrefixCache

GREEDY = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)  # reuse needs a few tokens, not many
TOLERANCE = 1e-4  # log-probabilities: float32 rounding of reused keys against a fresh prefill


@pytest.fixture(scope="module")
def random_moe(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model("tiny_moe", tiny_tokenizer, seed=0)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def random_dense(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048))
    return model.eval(), tiny_tokenizer


@pytest.fixture(params=["random_moe", "random_dense"])
def model(request):
    return request.getfixturevalue(request.param)


def _tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, 4000, size=length).tolist()


def _delta(engine: LocalEngine, before) -> dict:
    """What ``engine.stats`` counted of prefills since the copy ``before`` (no drafts here)."""
    now = dataclasses.asdict(engine.stats)
    return {k: now[k] - v for k, v in dataclasses.asdict(before).items() if not k.startswith("draft")}


def _assert_close(cached, fresh, moe: bool) -> None:
    """A completion from a reused prefix against one from a fresh prefill of the same prompt."""
    assert cached.token_ids == fresh.token_ids
    np.testing.assert_allclose(cached.logprobs, fresh.logprobs, rtol=0, atol=TOLERANCE)
    if moe:
        assert np.array_equal(cached.prompt_routed_experts, fresh.prompt_routed_experts)
        assert np.array_equal(cached.routed_experts, fresh.routed_experts)


def _exact(completion) -> tuple:
    routes = [r.tobytes() for r in (completion.routed_experts, completion.prompt_routed_experts) if r is not None]
    return completion.token_ids, completion.logprobs, completion.token_versions, routes


def _stored_length(engine: LocalEngine, prompt: list[int], completion) -> int:
    """Positions the engine fed for a lone row: its prompt and completion, but for the dense
    model not the last token (a row that finishes at the last step is never fed it again; the
    MoE path feeds it for its route)."""
    return len(prompt) + len(completion.token_ids) - (0 if engine.is_moe else 1)


# ---- the agent's continued conversation ----------------------------------------------------------

def test_a_continued_conversation_prefills_only_the_new_tokens(model):
    model, tokenizer = model
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=4096)
    fresh = LocalEngine(model, tokenizer)
    assert cached.batch_invariant and cached.prefix_cache is not None
    prompt = _tokens(0, 150)
    reusable = 0  # positions the previous turn left in the cache
    for turn in range(4):  # each turn: the previous context, the completion, a tool output (or summary request)
        before = dataclasses.replace(cached.stats)
        [ours] = cached.generate([prompt], GREEDY)
        [theirs] = fresh.generate([prompt], GREEDY)
        counted = _delta(cached, before)
        if turn == 0:  # nothing stored yet: exactly the uncached computation
            assert _exact(ours) == _exact(theirs)
            assert counted == dict(prefills=1, prefix_hits=0, prefill_tokens=len(prompt), prefill_tokens_reused=0)
        else:
            _assert_close(ours, theirs, cached.is_moe)
            assert counted == dict(prefills=1, prefix_hits=1, prefill_tokens=len(prompt) - reusable,
                                   prefill_tokens_reused=reusable)
        # one entry: each turn's sequence extends, and replaces, the previous one
        reusable = _stored_length(cached, prompt, ours)
        assert len(cached.prefix_cache) == 1 and cached.prefix_cache.tokens == reusable
        prompt = prompt + ours.token_ids + _tokens(10 + turn, 20)
    assert cached.stats.prefill_tokens_reused > cached.stats.prefill_tokens
    assert fresh.stats.prefill_tokens_reused == 0
    assert fresh.stats.prefill_tokens == cached.stats.prefill_tokens + cached.stats.prefill_tokens_reused


@pytest.mark.slow  # ~1 minute of SmolLM2 on CPU; the random models above run the same logic in make test
def test_a_continued_chat_on_smollm2_matches_a_fresh_prefill(smollm2):
    """A trained dense model: peaked logits, 30 layers of rounding in the reused keys."""
    model, tokenizer = smollm2
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=4096)
    fresh = LocalEngine(model, tokenizer)
    greedy = dataclasses.replace(GREEDY, max_new_tokens=12)  # 30 layers and a 49k vocabulary: keep it short
    chat = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    [first] = cached.generate([prompt], greedy)
    follow_up = tokenizer.encode("<|im_end|>\n<|im_start|>user\nNow add type hints.<|im_end|>\n"
                                 "<|im_start|>assistant\n", add_special_tokens=False)
    prompt = prompt + first.token_ids + follow_up
    before = dataclasses.replace(cached.stats)
    [ours] = cached.generate([prompt], greedy)
    assert _delta(cached, before)["prefill_tokens"] == len(follow_up) + 1  # the last completion token was never fed
    _assert_close(ours, fresh.generate([prompt], greedy)[0], moe=False)


def test_moe_prompt_routes_of_a_reused_prefix_are_those_of_a_fresh_prefill(random_moe):
    model, tokenizer = random_moe
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=4096)
    first_prompt = _tokens(1, 100)
    [first] = cached.generate([first_prompt], GREEDY)
    prompt = first_prompt + first.token_ids + _tokens(2, 30)
    [ours] = cached.generate([prompt], GREEDY)
    [theirs] = LocalEngine(model, tokenizer).generate([prompt], GREEDY)
    routes = ours.prompt_routed_experts
    assert routes.shape == theirs.prompt_routed_experts.shape == (len(prompt), *cached.route_shape)
    assert np.array_equal(routes, theirs.prompt_routed_experts)
    # the reused positions carry the routes the first call recorded for them
    earlier = np.concatenate([first.prompt_routed_experts, first.routed_experts])
    assert np.array_equal(routes[: len(earlier)], earlier)


def test_a_common_prefix_is_reused_up_to_where_the_prompt_departs(random_moe):
    """A completion cut short (the batching front-end cuts a request back to its cap) or a context
    re-rendered from some token on still reuses everything before that token; a prompt equal to
    a stored sequence runs its last position (for its logits)."""
    model, tokenizer = random_moe
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=4096)
    fresh = LocalEngine(model, tokenizer)
    first_prompt = _tokens(3, 80)
    [first] = cached.generate([first_prompt], GREEDY)
    stored = first_prompt + first.token_ids
    for prompt, reused in [(first_prompt + first.token_ids[:10] + _tokens(4, 15), len(first_prompt) + 10),
                           (stored, len(stored) - 1),
                           (first_prompt[:40], 39)]:
        before = dataclasses.replace(cached.stats)
        [ours] = cached.generate([prompt], GREEDY)
        assert _delta(cached, before)["prefill_tokens_reused"] == reused
        _assert_close(ours, fresh.generate([prompt], GREEDY)[0], moe=True)


def test_n_samples_of_a_continued_prompt_share_one_prefill(random_moe):
    model, tokenizer = random_moe
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=8192)
    fresh = LocalEngine(model, tokenizer)
    first_prompt = _tokens(5, 120)
    sampled = SamplingParams(max_new_tokens=20, temperature=1.0, seed=11, ignore_eos=True)
    firsts = cached.generate([first_prompt], sampled, n=3)
    assert len({tuple(c.token_ids) for c in firsts}) == 3
    assert len(cached.prefix_cache) == 3  # one entry per sample: each may be continued
    # continue sample 1, as its rollout would, with 4 samples of the next turn
    prompt = first_prompt + firsts[1].token_ids + _tokens(6, 25)
    before = dataclasses.replace(cached.stats)
    ours = cached.generate([prompt], sampled, n=4)
    theirs = fresh.generate([prompt], sampled, n=4)
    stored = len(first_prompt) + len(firsts[1].token_ids)
    assert _delta(cached, before) == dict(prefills=1, prefix_hits=1, prefill_tokens=len(prompt) - stored,
                                          prefill_tokens_reused=stored)
    for a, b in zip(ours, theirs):
        _assert_close(a, b, moe=True)
        assert np.array_equal(a.prompt_routed_experts, ours[0].prompt_routed_experts)
    assert len({tuple(c.token_ids) for c in ours}) > 1


def test_several_prompts_of_one_call_each_find_their_own_prefix(random_moe):
    model, tokenizer = random_moe
    cached = LocalEngine(model, tokenizer, prefix_cache_tokens=8192, max_batch_size=4)  # 2 chunks of 2 prompts
    fresh = LocalEngine(model, tokenizer, max_batch_size=4)
    starts = [_tokens(20 + i, length) for i, length in enumerate((30, 70, 140, 12))]
    firsts = cached.generate(starts, GREEDY, n=2)
    prompts = [s + firsts[2 * i].token_ids + _tokens(30 + i, 9) for i, s in enumerate(starts)]
    prompts.append(_tokens(99, 50))  # shares nothing
    before = dataclasses.replace(cached.stats)
    ours = cached.generate(prompts, GREEDY, n=2)
    theirs = fresh.generate(prompts, GREEDY, n=2)
    expected = sum(len(s) + len(firsts[2 * i].token_ids) for i, s in enumerate(starts))
    counted = _delta(cached, before)
    assert counted["prefix_hits"] == 4 and counted["prefill_tokens_reused"] == expected
    for a, b in zip(ours, theirs):
        _assert_close(a, b, moe=True)


# ---- bounds and invalidation ------------------------------------------------------------------

def _entry(length: int) -> tuple[list[torch.Tensor], list[torch.Tensor], None]:
    kv = [torch.zeros(2, length, 4)]
    return kv, kv, None


def test_the_store_keeps_its_token_bound_least_recently_used_first():
    cache = PrefixCache(100)
    a, b, c = _tokens(40, 40), _tokens(41, 40), _tokens(42, 40)
    assert cache.insert(a, *_entry(40), epoch=0) and cache.insert(b, *_entry(40), epoch=0)
    assert cache.lookup(a + [1, 2]).length == 40  # a is now the most recently used
    assert cache.insert(c, *_entry(40), epoch=0)  # 120 > 100: b goes
    assert cache.sequences() == [tuple(a), tuple(c)] and cache.tokens == 80
    assert cache.lookup(b + [1]) is None
    assert not cache.insert(_tokens(43, 101), *_entry(101), epoch=0)  # longer than the whole bound
    assert not cache.insert(a[:MIN_PREFIX_TOKENS - 1], *_entry(MIN_PREFIX_TOKENS - 1), epoch=0)  # too short
    assert not cache.insert(a[:30], *_entry(30), epoch=0)  # a stored sequence already starts with it
    assert cache.insert(c + [7] * 10, *_entry(50), epoch=0)  # extends c, which it replaces
    assert cache.sequences() == [tuple(a), tuple(c + [7] * 10)] and cache.tokens == 90
    assert cache.lookup(a[: MIN_PREFIX_TOKENS - 2] + [5] * 20) is None  # common prefix below the minimum
    assert cache.lookup(a[:20] + [5]).length == 20
    cache.invalidate()
    assert len(cache) == 0 and cache.tokens == 0
    assert not cache.insert(a, *_entry(40), epoch=0)  # computed before the invalidation


def test_the_engine_evicts_to_its_token_bound(random_moe):
    model, tokenizer = random_moe
    bound = 300
    engine = LocalEngine(model, tokenizer, prefix_cache_tokens=bound)
    prompts = [_tokens(50 + i, 100) for i in range(4)]
    completions = []
    for prompt in prompts:
        completions += engine.generate([prompt], GREEDY)
        assert engine.prefix_cache.tokens <= bound
    assert len(engine.prefix_cache) == 2  # 124 positions each: two fit in 300
    # newest first: a miss stores its own sequence, which would evict the older of the two
    for prompt, completion, hit in zip(prompts[::-1], completions[::-1], (True, True, False, False)):
        before = dataclasses.replace(engine.stats)
        engine.generate([prompt + completion.token_ids + [11] * 5], SamplingParams(max_new_tokens=1, temperature=0))
        assert _delta(engine, before)["prefix_hits"] == hit
    # a sequence longer than the whole bound is not stored at all
    engine.generate([_tokens(60, 290)], GREEDY)
    assert engine.prefix_cache.tokens <= bound and all(len(s) < 290 for s in engine.prefix_cache.sequences())


def test_new_weights_empty_the_cache(random_moe, tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, tokenizer = random_moe
    other, _ = load_model("tiny_moe", tiny_tokenizer, seed=5)
    engine = LocalEngine(copy.deepcopy(model), tokenizer, prefix_cache_tokens=4096)
    first_prompt = _tokens(7, 90)
    [first] = engine.generate([first_prompt], GREEDY)
    assert len(engine.prefix_cache) == 1
    engine.load_weights(other.state_dict(), version=1)
    assert len(engine.prefix_cache) == 0
    prompt = first_prompt + first.token_ids + _tokens(8, 10)
    before = dataclasses.replace(engine.stats)
    [ours] = engine.generate([prompt], GREEDY)
    assert _delta(engine, before)["prefill_tokens_reused"] == 0
    assert _exact(ours) == _exact(LocalEngine(other, tokenizer, policy_version=1).generate([prompt], GREEDY)[0])


def test_rows_that_span_an_in_flight_update_are_not_stored(random_moe, tiny_tokenizer, monkeypatch):
    from opencomposer.model.loading import load_model

    model, tokenizer = random_moe
    other, _ = load_model("tiny_moe", tiny_tokenizer, seed=5)
    engine = LocalEngine(copy.deepcopy(model), tokenizer, prefix_cache_tokens=4096)
    first_prompt = _tokens(9, 90)
    [first] = engine.generate([first_prompt], GREEDY)
    prompt = first_prompt + first.token_ids + _tokens(10, 10)

    reached, resume, steps = threading.Event(), threading.Event(), [0]
    step = InvariantDecoder.step

    def parked_step(self, ids, positions):
        steps[0] += 1
        if steps[0] == 5:
            reached.set()
            assert resume.wait(timeout=60)
        return step(self, ids, positions)

    monkeypatch.setattr(InvariantDecoder, "step", parked_step)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(result=engine.generate([prompt], GREEDY)))
    thread.start()
    assert reached.wait(timeout=120)
    engine.load_weights(other.state_dict(), version=1)
    assert len(engine.prefix_cache) == 1  # staged, not applied: the model still runs the old weights
    resume.set()
    thread.join(timeout=120)
    [spanning] = out["result"]
    assert set(spanning.token_versions) == {0, 1}
    assert spanning.prompt_routed_experts.shape[0] == len(prompt)
    assert len(engine.prefix_cache) == 0 and engine.prefix_cache.epoch == 1  # neither old nor mixed rows kept
    # stored again once a call runs under one version
    engine.generate([prompt], GREEDY)
    assert len(engine.prefix_cache) == 1


# ---- where it does not apply, and the off path --------------------------------------------------

def test_off_and_no_reuse_are_bit_for_bit_the_uncached_engine(random_moe):
    model, tokenizer = random_moe
    off = LocalEngine(model, tokenizer)
    on = LocalEngine(model, tokenizer, prefix_cache_tokens=4096)
    assert off.prefix_cache is None
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    prompts = [_tokens(70, 37), _tokens(71, 5), _tokens(72, 130)]
    a, b = off.generate(prompts, sampled, n=3), on.generate(prompts, sampled, n=3)
    assert [_exact(x) for x in a] == [_exact(x) for x in b]
    # a prompt sharing fewer than MIN_PREFIX_TOKENS tokens with the stored ones is not served from them
    short = prompts[2][: MIN_PREFIX_TOKENS - 1] + _tokens(73, 40)
    assert _exact(off.generate([short], sampled)[0]) == _exact(on.generate([short], sampled)[0])
    assert on.stats.prefill_tokens_reused == 0
    assert off.stats.prefill_tokens == sum(map(len, prompts)) + len(short) and off.stats.prefills == 4


def test_paths_without_per_row_prefill_keep_no_cache(random_moe, tiny_tokenizer):
    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model

    model, tokenizer = random_moe
    assert LocalEngine(model, tokenizer, batch_invariant=False, prefix_cache_tokens=4096).prefix_cache is None
    deepseek, _ = load_model(ModelConfig(kind="tiny_deepseek_v3"), tiny_tokenizer, seed=0)
    engine = LocalEngine(deepseek, tokenizer, prefix_cache_tokens=4096)
    assert engine.prefix_cache is None
    engine.generate([_tokens(80, 40)], GREEDY)
    assert engine.stats.prefill_tokens == 40 and engine.stats.prefill_tokens_reused == 0
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        LocalEngine(model, tokenizer, prefix_cache_tokens=-1)


def test_sessions_of_the_batching_front_end_reuse_their_own_context(random_moe):
    model, tokenizer = random_moe
    engine = LocalEngine(model, tokenizer, prefix_cache_tokens=8192)
    batcher = BatchingEngine(engine, max_wait_s=0.0)
    prompt = _tokens(90, 200)
    with batcher.session() as session:
        for turn in range(3):
            [completion] = session.generate([prompt], dataclasses.replace(GREEDY, max_new_tokens=8 + 4 * turn))
            prompt = prompt + completion.token_ids + _tokens(91 + turn, 12)
    assert engine.stats.prefix_hits == 2
    assert engine.stats.prefill_tokens == 200 + 2 * 12


MALLOC_PROBE = """
import sys, torch
from opencomposer.inference.local import mmap_large_allocations

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "on":
    assert mmap_large_allocations()
big = torch.ones(8 << 20)  # 32 MB, freed: glibc's dynamic threshold would rise past 2 MB buffers
del big
base = rss_mb()
kept = []
for i in range(300):  # 2 MB buffers, every tenth kept: the pattern of cache entries coming and going
    t = torch.ones(1 << 19)
    if i % 10 == 0:
        kept.append(t)
    else:
        del t
held = [torch.ones(1 << 19) for _ in range(100)]
del held
print(rss_mb() - base)
"""


def test_large_freed_buffers_go_back_to_the_system_with_the_cache_on():
    """``mmap_large_allocations`` (what an engine with a prefix cache sets): buffers of a megabyte
    or more are mmap'ed, so freeing them returns the memory (the process held ~60 MB of kept
    buffers, not the ~800 MB it allocated)."""
    import subprocess
    import sys

    grown = float(subprocess.run([sys.executable, "-c", MALLOC_PROBE, "on"], capture_output=True, text=True,
                                 check=True).stdout)
    assert grown < 120, grown  # the 30 kept buffers are 60 MB; without the setting here: ~290 MB
