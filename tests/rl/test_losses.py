"""Policy-gradient losses (report §4.1) on a packed batch: every value against a pure-Python
reference, gradients against finite differences in float64, and the properties the report's
choices rest on (no length normalisation; clipping is inert at ratio 1)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from opencomposer.config import KLConfig, LossConfig
from opencomposer.rl.losses import (
    LOSSES,
    LossInputs,
    packed_sequence_ids,
    rl_loss,
)
from opencomposer.training.forward import token_logprobs_and_entropy
from opencomposer.types import TrainBatch

NAMES = ["composer", "ppo_clip", "tis", "grpo", "dr_grpo", "dapo"]
CONFIG = LossConfig(token_budget=37, max_sequence_tokens=11, clip_eps=0.2, clip_eps_high=0.28, tis_cap=1.5)

# Three packed rows; segment ids restart per row, 0 is padding. Five sequences.
SEGMENTS = [[1, 1, 1, 1, 2, 2, 2, 2, 2, 2], [1] * 10, [1, 1, 1, 2, 2, 2, 2, 2, 0, 0]]
MASK = [  # False: prompt, tool output, padding
    [0, 1, 1, 1, 0, 1, 1, 0, 1, 1],
    [0, 0, 1, 1, 1, 0, 0, 1, 1, 1],
    [0, 1, 1, 0, 1, 1, 1, 1, 0, 0],
]
SEQUENCE_ADVANTAGE = {(0, 1): 0.7, (0, 2): -0.4, (1, 1): 1.3, (2, 1): -0.9, (2, 2): 0.25}


def _batch(seed=0):
    """Float64 arrays: logprobs, advantages, mask, sampler and reference logprobs."""
    rng = np.random.default_rng(seed)
    mask = np.array(MASK, dtype=bool)
    logp = -rng.uniform(0.05, 3.0, size=mask.shape)
    sampler = logp + rng.normal(0.0, 0.4, size=mask.shape)
    ref = logp + rng.normal(0.0, 0.2, size=mask.shape)
    adv = np.zeros(mask.shape)
    for r, row in enumerate(SEGMENTS):
        for c, seg in enumerate(row):
            if mask[r, c]:
                adv[r, c] = SEQUENCE_ADVANTAGE[(r, seg)]
    return logp, adv, mask, sampler, ref


def _inputs(logp, adv, mask, sampler, ref=None, requires_grad=True, **extra):
    t = torch.tensor(logp, requires_grad=requires_grad)
    return t, LossInputs(
        logprobs=t,
        advantages=torch.tensor(adv),
        loss_mask=torch.tensor(mask),
        sampler_logprobs=torch.tensor(sampler),
        sequence_ids=packed_sequence_ids(torch.tensor(SEGMENTS)),
        ref_logprobs=None if ref is None else torch.tensor(ref),
        **extra,
    )


# ----------------------------------------------------------------------------------------------
# The reference: scalar Python over token lists, one formula per loss as the papers write them


def reference_loss(name, logp, adv, mask, sampler, config, kl=None):
    tokens = [(r, c) for r in range(mask.shape[0]) for c in range(mask.shape[1]) if mask[r, c]]
    sequences = {}
    for r, c in tokens:
        sequences.setdefault((r, SEGMENTS[r][c]), []).append((r, c))

    def clip(r, c, low, high):
        rho, a = math.exp(logp[r, c] - sampler[r, c]), adv[r, c]
        return -min(rho * a, min(max(rho, 1 - low), 1 + high) * a)

    def term(r, c):
        eps = config.clip_eps
        if name == "composer":
            value = -adv[r, c] * logp[r, c]
        elif name == "tis":
            value = -min(math.exp(logp[r, c] - sampler[r, c]), config.tis_cap) * adv[r, c] * logp[r, c]
        elif name == "dapo":
            value = clip(r, c, eps, config.clip_eps_high)
        else:
            value = clip(r, c, eps, eps)
        return value + (0.0 if kl is None else kl[r, c])

    total = sum(term(r, c) for r, c in tokens)
    if name in ("composer", "ppo_clip", "tis"):
        return total / config.token_budget
    if name == "grpo":
        return sum(sum(term(r, c) for r, c in seq) / len(seq) for seq in sequences.values()) / len(sequences)
    if name == "dr_grpo":
        return total / (len(sequences) * config.max_sequence_tokens)
    if name == "dapo":
        return total / len(tokens)
    raise ValueError(name)


@pytest.mark.parametrize("name", NAMES)
def test_loss_value_matches_reference(name):
    logp, adv, mask, sampler, _ = _batch()
    _, inputs = _inputs(logp, adv, mask, sampler)
    loss, _ = LOSSES[name](inputs, dataclasses.replace(CONFIG, name=name))
    assert loss.item() == pytest.approx(reference_loss(name, logp, adv, mask, sampler, CONFIG), rel=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_loss_value_with_kl_in_the_loss_matches_reference(name):
    logp, adv, mask, sampler, ref = _batch()
    _, inputs = _inputs(logp, adv, mask, sampler, ref)
    loss, metrics = rl_loss(
        inputs, dataclasses.replace(CONFIG, name=name), KLConfig(estimator="k3", placement="loss", coef=0.1)
    )
    log_r = ref - logp
    kl = 0.1 * (np.exp(log_r) - 1.0 - log_r)
    assert loss.item() == pytest.approx(
        reference_loss(name, logp, adv, mask, sampler, CONFIG, kl=kl), rel=1e-13
    )
    assert metrics["kl_loss_term"] == pytest.approx(kl[mask].mean(), rel=1e-13)


def test_the_batch_exercises_clipping_and_truncation():
    """The golden batch must hit both clip sides and the TIS cap, or the tests above prove little."""
    logp, adv, mask, sampler, _ = _batch()
    ratio = np.exp(logp - sampler)[mask]
    a = adv[mask]
    low, high = int(np.sum((ratio < 0.8) & (a < 0))), int(np.sum((ratio > 1.2) & (a > 0)))
    assert (low, high) == (2, 1)
    assert int(np.sum(ratio >= 1.5)) == 2
    _, inputs = _inputs(logp, adv, mask, sampler)
    _, metrics = LOSSES["ppo_clip"](inputs, CONFIG)
    assert metrics["clip_fraction_low"] == pytest.approx(low / mask.sum())
    assert metrics["clip_fraction_high"] == pytest.approx(high / mask.sum())
    _, metrics = LOSSES["tis"](inputs, CONFIG)
    assert metrics["tis_truncated_fraction"] == pytest.approx(2 / mask.sum())


@pytest.mark.parametrize("name", [n for n in NAMES if n != "tis"])
def test_gradient_matches_finite_differences(name):
    logp, adv, mask, sampler, ref = _batch()
    config = dataclasses.replace(CONFIG, name=name)
    kl_config = KLConfig(estimator="k3", placement="loss", coef=0.1)
    ratio = np.exp(logp - sampler)
    assert np.min(np.abs(ratio[mask][:, None] - [0.8, 1.2, 1.28])) > 1e-3  # away from the kinks
    t, inputs = _inputs(logp, adv, mask, sampler, ref)
    loss, _ = rl_loss(inputs, config, kl_config)
    (grad,) = torch.autograd.grad(loss, t)

    def value(x):
        _, perturbed = _inputs(x, adv, mask, sampler, ref, requires_grad=False)
        return rl_loss(perturbed, config, kl_config)[0].item()

    h = 1e-6
    numeric = np.zeros_like(logp)
    for index in np.ndindex(logp.shape):
        up, down = logp.copy(), logp.copy()
        up[index] += h
        down[index] -= h
        numeric[index] = (value(up) - value(down)) / (2 * h)
    np.testing.assert_allclose(grad.numpy(), numeric, atol=1e-9)
    assert np.all(grad.numpy()[~mask] == 0.0)


def test_tis_gradient_is_the_truncated_weight_times_the_policy_gradient():
    """TIS's weight is detached, so its gradient is -min(ρ, C)·A/budget: the closed form."""
    logp, adv, mask, sampler, _ = _batch()
    t, inputs = _inputs(logp, adv, mask, sampler)
    loss, _ = LOSSES["tis"](inputs, CONFIG)
    (grad,) = torch.autograd.grad(loss, t)
    weight = np.minimum(np.exp(logp - sampler), CONFIG.tis_cap)
    np.testing.assert_allclose(
        grad.numpy(), np.where(mask, -weight * adv / CONFIG.token_budget, 0.0), rtol=1e-14
    )


