"""Sequence packing: several segments in one batch row, each attending only to itself, give every
token the log-probability and gradient it has in a row of its own, for every model family the
trainer takes (the tiny Qwen3-MoE and DeepSeek-V3 kinds, and a Llama like SmolLM2); the RL loss,
the trainer's step and its reference pass are unchanged by it."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import Config, ConfigError, RLConfig, load_recipe
from opencomposer.rl.trainer import Trainer
from opencomposer.training.forward import token_logprobs
from opencomposer.training.packing import (
    PackedRow,
    SequenceRow,
    collate,
    episode_rows,
    micro_batches,
    pack_rows,
    padded_positions,
    row_parts,
    unpack,
)
from opencomposer.types import Group, Task
from tests.rl.test_trainer import sgd_update
from tests.training.test_forward import SMALL


def random_rows(lengths: list[int], seed: int = 0, vocab: int = 4000) -> list[SequenceRow]:
    """Rows of random ids whose second half is model-written, each its own episode."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = rng.integers(0, vocab, n + 1)
        mask = np.zeros(n, dtype=bool)
        mask[n // 2 :] = True
        logprobs = np.where(mask, -rng.random(n), 0.0).astype(np.float32)
        rows.append(SequenceRow(i, ids[:-1], ids[1:], mask, logprobs, advantage=float(rng.normal()),
                                versions=np.where(mask, 3, -1)))
    return rows


def test_pack_rows_is_first_fit_longest_first_and_places_every_row_once():
    rows = random_rows([50, 30, 70, 20, 90, 150])
    packed = pack_rows(rows, 100)
    # longest first: 150 (over the limit: a row of its own), 90, 70, 50; then 30 fits beside 70
    # and 20 beside 50 (not beside 90: 10 left there); parts keep their arrival order
    assert [[part.episode for part in row.parts] for row in packed] == [[5], [4], [1, 2], [0, 3]]
    assert [len(row) for row in packed] == [150, 90, 100, 70]
    assert sorted(part.episode for row in packed for part in row.parts) == list(range(6))
    assert [[p.episode for p in r.parts] for r in pack_rows(rows, 100)] == [[5], [4], [1, 2], [0, 3]]
    assert all(isinstance(row, PackedRow) for row in packed) and row_parts(rows[0]) == [rows[0]]
    with pytest.raises(ValueError, match="max_tokens"):
        pack_rows(rows, 0)


def test_a_packed_row_restarts_positions_per_segment_and_keeps_each_segments_arrays():
    rows = random_rows([5, 3, 4], seed=1)
    batch = collate([PackedRow(rows[:2]), PackedRow(rows[2:])], pad_id=-1)
    assert batch.input_ids.shape == (2, 8)
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]]  # padding continues
    assert batch.segment_ids.tolist() == [[0] * 5 + [1] * 3, [0] * 8]
    assert batch.episode_ids.tolist() == [[0] * 5 + [1] * 3, [2] * 4 + [-1] * 4]
    assert batch.input_ids[1, 4:].tolist() == [-1] * 4 and not batch.loss_mask[1, 4:].any()
    for r, part, span in ((0, rows[0], slice(0, 5)), (0, rows[1], slice(5, 8)), (1, rows[2], slice(0, 4))):
        assert batch.input_ids[r, span].tolist() == part.input_ids.tolist()
        assert batch.target_ids[r, span].tolist() == part.target_ids.tolist()
        assert batch.loss_mask[r, span].tolist() == part.loss_mask.tolist()
        assert batch.versions[r, span].tolist() == part.versions.tolist()
        expected = np.where(part.loss_mask, part.advantage, 0.0)
        np.testing.assert_allclose(batch.advantages[r, span].numpy(), expected, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(batch.sampler_logprobs[r, span].numpy(), part.sampler_logprobs)
        assert (batch.episode_tokens[r, span] == part.model_tokens).all()
    assert batch.num_episodes == 3
    back = unpack(batch.input_ids, [PackedRow(rows[:2]), PackedRow(rows[2:])])
    assert [b.tolist() for b in back] == [row.input_ids.tolist() for row in rows]


def test_packing_cuts_the_padding_of_mixed_lengths():
    rows = random_rows([300, 40, 260, 30, 200, 90, 20, 60])
    real, padded = padded_positions(rows, 640)
    packed_real, packed_padded = padded_positions(pack_rows(rows, 320), 640)
    assert real == packed_real == 1000
    # padded: [300, 260] at 300, [200, 90, 60] at 200, [40, 30, 20] at 40; packed: rows of
    # 300+20, 260+60, 200+90+30 and 40, two micro-batches of two rows at 320
    assert (padded, packed_padded) == (1320, 1280)


def test_packed_attention_is_causal_attention_inside_each_document():
    """``training.attention``: per-document ``is_causal`` attention equals attention under the
    block-diagonal causal mask, with grouped-query heads and a value width of its own."""
    from opencomposer.training.attention import (
        PACKED_ATTENTION,
        document_spans,
        packed_attention,
        packed_attention_forward,
    )

    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], list(range(12)), [0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 5, 6]])
    assert document_spans(positions) == [[(0, 5), (5, 12)], [(0, 12)], [(0, 3), (3, 5), (5, 12)]]
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 4, 12, 8), torch.randn(3, 2, 12, 8), torch.randn(3, 2, 12, 6)
    docs = (torch.diff(positions, prepend=positions[:, :1] - 1) != 1).cumsum(-1)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    mask = (causal[None] & (docs[:, :, None] == docs[:, None, :]))[:, None]
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3,
                                                                enable_gqa=True).transpose(1, 2)
    model = torch.nn.Linear(1, 1)
    model.config = type("Config", (), {"_attn_implementation": "sdpa"})()
    with pytest.raises(RuntimeError, match="only inside"):
        packed_attention_forward(model, query, key, value, None, scaling=0.3)
    with packed_attention(model, positions):
        assert model.config._attn_implementation == PACKED_ATTENTION
        got, _ = packed_attention_forward(model, query, key, value, None, scaling=0.3)
        with pytest.raises(RuntimeError, match="documents were given"):
            packed_attention_forward(model, query[:, :, :6], key[:, :, :6], value[:, :, :6], None)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_copy_taken_inside_the_switch_gets_its_own_attention_back_and_flash_keeps_its_own():
    """The asynchronous inference service may copy the trainer's model while a packed forward
    runs (``model.attention.restore_attention``); a model on another implementation than sdpa or
    eager (flash attention reads packed position ids itself) is not switched at all."""
    from opencomposer.model.attention import SAVED, restore_attention
    from opencomposer.training.attention import PACKED_ATTENTION, packed_attention

    model = hf_llama()
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    with packed_attention(model, positions):
        assert model.config._attn_implementation == PACKED_ATTENTION
        copied = restore_attention(copy.deepcopy(model))
    assert copied.config._attn_implementation == model.config._attn_implementation == "sdpa"
    assert not hasattr(copied.config, SAVED) and not hasattr(model.config, SAVED)
    with torch.no_grad():  # the copy runs a cached forward, as a sampler does
        copied(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    model.config._attn_implementation = "flash_attention_2"
    with packed_attention(model, positions):
        assert model.config._attn_implementation == "flash_attention_2"
    model.config._attn_implementation = "sdpa"


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=["tiny_moe", "tiny_deepseek_v3", "llama"])
def model(request, tiny_tokenizer):
    if request.param == "llama":
        return hf_llama()
    from opencomposer.model.loading import load_model

    return load_model(dataclasses.replace(SMALL, kind=request.param), tiny_tokenizer, seed=3)[0]


