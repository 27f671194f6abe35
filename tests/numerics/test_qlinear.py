"""Quantised autograd matmuls and the MoE converter, against references computed independently
from the public quantise/dequantise functions."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opencomposer.config import NumericsConfig
from opencomposer.numerics import dequantize_mx, dequantize_nvfp4, quantize_mx, quantize_nvfp4
from opencomposer.numerics.convert import QuantizedExperts, convert_model, is_converted
from opencomposer.numerics.qlinear import (
    MXSpec,
    NVFP4Spec,
    QuantizedLinear,
    fake_quantize,
    matmul_recipe,
    quantized_linear,
)

NVFP4_RECIPE = NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd")
MXFP8_RECIPE = NumericsConfig(recipe="mxfp8")


def mx_rows(t: torch.Tensor) -> torch.Tensor:
    """MXFP8 E4M3 of a 2-D tensor, blocks along rows, zero-padded to a multiple of 32."""
    length = t.shape[1]
    padded = F.pad(t, (0, (-length) % 32)).contiguous()
    return dequantize_mx(quantize_mx(padded, "e4m3", 32, "floor"))[:, :length]


def nvfp4_rows(t: torch.Tensor, granularity: str) -> torch.Tensor:
    return dequantize_nvfp4(quantize_nvfp4(t.contiguous(), granularity))


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4_fwd_mxfp8_bwd"])
def test_quantized_matmul_matches_an_independent_fake_quant_reference(recipe_name):
    g = torch.Generator().manual_seed(0)
    tokens, k, n = 40, 64, 48  # 40 tokens and 48 outputs are not multiples of 32: padding paths
    x = torch.randn(tokens, k, generator=g, requires_grad=True)
    w = torch.randn(n, k, generator=g, requires_grad=True)
    dy = torch.randn(tokens, n, generator=g)
    recipe = matmul_recipe(NumericsConfig(recipe=recipe_name))
    y = quantized_linear(x, w, recipe)
    y.backward(dy)

    with torch.no_grad():
        if recipe_name == "mxfp8":
            y_ref = mx_rows(x) @ mx_rows(w).T
        else:  # activations one FP32 scale per token, weights one per tensor
            y_ref = nvfp4_rows(x, "token") @ nvfp4_rows(w, "tensor").T
        dx_ref = mx_rows(dy) @ mx_rows(w.T).T  # reduction over N: dy rows, w columns
        dw_ref = mx_rows(dy.T) @ mx_rows(x.T).T  # reduction over T: dy columns, x columns
    assert torch.equal(y, y_ref)
    assert torch.equal(x.grad, dx_ref)
    assert torch.equal(w.grad, dw_ref)
    # the rounding is real: not the plain product
    assert not torch.equal(y, x.detach() @ w.detach().T)


def test_matmul_recipe_follows_the_config():
    assert matmul_recipe(NumericsConfig()) is None
    nv = matmul_recipe(
        NumericsConfig(
            recipe="nvfp4_fwd_mxfp8_bwd", mx_grad_dtype="e5m2", division="approx", reciprocal_ulp=-1
        )
    )
    assert nv.forward_input == NVFP4Spec("token", "approx", -1)
    assert nv.forward_weight == NVFP4Spec("tensor", "approx", -1)
    assert nv.backward_grad == MXSpec("e5m2", 32, "floor")
    assert nv.backward_operand == MXSpec("e4m3", 32, "floor")
    mx = matmul_recipe(NumericsConfig(recipe="mxfp8", mx_scale_mode="rceil"))
    assert mx.forward_input == mx.forward_weight == mx.backward_operand == MXSpec("e4m3", 32, "rceil")


def test_fake_quantize_along_dim_zero_pads_the_blocks():
    x = torch.randn(40, 8)
    along_tokens = fake_quantize(x, MXSpec(), dim=0)
    assert torch.equal(along_tokens, mx_rows(x.T).T)


def test_quantized_linear_module_keeps_the_parameters():
    linear = nn.Linear(64, 32)
    q = QuantizedLinear(linear, matmul_recipe(MXFP8_RECIPE))
    assert q.weight is linear.weight and q.bias is linear.bias
    x = torch.randn(2, 5, 64)
    expected = (mx_rows(x.view(10, 64)) @ mx_rows(linear.weight.detach()).T).view(2, 5, 32) + linear.bias
    assert torch.equal(q(x), expected)


def _routing(num_tokens, num_experts, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k, generator=g)
    return index, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("quantize_dispatch", [False, True])
def test_quantized_experts_equal_a_token_by_token_reference(make_qwen3_moe, quantize_dispatch):
    """Per-token scales make every token's result independent of which tokens share its expert,
    so a loop over single tokens must reproduce the grouped expert loop."""
    model = make_qwen3_moe()
    experts = model.model.layers[0].mlp.experts
    converted = QuantizedExperts(experts, matmul_recipe(NVFP4_RECIPE), quantize_dispatch=quantize_dispatch)
    hidden = torch.randn(12, 64)
    index, weights = _routing(12, 4, 2, seed=1)
    out = converted(hidden, index, weights)

    with torch.no_grad():
        reference = torch.zeros_like(hidden)
        for t in range(12):
            token = mx_rows(hidden[t : t + 1]) if quantize_dispatch else hidden[t : t + 1]
            for slot in range(2):
                e = int(index[t, slot])
                gate, up = (
                    nvfp4_rows(token, "token") @ nvfp4_rows(experts.gate_up_proj[e], "tensor").T
                ).chunk(2, -1)
                h = experts.act_fn(gate) * up
                y = nvfp4_rows(h, "token") @ nvfp4_rows(experts.down_proj[e], "tensor").T
                if quantize_dispatch:
                    y = y.to(torch.bfloat16).float()
                reference[t] += (y * weights[t, slot])[0]
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert experts.gate_up_proj.grad is not None and torch.isfinite(experts.gate_up_proj.grad).all()


def test_convert_qwen3_moe_keeps_parameters_and_state_dict(make_qwen3_moe):
    model = make_qwen3_moe()
    before = {name: p for name, p in model.named_parameters()}
    conversion = convert_model(model, NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_linears=True))
    assert conversion.experts == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert len(conversion.linears) == 8  # q, k, v, o per layer
    assert "lm_head" not in conversion.linears and type(model.lm_head) is nn.Linear
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert isinstance(model.model.layers[1].mlp.experts, QuantizedExperts)
    assert isinstance(model.model.layers[1].self_attn.q_proj, QuantizedLinear)


def test_bf16_recipe_converts_nothing(make_qwen3_moe):
    model = make_qwen3_moe()
    conversion = convert_model(model, NumericsConfig(recipe="bf16"))
    assert conversion.experts == [] and conversion.linears == []
    assert not any(isinstance(m, (QuantizedExperts, QuantizedLinear)) for m in model.modules())


def test_convert_deepseek_v3_trains_the_experts_and_the_router(make_deepseek_v3):
    model = make_deepseek_v3()
    conversion = convert_model(model, NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_linears=True))
    assert conversion.experts == ["model.layers.1.mlp.experts"]  # layer 0 is dense (first_k_dense_replace)
    assert "model.layers.1.mlp.shared_experts.down_proj" in conversion.linears
    assert "model.layers.0.mlp.down_proj" in conversion.linears
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    experts = model.model.layers[1].mlp.experts
    assert torch.isfinite(loss) and experts.gate_up_proj.grad.abs().sum() > 0
    assert model.model.layers[1].mlp.gate.weight.grad.abs().sum() > 0  # router stays trainable


def test_converting_again_keeps_the_format_and_refuses_another(make_qwen3_moe):
    """The commands convert the policy and the samplers deep-copy it; a copy passing through
    ``convert_model`` again (an evaluation engine) is left as it is, never wrapped twice."""
    import copy

    config = NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_linears=True, quantize_dispatch=True)
    model = make_qwen3_moe()
    assert not is_converted(model)
    first = convert_model(model, config)
    modules = dict(model.named_modules())
    copied = copy.deepcopy(model)
    assert is_converted(copied)
    assert convert_model(model, config) == first == convert_model(copied, config)
    assert dict(model.named_modules()) == modules  # the same module objects, nothing re-wrapped
    assert isinstance(copied.model.layers[0].mlp.experts.gate_up_proj, nn.Parameter)
    for other in (
        NumericsConfig(recipe="mxfp8", quantize_linears=True, quantize_dispatch=True),
        NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_dispatch=True),  # linears differ
        NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_linears=True),  # dispatch differs
        NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_linears=True, quantize_dispatch=True,
                       nvfp4_activation_scale="tensor"),
        NumericsConfig(recipe="bf16"),
    ):
        with pytest.raises(ValueError, match=f"already converted.*numerics.recipe = '{other.recipe}'"):
            convert_model(copied, other)


def test_convert_rejects_a_model_without_experts():
    with pytest.raises(ValueError, match="Sequential has no fused MoE experts"):
        convert_model(nn.Sequential(nn.Linear(4, 4)), MXFP8_RECIPE)


def test_quantized_tiny_moe_trains_close_to_the_unquantised_one(make_qwen3_moe):
    """A repeated short sequence: every recipe must fit it, and the quantised loss must stay
    within 0.05 nats of the unquantised run after the same 25 Adam steps (measured gap: 0.008)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (4, 32), generator=g)
    final = {}
    for recipe in ("bf16", "nvfp4_fwd_mxfp8_bwd"):
        model = make_qwen3_moe(seed=0)
        convert_model(model, NumericsConfig(recipe=recipe))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(25):
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], (recipe, losses[0], losses[-1])
        final[recipe] = losses[-1]
    assert abs(final["nvfp4_fwd_mxfp8_bwd"] - final["bf16"]) < 0.05, final


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4_fwd_mxfp8_bwd"])
def test_a_quantised_model_trains_under_bf16_autocast(make_qwen3_moe, recipe_name):
    """``rl.bf16`` / ``sft.bf16`` with a ``[numerics]`` recipe: autocast makes the activations bf16
    while the weights stay float32, and does not reach the backward. The quantised matmuls run
    outside it, so the backward does not meet two dtypes, and each gradient comes back in its
    parameter's dtype, close to the one of the same step without autocast."""
    model = make_qwen3_moe()
    convert_model(model, NumericsConfig(recipe=recipe_name, quantize_linears=True))
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    grads = {}
    for autocast in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads[autocast] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert torch.isfinite(loss)
    assert grads[True].keys() == grads[False].keys()
    experts = "model.layers.1.mlp.experts.gate_up_proj"
    for name, grad in grads[True].items():
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all(), name
    cosine = F.cosine_similarity(grads[True][experts].flatten(), grads[False][experts].flatten(), dim=0)
    assert cosine > 0.9, float(cosine)