@pytest.mark.parametrize("name", NAMES)
def test_at_ratio_one_clipping_is_inert_and_the_gradient_is_the_policy_gradient(name):
    """With π_θ = π_sampler every clipped or reweighted variant reduces to -A·∇log π under its own
    normalisation (composer, ppo_clip, tis: 1/budget; grpo: 1/(N·|o_i|); dr_grpo: 1/(N·L_max);
    dapo: 1/tokens)."""
    logp, adv, mask, _, _ = _batch()
    t, inputs = _inputs(logp, adv, mask, sampler=logp.copy())
    loss, metrics = LOSSES[name](inputs, dataclasses.replace(CONFIG, name=name))
    (grad,) = torch.autograd.grad(loss, t)
    lengths = {}
    for r, row in enumerate(SEGMENTS):
        for c, seg in enumerate(row):
            lengths[(r, seg)] = lengths.get((r, seg), 0) + int(mask[r, c])
    scale = np.zeros_like(logp)
    for r, row in enumerate(SEGMENTS):
        for c, seg in enumerate(row):
            scale[r, c] = {
                "grpo": 1.0 / (len(SEQUENCE_ADVANTAGE) * max(lengths[(r, seg)], 1)),
                "dr_grpo": 1.0 / (len(SEQUENCE_ADVANTAGE) * CONFIG.max_sequence_tokens),
                "dapo": 1.0 / mask.sum(),
            }.get(name, 1.0 / CONFIG.token_budget)
    np.testing.assert_allclose(grad.numpy(), np.where(mask, -adv * scale, 0.0), rtol=1e-13, atol=1e-16)
    for key in ("clip_fraction", "tis_truncated_fraction"):
        assert metrics.get(key, 0.0) == 0.0


