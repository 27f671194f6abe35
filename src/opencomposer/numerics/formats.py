"""Bit-exact codecs for the small floating-point formats of low-precision training.

The formats
-----------
A minifloat with ``E`` exponent bits, ``M`` mantissa bits and bias ``B`` stores a sign ``s``, a
biased exponent ``e`` and a mantissa ``m``. Its value is ``(-1)^s * 2^(e - B) * (1 + m / 2^M)`` for
``e >= 1`` (normal) and ``(-1)^s * 2^(1 - B) * (m / 2^M)`` for ``e == 0`` (subnormal: the last
binade is spread evenly down to zero, so there is a +0 and a -0). The three element formats used
here differ in what they do with the top of the range:

============  ====  ====  ====  ===========  =====================================================
format        E     M     B     largest      specials
============  ====  ====  ====  ===========  =====================================================
FP8 E4M3      4     3     7     448          "fn": no infinities; only S.1111.111 is NaN, so the
                                             top binade gains 1.5*2^8, 1.625*2^8 and 1.75*2^8=448
FP8 E5M2      5     2     15    57344        IEEE-like: exponent 11111 is Inf (m=0) or NaN (m!=0)
FP4 E2M1      2     1     1     6            none: the 16 codes are 0, 0.5, 1, 1.5, 2, 3, 4, 6
                                             and their negatives
============  ====  ====  ====  ===========  =====================================================

The scale format **E8M0** is an unsigned exponent byte: code ``c`` means ``2^(c - 127)``, from
``2^-127`` (code 0) to ``2^127`` (code 254); code 255 is NaN. There is no zero and no sign.

Rounding
--------
Encoding rounds to nearest, ties to even (the candidate whose code has a 0 mantissa LSB), as the
OCP OFP8 and MX v1.0 specifications and NVIDIA's ``cvt.rn`` conversions do. Subnormals are
produced, never flushed. The sign of zero and of NaN is kept.

Saturation
----------
Block-scaled formats (MX, NVFP4) pick the scale so that the block maximum lands at or just below
the largest element value; anything above it is rounding noise or clipping that must not turn into
Inf/NaN. So encoding *saturates* by default: a finite value or an infinity beyond the largest
finite magnitude becomes +-largest (OCP's "saturating conversion", NVIDIA's ``.satfinite``).
``saturate=False`` gives the overflowing conversion instead: E5M2 rounds to Inf past the rounding
boundary (61440), E4M3 to NaN past its boundary (464). E2M1 has neither Inf nor NaN, so it always
saturates, and a NaN input encodes as +-6 (what ``.satfinite`` does for formats without NaN).

Paths
-----
``encode``/``decode`` are the fast vectorised paths. FP8 uses PyTorch's native casts (checked bit
for bit against the reference in the tests; PyTorch's E5M2 cast does not saturate, so a clamp goes
first). E2M1, which PyTorch cannot cast to, is rounded arithmetically, binade by binade with
``torch.round`` (half to even). ``encode_reference`` is the slow exact
reference: it decodes every finite code from the bit-field formula and picks the nearest value in
exact rational arithmetic, so it shares no code or trick with the fast paths.

What this module is not: block scaling (``mx.py``, ``nvfp4.py``) and any choice of scale.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import torch

FP32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class FloatFormat:
    """A sign-exponent-mantissa minifloat of at most 8 bits (see the module docstring)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_value: float
    """Largest finite magnitude."""
    nan_style: str
    """``"fn"``: only all-ones (S.1..1.1..1) is NaN, no Inf. ``"ieee"``: all-ones exponent is Inf
    (zero mantissa) or NaN. ``"none"``: every code is a finite number."""
    torch_dtype: torch.dtype | None
    """PyTorch's storage dtype for this format when PyTorch can cast to it."""

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exponent_bits + self.mantissa_bits)

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite value (OCP MX's ``emax_elem``)."""
        return math.frexp(self.max_value)[1] - 1

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal value."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Code of the largest finite positive value."""
        return _positive_values(self).index(self.max_value)

    @property
    def nan_code(self) -> int | None:
        """Canonical positive NaN code (the sign bit is added for negative NaN)."""
        if self.nan_style == "none":
            return None
        return self.sign_bit - 1  # S=0, all exponent and mantissa bits set

    @property
    def inf_code(self) -> int | None:
        if self.nan_style != "ieee":
            return None
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits


E4M3 = FloatFormat("e4m3", 4, 3, 7, 448.0, "fn", torch.float8_e4m3fn)
E5M2 = FloatFormat("e5m2", 5, 2, 15, 57344.0, "ieee", torch.float8_e5m2)
E2M1 = FloatFormat("e2m1", 2, 1, 1, 6.0, "none", None)
FORMATS: dict[str, FloatFormat] = {f.name: f for f in (E4M3, E5M2, E2M1)}


def get_format(name: str | FloatFormat) -> FloatFormat:
    """The format called ``name`` (``"e4m3"``, ``"e5m2"`` or ``"e2m1"``)."""
    if isinstance(name, FloatFormat):
        return name
    if name not in FORMATS:
        raise ValueError(f"unknown element format {name!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[name]


# ----------------------------------------------------------------------------------------------
# Decoding


def decode_code_reference(code: int, fmt: FloatFormat) -> float:
    """The value of one code, straight from the bit-field formula (exact as a Python float)."""
    if not 0 <= code < (1 << fmt.bits):
        raise ValueError(f"code {code} is outside the {fmt.bits}-bit range of {fmt.name}")
    sign = -1.0 if code & fmt.sign_bit else 1.0
    exponent = (code >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    mantissa = code & ((1 << fmt.mantissa_bits) - 1)
    all_ones = (1 << fmt.exponent_bits) - 1
    if fmt.nan_style == "ieee" and exponent == all_ones:
        return sign * math.inf if mantissa == 0 else math.nan
    if fmt.nan_style == "fn" and exponent == all_ones and mantissa == (1 << fmt.mantissa_bits) - 1:
        return math.nan
    if exponent == 0:
        return sign * math.ldexp(mantissa, fmt.emin - fmt.mantissa_bits)
    return sign * math.ldexp((1 << fmt.mantissa_bits) + mantissa, exponent - fmt.bias - fmt.mantissa_bits)


@cache
def _decode_table(fmt: FloatFormat) -> torch.Tensor:
    return torch.tensor([decode_code_reference(c, fmt) for c in range(1 << fmt.bits)], dtype=torch.float32)


@cache
def _positive_values(fmt: FloatFormat) -> list[float]:
    """Finite values of the non-negative codes, indexed by code (NaN/Inf codes cut off)."""
    values = []
    for code in range(fmt.sign_bit):
        value = decode_code_reference(code, fmt)
        if not math.isfinite(value):
            break
        values.append(value)
    return values


def decode(codes: torch.Tensor, fmt: str | FloatFormat, out: torch.Tensor | None = None) -> torch.Tensor:
    """Codes (uint8, one per element, any shape) to their exact float32 values (written into
    ``out``, a float32 tensor of the same shape, when given)."""
    fmt = get_format(fmt)
    if codes.dtype != torch.uint8:
        raise TypeError(f"decode expects uint8 codes, got {codes.dtype}")
    if fmt.torch_dtype is not None:
        if out is not None:
            return out.copy_(codes.view(fmt.torch_dtype))
        return codes.view(fmt.torch_dtype).to(torch.float32)
    if fmt.bits < 8 and codes.numel() and int(codes.max()) >= (1 << fmt.bits):
        raise ValueError(f"{fmt.name} codes must be below {1 << fmt.bits}, got {int(codes.max())}")
    values = _decode_table(fmt).to(codes.device)[codes.long()]
    return values if out is None else out.copy_(values)


# ----------------------------------------------------------------------------------------------
# Encoding: slow exact reference


def encode_value_reference(value: float | Fraction, fmt: FloatFormat, saturate: bool = True) -> int:
    """Code of one real number, in exact rational arithmetic over the list of all finite values.

    The non-negative codes of these formats are ordered like their values, so the two neighbours
    of ``|value|`` are found by bisection in the decoded list; the nearer one wins, and on a tie
    the code with an even mantissa (even code) wins. Beyond
    the largest value the input saturates, or (``saturate=False``) rounds to Inf/NaN once it passes
    the midpoint between the largest value and the next step of the format's grid.
    """
    if isinstance(value, float) and math.isnan(value):
        negative = math.copysign(1.0, value) < 0
        if fmt.nan_style == "none":
            return fmt.max_code | (fmt.sign_bit if negative else 0)
        return fmt.nan_code | (fmt.sign_bit if negative else 0)
    if isinstance(value, float):
        negative = math.copysign(1.0, value) < 0
        if math.isinf(value):
            magnitude_code = _overflow_code(fmt, saturate)
            return magnitude_code | (fmt.sign_bit if negative else 0)
        magnitude = Fraction(abs(value))
    else:
        negative = value < 0
        magnitude = abs(value)
    sign = fmt.sign_bit if negative else 0
    values = _positive_values(fmt)
    top = Fraction(values[-1])
    # One grid step above the largest value: where the next code would sit if the range went on.
    step = Fraction(2) ** (fmt.emax - fmt.mantissa_bits)
    if magnitude > top:
        boundary = top + step / 2
        top_wins_tie = magnitude == boundary and fmt.max_code % 2 == 0  # ties go to the even code
        if saturate or magnitude < boundary or top_wins_tie:
            return fmt.max_code | sign
        return _overflow_code(fmt, saturate) | sign
    above = bisect.bisect_left(values, magnitude)  # values[above - 1] < magnitude <= values[above]
    if values[above] == magnitude or above == 0:
        return above | sign
    below_error = magnitude - Fraction(values[above - 1])
    above_error = Fraction(values[above]) - magnitude
    if below_error < above_error or (below_error == above_error and (above - 1) % 2 == 0):
        return above - 1 | sign
    return above | sign


def _overflows(magnitude: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Where a non-saturating conversion leaves the finite range: past the midpoint between the
    largest value and the next grid step, or on it when the largest code is odd (ties to even)."""
    boundary = fmt.max_value + 2.0 ** (fmt.emax - fmt.mantissa_bits) / 2
    if fmt.max_code % 2:
        return magnitude >= boundary
    return magnitude > boundary


def _overflow_code(fmt: FloatFormat, saturate: bool) -> int:
    if saturate or fmt.nan_style == "none":
        return fmt.max_code
    return fmt.inf_code if fmt.nan_style == "ieee" else fmt.nan_code


def encode_reference(x: torch.Tensor, fmt: str | FloatFormat, saturate: bool = True) -> torch.Tensor:
    """Slow exact encoder (one Python call per element) for checking the fast paths."""
    fmt = get_format(fmt)
    flat = x.detach().to(torch.float32).flatten().tolist()
    codes = [encode_value_reference(v, fmt, saturate) for v in flat]
    return torch.tensor(codes, dtype=torch.uint8).view(x.shape)


# ----------------------------------------------------------------------------------------------
# Encoding: fast paths


def encode(
    x: torch.Tensor, fmt: str | FloatFormat, saturate: bool = True, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Round float32/bfloat16 values to ``fmt`` (nearest even) and return the uint8 codes.

    Same shape as ``x``; one code per element (E2M1 codes are not packed here, see ``pack_fp4``).
    ``out``: a uint8 tensor of ``x``'s shape to write the codes into (saturating mode only).
    """
    fmt = get_format(fmt)
    if out is not None and not saturate:
        raise ValueError("encode(out=...) supports only saturate=True")
    if fmt is E2M1:
        codes = _encode_e2m1(x)
        return codes if out is None else out.copy_(codes)
    if fmt.nan_style == "ieee" and saturate:
        # PyTorch's E5M2 cast overflows to Inf; clamp first (clamp keeps NaN).
        x = x.clamp(-fmt.max_value, fmt.max_value)
    elif fmt.nan_style == "fn" and not saturate:
        # PyTorch's E4M3 cast saturates; mark what overflows before casting.
        overflow = _overflows(x.abs(), fmt)
        codes = x.to(fmt.torch_dtype).view(torch.uint8)
        return torch.where(overflow, (codes & fmt.sign_bit) | fmt.nan_code, codes)
    if out is not None:
        out.view(fmt.torch_dtype).copy_(x)
        return out
    return x.to(fmt.torch_dtype).view(torch.uint8)


def _encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 by arithmetic: the grid has spacing 1/2 on [0, 2], 1 on [2, 4] and 2 on [4, 6], so
    with ``e = (a >= 2) + (a >= 4)`` the magnitude code is ``round(a * 2^(1-e)) + 2e``: the
    product is exact (a power of two) and ``torch.round`` rounds half to even, which here is also
    the even code. Saturation is a clamp to 6; a NaN becomes +-6 with its sign."""
    x32 = x.to(torch.float32)
    magnitude = x32.abs().clamp_(max=E2M1.max_value)
    binade = (magnitude >= 2.0).to(torch.uint8) + (magnitude >= 4.0).to(torch.uint8)  # e in {0, 1, 2}
    step = torch.where(binade == 0, 2.0, torch.where(binade == 1, 1.0, 0.5))  # 2^(1-e)
    code = magnitude.mul_(step).round_().to(torch.uint8) + 2 * binade
    nan = torch.isnan(x32)
    if bool(nan.any()):
        code[nan] = E2M1.max_code
    return code | (torch.signbit(x32).to(torch.uint8) << 3)


# ----------------------------------------------------------------------------------------------
# FP4 packing


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last dim: element 2i in the low nibble.

    ``[..., 2n]`` uint8 codes below 16 -> ``[..., n]`` uint8 bytes.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    pairs = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_fp4``: ``[..., n]`` bytes -> ``[..., 2n]`` codes."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).view(*packed.shape[:-1], packed.shape[-1] * 2)


# ----------------------------------------------------------------------------------------------
# E8M0 scales

E8M0_BIAS = 127
E8M0_NAN = 255


def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) to float32 ``2^(code - 127)``; code 0 is the FP32 subnormal 2^-127 and
    code 255 is NaN. Built from bits, so every value is exact."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"decode_e8m0 expects uint8 codes, got {codes.dtype}")
    exponent_field = codes.to(torch.int32)
    bits = exponent_field << 23
    bits = torch.where(exponent_field == 0, 1 << 22, bits)  # 2^-127 = 0x00400000
    bits = torch.where(exponent_field == E8M0_NAN, 0x7FC00000, bits)
    return bits.view(torch.float32)


def encode_e8m0(x: torch.Tensor, rounding: str = "floor") -> torch.Tensor:
    """Positive float32 values to E8M0 codes, rounding the power of two down (``"floor"``: largest
    2^k <= x) or up (``"ceil"``: smallest 2^k >= x), then clamping to [2^-127, 2^127]. NaN -> 255;
    +Inf -> 254 (saturating, like ``cvt.rp.satfinite.ue8m0x2.f32``); the sign is ignored.

    ``torch.float8_e8m0fnu`` casts round to *nearest* power of two, which is neither mode, which
    is why scales are never produced by a dtype cast here.
    """
    x32 = x.to(torch.float32).abs()
    bits = x32.view(torch.int32)
    field = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    subnormal = field == 0  # FP32 zero and subnormals, all below 2^-126
    if rounding == "floor":
        exponent = torch.where(subnormal, -127, field - 127)
    elif rounding == "ceil":
        exponent = field - 127 + (mantissa != 0).to(torch.int32)
        # at or below 2^-127 (0x00400000) round up to 2^-127; above it, to 2^-126
        exponent = torch.where(subnormal, torch.where(mantissa > (1 << 22), -126, -127), exponent)
    else:
        raise ValueError(f"unknown E8M0 rounding {rounding!r}; expected 'floor' or 'ceil'")
    code = (exponent.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).to(torch.uint8)
    code = torch.where(torch.isinf(x32), 254, code)
    return torch.where(torch.isnan(x32), E8M0_NAN, code)
