"""MXFP8 against golden blocks derived from the OCP MX v1.0 algorithm, the slow reference, and torchao.

Derivation recipe for a golden block: amax -> floor(log2(amax)) - emax_elem (emax 8 for E4M3, 15
for E5M2) -> E8M0 code = that + 127 -> every element divided by 2^(code-127) and rounded to the
element format (nearest even, saturating). Element codes are written sign.exponent.mantissa.
"""

import math

import pytest
import torch

from opencomposer.numerics import MXTensor, dequantize_mx, quantize_mx
from opencomposer.numerics.formats import decode
from opencomposer.numerics.mx import quantize_mx_reference
from tests.conftest import skip_missing


def _block(*head, length=32, dtype=torch.float32):
    x = torch.zeros(1, length, dtype=torch.float32)
    x[0, : len(head)] = torch.tensor(head, dtype=torch.float32)
    return x.to(dtype)


def test_floor_golden_block_e4m3():
    # amax 3.0 = 1.5 * 2^1 -> shared exponent 1 - 8 = -7 -> scale code 120, elements times 2^7:
    #   3.0 -> 384 = 1.5 * 2^8     -> 0.1111.100 = 0x7C
    #   1.0 -> 128 = 2^7           -> 0.1110.000 = 0x70
    #  0.01 -> 1.28 (nearest 1.25) -> 0.0111.010 = 0x3A
    #  -2.5 -> -320 = -1.25 * 2^8  -> 1.1111.010 = 0xFA
    q = quantize_mx(_block(3.0, 1.0, 0.01, -2.5, -0.0))
    assert q.scale.tolist() == [[120]]
    assert q.data[0, :6].tolist() == [0x7C, 0x70, 0x3A, 0xFA, 0x80, 0x00]
    assert dequantize_mx(q)[0, :4].tolist() == [3.0, 1.0, 1.25 * 2.0**-7, -2.5]


def test_floor_clips_where_rceil_rounds_the_scale_up():
    # amax 480 (above E4M3's 448): floor -> floor(log2 480) - 8 = 0 -> code 127, X = 1:
    #   480 saturates to 448 (0x7E), 1.0 -> 0.0111.000 = 0x38.
    # rceil -> ceil(log2(480 / 448 = 1.07)) = 1 -> code 128, X = 2:
    #   480 -> 240 = 1.875 * 2^7 -> 0.1110.111 = 0x77, 1.0 -> 0.5 -> 0.0110.000 = 0x30.
    x = _block(480.0, 1.0)
    floor, rceil = quantize_mx(x, scale_mode="floor"), quantize_mx(x, scale_mode="rceil")
    assert (floor.scale.item(), floor.data[0, :2].tolist()) == (127, [0x7E, 0x38])
    assert (rceil.scale.item(), rceil.data[0, :2].tolist()) == (128, [0x77, 0x30])
    assert dequantize_mx(floor)[0, 0].item() == 448.0  # 6.7% clipping error
    assert dequantize_mx(rceil)[0, 0].item() == 480.0


def test_rceil_equals_floor_when_amax_is_not_in_the_clipping_band():
    # 3 / 448 = 0.0067 -> ceil(log2) = -7: the same scale as floor's, code 120
    q = quantize_mx(_block(3.0, 1.0), scale_mode="rceil")
    assert (q.scale.item(), q.data[0, :2].tolist()) == (120, [0x7C, 0x70])


def test_floor_golden_block_e5m2():
    # amax 3.0 -> 1 - 15 = -14 -> code 113; 3.0 * 2^14 = 1.5 * 2^15 -> 0.11110.10 = 0x7A,
    # 1.0 * 2^14 -> 0.11101.00 = 0x74
    q = quantize_mx(_block(3.0, 1.0), elem_dtype="e5m2")
    assert (q.scale.item(), q.data[0, :2].tolist()) == (113, [0x7A, 0x74])