def _two_sequences(short, long):
    """One row each: a correct sequence of ``short`` model tokens and one of ``long``, A = 1 both."""
    seq = max(short, long)
    mask = np.zeros((2, seq), dtype=bool)
    mask[0, :short], mask[1, :long] = True, True
    logp = np.where(mask, -1.0, 0.0)
    return logp, mask.astype(float), mask, logp.copy()


def _grad(name, logp, adv, mask, sampler):
    t = torch.tensor(logp, requires_grad=True)
    inputs = LossInputs(
        t,
        torch.tensor(adv),
        torch.tensor(mask),
        torch.tensor(sampler),
        sequence_ids=torch.arange(2)[:, None].expand(mask.shape),
    )
    loss, _ = LOSSES[name](inputs, dataclasses.replace(CONFIG, name=name))
    return torch.autograd.grad(loss, t)[0].numpy()


def test_composer_gradient_has_no_length_normalisation_grpo_has():
    """Report §4.1 / Dr. GRPO: every token of a correct answer gets the same push, -A/budget,
    whatever its sequence's length; GRPO gives each token of a 2-token answer 10x the push of a
    20-token answer's token, and DAPO's token mean couples sequences through the batch total."""
    g = _grad("composer", *_two_sequences(2, 20))
    np.testing.assert_allclose(g[0, :2], -1.0 / CONFIG.token_budget, rtol=1e-15)
    np.testing.assert_allclose(g[1, :20], -1.0 / CONFIG.token_budget, rtol=1e-15)

    g = _grad("grpo", *_two_sequences(2, 20))
    np.testing.assert_allclose(g[0, :2], -1.0 / (2 * 2), rtol=1e-15)
    np.testing.assert_allclose(g[1, :20], -1.0 / (2 * 20), rtol=1e-15)
    assert g[0, 0] / g[1, 0] == pytest.approx(10.0, rel=1e-14)

    # growing the other sequence from 20 to 40 tokens: composer and grpo leave the first one's
    # gradient alone, dapo shrinks it
    for name, unchanged in (("composer", True), ("grpo", True), ("dr_grpo", True), ("dapo", False)):
        before = _grad(name, *_two_sequences(2, 20))[0, :2]
        after = _grad(name, *_two_sequences(2, 40))[0, :2]
        assert np.array_equal(before, after) == unchanged, name


