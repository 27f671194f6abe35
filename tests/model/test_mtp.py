"""MTP layers (model.mtp): alignment of the self-distillation loss, checkpoints, gradients."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from opencomposer.config import ConfigError, ModelConfig
from opencomposer.model.loading import load_model, save_checkpoint
from opencomposer.model.mtp import (
    MTP_CONFIG_KEY,
    main_hidden,
    mtp_distillation_loss,
    mtp_layers,
    mtp_logits,
    rope_base,
    shift_valid,
)

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
            moe_intermediate_size=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelConfig(**TINY, num_mtp_layers=2))


def test_depth_one_at_i_is_matched_with_the_main_head_at_i_plus_1(tiny):
    """Hand-made: the loss of a 6-token row is the mean over i of KL(main at i+1 || MTP at i),
    where MTP at i reads the main hidden state at i and the embedding of token i+1; computed here
    position by position, straight from the layer's modules."""
    model, _ = tiny
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    positions = torch.arange(6)[None]
    logits, hidden = main_hidden(model, ids, positions)
    layer = model.mtp.layers[0]
    embed = model.get_input_embeddings().weight
    x = layer.proj(torch.cat([layer.enorm(embed[ids[0, 1:]]), layer.hnorm(hidden[0, :-1])], dim=-1))
    block_out = layer.block(x[None], positions[:, :5], rope_base(model))[0]
    draft = model.lm_head(layer.norm(block_out))  # [5, V]: row i guesses the main head's row i + 1
    kls = []
    for i in range(5):
        p = torch.log_softmax(logits[0, i + 1], -1)
        q = torch.log_softmax(draft[i], -1)
        kls.append((p.exp() * (p - q)).sum())
    mine = mtp_logits(model, hidden, ids, positions)[0][0]
    assert torch.allclose(mine, draft, atol=1e-5)
    # depth 2 reads depth 1's output at i and token i + 2: four rows, matched with the main head at i + 2
    assert mtp_logits(model, hidden, ids, positions)[1].shape[1] == 4
    _, metrics = mtp_distillation_loss(model, logits, hidden, ids, positions)
    assert metrics["mtp_kl_1"] == pytest.approx(float(torch.stack(kls).mean().detach()), rel=1e-5)


def test_rows_whose_shifted_target_leaves_the_document_are_not_trained():
    # two packed documents: positions restart at index 3
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    assert shift_valid(positions, 1).tolist() == [[True, True, False, True, True, True]]
    assert shift_valid(positions, 2).tolist() == [[True, False, False, True, True]]
    # demonstration rows: only targets that are model tokens
    targets = torch.tensor([[0, 0, 1, 1, 0, 1, 0]])
    assert shift_valid(torch.arange(7)[None], 1, targets).tolist() == [[False, True, True, False, True, False]]


def test_the_mtp_block_attends_within_documents(tiny):
    model, _ = tiny
    layer = model.mtp.layers[0]
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(0))
    packed = layer.block(x, torch.tensor([[0, 1, 2, 0, 1, 2, 3]]), 10_000.0)
    alone = layer.block(x[:, 3:], torch.tensor([[0, 1, 2, 3]]), 10_000.0)
    assert torch.allclose(packed[:, 3:], alone, atol=1e-5)


def test_the_loss_trains_the_mtp_layers_only(tiny):
    model, _ = tiny
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(12)[None].expand(2, -1)
    logits, hidden = main_hidden(model, ids, positions)
    loss, _ = mtp_distillation_loss(model, logits, hidden, ids, positions)
    loss.backward()
    for name, parameter in model.named_parameters():
        if name.startswith("mtp."):
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        else:
            assert parameter.grad is None, name
    model.zero_grad(set_to_none=True)


def test_distillation_teaches_the_draft_the_main_heads_choice(tiny):
    model, _ = tiny
    model = load_model(ModelConfig(**TINY, num_mtp_layers=1))[0]
    optimizer = torch.optim.Adam(model.mtp.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    history = []
    for _ in range(60):
        ids = torch.randint(0, 4000, (8, 33), generator=generator)
        positions = torch.arange(33)[None].expand(8, -1)
        with torch.no_grad():
            logits, hidden = main_hidden(model, ids, positions)
        loss, metrics = mtp_distillation_loss(model, logits, hidden, ids, positions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(metrics)
    assert history[-1]["mtp_kl"] < 0.5 * history[0]["mtp_kl"]
    assert history[-1]["mtp_top1_1"] > history[0]["mtp_top1_1"] + 0.3


def test_checkpoints_load_in_plain_transformers_and_restore_here(tiny, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    assert not hasattr(plain, "mtp")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again, _ = load_model(tmp_path / "ckpt")
    assert mtp_layers(again) == 2 and getattr(again.config, MTP_CONFIG_KEY) == 2
    for (name, a), (_, b) in zip(model.mtp.state_dict().items(), again.mtp.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not [r for r in caplog.records if "mtp" in r.getMessage()]  # the skipped keys are expected


def test_a_checkpoint_without_mtp_gets_fresh_layers_and_a_mismatch_is_refused(tiny, tmp_path):
    plain, tokenizer = load_model(ModelConfig(**TINY))
    assert mtp_layers(plain) == 0
    save_checkpoint(plain, tokenizer, tmp_path / "base")
    grown, _ = load_model(ModelConfig(kind="hf", path=str(tmp_path / "base"), num_mtp_layers=1))
    assert mtp_layers(grown) == 1
    base_state = plain.state_dict()
    assert all(torch.equal(v, base_state[k]) for k, v in grown.state_dict().items() if not k.startswith("mtp."))
    model, tokenizer = tiny
    save_checkpoint(model, tokenizer, tmp_path / "two")
    with pytest.raises(ConfigError, match="num_mtp_layers = 1, but the checkpoint has 2"):
        load_model(ModelConfig(kind="hf", path=str(tmp_path / "two"), num_mtp_layers=1))
    assert mtp_layers(load_model(ModelConfig(kind="hf", path=str(tmp_path / "two")))[0]) == 2


def test_negative_counts_are_refused():
    with pytest.raises(ConfigError, match="model.num_mtp_layers"):
        ModelConfig(num_mtp_layers=-1).validate()


def test_the_embedding_and_head_are_shared_not_copied(tiny):
    model, _ = tiny
    names = [n for n, _ in model.mtp.named_parameters()]
    assert not any("embed" in n or "lm_head" in n for n in names)
    ids = torch.tensor([[3, 4, 5]])
    logits, hidden = main_hidden(model, ids, torch.arange(3)[None])
    out = mtp_logits(model, hidden, ids, torch.arange(3)[None])[0]
    layer = model.mtp.layers[0]
    h = layer(hidden[:, :-1], F.embedding(ids[:, 1:], model.get_input_embeddings().weight), torch.arange(2)[None],
              rope_base(model))
    assert torch.allclose(out, model.lm_head(layer.norm(h)), atol=1e-6)
