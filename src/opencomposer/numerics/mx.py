"""MXFP8: OCP Microscaling v1.0 blocks of FP8 elements under one E8M0 power-of-two scale.

The format
----------
A tensor is cut along its last dimension into blocks of ``block_size`` (32) consecutive elements.
Each block stores one E8M0 scale ``X = 2^k`` and ``block_size`` FP8 codes ``P_i`` (E4M3 or E5M2),
and means ``X * P_i``. With a power-of-two scale the element grid of every block is the element
format's own grid shifted by ``k`` binades; nothing else about the values changes.

Choosing the scale
------------------
``floor`` (the OCP MX v1.0 conversion, section 6.3):
``k = floor(log2(amax)) - emax_elem``, where ``amax`` is the block's largest magnitude and
``emax_elem`` is the exponent of the element format's largest value (8 for E4M3, 15 for E5M2). The
block maximum then lands in the element format's top binade, at most 2^(emax+1) before scaling,
so values between the largest element (448 for E4M3) and the next power of two are *clipped*
(saturated) to it: up to 12.5% error on the block maximum for E4M3, in exchange for one more
binade of resolution at the bottom.

``rceil`` (NVIDIA's hardware path, ``cvt.rp.satfinite.ue8m0x2.f32``): ``k = ceil(log2(amax /
max_elem))`` with ``amax / max_elem`` rounded to float32 first. The smallest power of two that
never clips; it gives up that bottom binade instead.

Both clamp ``k`` to E8M0's range [-127, 127]. A block with a NaN gets the NaN scale (code 255) in
both modes. A block with an infinity gets the NaN scale under ``floor`` (``floor(log2(Inf))`` is
beyond E8M0, as the spec authors' reference emulation has it) and the largest scale 2^127 under
``rceil`` (``satfinite``). The elements of a NaN-scale block are stored as the element format's NaN
code; the block decodes to NaN whatever they are.

Elements: ``P_i = quantize(V_i / X)``, round to nearest even with saturation (``formats.py``).
Dividing by a power of two is exact (unless the quotient falls below FP32's normal range, where
it is far below the element format's smallest subnormal anyway), so it equals multiplication by
the exact reciprocal, which is how the fast path does it; the ``division`` option exists to prove
that an approximate reciprocal changes nothing (``division.py``).

Departures from torchao's ``to_mx`` (which we otherwise match bit for bit, see the tests): for a
block whose scale is code 0 (2^-127, only when every element is below ~2^-118), torchao divides by
2^-126 (``floor``) or 1 (``rceil``) instead of 2^-127, and it gives an infinite block the scale
2^120 (``floor``); we follow the specification.

Dequantisation multiplies in float32, so a decoded value outside float32's range (an element times
2^127, or below 2^-149) comes out as the nearest float32 (Inf or a rounded subnormal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from opencomposer.numerics.division import Division, check_division, divide_reference, reciprocal
from opencomposer.numerics.formats import (
    E8M0_BIAS,
    E8M0_NAN,
    FloatFormat,
    decode_e8m0,
    encode,
    encode_e8m0,
    encode_value_reference,
    get_format,
)

ScaleMode = Literal["floor", "rceil"]
MX_ELEMENT_FORMATS = ("e4m3", "e5m2")


@dataclass
class MXTensor:
    """An MX-quantised tensor: element codes and one E8M0 scale per block of the last dim."""

    data: torch.Tensor
    """uint8 element codes, same shape as the source ``[..., K]``."""
    scale: torch.Tensor
    """uint8 E8M0 codes ``[..., K // block_size]``."""
    elem_dtype: str
    block_size: int

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_mx(self, dtype)


def _check(x: torch.Tensor, elem_dtype: str, block_size: int, scale_mode: str) -> FloatFormat:
    if elem_dtype not in MX_ELEMENT_FORMATS:
        raise ValueError(f"MX elem_dtype {elem_dtype!r}: expected one of {MX_ELEMENT_FORMATS}")
    if scale_mode not in ("floor", "rceil"):
        raise ValueError(f"MX scale_mode {scale_mode!r}: expected 'floor' or 'rceil'")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"quantize_mx takes float32 or bfloat16, got {x.dtype}")
    if block_size <= 0 or x.ndim == 0 or x.shape[-1] % block_size:
        raise ValueError(
            f"quantize_mx: last dim of shape {tuple(x.shape)} must be a multiple of block_size {block_size}"
        )
    return get_format(elem_dtype)