def logprobs_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    model.train()
    logprobs, entropy = token_logprobs(model, batch)
    (torch.where(batch.loss_mask, logprobs, 0.0) * batch.advantages).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.eval()
    return logprobs.detach(), entropy, grads


def test_a_packed_forward_scores_every_token_as_its_own_row_does(model):
    rows = random_rows([37, 12, 25, 50, 8, 31], seed=2)
    packed = pack_rows(rows, 64)
    assert any(len(row.parts) > 1 for row in packed)
    lp_packed, ent_packed, g_packed = logprobs_and_grads(model, collate(packed, pad_id=0))
    lp_rows, ent_rows, g_rows = logprobs_and_grads(model, collate(rows, pad_id=0))
    parts = [part for row in packed for part in row.parts]
    for part, lp, ent in zip(parts, unpack(lp_packed, packed), unpack(ent_packed, packed), strict=True):
        alone, _ = token_logprobs(model, collate([part], pad_id=0), with_entropy=False)
        mask = part.loss_mask
        np.testing.assert_allclose(lp[mask], alone[0, : len(part)].detach().numpy()[mask], rtol=1e-4, atol=1e-5)
        unpacked = ent_rows[part.episode, : len(part)].numpy()
        np.testing.assert_allclose(ent[mask], unpacked[mask], rtol=1e-4, atol=1e-5)
    assert g_packed.keys() == g_rows.keys()
    for name, grad in g_rows.items():
        scale = float(grad.abs().max()) + 1e-12
        assert float((g_packed[name] - grad).abs().max()) / scale < 1e-4, name
    del lp_rows


