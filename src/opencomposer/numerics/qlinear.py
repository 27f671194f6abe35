"""Quantised matmuls for training: forward in NVFP4 or MXFP8, backward in MXFP8.

Composer 2 report, section 6.1: the MoE forward runs in an NVFP4 variant (per-token FP32 scale),
the backward in MXFP8. For ``y = x @ w.T`` with ``x [T, K]``, ``w [N, K]`` a block-scaled GEMM needs
both operands blocked along the *reduction* dimension, so each product quantises along a different
axis:

=========================  ===========================  ======================================
product                    operands                     blocks run along
=========================  ===========================  ======================================
forward ``y = x @ w.T``    x, w in the forward format   K (last dim of both)
input grad ``dx = dy @ w`` dy (grad format), w (MXFP8)  N (last dim of dy, first dim of w)
weight grad ``dw = dy.T @ x``  dy (grad format), x (MXFP8)  T (first dim of both)
=========================  ===========================  ======================================

This is emulation: each operand is quantised exactly as its format dictates and dequantised back
to float32 (``fake_quantize``), and the product is an ordinary float32 matmul, which is what a
tensor core computes from the same codes up to the order of its float32 accumulation. The
backward quantises the high-precision ``x`` and ``w`` that the forward saved (a kernel would
re-quantise the saved BF16 copies column-wise), never the forward's rounded operands.

Straight-through: the rounding has no gradient of its own; ``dx`` and ``dw`` are the gradients of
the float32 product as if the forward operands were the unrounded ones. A reduction dimension that
is not a multiple of the block size is padded with zeros, which change no block maximum and add
nothing to any sum.

What this module is not: a speed-up. On CPU these kernels cost more than plain matmuls; they
exist so that training runs see exactly the numbers a low-precision GPU run would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from opencomposer.config import NumericsConfig
from opencomposer.numerics.division import Division
from opencomposer.numerics.mx import ScaleMode, dequantize_mx, quantize_mx
from opencomposer.numerics.nvfp4 import NVFP4_BLOCK, ScaleGranularity, dequantize_nvfp4, quantize_nvfp4


@dataclass(frozen=True)
class MXSpec:
    """Quantise to MX with these settings (``mx.quantize_mx``)."""

    elem_dtype: str = "e4m3"
    block_size: int = 32
    scale_mode: ScaleMode = "floor"


@dataclass(frozen=True)
class NVFP4Spec:
    """Quantise to NVFP4 with these settings (``nvfp4.quantize_nvfp4``)."""

    scale_granularity: ScaleGranularity = "token"
    division: Division = "exact"
    reciprocal_ulp: int = 0


QuantSpec = MXSpec | NVFP4Spec


def fake_quantize(x: torch.Tensor, spec: QuantSpec, dim: int = -1) -> torch.Tensor:
    """``x`` quantised with blocks along ``dim`` and dequantised back, in ``x``'s dtype and shape.

    With an NVFP4 ``token`` scale, each slice across the other dims (each row when ``dim=-1``)
    gets its own FP32 scale.
    """
    moved = x.detach().movedim(dim, -1)
    length = moved.shape[-1]
    block = spec.block_size if isinstance(spec, MXSpec) else NVFP4_BLOCK
    if length % block:
        moved = F.pad(moved, (0, block - length % block))
    moved = moved.contiguous()
    if isinstance(spec, MXSpec):
        out = dequantize_mx(quantize_mx(moved, spec.elem_dtype, spec.block_size, spec.scale_mode))
    else:
        out = dequantize_nvfp4(
            quantize_nvfp4(moved, spec.scale_granularity, spec.division, spec.reciprocal_ulp)
        )
    return out[..., :length].movedim(-1, dim).to(x.dtype)


@dataclass(frozen=True)
class MatmulRecipe:
    """How each operand of a linear layer's three products is quantised."""

    forward_input: QuantSpec
    """Activations ``x`` in the forward (blocks along K)."""
    forward_weight: QuantSpec
    """Weights ``w`` in the forward (blocks along K)."""
    backward_grad: MXSpec
    """Output gradients ``dy`` in both backward products."""
    backward_operand: MXSpec
    """``w`` and ``x`` where they meet ``dy`` in the backward."""


