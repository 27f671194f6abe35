"""Bit-exact tests of the FP8 / FP4 / E8M0 codecs against golden codes derived from the formats.

Notation in the derivations: a code is written sign.exponent.mantissa in binary; E4M3 has bias 7,
E5M2 bias 15, E2M1 bias 1 (see the table in ``formats.py``).
"""

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opencomposer.numerics.formats import (
    E2M1,
    E4M3,
    E5M2,
    FORMATS,
    decode,
    decode_code_reference,
    decode_e8m0,
    encode,
    encode_e8m0,
    encode_reference,
    get_format,
    pack_fp4,
    unpack_fp4,
)

NAN, INF = float("nan"), float("inf")

# (value, saturating code, non-saturating code)
E4M3_GOLDEN = [
    (1.0, 0x38, 0x38),  # 2^0: exponent 0+7 = 0111, mantissa 000 -> 0.0111.000
    (448.0, 0x7E, 0x7E),  # 1.75 * 2^8: exponent 15 = 1111, mantissa 110 (111 is NaN)
    (-448.0, 0xFE, 0xFE),
    (2.0**-6, 0x08, 0x08),  # smallest normal: exponent 0001, mantissa 000
    (2.0**-9, 0x01, 0x01),  # smallest subnormal: 2^(1-7) * 1/8
    (7 * 2.0**-9, 0x07, 0x07),  # largest subnormal 0.875 * 2^-6
    (2.0**-10, 0x00, 0x00),  # half the smallest subnormal: tie between 0x00 and 0x01 -> even 0x00
    (2.0**-10 * 1.0001, 0x01, 0x01),  # just past that tie
    (3 * 2.0**-10, 0x02, 0x02),  # 1.5 * 2^-9: tie between 0x01 and 0x02 -> even 0x02
    (1.0625, 0x38, 0x38),  # midway 1.0 (0x38) and 1.125 (0x39) -> even mantissa 000
    (1.1875, 0x3A, 0x3A),  # midway 1.125 (0x39) and 1.25 (0x3A) -> even mantissa 010
    (464.0, 0x7E, 0x7E),  # midway 448 and the next grid step 480 (0x7F, NaN): tie -> even 0x7E
    (470.0, 0x7E, 0x7F),  # past the midpoint: saturates, or overflows to NaN
    (1e9, 0x7E, 0x7F),
    (INF, 0x7E, 0x7F),  # E4M3 "fn" has no infinity
    (-INF, 0xFE, 0xFF),
    (NAN, 0x7F, 0x7F),  # S.1111.111 is the only NaN
    (-0.0, 0x80, 0x80),  # the sign of zero is kept
    (0.0, 0x00, 0x00),
]

E5M2_GOLDEN = [
    (1.0, 0x3C, 0x3C),  # exponent 0+15 = 01111, mantissa 00
    (57344.0, 0x7B, 0x7B),  # 1.75 * 2^15: exponent 11110, mantissa 11
    (2.0**-16, 0x01, 0x01),  # smallest subnormal 2^(1-15) * 1/4
    (2.0**-14, 0x04, 0x04),  # smallest normal
    (61440.0, 0x7B, 0x7C),  # midway 57344 (0x7B, odd) and 65536 (0x7C = Inf): tie -> even = Inf
    (60000.0, 0x7B, 0x7B),  # below the midpoint
    (INF, 0x7B, 0x7C),
    (-INF, 0xFB, 0xFC),
    (NAN, 0x7F, 0x7F),  # exponent 11111 with a non-zero mantissa
    (-0.0, 0x80, 0x80),
    (1.125, 0x3C, 0x3C),  # midway 1.0 (mantissa 00) and 1.25 (01) -> even 00
    (1.375, 0x3E, 0x3E),  # midway 1.25 (01) and 1.5 (10) -> even 10
]