def small_policy(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    return load_model(SMALL, tiny_tokenizer, seed=5)


@pytest.mark.parametrize("loss", ["composer", "grpo", "dr_grpo"])
def test_the_rl_step_on_packed_rows_equals_the_step_on_padded_rows(tiny_tokenizer, loss):
    from tests.rl.test_trainer import episode

    model, _ = small_policy(tiny_tokenizer)
    rng = np.random.default_rng(4)
    episodes = [episode(rng, r, n_model=int(rng.integers(3, 15))) for r in (1.0, 0.0, 0.0, 1.0, 0.0, 1.0)]
    rows = episode_rows(episodes, [0.6, -0.4, -0.4, 0.6, -0.4, 0.2])
    config = RLConfig(grad_clip=0.0)
    config.loss.kind, config.loss.token_budget = loss, 64
    plain = sgd_update(model, [collate(c, 0) for c in micro_batches(rows, 160)], config)
    packed_rows = pack_rows(rows, 160)
    assert len(packed_rows) < len(rows)
    packed = sgd_update(model, [collate(c, 0) for c in micro_batches(packed_rows, 160)], config)
    for name, delta in plain.items():
        scale = float(delta.abs().max()) + 1e-12
        assert float((packed[name] - delta).abs().max()) / scale < 1e-4, name
    assert max(float(d.abs().max()) for d in plain.values()) > 0


def test_the_trainer_packs_its_steps_and_its_reference_pass(tiny_tokenizer):
    """``rl.pack_tokens``: the same KL penalties from the packed reference pass, the same update
    (Adam with ε = 1 is linear in the gradient at the first step), less padding."""
    from tests.rl.test_trainer import episode

    model, tokenizer = small_policy(tiny_tokenizer)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    from opencomposer.rl import trainer as trainer_module

    trained_segments = []  # segments per row of every batch the trainer collates

    def spy(rows, *args, **kwargs):
        batch = collate(rows, *args, **kwargs)
        trained_segments.append(int(batch.segment_ids.max()) + 1)
        return batch

    results = {}
    for pack in (0, 256):
        trained_segments.clear()
        config = Config()
        config.rl.kl.coef, config.rl.lr, config.rl.adam_eps = 0.05, 1.0, 1.0
        config.rl.micro_batch_tokens, config.rl.pack_tokens = 256, pack
        trainer = Trainer(copy.deepcopy(model), tokenizer, config, reference=reference)
        rng = np.random.default_rng(6)
        task = Task(id="t", instruction="x", repo=Path("."))
        groups = [Group(task, [episode(rng, r, n_model=int(rng.integers(2, 20))) for r in (1.0, 0.0, 0.0, 1.0)])
                  for _ in range(2)]
        scored = trainer.score(groups)
        assert scored.metrics["kl_penalty_mean"] > 0
        original = trainer_module.collate
        trainer_module.collate = spy
        try:
            loss, metrics = trainer.train(scored)
        finally:
            trainer_module.collate = original
        assert (max(trained_segments) > 1) == bool(pack)  # packed rows trained only when asked
        rewards = [e.reward for g in groups for e in g.episodes]
        results[pack] = (rewards, loss, metrics, {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    (r0, loss0, m0, w0), (r1, loss1, m1, w1) = results[0], results[256]
    assert r1 == pytest.approx(r0, abs=1e-6)  # the rewards hold the KL penalty
    assert loss1 == pytest.approx(loss0, rel=1e-4)
    assert m1["padding_fraction"] < m0["padding_fraction"]
    start = dict(model.named_parameters())
    for name, value in w0.items():
        moved = value - start[name].detach()
        scale = float(moved.abs().max()) + 1e-12
        assert float((w1[name] - value).abs().max()) / scale < 1e-3, name


@pytest.mark.parametrize(("overrides", "message"), [
    (["rl.pack_tokens=32"], "rl.pack_tokens"),
    (["rl.micro_batch_tokens=1024", "rl.pack_tokens=2048"], "rl.pack_tokens"),
    (["sft.pack_tokens=16"], "sft.pack_tokens"),
])
def test_bad_packing_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, overrides)