def matmul_recipe(config: NumericsConfig) -> MatmulRecipe | None:
    """The recipe for ``config.recipe``; ``None`` for ``bf16`` (no quantisation)."""
    if config.recipe == "bf16":
        return None
    mx_e4m3 = MXSpec("e4m3", 32, config.mx_scale_mode)
    backward_grad = MXSpec(config.mx_grad_dtype, 32, config.mx_scale_mode)
    if config.recipe == "mxfp8":
        return MatmulRecipe(mx_e4m3, mx_e4m3, backward_grad, mx_e4m3)
    if config.recipe == "nvfp4_fwd_mxfp8_bwd":
        return MatmulRecipe(
            NVFP4Spec(config.nvfp4_activation_scale, config.division, config.reciprocal_ulp),
            NVFP4Spec(config.nvfp4_weight_scale, config.division, config.reciprocal_ulp),
            backward_grad,
            mx_e4m3,
        )
    raise ValueError(f"numerics.recipe {config.recipe!r}: expected 'bf16', 'mxfp8' or 'nvfp4_fwd_mxfp8_bwd'")


class QuantizedMatmul(torch.autograd.Function):
    """``y [T, N] = x [T, K] @ w [N, K].T`` with every operand quantised per ``MatmulRecipe``."""

    # Under bf16 autocast the operands can differ in dtype (bf16 activations, float32 weights) and
    # autocast does not reach the backward: both passes run outside it, every operand cast to the
    # wider of the dtypes before it is quantised (an NVFP4 value need not fit in bf16), and each
    # gradient comes back in its input's dtype. So such a layer returns float32 under autocast
    # with float32 weights; with operands of one dtype nothing changes.
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, recipe: MatmulRecipe) -> torch.Tensor:
        ctx.recipe = recipe
        ctx.save_for_backward(x, weight)
        dtype = torch.promote_types(x.dtype, weight.dtype)
        with torch.autocast(x.device.type, enabled=False):
            x_q = fake_quantize(x.to(dtype), recipe.forward_input)
            return x_q @ fake_quantize(weight.to(dtype), recipe.forward_weight).T

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # grad_out [T, N]
        x, weight = ctx.saved_tensors
        recipe: MatmulRecipe = ctx.recipe
        dtype = torch.promote_types(grad_out.dtype, torch.promote_types(x.dtype, weight.dtype))
        grad_x = grad_weight = None
        with torch.autocast(x.device.type, enabled=False):
            if ctx.needs_input_grad[0]:  # [T, N] @ [N, K], reduction over N
                grad_x = (fake_quantize(grad_out.to(dtype), recipe.backward_grad, dim=-1)
                          @ fake_quantize(weight.to(dtype), recipe.backward_operand, dim=0)).to(x.dtype)
            if ctx.needs_input_grad[1]:  # [N, T] @ [T, K], reduction over T
                grad_weight = (fake_quantize(grad_out.to(dtype), recipe.backward_grad, dim=0).T
                               @ fake_quantize(x.to(dtype), recipe.backward_operand, dim=0)).to(weight.dtype)
        return grad_x, grad_weight, None


def quantized_linear(
    x: torch.Tensor, weight: torch.Tensor, recipe: MatmulRecipe, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` through ``QuantizedMatmul``: ``x [..., K]``, ``weight [N, K]`` -> ``[..., N]``.
    The bias is added in high precision (an epilogue, as in the kernels)."""
    y = QuantizedMatmul.apply(x.reshape(-1, x.shape[-1]), weight, recipe)
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` whose matmul goes through ``quantized_linear``; it keeps the original
    ``weight`` and ``bias`` parameters (same objects, same state-dict keys)."""

    def __init__(self, linear: nn.Linear, recipe: MatmulRecipe):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_linear(x, self.weight, self.recipe, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe}"


# ----------------------------------------------------------------------------------------------
# Expert-parallel dispatch and combine


class _DispatchQuantize(torch.autograd.Function):
    """Tokens travel to the experts in MXFP8; their gradients come back in BF16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: MXSpec) -> torch.Tensor:
        return fake_quantize(x, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(torch.bfloat16).to(grad.dtype), None


class _RoundBF16(torch.autograd.Function):
    """Expert outputs travel back (and their gradients out) in BF16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(torch.bfloat16).to(grad.dtype)


def dispatch_quantize(x: torch.Tensor, spec: MXSpec) -> torch.Tensor:
    """``x [T, H]`` as the experts receive it after an MXFP8 dispatch (blocks along H)."""
    return _DispatchQuantize.apply(x, spec)


def combine_round(y: torch.Tensor) -> torch.Tensor:
    """Expert outputs ``y [T, H]`` as the combine receives them: rounded to BF16."""
    return _RoundBF16.apply(y)
