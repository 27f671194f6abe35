"""Models build from configs, save to folders plain transformers loads, and reload bit-identically."""

from __future__ import annotations

import json

import pytest
import torch

from opencomposer.config import ConfigError, ModelConfig
from opencomposer.model.loading import load_model, parameter_counts, save_checkpoint


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.mark.parametrize("fixture", ["tiny_moe", "tiny_deepseek", "smollm2"])
def test_checkpoint_round_trip_is_bit_identical(fixture, request, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = request.getfixturevalue(fixture)
    ids = tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    before = _logits(model, ids)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((tmp_path / "ckpt" / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    retok = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    assert retok.encode("def f(): pass") == tokenizer.encode("def f(): pass")
    assert torch.equal(_logits(reloaded, ids), before)


def test_load_model_accepts_a_checkpoint_folder(tiny_moe, tmp_path):
    model, tokenizer = tiny_moe
    save_checkpoint(model, tokenizer, tmp_path)
    again, _ = load_model(str(tmp_path))
    ids = tokenizer.encode("import os")
    assert torch.equal(_logits(again, ids), _logits(model, ids))


def test_tiny_moe_parameter_count_matches_architecture(tiny_tokenizer):
    config = ModelConfig()
    model, _ = load_model(config, tiny_tokenizer)
    v, h, layers, e, i = len(tiny_tokenizer), config.hidden_size, config.num_layers, config.num_experts, config.moe_intermediate_size
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    attention = h * q + 2 * h * kv + q * h + 2 * config.head_dim  # q, k, v, o projections + q/k norms
    moe = e * 3 * h * i + e * h  # experts (gate, up, down) + router
    expected = v * h + layers * (attention + moe + 2 * h) + h  # tied embeddings, two norms per layer, final norm
    counts = parameter_counts(model)
    assert counts["total"] == expected
    assert counts["experts"] == layers * e * 3 * h * i
    assert counts["active"] == expected - counts["experts"] + counts["experts"] * config.top_k // e


def test_same_seed_same_init_different_seed_different(tiny_tokenizer):
    a, _ = load_model("tiny_moe", tiny_tokenizer, seed=1)
    b, _ = load_model("tiny_moe", tiny_tokenizer, seed=1)
    c, _ = load_model("tiny_moe", tiny_tokenizer, seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_bad_specs_are_named(tmp_path):
    with pytest.raises(ConfigError, match="expected 'tiny_moe'"):
        load_model("gpt-17")
    with pytest.raises(ConfigError, match="is not a checkpoint folder"):
        load_model(ModelConfig(kind="hf", path=str(tmp_path)))
    with pytest.raises(ConfigError, match="even count"):
        load_model(ModelConfig(kind="tiny_deepseek_v3", num_experts=7, top_k=2))