@pytest.mark.parametrize("name", NAMES)
def test_microbatches_with_step_totals_sum_to_the_step_loss(name):
    logp, adv, mask, sampler, _ = _batch()
    config = dataclasses.replace(CONFIG, name=name)
    _, whole = _inputs(logp, adv, mask, sampler)
    full, _ = LOSSES[name](whole, config)
    totals = {"num_tokens": float(mask.sum()), "num_sequences": float(len(SEQUENCE_ADVANTAGE))}
    parts = 0.0
    for rows in (slice(0, 2), slice(2, 3)):
        t = torch.tensor(logp[rows], requires_grad=True)
        part = LossInputs(
            t,
            torch.tensor(adv[rows]),
            torch.tensor(mask[rows]),
            torch.tensor(sampler[rows]),
            sequence_ids=packed_sequence_ids(torch.tensor(SEGMENTS))[rows],
            **totals,
        )
        parts = parts + LOSSES[name](part, config)[0].item()
    assert parts == pytest.approx(full.item(), rel=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_masked_positions_have_no_influence(name):
    logp, adv, mask, sampler, _ = _batch()
    config = dataclasses.replace(CONFIG, name=name)
    t1, clean = _inputs(logp, adv, mask, sampler)
    dirty_logp, dirty_sampler, dirty_adv = logp.copy(), sampler.copy(), adv.copy()
    dirty_logp[~mask], dirty_sampler[~mask], dirty_adv[~mask] = -40.0, 0.0, 5.0
    t2, dirty = _inputs(dirty_logp, dirty_adv, mask, dirty_sampler)
    (l1, m1), (l2, m2) = LOSSES[name](clean, config), LOSSES[name](dirty, config)
    assert l1.item() == l2.item() and m1 == m2
    np.testing.assert_array_equal(torch.autograd.grad(l1, t1)[0], torch.autograd.grad(l2, t2)[0])


def test_metrics_match_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 2.0, size=(3, 10, 7))
    targets = rng.integers(0, 7, size=(3, 10))
    logp_all = logits - logits.max(-1, keepdims=True)
    logp_all = logp_all - np.log(np.exp(logp_all).sum(-1, keepdims=True))
    logp = np.take_along_axis(logp_all, targets[..., None], -1)[..., 0]
    entropy = -(np.exp(logp_all) * logp_all).sum(-1)

    t_logp, t_entropy = token_logprobs_and_entropy(torch.tensor(logits), torch.tensor(targets))
    np.testing.assert_allclose(t_logp.detach().numpy(), logp, rtol=1e-13)
    np.testing.assert_allclose(t_entropy.numpy(), entropy, rtol=1e-13)

    _, adv, mask, _, ref = _batch()
    sampler = logp + rng.normal(0.0, 0.3, size=logp.shape)
    _, inputs = _inputs(logp, adv, mask, sampler, ref, entropy=t_entropy)
    _, metrics = LOSSES["dapo"](inputs, CONFIG)
    d = logp - sampler  # log(π_θ / π_sampler)
    ratio = np.exp(d)[mask]
    expected = {
        "tokens": float(mask.sum()),
        "neg_logprob": -logp[mask].mean(),
        "entropy": entropy[mask].mean(),
        "kl_sampler": (np.exp(d) - 1.0 - d)[mask].mean(),
        "kl_sampler_k1": -d[mask].mean(),
        "kl_ref": (logp - ref)[mask].mean(),
        "ratio_max": ratio.max(),
        "ratio_min": ratio.min(),
        "clip_fraction_low": np.mean((ratio < 0.8) & (adv[mask] < 0)),
        "clip_fraction_high": np.mean((ratio > 1.28) & (adv[mask] > 0)),
    }
    expected["clip_fraction"] = expected["clip_fraction_low"] + expected["clip_fraction_high"]
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12), key


def test_logprob_gradient_through_logits_by_gradcheck():
    logits = torch.randn(
        2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True
    )
    targets = torch.tensor([[0, 4, 2, 1], [3, 3, 0, 2]])
    assert torch.autograd.gradcheck(lambda z: token_logprobs_and_entropy(z, targets)[0], (logits,))