def test_special_blocks():
    x = torch.cat(
        [
            _block(0.0, -0.0),  # zero block: log2(0) clamps to the smallest scale 2^-127
            _block(float("nan"), 1.0),  # NaN anywhere -> NaN scale, NaN codes
            _block(float("inf"), 1.0),  # Inf: floor(log2(Inf)) is beyond E8M0 -> NaN scale
            _block(2.0**-120, 1.5 * 2.0**-121),  # below 2^-118: clamped scale 2^-127 (code 0)
        ]
    ).view(1, 128)
    floor = quantize_mx(x, scale_mode="floor")
    assert floor.scale.tolist() == [[0, 255, 255, 0]]
    assert floor.data[0, :2].tolist() == [0x00, 0x80]
    assert floor.data[0, 32:64].eq(0x7F).all() and floor.data[0, 64:96].eq(0x7F).all()
    # tiny block: 2^-120 / 2^-127 = 128 -> 0.1110.000 = 0x70; 1.5*2^-121 / 2^-127 = 96 -> 0.1101.100 = 0x6C
    assert floor.data[0, 96:98].tolist() == [0x70, 0x6C]
    out = dequantize_mx(floor)
    assert torch.isnan(out[0, 32:96]).all()
    assert out[0, 96:98].tolist() == [2.0**-120, 1.5 * 2.0**-121]  # exact through the subnormal scale
    # rceil saturates Inf like cvt.rp.satfinite: scale 2^127 (254), Inf -> 448 (0x7E), 1.0 -> 0
    rceil = quantize_mx(x, scale_mode="rceil")
    assert rceil.scale.tolist() == [[0, 255, 254, 0]]
    assert rceil.data[0, 64:66].tolist() == [0x7E, 0x00]


def _heavy_tailed(shape, scale, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2.0) * scale
    return x.to(dtype)


