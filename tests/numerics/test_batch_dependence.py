"""Per-tensor versus per-token NVFP4 activation scales in a model's forward (report §6.1).

With one FP32 scale per tensor, the codes of every token depend on the largest activation anywhere
in the tensor: a sequence's logits change with the other sequences of its batch, and an earlier
token's with the later tokens of its own sequence (a causal model that is no longer causal in its
numerics). With one scale per token, neither happens: the forward of a sequence differs from its
forward alone only by float32 summation order, as the unquantised model's does.

``tests/numerics/test_nvfp4.py`` shows the same on the quantised codes of one tensor; here it is
the logits of the tiny Qwen3-MoE with its experts converted. The other sequence of the batch
holds a token whose embedding is a spike, so its normalised hidden state has a maximum of
sqrt(64) = 8 where other tokens have about 3 (measured on 6 seeds: per-token and unquantised
differences at most 2.4e-7, per-tensor at least 1.4e-3 on logits of magnitude ~0.6).
"""

import copy

import pytest
import torch

from opencomposer.config import NumericsConfig
from opencomposer.numerics.convert import convert_model

SPIKE_TOKEN = 7
FLOAT_NOISE = 1e-5  # summation order only
QUANTISATION = 1e-4  # a moved NVFP4 code


def _model_and_batch(make_qwen3_moe, seed: int):
    model = make_qwen3_moe(seed)
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[SPIKE_TOKEN] = 0.0
        embedding[SPIKE_TOKEN, 3] = 1.0
    g = torch.Generator().manual_seed(seed)
    sequence = torch.randint(SPIKE_TOKEN + 1, 128, (1, 16), generator=g)  # [1, T]
    other = torch.randint(SPIKE_TOKEN + 1, 128, (1, 16), generator=g)
    other[0, 5] = SPIKE_TOKEN
    return model, sequence, other


def _differences(model, sequence: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """(batch, later tokens): max |logit change| of ``sequence`` when ``other`` shares its batch,
    and of its first half when its second half is there."""
    half = sequence.shape[1] // 2
    with torch.no_grad():
        alone = model(input_ids=sequence).logits[0]  # [T, V]
        batched = model(input_ids=torch.cat([sequence, other])).logits[0]
        prefix = model(input_ids=sequence[:, :half]).logits[0]
    return float((alone - batched).abs().max()), float((alone[:half] - prefix).abs().max())


@pytest.mark.parametrize("seed", [0, 1])
def test_per_tensor_scales_make_a_sequence_depend_on_its_batch_and_per_token_scales_do_not(make_qwen3_moe, seed):
    model, sequence, other = _model_and_batch(make_qwen3_moe, seed)
    unquantised = _differences(model, sequence, other)
    assert max(unquantised) < FLOAT_NOISE, unquantised
    found = {}
    for scale in ("token", "tensor"):
        converted = copy.deepcopy(model)
        convert_model(converted, NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", nvfp4_activation_scale=scale))
        found[scale] = _differences(converted, sequence, other)
    batch_token, later_token = found["token"]
    batch_tensor, later_tensor = found["tensor"]
    assert batch_token < FLOAT_NOISE and later_token < FLOAT_NOISE, found
    assert batch_tensor > QUANTISATION and later_tensor > QUANTISATION, found