def test_packed_sequence_ids_and_from_batch():
    segment_ids = torch.tensor(SEGMENTS)
    ids = packed_sequence_ids(segment_ids)
    assert ids.tolist() == [[1, 1, 1, 1, 2, 2, 2, 2, 2, 2], [4] * 10, [7, 7, 7, 8, 8, 8, 8, 8, 6, 6]]
    logp, adv, mask, sampler, ref = _batch()
    batch = TrainBatch(
        input_ids=torch.zeros(3, 10, dtype=torch.long),
        target_ids=torch.zeros(3, 10, dtype=torch.long),
        loss_mask=torch.tensor(mask, dtype=torch.float64),
        advantages=torch.tensor(adv),
        sampler_logprobs=torch.tensor(sampler),
        position_ids=torch.zeros(3, 10, dtype=torch.long),
        segment_ids=segment_ids,
        ref_logprobs=torch.tensor(ref),
    )
    for name in NAMES:
        config = dataclasses.replace(CONFIG, name=name)
        got, _ = LOSSES[name](LossInputs.from_batch(batch, torch.tensor(logp)), config)
        assert got.item() == pytest.approx(reference_loss(name, logp, adv, mask, sampler, CONFIG), rel=1e-13)


def test_errors_name_the_missing_input():
    logp, adv, mask, sampler, _ = _batch()
    _, inputs = _inputs(logp, adv, mask, sampler)
    with pytest.raises(ValueError, match="ref_logprobs"):
        rl_loss(inputs, CONFIG, KLConfig(placement="loss", coef=0.1))
    with pytest.raises(ValueError, match="sequence_ids"):
        LOSSES["grpo"](dataclasses.replace(inputs, sequence_ids=None), CONFIG)
    with pytest.raises(ValueError, match="advantages: shape"):
        dataclasses.replace(inputs, advantages=torch.zeros(3, 9))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_a_self_summary_chain_counts_as_one_sequence_across_micro_batches(name):
    """Two episodes: one a chain of two segments (two rows, put in different micro-batches), one a
    single segment. GRPO's per-sequence mean and Dr. GRPO's sequence count see two episodes, and the
    micro-batches add up to the reference computed on whole episodes."""
    from opencomposer.rl.step import count_sequences
    from opencomposer.training.packing import SequenceRow, collate

    rng = np.random.default_rng(3)

    def row(episode: int, length: int, advantage: float) -> SequenceRow:
        mask = rng.random(length) < 0.7
        return SequenceRow(episode=episode, input_ids=np.zeros(length, np.int64), target_ids=np.zeros(length, np.int64),
                           loss_mask=mask, sampler_logprobs=np.where(mask, -rng.random(length), 0).astype(np.float32),
                           advantage=advantage)

    rows = [row(0, 9, 0.5), row(0, 6, 0.5), row(1, 7, -0.5)]  # episode 0 is a chain of two segments
    totals = {0: rows[0].model_tokens + rows[1].model_tokens, 1: rows[2].model_tokens}
    for r in rows:
        r.episode_tokens = totals[r.episode]
    micro = [collate([rows[0], rows[2]], pad_id=0), collate([rows[1]], pad_id=0)]
    assert count_sequences(micro) == 2
    logps = [torch.tensor(-rng.random(b.loss_mask.shape), dtype=torch.float32) for b in micro]
    config = dataclasses.replace(CONFIG, name=name)
    got = sum(LOSSES[name](dataclasses.replace(LossInputs.from_batch(b, lp), num_sequences=2.0), config)[0].item()
              for b, lp in zip(micro, logps, strict=True))
    # reference: each episode's tokens gathered from every row, surrogate per token, then the loss's rule
    per_episode: dict[int, list[float]] = {0: [], 1: []}
    for b, lp in zip(micro, logps, strict=True):
        ratio = torch.exp(lp - b.sampler_logprobs)
        surrogate = -torch.minimum(ratio * b.advantages, ratio.clamp(1 - CONFIG.clip_eps, 1 + CONFIG.clip_eps) * b.advantages)
        for e, value, keep in zip(b.episode_ids.flatten().tolist(), surrogate.flatten().tolist(),
                                  b.loss_mask.flatten().tolist(), strict=True):
            if keep:
                per_episode[e].append(value)
    if name == "grpo":
        want = sum(np.mean(v) for v in per_episode.values()) / 2
    else:
        want = sum(sum(v) for v in per_episode.values()) / (2 * CONFIG.max_sequence_tokens)
    assert got == pytest.approx(want, rel=1e-5)
