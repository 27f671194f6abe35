"""The sampled distribution (``inference.sampling``): the top-p / top-k cut against an independent
NumPy computation, the sampler drawing from it and recording its logprobs, the trainer scoring the
same tokens by the same rule, and the trainer's gradient by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opencomposer.inference.local import sample_tokens
from opencomposer.inference.sampling import kept_tokens, truncated_logprobs
from opencomposer.training.forward import token_logprobs_and_entropy
from opencomposer.types import SamplingParams

SETTINGS = [(1.0, 1.0, 0), (1.0, 0.8, 0), (0.7, 0.8, 0), (1.3, 0.95, 0), (1.0, 1.0, 5), (0.8, 0.5, 3)]  # T, top_p, top_k


def reference_cut(logits: np.ndarray, temperature: float, top_p: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept mask, log π_cut) of one row in float64, written out token by token."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.zeros(len(z), dtype=bool)
    mass = 0.0
    for rank, token in enumerate(np.argsort(-p, kind="stable")):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[token] = True
        mass += p[token]
    kept = z[keep]
    log_norm = kept.max() + np.log(np.exp(kept - kept.max()).sum())
    return keep, np.where(keep, z - log_norm, -np.inf)


def random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0.0, 2.5, (rows, vocab))).float()


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_the_cut_matches_an_independent_computation(temperature, top_p, top_k):
    logits = random_logits(16, 60, seed=1)
    scaled = logits / temperature
    keep = kept_tokens(scaled, top_p, top_k)
    logq = truncated_logprobs(scaled, keep)
    for row in range(len(logits)):
        expected_keep, expected = reference_cut(logits[row].numpy(), temperature, top_p, top_k)
        assert np.array_equal(keep[row].numpy(), expected_keep)
        got = logq[row].double().numpy()
        assert np.array_equal(np.isinf(got), np.isinf(expected))
        np.testing.assert_allclose(got[expected_keep], expected[expected_keep], rtol=0, atol=2e-6)
    if top_p == 1.0 and top_k == 0:
        assert bool(keep.all())


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_sampler_draws_from_the_cut_distribution_and_records_its_logprobs(temperature, top_p, top_k):
    draws = 40_000
    row = random_logits(1, 30, seed=2)
    logits = row.expand(draws, -1).contiguous()
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    tokens, logprobs = sample_tokens(logits, params, uniforms)
    keep, expected = reference_cut(row[0].numpy(), temperature, top_p, top_k)
    assert keep[tokens.numpy()].all()  # nothing outside the cut is ever drawn
    np.testing.assert_allclose(logprobs.double().numpy(), expected[tokens.numpy()], rtol=0, atol=2e-6)
    frequencies = np.bincount(tokens.numpy(), minlength=30) / draws
    probs = np.exp(expected)
    assert np.abs(frequencies - probs).max() < 4 * np.sqrt(probs * (1 - probs) / draws).max() + 1e-3


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_sampler_and_trainer_score_the_same_tokens_alike(temperature, top_p, top_k):
    logits = random_logits(64, 200, seed=3)
    uniforms = torch.rand(64, generator=torch.Generator().manual_seed(1))
    tokens, sampled = sample_tokens(logits, SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k), uniforms)
    # the trainer's shapes: [rows, seq, vocab] logits divided by the temperature, [rows, seq] targets
    scored, entropy = token_logprobs_and_entropy((logits / temperature)[None], tokens[None], top_p, top_k)
    torch.testing.assert_close(scored[0], sampled, rtol=0, atol=1e-6)
    for r in range(0, 64, 9):  # the entropy (a metric) is that of the cut distribution too
        _, logq = reference_cut(logits[r].numpy(), temperature, top_p, top_k)
        finite = logq[np.isfinite(logq)]
        assert float(entropy[0, r]) == pytest.approx(-(np.exp(finite) * finite).sum(), abs=1e-5)


def test_a_target_just_outside_the_trainers_cut_is_scored_as_kept():
    logits = torch.tensor([[[3.0, 2.0, 1.0, -4.0]]], dtype=torch.float64)  # top_p 0.5 keeps token 0 alone
    scored, _ = token_logprobs_and_entropy(logits, torch.tensor([[3]]), top_p=0.5)
    z = logits[0, 0, [0, 3]]
    assert float(scored) == pytest.approx(float(z[1] - torch.logsumexp(z, 0)), abs=1e-12)  # renormalised over {0, 3}


@pytest.mark.parametrize(("top_p", "top_k"), [(0.7, 0), (1.0, 4), (0.9, 6)])
def test_trainer_gradient_matches_finite_differences(top_p, top_k):
    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (2, 3, 12))).requires_grad_(True)  # float64
    weights = torch.from_numpy(rng.normal(size=(2, 3)))
    logq = truncated_logprobs(logits.detach(), kept_tokens(logits.detach(), top_p, top_k))
    targets = logq.argmax(-1)  # a kept token at every position, as sampled tokens are

    def objective(values: torch.Tensor) -> torch.Tensor:
        logprobs, _ = token_logprobs_and_entropy(values, targets, top_p, top_k)
        return (weights * logprobs).sum()

    objective(logits).backward()
    numeric = torch.zeros_like(logits)
    eps = 1e-6
    with torch.no_grad():
        for index in np.ndindex(*logits.shape):
            step = torch.zeros_like(logits)
            step[index] = eps
            numeric[index] = (objective(logits + step) - objective(logits - step)) / (2 * eps)
    torch.testing.assert_close(logits.grad, numeric, rtol=0, atol=1e-7)
    cut = ~kept_tokens(logits.detach(), top_p, top_k)
    assert bool(cut.any()) and float(logits.grad[cut].abs().max()) == 0.0  # cut logits get no gradient
