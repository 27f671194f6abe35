"""NVFP4 (per-tensor and per-token scales) against a hand-derived golden row, the slow reference,
and the two properties the report cares about: batch independence and division sensitivity."""

import pytest
import torch

from opencomposer.numerics import NVFP4Tensor, dequantize_mx, dequantize_nvfp4, quantize_mx, quantize_nvfp4
from opencomposer.numerics.formats import unpack_fp4
from opencomposer.numerics.nvfp4 import quantize_nvfp4_reference


def golden_row():
    row = torch.zeros(32)
    row[:8] = torch.tensor([10.5, 5.25, 2.625, 1.3125, -10.5, 0.0, -0.0, 0.4])
    row[16:20] = torch.tensor([1.0, 0.5, 0.125, -0.25])
    return row


def test_golden_row_exact_division():
    # amax 10.5: S_enc = 2688 / 10.5 = 256 exactly, S_dec = 2^-8.
    # RN(1/6) = 1/6 + 2^-25/3 (1/6 = 1.0101...b * 2^-3, the cut tail is 2/3 ulp: rounds up),
    # so S_enc * RN(1/6) = 128/3 + 2^-17/3 exactly.
    # Block 0, amax 10.5: 10.5 * (128/3 + 2^-17/3) = 448 + 0.875 * 2^-15 -> float32 (ulp 2^-15)
    #   448 + 2^-15 -> E4M3 saturates to 448 = 0x7E. Multiplier 1 / (448 * 2^-8) = RN(4/7)
    #   = 4/7 + (3/7) 2^-24 (4/7 = 0.100100...b, the cut tail is 4/7 ulp: rounds up). Then
    #   10.5 m = 6 + 4.5 * 2^-24 -> 6 (code 7); 5.25 -> 3 (5); 2.625 -> 1.5 (3);
    #   1.3125 m = 0.75 + 0.5625 * 2^-24 -> float32 0.75 + 2^-24, past the 0.5/1.0 tie -> 1.0 (2);
    #   -10.5 -> 0xF; 0 -> 0; -0 -> 0 (a zero is +0 whatever its sign, as TE writes); 0.4 m = 0.229 < 0.25 -> 0.
    # Block 1, amax 1.0: 128/3 + 2^-17/3 = 42.67 -> E4M3 between 40 (0x62) and 44 (0x63),
    #   past the midpoint 42 -> 44 = 0x63. Multiplier 1 / (44 * 2^-8) = 64/11 = 5.82:
    #   1.0 -> 5.82 > 5 -> 6 (7); 0.5 -> 2.91 -> 3 (5); 0.125 -> 0.727 < 0.75 -> 0.5 (1);
    #   -0.25 -> -1.45 -> -1.5 (0xB).
    q = quantize_nvfp4(golden_row())
    assert q.block_scale.tolist() == [0x7E, 0x63]
    assert q.global_scale.item() == 2.0**-8
    assert unpack_fp4(q.data).tolist() == [7, 5, 3, 2, 15, 0, 0, 0] + [0] * 8 + [7, 5, 1, 11] + [0] * 12
    assert q.data[:2].tolist() == [0x57, 0x23]  # element 0 in the low nibble
    assert dequantize_nvfp4(q)[:8].tolist() == [10.5, 5.25, 2.625, 1.75, -10.5, 0.0, 0.0, 0.0]
    assert dequantize_nvfp4(q)[16:20].tolist() == [
        6 * 44 / 256,
        3 * 44 / 256,
        0.5 * 44 / 256,
        -1.5 * 44 / 256,
    ]
    assert torch.equal(dequantize_nvfp4(q)[:8].sign(), torch.tensor([1.0, 1, 1, 1, -1, 0, 0, 0]))
    assert str(dequantize_nvfp4(q)[6].item()) == "0.0"