# E2M1 magnitudes by code: 0 0.5 1 1.5 2 3 4 6 (codes 0-7), negatives add 8.
E2M1_GOLDEN = [
    (0.0, 0x0),
    (-0.0, 0x8),
    (0.5, 0x1),  # subnormal: 2^(1-1) * 1/2
    (1.0, 0x2),
    (1.5, 0x3),
    (2.0, 0x4),
    (3.0, 0x5),
    (4.0, 0x6),
    (6.0, 0x7),
    (-6.0, 0xF),
    (0.25, 0x0),  # tie 0 / 0.5 -> even code 0
    (0.75, 0x2),  # tie 0.5 (code 1) / 1.0 (code 2) -> 2
    (1.25, 0x2),  # tie 1.0 (2) / 1.5 (3) -> 2
    (1.75, 0x4),  # tie 1.5 (3) / 2.0 (4) -> 4
    (2.5, 0x4),  # tie 2 (4) / 3 (5) -> 4
    (3.5, 0x6),  # tie 3 (5) / 4 (6) -> 6
    (5.0, 0x6),  # tie 4 (6) / 6 (7) -> 6
    (5.0001, 0x7),
    (7.0, 0x7),  # saturates: E2M1 has no Inf or NaN
    (INF, 0x7),
    (-INF, 0xF),
    (NAN, 0x7),  # no NaN code either: +-max, as .satfinite does
    (-0.2, 0x8),  # rounds to zero, keeps the sign
]


def _codes(values, fmt, saturate=True):
    return encode(torch.tensor(values, dtype=torch.float32), fmt, saturate=saturate).tolist()


@pytest.mark.parametrize("fmt, table", [(E4M3, E4M3_GOLDEN), (E5M2, E5M2_GOLDEN)])
def test_fp8_golden_codes_saturating_and_not(fmt, table):
    values = [v for v, _, _ in table]
    for encoder in (encode, encode_reference):
        x = torch.tensor(values, dtype=torch.float32)
        assert encoder(x, fmt, saturate=True).tolist() == [c for _, c, _ in table], encoder.__name__
        assert encoder(x, fmt, saturate=False).tolist() == [c for _, _, c in table], encoder.__name__


def test_e2m1_golden_codes():
    x = torch.tensor([v for v, _ in E2M1_GOLDEN], dtype=torch.float32)
    expected = [c for _, c in E2M1_GOLDEN]
    assert encode(x, E2M1).tolist() == expected
    assert encode_reference(x, E2M1).tolist() == expected


def test_negative_nan_keeps_its_sign():
    negative_nan = struct.unpack("<f", struct.pack("<I", 0xFFC00000))[0]
    x = torch.tensor([negative_nan])
    assert encode(x, E4M3).tolist() == [0xFF]
    assert encode(x, E5M2).tolist() == [0xFF]
    assert encode(x, E2M1).tolist() == [0xF]  # no NaN code: -6
    assert encode_reference(x, E4M3).tolist() == [0xFF]


def test_decode_golden_values():
    assert decode(torch.tensor([0x01, 0x08, 0x38, 0x7E, 0xFE], dtype=torch.uint8), E4M3).tolist() == [
        2.0**-9,
        2.0**-6,
        1.0,
        448.0,
        -448.0,
    ]
    assert decode(torch.tensor([0x7C, 0xFC, 0x7B, 0x01], dtype=torch.uint8), E5M2).tolist() == [
        INF,
        -INF,
        57344.0,
        2.0**-16,
    ]
    assert decode(torch.arange(16, dtype=torch.uint8), E2M1).tolist() == [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ]  # fmt: skip
    assert math.isnan(decode(torch.tensor([0x7F], dtype=torch.uint8), E4M3).item())
    assert torch.isnan(decode(torch.tensor([0x7D, 0x7E, 0x7F], dtype=torch.uint8), E5M2)).all()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_code_decodes_per_the_bit_formula_and_round_trips(name):
    fmt = FORMATS[name]
    codes = torch.arange(1 << fmt.bits, dtype=torch.uint8)
    fast = decode(codes, fmt)
    slow = torch.tensor([decode_code_reference(c, fmt) for c in range(1 << fmt.bits)], dtype=torch.float32)
    assert torch.equal(torch.isnan(fast), torch.isnan(slow))
    finite = ~torch.isnan(fast)
    assert torch.equal(fast[finite].view(torch.int32), slow[finite].view(torch.int32))  # -0.0 included
    round_trip = encode(fast[finite & ~torch.isinf(fast)], fmt, saturate=False)
    assert torch.equal(round_trip, codes[finite & ~torch.isinf(fast)])


