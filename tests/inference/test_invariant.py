"""Batch invariance: a row's logits, and so its completion, do not depend on what shares its batch.

The first two tests check the premises of ``inference.invariant`` on this machine's kernels (a
fixed-shape matmul gives a row the same bits in every slot and batch; blocked attention gives a
row the same bits whatever the other rows' lengths); the others check the engine end to end on a
random-init tiny MoE at temperature 1, where near-ties between tokens and between experts are
everywhere, so any difference in a logit would show."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.inference.invariant import BLOCK, InvariantDecoder, block_attention, linear_rows
from opencomposer.inference.local import row_seed


@pytest.mark.parametrize("in_features,out_features", [(64, 128), (128, 256), (128, 4096)])
def test_a_row_gets_the_same_bits_from_every_batch_and_slot(in_features, out_features):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator)
    row = torch.randn(in_features, generator=generator)
    reference = linear_rows(row[None], weight)[0]
    for rows in range(1, 41):
        others = torch.randn(rows, in_features, generator=generator)
        for slot in range(rows):
            batch = others.clone()
            batch[slot] = row
            assert torch.equal(linear_rows(batch, weight)[slot], reference), (rows, slot)
    torch.testing.assert_close(reference, F.linear(row[None], weight)[0], rtol=1e-5, atol=1e-5)


def test_blocked_attention_ignores_the_other_rows_and_matches_sdpa():
    generator = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, length = 4, 2, 16, 70  # 70 keys: one full block and part of a second
    q = torch.randn(heads, dim, generator=generator)
    k = torch.randn(kv_heads, length, dim, generator=generator)
    v = torch.randn(kv_heads, length, dim, generator=generator)

    def attend(rows: int, slot: int, capacity: int) -> torch.Tensor:
        queries = torch.randn(rows, heads, dim, generator=generator)
        keys = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
        values = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
        lengths = torch.randint(1, capacity + 1, (rows,), generator=generator)
        queries[slot], lengths[slot] = q, length
        keys[slot, :, length:] = 0  # the cache keeps unwritten slots zero
        values[slot, :, length:] = 0
        keys[slot, :, :length], values[slot, :, :length] = k, v
        return block_attention(queries, keys, values, lengths, dim**-0.5)[slot]

    reference = attend(1, 0, 2 * BLOCK)
    for rows, slot, capacity in [(3, 0, 2 * BLOCK), (3, 2, 5 * BLOCK), (17, 9, 3 * BLOCK), (40, 39, 8 * BLOCK)]:
        assert torch.equal(attend(rows, slot, capacity), reference), (rows, slot, capacity)
    expected = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None], enable_gqa=True)[0, :, 0]
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def random_moe(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model("tiny_moe", tiny_tokenizer, seed=0)
    return model, tokenizer


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)  # lengths on both sides of the attention block (64)
    return [rng.integers(10, 4000, size=length).tolist() for length in (37, 5, 64, 130, 90, 12)]


def _exact(completion) -> tuple:
    return completion.token_ids, completion.logprobs, completion.routed_experts.tobytes()


def test_a_completion_is_the_same_alone_and_in_any_batch(random_moe, monkeypatch):
    model, tokenizer = random_moe
    engine = LocalEngine(model, tokenizer)
    assert engine.batch_invariant
    prompts = _prompts()
    target = prompts[0]
    # 300 stop ids: rows end after ~14 tokens on average, so batches compact while others still run
    params = SamplingParams(max_new_tokens=48, temperature=1.0, stop_token_ids=list(range(100, 400)),
                            ignore_eos=True)
    seeds = [row_seed(7, 0, j) for j in range(8)]
    alone = [_exact(c) for c in engine.generate([target], params, n=8, row_seeds=seeds)]
    single = _exact(engine.generate([target], params, n=1, row_seeds=seeds[3:4])[0])
    assert single == alone[3]  # n does not matter either
    assert len({a[0][0] for a in alone}) > 1  # temperature 1 on a random model: the samples differ

    compactions = []  # (rows before, step) of every compaction, to show that some happened mid-way
    steps = [0]
    select, step = InvariantDecoder.select, InvariantDecoder.step
    monkeypatch.setattr(InvariantDecoder, "select",
                        lambda self, rows: (compactions.append(steps[0]), select(self, rows))[1])
    monkeypatch.setattr(InvariantDecoder, "step",
                        lambda self, ids, pos: (steps.__setitem__(0, steps[0] + 1), step(self, ids, pos))[1])
    rng = np.random.default_rng(1)
    for others, position, n in [([1], 0, 8), ([2, 3], 1, 8), ([5, 4, 1, 3, 2], 5, 4), ([3], 1, 2)]:
        batch = [prompts[i] for i in others]
        batch.insert(position, target)
        row_seeds = [int(s) for s in rng.integers(2**62, size=len(batch) * n)]
        row_seeds[position * n : (position + 1) * n] = seeds[:n]
        steps[0], compactions[:] = 0, []
        out = engine.generate(batch, params, n=n, row_seeds=row_seeds)
        mine = [_exact(c) for c in out[position * n : (position + 1) * n]]
        assert mine == alone[:n], (others, position, n)
        longest = max(len(a[0]) for a in mine)
        assert any(step < longest for step in compactions), "no compaction while the target was decoding"


def test_a_completion_does_not_depend_on_the_chunking(random_moe):
    model, tokenizer = random_moe
    prompts = _prompts()[:4]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    wide = LocalEngine(model, tokenizer, max_batch_size=64).generate(prompts, params, n=3)
    narrow = LocalEngine(model, tokenizer, max_batch_size=3).generate(prompts, params, n=3)  # a prompt a call
    assert [_exact(c) for c in wide] == [_exact(c) for c in narrow]


def test_the_fast_path_does_depend_on_the_batch_and_stays_close(random_moe):
    """The previous decoder (``batch_invariant=False``) gives logprobs that move with the batch;
    the invariant decoder agrees with it to float32 rounding."""
    model, tokenizer = random_moe
    prompts = _prompts()
    params = SamplingParams(max_new_tokens=16, temperature=0)  # greedy: same tokens on both paths
    fast = LocalEngine(model, tokenizer, batch_invariant=False)
    invariant = LocalEngine(model, tokenizer)
    together = fast.generate(prompts, params)
    alone = [fast.generate([p], params)[0] for p in prompts]
    assert any(a.logprobs != b.logprobs for a, b in zip(together, alone))
    for a, b in zip(invariant.generate(prompts, params), together):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-4)


CONVERSIONS = {
    "nvfp4-token-linears-dispatch": {"recipe": "nvfp4_fwd_mxfp8_bwd", "quantize_linears": True,
                                     "quantize_dispatch": True},
    "mxfp8-linears": {"recipe": "mxfp8", "quantize_linears": True},
}


def _converted(model, **numerics):
    import copy

    from opencomposer.config import NumericsConfig
    from opencomposer.numerics.convert import convert_model

    converted = copy.deepcopy(model)
    convert_model(converted, NumericsConfig(**numerics))
    return converted


def _forward_logprobs(model, prompt: list[int], completion) -> torch.Tensor:
    """Log-probabilities of ``completion``'s tokens under ``model``'s transformers forward (temperature 1)."""
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return F.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_a_converted_model_decodes_batch_invariantly_and_in_its_format(random_moe, name):
    """A [numerics]-converted sampler (the RL sampler in an NVFP4 or MXFP8 run) keeps the
    guarantee: a row's completion is the same bits alone and in a batch. And it decodes in the
    format: its log-probabilities agree with the converted model's own forward far more closely
    than with the unconverted model's (measured: 2e-7 against 0.06 nats a token for NVFP4, 0 against
    0.02 for MXFP8)."""
    model, tokenizer = random_moe
    converted = _converted(model, **CONVERSIONS[name])
    engine = LocalEngine(converted, tokenizer)
    assert engine.batch_invariant
    prompts = _prompts()
    target = prompts[0]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)
    seeds = [row_seed(7, 0, j) for j in range(4)]
    alone = engine.generate([target], params, n=4, row_seeds=seeds)
    rng = np.random.default_rng(2)
    batch = [prompts[3], target, prompts[1], prompts[5]]
    row_seeds = [int(s) for s in rng.integers(2**62, size=len(batch) * 4)]
    row_seeds[4:8] = seeds
    together = engine.generate(batch, params, n=4, row_seeds=row_seeds)
    assert [_exact(c) for c in together[4:8]] == [_exact(c) for c in alone]

    sampled = torch.tensor(alone[0].logprobs)
    near = (_forward_logprobs(converted, target, alone[0]) - sampled).abs().mean().item()
    far = (_forward_logprobs(model, target, alone[0]) - sampled).abs().mean().item()
    assert near < 1e-4 < 1e-2 < far, (near, far)


def test_per_tensor_nvfp4_activation_scales_keep_the_batch_dependent_decoder(random_moe):
    """One FP32 scale for a whole activation tensor takes every row of the call into account: no
    decoder can make that batch-invariant, so the engine says so and the invariant decoder refuses."""
    model, tokenizer = random_moe
    converted = _converted(model, recipe="nvfp4_fwd_mxfp8_bwd", nvfp4_activation_scale="tensor")
    assert not LocalEngine(converted, tokenizer).batch_invariant
    with pytest.raises(ValueError, match="one scale per tensor"):
        InvariantDecoder(converted)


@pytest.mark.parametrize("name", ["plain", *CONVERSIONS])
def test_experts_at_once_are_the_experts_one_by_one(random_moe, name, monkeypatch):
    """Every expert's tiles in one product (each tile with a copy of its expert's matrices) gives
    the bits of one expert at a time: each tile is the same fixed-shape problem either way."""
    from opencomposer.inference import invariant

    model, _ = random_moe
    if name != "plain":
        model = _converted(model, **CONVERSIONS[name])
    block = next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    torch.manual_seed(1)
    for rows in (1, 17, 64):
        x = torch.randn(rows, model.config.hidden_size)
        at_once = invariant.sparse_moe(block, x, None)
        monkeypatch.setattr(invariant, "GATHER_BYTES", 0)
        one_by_one = invariant.sparse_moe(block, x, None)
        monkeypatch.undo()
        assert torch.equal(at_once, one_by_one), rows