def _heavy_tailed(shape, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    # Student-t-like tails: a Gaussian divided by the root of a chi-square with 3 degrees of freedom
    chi = (torch.randn((*shape, 3), generator=g) ** 2).mean(-1).sqrt()
    return (torch.randn(shape, generator=g) / chi * scale).to(dtype)


@pytest.mark.parametrize("granularity", ["token", "tensor"])
@pytest.mark.parametrize("division, ulp", [("exact", 0), ("approx", 0), ("approx", 1), ("approx", -1)])
def test_fast_path_matches_the_slow_reference(granularity, division, ulp):
    cases = [((3, 32), 1.0, torch.float32), ((2, 2, 48), 1e-3, torch.float32), ((4, 16), 1e3, torch.bfloat16)]
    for seed, (shape, scale, dtype) in enumerate(cases):
        x = _heavy_tailed(shape, scale, seed, dtype)
        fast = quantize_nvfp4(x, granularity, division, ulp)
        slow = quantize_nvfp4_reference(x, granularity, division, ulp)
        assert torch.equal(fast.block_scale, slow.block_scale)
        assert torch.equal(fast.data, slow.data)
        assert torch.equal(fast.global_scale, slow.global_scale)


@pytest.mark.parametrize("granularity", ["token", "tensor"])
def test_chunked_fast_path_covers_many_rows(monkeypatch, granularity):
    import opencomposer.numerics.nvfp4 as nvfp4

    monkeypatch.setattr(nvfp4, "CHUNK_ELEMENTS", 96)  # 2 rows of 48 per chunk, the last one partial
    x = _heavy_tailed((5, 48), seed=4)
    fast = quantize_nvfp4(x, granularity)
    slow = quantize_nvfp4_reference(x, granularity)
    assert torch.equal(fast.data, slow.data) and torch.equal(fast.block_scale, slow.block_scale)
    assert torch.equal(dequantize_nvfp4(fast), dequantize_nvfp4(slow))


def test_per_token_codes_do_not_depend_on_the_rest_of_the_batch():
    x = _heavy_tailed((8, 64), seed=1)
    batch = quantize_nvfp4(x, "token")
    for i in range(8):
        alone = quantize_nvfp4(x[i : i + 1], "token")
        assert torch.equal(alone.data[0], batch.data[i]) and torch.equal(
            alone.block_scale[0], batch.block_scale[i]
        )
    with_outlier = quantize_nvfp4(torch.cat([x, 1000 * x[:1]]), "token")
    assert torch.equal(with_outlier.data[:8], batch.data) and torch.equal(
        with_outlier.block_scale[:8], batch.block_scale
    )


def test_per_tensor_codes_depend_on_the_rest_of_the_batch():
    """A later token with a larger amax changes how every earlier token is rounded."""
    x = _heavy_tailed((8, 64), seed=1)
    batch = quantize_nvfp4(x, "tensor")
    with_outlier = quantize_nvfp4(torch.cat([x, 1000 * x[:1]]), "tensor")
    assert batch.global_scale.shape == ()
    assert with_outlier.global_scale.item() != batch.global_scale.item()
    changed = (with_outlier.data[:8] != batch.data).sum().item()
    assert changed > 0, "an outlier row should move the codes of the other rows under a per-tensor scale"


def test_approximate_division_flips_nvfp4_codes_but_not_mx():
    """Activations arrive in BF16, so ratios like x / amax = 1/8 are common; with a per-token scale
    the block holding the row maximum gets the scale exactly 448 and 6 * x / amax = 0.75 is an
    E2M1 tie, which the last bit of the multiplier decides. A faster reciprocal moves that bit."""
    x = _heavy_tailed((64, 256), seed=2).to(torch.bfloat16)
    exact = quantize_nvfp4(x, "token")
    mx_exact = quantize_mx(x)
    for ulp in (-1, 0, 1):
        approx = quantize_nvfp4(x, "token", "approx", ulp)
        assert (approx.data != exact.data).any(), ulp
        assert not torch.equal(dequantize_nvfp4(approx), dequantize_nvfp4(exact))
        mx_approx = quantize_mx(x, division="approx", reciprocal_ulp=ulp)
        assert torch.equal(dequantize_mx(mx_approx), dequantize_mx(mx_exact))


def test_zero_and_nan_rows():
    x = _heavy_tailed((3, 32), seed=3)
    x[0] = 0.0
    x[1, 5] = float("nan")
    q = quantize_nvfp4(x, "token")
    # zero row: amax 0 -> S_enc = 1 -> S_dec = 1; block scales 0, codes 0, decodes to 0
    assert q.global_scale[0].item() == 1.0
    assert q.block_scale[0].tolist() == [0, 0] and q.data[0].eq(0).all()
    out = dequantize_nvfp4(q)
    assert out[0].eq(0).all()
    assert torch.isnan(out[1]).all()  # NaN scale for the whole row
    assert torch.equal(out[2], dequantize_nvfp4(quantize_nvfp4(x[2:], "token"))[0])


@pytest.mark.parametrize("granularity", ["token", "tensor"])
@pytest.mark.parametrize("division", ["exact", "approx"])
def test_negative_zero_blocks_encode_as_positive_zero(granularity, division):
    """Transformer Engine's bits for zeros: an all-zero block, of +0 or of -0, gets a +0 block scale
    and +0 codes, never the -0 scale with -6 codes that the sign of ``maximum(amax, -amin)`` once
    produced; a -0.0 element anywhere encodes as +0 (TE's reference puts it in the ``x >= 0``
    bucket), while a negative value that rounds to zero keeps its sign (code 8), as there."""
    x = _heavy_tailed((4, 32), seed=5)
    x[0] = 0.0  # a whole row of +0
    x[1] = -0.0  # a whole row of -0
    x[2, :16] = -0.0  # one -0 block of a row whose other block is not zero
    x[3, 16:] = 0.0
    x[3, 16] = -1e-3 * x[3, :16].abs().max()  # rounds to -0 within a block whose maximum is 6 codes up
    x[3, 17] = 1.0
    fast = quantize_nvfp4(x, granularity, division)
    slow = quantize_nvfp4_reference(x, granularity, division)
    assert fast.block_scale[:2].eq(0).all() and fast.block_scale[2, 0].item() == 0
    assert fast.data[:2].eq(0x00).all() and fast.data[2, :8].eq(0x00).all()
    assert unpack_fp4(fast.data[3:4])[0, 16].item() == 0x8
    decoded = dequantize_nvfp4(fast)
    assert decoded[:2].eq(0).all() and not torch.signbit(decoded[:2]).any() and not torch.signbit(decoded[2, :16]).any()
    assert torch.equal(fast.block_scale, slow.block_scale)
    assert torch.equal(fast.data, slow.data)
    assert torch.equal(fast.global_scale, slow.global_scale)


def test_tensor_method_and_shapes():
    q = quantize_nvfp4(torch.ones(2, 3, 32), "token")
    assert isinstance(q, NVFP4Tensor)
    assert q.data.shape == (2, 3, 16) and q.block_scale.shape == (2, 3, 2) and q.global_scale.shape == (2, 3)
    assert q.shape == (2, 3, 32)
    # all ones: S_enc = 2688, block scale E4M3(2688/6 = 448) = 0x7E, multiplier 1/(448/2688) = 6
    assert q.block_scale.unique().tolist() == [0x7E]
    assert torch.equal(q.dequantize(torch.bfloat16), torch.ones(2, 3, 32, dtype=torch.bfloat16))


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"shape \(2, 20\) must be a multiple of 16"):
        quantize_nvfp4(torch.zeros(2, 20))
    with pytest.raises(ValueError, match="'row'"):
        quantize_nvfp4(torch.zeros(16), "row")
    with pytest.raises(ValueError, match="reciprocal_ulp 2"):
        quantize_nvfp4(torch.zeros(16), division="approx", reciprocal_ulp=2)
    with pytest.raises(ValueError, match="'fast'"):
        quantize_nvfp4(torch.zeros(16), division="fast")
