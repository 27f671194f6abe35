"""Router replay against an independent computation of the MoE layer, for every router kind.

The reference below is written from the model cards' formulas, not from transformers' code paths:
gate weights from the router's softmax (Qwen3-MoE) or sigmoid (DeepSeek-V3, with its
load-balancing bias and group limits deciding only the choice), each expert a SwiGLU, the output
their weighted sum (plus DeepSeek-V3's shared expert). The confidence filter is restated token by
token with Python lists.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from opencomposer.model.routing import RouteRecorder, RouterReplay, confidence_filter, moe_routers

HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 8, 2, 40


def _block(kind: str, seed: int = 0):
    """One MoE block with random weights: (block, router kind for the reference)."""
    from transformers import DeepseekV3Config, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(seed)
    if kind.startswith("qwen3"):
        config = Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                moe_intermediate_size=12, norm_topk_prob=kind == "qwen3_norm")
        block = Qwen3MoeSparseMoeBlock(config)
    else:
        config = DeepseekV3Config(hidden_size=HIDDEN, n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                  moe_intermediate_size=12, n_shared_experts=1, n_group=2, topk_group=1,
                                  routed_scaling_factor=2.5, norm_topk_prob=True)
        block = DeepseekV3MoE(config)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.4)
        if kind == "deepseek_bias":
            block.gate.e_score_correction_bias.normal_(0.0, 0.3)
    return block


KINDS = ["qwen3_norm", "qwen3_plain", "deepseek", "deepseek_bias"]


def reference_gates(block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate scores, selection scores) [T, E] from the model's formulas."""
    router = block.gate
    logits = x.double() @ router.weight.double().T
    if not hasattr(router, "e_score_correction_bias"):
        probs = torch.softmax(logits, dim=-1)
        return probs, probs
    scores = torch.sigmoid(logits)
    biased = scores + router.e_score_correction_bias.double()
    choice = torch.full_like(biased, float("-inf"))
    per_group = EXPERTS // router.num_group
    for t in range(x.shape[0]):
        group_scores = [sorted(biased[t, g * per_group:(g + 1) * per_group].tolist())[-2:] for g in range(router.num_group)]
        best = sorted(range(router.num_group), key=lambda g: -sum(group_scores[g]))[: router.topk_group]
        for g in best:
            choice[t, g * per_group:(g + 1) * per_group] = biased[t, g * per_group:(g + 1) * per_group]
    return scores, choice


def reference_moe(block, x: torch.Tensor, experts: list[list[int]]) -> torch.Tensor:
    """The MoE layer on ``x`` [T, H] with the given experts per token, gate weights from the
    router's own scores there; float64."""
    router, bank = block.gate, block.experts
    scores, _ = reference_gates(block, x)
    deepseek = hasattr(router, "e_score_correction_bias")
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float64)
    for t, chosen in enumerate(experts):
        weights = scores[t, chosen]
        if router.norm_topk_prob:
            weights = weights / weights.sum()
        if deepseek:
            weights = weights * router.routed_scaling_factor
        for w, e in zip(weights, chosen):
            gate, up = (bank.gate_up_proj[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (bank.down_proj[e].double() @ (F.silu(gate) * up))
    if deepseek:
        shared = block.shared_experts
        xs = x.double()
        hidden = F.silu(xs @ shared.gate_proj.weight.double().T) * (xs @ shared.up_proj.weight.double().T)
        out += hidden @ shared.down_proj.weight.double().T
    return out


def reference_filter(scores: torch.Tensor, choice: torch.Tensor, replayed: list[list[int]], threshold: float):
    """The confidence filter token by token: (experts, replaced flags)."""
    experts, replaced = [], []
    for t, row in enumerate(replayed):
        own = sorted(range(EXPERTS), key=lambda e: -float(choice[t, e]))[:TOP_K]
        floor = threshold * min(float(scores[t, e]) for e in own)
        kept = [e for e in row if float(scores[t, e]) >= floor]
        free = iter(e for e in own if e not in kept)
        experts.append([e if float(scores[t, e]) >= floor else next(free) for e in row])
        replaced.append([float(scores[t, e]) < floor for e in row])
    return experts, replaced


def random_routes(seed: int, unknown: int = 4) -> torch.Tensor:
    """[1, TOKENS, 1, k]: distinct random experts per token in random column order, the last
    ``unknown`` tokens unknown (-1)."""
    generator = torch.Generator().manual_seed(seed)
    routes = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(TOKENS)])
    routes[TOKENS - unknown:] = -1
    return routes.view(1, TOKENS, 1, TOP_K)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["replay", "filtered"])
def test_replayed_layer_equals_the_reference_moe_with_those_experts(kind, mode):
    block = _block(kind)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    routes = random_routes(2)
    replay = RouterReplay(block, mode, threshold=0.5)
    with torch.no_grad(), replay.routes(routes):
        got = block(x)[0].double()
    with torch.no_grad():
        scores, choice = reference_gates(block, x[0])
    replayed = routes[0, :, 0].tolist()
    experts = replayed[:-4]
    if mode == "filtered":
        experts, replaced = reference_filter(scores, choice, experts, 0.5)
        assert 0 < sum(map(sum, replaced)) < len(experts) * TOP_K  # the random routes trip the filter sometimes
        assert replay.stats.replaced.tolist() == [sum(map(sum, replaced))]
    own = [sorted(range(EXPERTS), key=lambda e: -float(choice[t, e]))[:TOP_K] for t in range(TOKENS - 4, TOKENS)]
    expected = reference_moe(block, x[0], experts + own)  # unknown tokens: the router's own choice
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert replay.stats.replayed.tolist() == [(TOKENS - 4) * TOP_K]
    agreed = sum(e in own_t for row, own_t in zip(replayed[:-4], [
        sorted(range(EXPERTS), key=lambda e: -float(choice[t, e]))[:TOP_K] for t in range(TOKENS - 4)]) for e in row)
    assert replay.stats.agreed.tolist() == [agreed]