@pytest.mark.parametrize("elem_dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_matches_the_slow_reference(elem_dtype, scale_mode, dtype):
    for seed, (shape, scale) in enumerate([((4, 64), 1.0), ((2, 3, 96), 1e-3), ((2, 32), 1e4)]):
        x = _heavy_tailed(shape, scale, seed, dtype)
        x.view(-1)[5] = 0.0 if seed else -0.0
        fast = quantize_mx(x, elem_dtype, 32, scale_mode)
        slow = quantize_mx_reference(x, elem_dtype, 32, scale_mode)
        assert torch.equal(fast.scale, slow.scale)
        assert torch.equal(fast.data, slow.data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_fast_path_covers_many_rows(monkeypatch, dtype):
    import opencomposer.numerics.mx as mx

    monkeypatch.setattr(mx, "CHUNK_ELEMENTS", 128)  # 2 rows of 64 per chunk, the last one partial
    x = _heavy_tailed((5, 64), 1.0, 7, dtype)
    x[3, 0] = float("nan")
    chunked = quantize_mx(x)
    slow = quantize_mx_reference(x)
    assert torch.equal(chunked.scale, slow.scale) and torch.equal(chunked.data, slow.data)
    expected = torch.tensor([math.ldexp(1.0, c - 127) for c in slow.scale.flatten().tolist()]).view(5, 2, 1)
    finite = ~torch.isnan(dequantize_mx(chunked))
    assert torch.equal(finite, ~torch.isnan(dequantize_mx(slow)))
    assert not finite[3, :32].any() and finite[3, 32:].all()  # only the NaN block decodes to NaN
    assert torch.equal(
        dequantize_mx(chunked)[finite],
        (decode(slow.data, "e4m3").view(5, 2, 32) * expected).view(5, 64)[finite],
    )


def test_approximate_division_changes_nothing_in_mx():
    """Power-of-two scales have exact reciprocals, so no nudge applies (report §6.1)."""
    x = _heavy_tailed((16, 256), 1.0, 3)
    exact = quantize_mx(x)
    for ulp in (-1, 0, 1):
        approx = quantize_mx(x, division="approx", reciprocal_ulp=ulp)
        assert torch.equal(approx.data, exact.data) and torch.equal(approx.scale, exact.scale)
        slow = quantize_mx_reference(x[:2], division="approx", reciprocal_ulp=ulp)
        assert torch.equal(slow.data, exact.data[:2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_to_half_types_rounds_the_float32_value_once(dtype):
    x = torch.cat(
        [_heavy_tailed((8, 64), 1.0, 5), _heavy_tailed((8, 64), 1e-36, 6), _heavy_tailed((8, 64), 1e36, 7)]
    )
    for elem_dtype in ("e4m3", "e5m2"):
        q = quantize_mx(x, elem_dtype)
        assert torch.equal(dequantize_mx(q, dtype), dequantize_mx(q).to(dtype))


def test_dequantize_to_bfloat16_and_mxtensor_method():
    q = quantize_mx(_block(3.0, 1.0))
    assert isinstance(q, MXTensor) and q.shape == (1, 32)
    out = q.dequantize(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out[0, :2].tolist() == [3.0, 1.0]


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"shape \(2, 40\) must be a multiple of block_size 32"):
        quantize_mx(torch.zeros(2, 40))
    with pytest.raises(ValueError, match="'e2m1'"):
        quantize_mx(torch.zeros(32), elem_dtype="e2m1")
    with pytest.raises(ValueError, match="'ceil'"):
        quantize_mx(torch.zeros(32), scale_mode="ceil")
    with pytest.raises(TypeError, match="float16"):
        quantize_mx(torch.zeros(32, dtype=torch.float16))
    with pytest.raises(ValueError, match="needs division='approx'"):
        quantize_mx(torch.zeros(32), reciprocal_ulp=1)


# ----------------------------------------------------------------------------------------------
# torchao (dev extra): bit-exact on random tensors of several shapes and scales


def _torchao():
    """torchao's MX module, or a skip when the dev extra is not installed."""
    try:
        from torchao.prototype.mx_formats import config, mx_tensor
    except ImportError as e:
        skip_missing(f"torchao (the dev extra: pip install -e '.[dev]'): {e}")
    return mx_tensor, config.ScaleCalculationMode


ELEM_TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("elem_dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_exact_with_torchao_to_mx(elem_dtype, scale_mode, dtype):
    mx_tensor, mode = _torchao()
    ao_mode = mode.FLOOR if scale_mode == "floor" else mode.RCEIL
    cases = [
        ((1, 32), 1.0),
        ((16, 256), 1e-30),
        ((3, 5, 64), 1e-6),
        ((64, 1024), 1.0),
        ((8, 96), 1e6),
        ((2, 128), 1e30),
    ]
    for seed, (shape, scale) in enumerate(cases):
        x = _heavy_tailed(shape, scale, seed, dtype)
        x.view(-1)[:32] = 0.0  # a zero block
        ao_scale, ao_data = mx_tensor.to_mx(x, ELEM_TORCH[elem_dtype], 32, ao_mode)
        ours = quantize_mx(x, elem_dtype, 32, scale_mode)
        assert torch.equal(ours.scale, ao_scale.view(torch.uint8)), (shape, scale)
        assert torch.equal(ours.data, ao_data.view(torch.uint8)), (shape, scale)
        ao_values = mx_tensor.to_dtype(ao_data, ao_scale, ELEM_TORCH[elem_dtype], 32, torch.float32)
        assert torch.equal(dequantize_mx(ours), ao_values)


def test_torchao_departs_from_the_spec_only_for_scale_code_zero():
    """torchao divides a code-0 block by 2^-126 (floor) instead of 2^-127, losing a binade."""
    mx_tensor, mode = _torchao()
    x = _block(2.0**-120, 1.5 * 2.0**-121)
    ao_scale, ao_data = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, mode.FLOOR)
    ours = quantize_mx(x)
    assert ao_scale.view(torch.uint8).item() == ours.scale.item() == 0
    assert ours.data[0, :2].tolist() == [0x70, 0x6C]  # 128 and 96, per the spec
    assert ao_data.view(torch.uint8)[0, :2].tolist() == [0x68, 0x64]  # 64 and 48
    assert not math.isclose(
        mx_tensor.to_dtype(ao_data, ao_scale, torch.float8_e4m3fn, 32, torch.float32)[0, 0].item(), 2.0**-120
    )
