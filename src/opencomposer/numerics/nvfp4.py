"""NVFP4, and the Composer 2 variant with one FP32 scale per token.

The format
----------
NVIDIA's NVFP4 stores FP4 E2M1 elements (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), two per
byte, in blocks of 16 along the last dimension. Each block has an FP8 **E4M3** scale (not a power of
two: 3 mantissa bits, so the block maximum can be mapped close to 6), and the whole tensor has one
FP32 scale on top, because E4M3 alone spans only 2^-9..448. A value decodes as
``e2m1 * e4m3_block_scale * global_scale``.

Scale per token (Composer 2 report, section 6.1): with one global scale per tensor, the codes of
every token depend on the largest value anywhere in the batch, so training depends on batch
composition and a later token can change how an earlier one is rounded. The report instead keeps
one FP32 scale per token (per row of the activation matrix). ``scale_granularity="token"`` does
that; ``"tensor"`` is standard NVFP4. A row-wise scale factors out of a matrix product exactly like
a per-tensor one (it multiplies an output row), so the GEMM cost is the same.

Arithmetic (NVIDIA Transformer Engine's reference quantiser and kernels, in float32, in this order)
-------------------------------------------------------------------------------------------------
1. ``amax``: largest magnitude of the tensor (``tensor``) or of the row (``token``).
2. encode scale ``S_enc = (448 * 6) / amax``, capped at the largest float32; 1 when ``amax`` is 0
   or infinite (``S_enc`` would be infinite or 0).
3. decode scale ``S_dec = 1 / S_enc``. This is what ``global_scale`` stores.
4. per block: ``block_scale = E4M3(block_amax * (S_enc * RN(1/6)))`` (saturating, nearest even;
   ``RN(1/6)`` is a float32 constant, not a division).
5. per block: element multiplier ``m = 1 / (decoded block_scale * S_dec)``, capped at the largest
   float32 (an all-zero block has scale 0 and multiplier FLT_MAX, which maps its zeros to zero).
6. elements: ``E2M1(x * m)``, saturating at 6, nearest even.

Steps 2, 3 and 5 are the divisions that the report says must be IEEE-exact; ``division="approx"``
computes each as a multiplication by a (possibly nudged) reciprocal (``division.py``). Dequantising
computes ``(e2m1 * block_scale) * global_scale``: the first product is exact (2 x 4 significant
bits), so each value is rounded once.

NaN: a row (or tensor) with a NaN gets a NaN global scale and NaN block scales, so it decodes to
NaN (E2M1 itself has no NaN; its codes there are +-6).

Zeros, as Transformer Engine writes them: a scaled element that is exactly zero, of either sign,
encodes as +0 (code 0), since TE's reference puts -0.0 in the +0 bucket (``x >= 0.0``); a negative
value that rounds to zero keeps its sign (code 8), as there. So an all-zero block, +0 or -0, has a
+0 block scale and +0 codes (step 1 takes the block maximum as a magnitude, never -0; once it
encoded a -0 scale, a NaN multiplier and -6 codes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from opencomposer.numerics.division import Division, check_division, divide, divide_reference
from opencomposer.numerics.formats import (
    E2M1,
    E4M3,
    FP32_MAX,
    decode,
    decode_code_reference,
    encode,
    encode_value_reference,
    pack_fp4,
    unpack_fp4,
)

NVFP4_BLOCK = 16
ScaleGranularity = Literal["token", "tensor"]
GLOBAL_RANGE = 448.0 * 6.0  # E4M3 max * E2M1 max: the product range of the two levels
INV_E2M1_MAX = float(np.float32(1.0) / np.float32(6.0))  # RN(1/6) in float32, a constant
CHUNK_ELEMENTS = 1 << 22  # fewer, larger steps: each op is a parallel region, costly on busy cores


@dataclass
class NVFP4Tensor:
    """An NVFP4-quantised tensor ``[..., K]`` with ``K % 16 == 0``."""

    data: torch.Tensor
    """uint8 ``[..., K // 2]``: E2M1 codes packed two per byte, element 2i in the low nibble."""
    block_scale: torch.Tensor
    """uint8 ``[..., K // 16]``: E4M3 codes of the block scales."""
    global_scale: torch.Tensor
    """float32 decode scale ``S_dec``: shape ``[...]`` (one per row) for ``token``, ``[]`` for
    ``tensor``."""
    scale_granularity: ScaleGranularity

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.data.shape[:-1], self.data.shape[-1] * 2))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_nvfp4(self, dtype)