@pytest.mark.parametrize("kind", KINDS)
def test_replaying_the_routers_own_choice_changes_nothing(kind):
    """Bit for bit in the router's own column order (columns are kept, so each token meets each
    expert in the same slot); to rounding in the recorder's sorted order, where a token's slot, and
    so its row in an expert's matmul, can change."""
    block = _block(kind, seed=4)
    x = torch.randn(2, 9, HIDDEN, generator=torch.Generator().manual_seed(5))
    seen = []
    handle = block.gate.register_forward_hook(lambda module, inputs, output: seen.append(output[2]))
    with torch.no_grad(), RouteRecorder(block) as recorder:
        plain = block(x)
        recorded = recorder.take(2, 9)
    handle.remove()
    own = seen[0].view(2, 9, 1, TOP_K)
    assert torch.equal(own.sort(dim=-1).values, recorded)
    for mode in ("replay", "filtered"):
        replay = RouterReplay(block, mode)
        with torch.no_grad(), replay.routes(own):
            assert torch.equal(block(x), plain)
        with torch.no_grad(), replay.routes(recorded):
            torch.testing.assert_close(block(x), plain, rtol=0, atol=1e-5)
        assert replay.metrics() == {"router_replay_replace_rate": 0.0, "router_replay_agreement": 1.0}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["replay", "filtered"])
def test_router_weight_gradient_matches_finite_differences(kind, mode):
    """Central differences of the router weight, at 48 random entries. The selection is piecewise
    constant (a token the router routes itself, or a filtered column, can switch experts under the
    perturbation and make the loss jump), so every route is known and an entry whose perturbation
    changes any selected expert is left out; few are."""
    block = _block(kind, seed=7)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(8))
    probe = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(9))
    routes = random_routes(10, unknown=0)
    replay = RouterReplay(block, mode, threshold=0.5)
    weight = block.gate.weight

    def loss() -> tuple[torch.Tensor, torch.Tensor]:
        selected = []
        with replay.routes(routes):
            handle = block.gate.register_forward_hook(lambda module, inputs, output: selected.append(output[2]))
            value = (block(x) * probe).sum()
        handle.remove()
        return value, selected[0]

    block.zero_grad()
    value, selection = loss()
    value.backward()
    analytic = weight.grad.clone()
    assert analytic.abs().max() > 1e-3  # the router is trained through the replayed gates
    numeric = torch.full_like(weight, float("nan"))
    step = 1e-2
    entries = torch.randperm(weight.numel(), generator=torch.Generator().manual_seed(11))[:48]  # of 128
    with torch.no_grad():
        for index in entries.tolist():
            original = weight.view(-1)[index].item()
            weight.view(-1)[index] = original + step
            up, up_selection = loss()
            weight.view(-1)[index] = original - step
            down, down_selection = loss()
            weight.view(-1)[index] = original
            if torch.equal(up_selection, selection) and torch.equal(down_selection, selection):
                numeric.view(-1)[index] = float((up.double() - down.double()) / (2 * step))
    smooth = ~numeric.isnan()
    assert int(smooth.sum()) >= (len(entries) if mode == "replay" else 0.8 * len(entries))
    error = (analytic[smooth] - numeric[smooth]).norm() / numeric[smooth].norm()
    assert error < 2e-3, f"relative error {float(error):.2e}"


def test_confidence_filter_keeps_the_floor_and_replaces_column_by_column():
    scores = torch.tensor([[0.40, 0.30, 0.20, 0.06, 0.04],
                           [0.40, 0.30, 0.20, 0.06, 0.04],
                           [0.40, 0.30, 0.20, 0.06, 0.04]])
    own = torch.tensor([[0, 1, 2]] * 3)  # best first; floor = 0.5 × 0.20 = 0.10
    replayed = torch.tensor([[3, 1, 4],   # 3 and 4 implausible: replaced by 0 then 2 (1 is kept)
                             [2, 0, 1],   # all plausible (the set of own experts, another order)
                             [4, 3, 0]])  # 4, 3 replaced by 1, 2 (0 is kept)
    experts, replaced = confidence_filter(scores, replayed, own, threshold=0.5)
    assert experts.tolist() == [[0, 1, 2], [2, 0, 1], [1, 2, 0]]
    assert replaced.tolist() == [[True, False, True], [False, False, False], [True, True, False]]


def test_routes_are_checked_against_the_model(tiny_tokenizer):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    model, _ = load_model(SMALL, tiny_tokenizer, seed=0)
    replay = RouterReplay(model, "filtered")
    layers = len(moe_routers(model))
    with pytest.raises(ValueError, match=r"expected \[batch, seq, 2, 2\]"):
        replay.check(torch.zeros(1, 3, layers, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected -1 \(unknown\) or \[0, 4\)"):
        replay.check(torch.full((1, 3, layers, 2), 4))
    partial = torch.zeros(1, 3, layers, 2, dtype=torch.long)
    partial[0, 1, 0, 1] = -1
    with pytest.raises(ValueError, match="known whole or not"):
        replay.check(partial)
    with pytest.raises(RuntimeError, match="routed 5 tokens, but the routes cover 3"), replay.routes(
        torch.zeros(1, 3, layers, 2, dtype=torch.long)
    ):
        model(input_ids=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="expected a ratio in"):
        RouterReplay(model, "filtered", threshold=0.0)