def shared_scale(amax: torch.Tensor, fmt: FloatFormat, scale_mode: ScaleMode) -> torch.Tensor:
    """E8M0 codes of the block scales from the blocks' float32 ``amax`` (any shape)."""
    if scale_mode == "floor":
        # floor(log2(amax)) + 127 is amax's biased exponent field; zero and FP32 subnormals have
        # field 0 and clamp to code 0 like every other amax below 2^(emax - 127).
        field = (amax.view(torch.int32) >> 23) & 0xFF
        code = (field - fmt.emax).clamp(0, 2 * E8M0_BIAS)
        return torch.where(field == 0xFF, E8M0_NAN, code).to(torch.uint8)  # Inf or NaN in the block
    return encode_e8m0(amax / fmt.max_value, rounding="ceil")


def _exact_reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """float32 ``2^(127 - code)``: exact for every code (code 254 gives the subnormal 2^-127)."""
    code = scale.to(torch.int32)
    bits = (2 * E8M0_BIAS - code) << 23
    bits = torch.where(code == 2 * E8M0_BIAS, 1 << 22, bits)
    bits = torch.where(code == E8M0_NAN, 0x7FC00000, bits)
    return bits.view(torch.float32)


# Rows are processed in chunks of about this many elements, so that the float32 intermediate
# (the scaled elements) stays in cache and is reused instead of being a second full-size tensor.
# The per-block scale arithmetic of a chunk (2^15 blocks) then stays under torch's parallel grain
# size: tiny multi-threaded ops were 100x slower on a busy 2-core machine.
CHUNK_ELEMENTS = 1 << 20


