"""The shared optimizer: Adam without weight decay, AdamW with decay groups (no decay on biases,
norms and embeddings) with it."""

from __future__ import annotations

import pytest
import torch

from opencomposer.training.optim import build_optimizer, decay_groups


class Toy(torch.nn.Module):
    """One of each kind of parameter, an output head tied to the embedding, and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.frozen = torch.nn.Linear(4, 4, bias=False).requires_grad_(False)


def names(model: torch.nn.Module, group: dict) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in group["params"]]


def test_decay_groups_keep_biases_norms_and_embeddings_out_of_weight_decay():
    decay, no_decay = decay_groups(Toy())
    assert decay == ["proj.weight"]
    assert no_decay == ["embed.weight", "proj.bias", "norm.weight", "norm.bias"]  # the tied head is embed.weight


def test_decay_groups_of_a_transformers_model(tiny_tokenizer):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    model, _ = load_model(SMALL, tiny_tokenizer, seed=0)
    decay, no_decay = decay_groups(model)
    shapes = dict(model.named_parameters())
    assert "model.embed_tokens.weight" in no_decay and "model.norm.weight" in no_decay
    assert all(shapes[n].dim() >= 2 for n in decay) and "model.layers.0.self_attn.q_proj.weight" in decay
    assert all(shapes[n].dim() < 2 or n == "model.embed_tokens.weight" for n in no_decay)
    assert len(decay) + len(no_decay) == len(shapes)


def test_with_weight_decay_it_is_adamw_with_a_decayed_and_an_undecayed_group():
    model = Toy()
    optimizer = build_optimizer(model, lr=3e-3, betas=[0.9, 0.95], weight_decay=0.1)
    assert type(optimizer) is torch.optim.AdamW
    decayed, undecayed = optimizer.param_groups
    assert (names(model, decayed), decayed["weight_decay"]) == (["proj.weight"], 0.1)
    assert (names(model, undecayed), undecayed["weight_decay"]) == (
        ["embed.weight", "proj.bias", "norm.weight", "norm.bias"], 0.0)
    assert all((g["lr"], g["betas"], g["eps"]) == (3e-3, (0.9, 0.95), 1e-8) for g in optimizer.param_groups)


def test_without_weight_decay_it_is_full_parameter_adam_in_one_group():
    model = Toy()
    optimizer = build_optimizer(model, lr=1e-6, betas=(0.8, 0.95), eps=1e-6)
    assert type(optimizer) is torch.optim.Adam
    (group,) = optimizer.param_groups
    assert names(model, group) == ["embed.weight", "proj.weight", "proj.bias", "norm.weight", "norm.bias"]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-6, (0.8, 0.95), 1e-6, 0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        build_optimizer(model, lr=1e-3, weight_decay=-0.1)