def _dense_samples(fmt):
    """Every finite value, every midpoint between neighbours, and one float32 ulp either side."""
    values = sorted({abs(decode_code_reference(c, fmt)) for c in range(1 << fmt.bits)} - {math.inf})
    values = [v for v in values if not math.isnan(v)]
    step = 2.0 ** (fmt.emax - fmt.mantissa_bits)
    grid = values + [values[-1] + step]  # the next step past the top sets the overflow midpoint
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    points = torch.tensor(values + mids, dtype=torch.float32)
    up = torch.nextafter(points, torch.full_like(points, INF))
    down = torch.nextafter(points, torch.zeros_like(points))
    allpoints = torch.cat([points, up, down, torch.tensor([INF, NAN, 1e30, 1e-30, 2.0**-149])])
    return torch.cat([allpoints, -allpoints])


# E2M1 has no Inf or NaN, so it always saturates
@pytest.mark.parametrize(
    "name, saturate", [("e4m3", True), ("e4m3", False), ("e5m2", True), ("e5m2", False), ("e2m1", True)]
)
def test_fast_encoders_match_reference_at_every_boundary(name, saturate):
    fmt = FORMATS[name]
    x = _dense_samples(fmt)
    expected = encode_reference(x, fmt, saturate)
    assert torch.equal(encode(x, fmt, saturate), expected)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_bfloat16_inputs_encode_like_their_float32_values(name):
    x = (torch.randn(4096) * torch.exp(torch.randn(4096) * 4)).to(torch.bfloat16)
    assert torch.equal(encode(x, name), encode(x.float(), name))


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=True, allow_infinity=True), st.sampled_from(sorted(FORMATS)))
def test_fast_encoder_matches_reference_on_arbitrary_float32(value, name):
    x = torch.tensor([value], dtype=torch.float32)
    assert encode(x, name).tolist() == encode_reference(x, name).tolist()


def test_pack_fp4_puts_the_even_element_in_the_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0x3, 0xF]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0xF3]]
    assert torch.equal(unpack_fp4(packed), codes)
    with pytest.raises(ValueError, match="even last dimension"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))


def test_e8m0_decode_golden():
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    values = decode_e8m0(codes)
    assert values[:6].tolist() == [
        2.0**-127,
        2.0**-126,
        0.5,
        1.0,
        2.0,
        2.0**127,
    ]  # 2^-127 is an FP32 subnormal
    assert math.isnan(values[6].item())


def test_e8m0_encode_floor_and_ceil_golden():
    sub_1_5 = 1.5 * 2.0**-127  # FP32 subnormal between 2^-127 and 2^-126
    x = torch.tensor([3.0, 4.0, 0.75, 2.0**-127, sub_1_5, 2.0**-149, 0.0, 1.5 * 2.0**127, INF, NAN])
    assert encode_e8m0(x, "floor").tolist() == [128, 129, 126, 0, 0, 0, 0, 254, 254, 255]
    assert encode_e8m0(x, "ceil").tolist() == [129, 129, 127, 0, 1, 0, 0, 254, 254, 255]


def test_e8m0_dtype_cast_rounds_to_nearest_which_is_neither_mode():
    """Why scales are never made by ``tensor.to(torch.float8_e8m0fnu)``: 3.0 becomes 4.0 there."""
    x = torch.tensor([3.0])
    assert x.to(torch.float8_e8m0fnu).view(torch.uint8).item() == 129
    assert encode_e8m0(x, "floor").item() == 128


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="unknown element format 'e3m4'"):
        get_format("e3m4")
    with pytest.raises(ValueError, match="codes must be below 16, got 16"):
        decode(torch.tensor([16], dtype=torch.uint8), E2M1)
    with pytest.raises(TypeError, match="uint8"):
        decode(torch.tensor([1]), E4M3)
    with pytest.raises(ValueError, match="'round'"):
        encode_e8m0(torch.tensor([1.0]), "round")