def quantize_mx(
    x: torch.Tensor,
    elem_dtype: str = "e4m3",
    block_size: int = 32,
    scale_mode: ScaleMode = "floor",
    division: Division = "exact",
    reciprocal_ulp: int = 0,
) -> MXTensor:
    """Quantise ``x [..., K]`` (float32 or bfloat16, ``K % block_size == 0``) to MX.

    ``division="approx"`` divides by the scale through ``division.reciprocal`` (optionally
    nudged by ``reciprocal_ulp``) instead of the exact power-of-two reciprocal.
    """
    fmt = _check(x, elem_dtype, block_size, scale_mode)
    check_division(division, reciprocal_ulp)
    blocks = x.reshape(-1, x.shape[-1] // block_size, block_size)  # [R, B, block]
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(blocks.shape[:2], dtype=torch.uint8, device=x.device)
    rows = max(1, CHUNK_ELEMENTS // x.shape[-1])
    scaled = torch.empty(
        (min(rows, blocks.shape[0]), *blocks.shape[1:]), dtype=torch.float32, device=x.device
    )
    for start in range(0, blocks.shape[0], rows):
        chunk = blocks[start : start + rows]
        n = chunk.shape[0]
        if chunk.dtype != torch.float32:  # widen once, then work in place (exact for bfloat16)
            chunk = scaled[:n].copy_(chunk)
        amax = torch.maximum(chunk.amax(dim=-1), -chunk.amin(dim=-1))  # [n, B]; NaN propagates
        chunk_scale = shared_scale(amax, fmt, scale_mode)
        scale[start : start + n] = chunk_scale
        if division == "exact":
            inverse = _exact_reciprocal(chunk_scale)
        else:
            inverse = reciprocal(decode_e8m0(chunk_scale), reciprocal_ulp)
        torch.mul(chunk, inverse.unsqueeze(-1), out=scaled[:n])
        chunk_codes = encode(scaled[:n], fmt, out=codes[start : start + n])  # saturating, nearest even
        nan_blocks = chunk_scale == E8M0_NAN
        if bool(nan_blocks.any()):
            chunk_codes[nan_blocks] = fmt.nan_code
    return MXTensor(codes.view(x.shape), scale.view(*x.shape[:-1], -1), elem_dtype, block_size)


def dequantize_mx(t: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``X * P_i`` for every element, rounded once to ``dtype``; shape of ``t.data``.

    float32 and bfloat16 share an exponent range, so in either the product of an element (at most
    4 significant bits) and a power of two is computed exactly and rounded once; both are done in
    place in the output. Other dtypes go through a float32 buffer.
    """
    fmt = get_format(t.elem_dtype)
    codes = t.data.reshape(-1, t.data.shape[-1] // t.block_size, t.block_size)  # [R, B, block]
    scale = t.scale.reshape(codes.shape[:2])
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    rows = max(1, CHUNK_ELEMENTS // t.data.shape[-1])
    in_place = dtype in (torch.float32, torch.bfloat16)
    buffer = (
        None if in_place else torch.empty((min(rows, codes.shape[0]), *codes.shape[1:]), device=codes.device)
    )
    for start in range(0, codes.shape[0], rows):
        end = min(start + rows, codes.shape[0])
        chunk = out[start:end] if in_place else buffer[: end - start]
        chunk.copy_(codes[start:end].view(fmt.torch_dtype))  # exact: every FP8 value fits both dtypes
        chunk.mul_(decode_e8m0(scale[start:end]).to(chunk.dtype).unsqueeze(-1))
        if not in_place:
            out[start:end] = chunk
    return out.view(t.data.shape)


# ----------------------------------------------------------------------------------------------
# Slow exact reference


def quantize_mx_reference(
    x: torch.Tensor,
    elem_dtype: str = "e4m3",
    block_size: int = 32,
    scale_mode: ScaleMode = "floor",
    division: Division = "exact",
    reciprocal_ulp: int = 0,
) -> MXTensor:
    """The OCP algorithm one block at a time in Python: ``frexp`` for the exact ``floor(log2)``,
    NumPy float32 for the one rounded division of ``rceil`` and for the element division, and the
    exact rational element encoder. Independent of every trick in ``quantize_mx``."""
    fmt = _check(x, elem_dtype, block_size, scale_mode)
    check_division(division, reciprocal_ulp)
    rows = x.to(torch.float32).reshape(-1, block_size).tolist()
    data: list[list[int]] = []
    scales: list[int] = []
    for block in rows:
        code = _reference_scale(block, fmt, scale_mode)
        scales.append(code)
        if code == E8M0_NAN:
            data.append([fmt.nan_code] * block_size)
            continue
        scale = np.float32(math.ldexp(1.0, code - E8M0_BIAS))
        data.append(
            [
                encode_value_reference(float(divide_reference(v, scale, division, reciprocal_ulp)), fmt)
                for v in block
            ]
        )
    return MXTensor(
        torch.tensor(data, dtype=torch.uint8).view(x.shape),
        torch.tensor(scales, dtype=torch.uint8).view(*x.shape[:-1], -1),
        elem_dtype,
        block_size,
    )


def _reference_scale(block: list[float], fmt: FloatFormat, scale_mode: str) -> int:
    if any(math.isnan(v) for v in block):
        return E8M0_NAN
    amax = max(abs(v) for v in block)
    if scale_mode == "floor":
        if math.isinf(amax):
            return E8M0_NAN
        if amax == 0.0:
            return 0
        mantissa, exponent = math.frexp(amax)  # amax = mantissa * 2^exponent, mantissa in [0.5, 1)
        return min(max(exponent - 1 - fmt.emax + E8M0_BIAS, 0), 2 * E8M0_BIAS)
    with np.errstate(over="ignore"):
        descale = float(np.float32(amax) / np.float32(fmt.max_value))
    if math.isinf(descale):
        return 2 * E8M0_BIAS
    if descale == 0.0:
        return 0
    mantissa, exponent = math.frexp(descale)
    ceil_log2 = exponent - 1 if mantissa == 0.5 else exponent
    return min(max(ceil_log2 + E8M0_BIAS, 0), 2 * E8M0_BIAS)