def _check(x: torch.Tensor, scale_granularity: str, division: str, reciprocal_ulp: int) -> None:
    if scale_granularity not in ("token", "tensor"):
        raise ValueError(f"NVFP4 scale_granularity {scale_granularity!r}: expected 'token' or 'tensor'")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"quantize_nvfp4 takes float32 or bfloat16, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(
            f"quantize_nvfp4: last dim of shape {tuple(x.shape)} must be a multiple of {NVFP4_BLOCK}"
        )
    check_division(division, reciprocal_ulp)


def quantize_nvfp4(
    x: torch.Tensor,
    scale_granularity: ScaleGranularity = "token",
    division: Division = "exact",
    reciprocal_ulp: int = 0,
) -> NVFP4Tensor:
    """Quantise ``x [..., K]`` (float32 or bfloat16) to NVFP4; see the module docstring."""
    _check(x, scale_granularity, division, reciprocal_ulp)
    k = x.shape[-1]
    blocks = x.reshape(-1, k // NVFP4_BLOCK, NVFP4_BLOCK)  # [R, B, 16]
    rows = max(1, CHUNK_ELEMENTS // k)  # row chunks keep the float32 intermediates in cache
    block_amax = torch.empty(blocks.shape[:2], dtype=torch.float32, device=x.device)  # [R, B]
    for start in range(0, blocks.shape[0], rows):
        chunk = blocks[start : start + rows]
        # abs: an all-zero block of -0.0 has amax -0 and -amin +0, and maximum keeps the -0, which
        # would encode a -0 block scale and -6 codes where Transformer Engine writes +0
        block_amax[start : start + rows] = torch.maximum(chunk.amax(dim=-1), -chunk.amin(dim=-1)).abs()
    if scale_granularity == "token":
        amax = block_amax.amax(dim=-1, keepdim=True)  # [R, 1]
    else:
        amax = block_amax.amax().reshape(1, 1)
    s_enc = divide(GLOBAL_RANGE, amax, division, reciprocal_ulp).clamp(max=FP32_MAX)
    s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    s_dec = divide(1.0, s_enc, division, reciprocal_ulp)
    block_scale = encode(block_amax * (s_enc * INV_E2M1_MAX), E4M3)  # [R, B]
    multiplier = divide(1.0, decode(block_scale, E4M3) * s_dec, division, reciprocal_ulp).clamp(max=FP32_MAX)
    packed = torch.empty(blocks.shape[0], k // 2, dtype=torch.uint8, device=x.device)
    scaled = torch.empty(
        (min(rows, blocks.shape[0]), *blocks.shape[1:]), dtype=torch.float32, device=x.device
    )
    for start in range(0, blocks.shape[0], rows):
        chunk = blocks[start : start + rows]
        n = chunk.shape[0]
        torch.mul(chunk, multiplier[start : start + n].unsqueeze(-1), out=scaled[:n])
        scaled[:n].add_(0.0)  # -0 + 0 = +0: a zero encodes as +0 whatever its sign (module doc)
        packed[start : start + n] = pack_fp4(encode(scaled[:n], E2M1).view(n, k))
    lead = x.shape[:-1]
    global_scale = s_dec.view(lead) if scale_granularity == "token" else s_dec.view(())
    return NVFP4Tensor(
        packed.view(*lead, k // 2),
        block_scale.view(*lead, k // NVFP4_BLOCK),
        global_scale,
        scale_granularity,
    )


def dequantize_nvfp4(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(e2m1 * block_scale) * global_scale`` in float32, returned as ``dtype``; shape ``t.shape``."""
    k = t.data.shape[-1] * 2
    packed = t.data.reshape(-1, k // 2)  # [R, K/2]
    block_scale = decode(t.block_scale.reshape(packed.shape[0], -1), E4M3).unsqueeze(-1)  # [R, B, 1]
    if t.scale_granularity == "token":
        global_scale = t.global_scale.reshape(-1, 1, 1)  # [R, 1, 1]
    else:
        global_scale = t.global_scale.expand(packed.shape[0], 1, 1)
    out = torch.empty(
        packed.shape[0], k // NVFP4_BLOCK, NVFP4_BLOCK, dtype=torch.float32, device=packed.device
    )
    rows = max(1, CHUNK_ELEMENTS // k)
    for start in range(0, packed.shape[0], rows):
        end = min(start + rows, packed.shape[0])
        values = out[start:end]
        decode(unpack_fp4(packed[start:end]), E2M1, out=values.view(end - start, k))
        values.mul_(block_scale[start:end]).mul_(global_scale[start:end])  # exact, then one rounding
    return out.view(t.shape).to(dtype)


# ----------------------------------------------------------------------------------------------
# Slow exact reference


def quantize_nvfp4_reference(
    x: torch.Tensor,
    scale_granularity: ScaleGranularity = "token",
    division: Division = "exact",
    reciprocal_ulp: int = 0,
) -> NVFP4Tensor:
    """The six steps one scalar at a time in NumPy float32 (each operation one IEEE rounding),
    with the exact rational encoders. Independent of the vectorised path."""
    _check(x, scale_granularity, division, reciprocal_ulp)
    k = x.shape[-1]
    rows = x.to(torch.float32).reshape(-1, k).cpu().numpy()
    if scale_granularity == "token":
        groups = [rows[i : i + 1] for i in range(rows.shape[0])]
    else:
        groups = [rows]
    codes, block_scales, global_scales = [], [], []
    fp32_max = np.float32(FP32_MAX)
    for group in groups:
        amax = np.float32(np.max(np.abs(group)))  # NaN propagates through np.max
        s_enc = divide_reference(np.float32(GLOBAL_RANGE), amax, division, reciprocal_ulp)
        if not math.isnan(s_enc):
            s_enc = min(s_enc, fp32_max)
        if amax == 0 or s_enc == 0:
            s_enc = np.float32(1.0)
        s_dec = divide_reference(np.float32(1.0), s_enc, division, reciprocal_ulp)
        global_scales.append(float(s_dec))
        for row in group:
            row_codes, row_scales = [], []
            for start in range(0, k, NVFP4_BLOCK):
                block = row[start : start + NVFP4_BLOCK]
                block_amax = np.float32(np.max(np.abs(block)))
                with np.errstate(over="ignore", invalid="ignore"):
                    raw_scale = np.float32(block_amax * np.float32(s_enc * np.float32(INV_E2M1_MAX)))
                scale_code = encode_value_reference(float(raw_scale), E4M3)
                row_scales.append(scale_code)
                decoded = np.float32(decode_code_reference(scale_code, E4M3))
                with np.errstate(over="ignore", invalid="ignore"):
                    multiplier = divide_reference(
                        np.float32(1.0), np.float32(decoded * s_dec), division, reciprocal_ulp
                    )
                    if not math.isnan(multiplier):
                        multiplier = min(multiplier, fp32_max)
                    row_codes.extend(
                        encode_value_reference(float(np.float32(v * multiplier) + np.float32(0.0)), E2M1)
                        for v in block
                    )
            codes.append(row_codes)
            block_scales.append(row_scales)
    lead = x.shape[:-1]
    code_tensor = torch.tensor(codes, dtype=torch.uint8)
    global_scale = torch.tensor(global_scales, dtype=torch.float32)
    return NVFP4Tensor(
        pack_fp4(code_tensor).view(*lead, k // 2),
        torch.tensor(block_scales, dtype=torch.uint8).view(*lead, k // NVFP4_BLOCK),
        global_scale.view(lead) if scale_granularity == "token" else global_scale.view(()),
        scale_granularity,
    )
