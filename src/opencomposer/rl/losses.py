"""Policy-gradient losses on packed ``[rows, seq]`` batches: the Composer loss and its ablations.

Report §4.1 (docs/recipe.md §4): a plain policy gradient, single epoch, every model token of an
episode weighted by the episode's advantage, **summed and divided by a constant**, never by each
sequence's own length (Dr. GRPO's observation: per-sequence means favour long wrong answers and
short right ones), and **no masking of overlong rollouts**. Tool outputs, prompts and padding
carry no loss (``loss_mask``). The report mentions no importance sampling and no clipping; it
keeps training on-policy with fast weight sync instead.

    composer   L = -Σ_t A_t·log π_θ(a_t)                     / token_budget
    ppo_clip   L = -Σ_t min(ρ_t A_t, clip(ρ_t, 1±ε) A_t)     / token_budget
    tis        L = -Σ_t min(ρ̂_t, C)·A_t·log π_θ(a_t)         / token_budget  (ρ̂ detached)
    grpo       L = -1/N Σ_i 1/|o_i| Σ_{t∈o_i} min(ρA, clip(ρ, 1±ε)A)         (+ std-normalised A)
    dr_grpo    L = -Σ_t min(ρA, clip(ρ, 1±ε)A) / (N · max_sequence_tokens)
    dapo       L = -Σ_t min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) / Σ_i |o_i|

ρ_t = π_θ(a_t)/π_sampler(a_t): the behaviour policy is the sampler (its logprobs travel with the
episode), so clipping and TIS correct both staleness and the train/inference numerical mismatch.
When a trainer prefers a recomputed "old" policy it passes those logprobs as ``sampler_logprobs``.
GRPO's std normalisation is an advantage option (``rl.advantage.std_normalize``), not a loss one.
With ``rl.kl.placement = "loss"`` the per-token KL term joins the per-token loss and is
aggregated the same way.

Where we depart: the report's constant is unnamed; ours is ``rl.loss.token_budget``. Being a
constant, the composer loss is additive over micro-batches. Means (grpo, dapo) and dr_grpo's
sequence count are not, so a step split into micro-batches passes the step's ``num_tokens`` /
``num_sequences`` and never splits a sequence across micro-batches.

Every loss returns ``(loss, metrics)``; metrics are Python floats over this batch's model tokens:
entropy, KL to the sampler (train/inference mismatch), ratio range, KL to the reference, and the
clip or truncation fractions of the variants that clip. Two more families are statistics of the
whole step, not means that micro-batches add up to, so the step computes them once over all its
tokens: the importance ratio's mean and tail (``ratio_metrics``), the sampler/trainer KL
(``mismatch_kl``) and, when sampling runs ahead of training, the staleness of the tokens
(``staleness_metrics``). They only measure: the corrections
(``tis``, ``ppo_clip`` and the other clipped losses) stay opt-in through ``rl.loss.name``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from opencomposer.config import KLConfig, LossConfig
from opencomposer.rl.kl import k1, k3, kl_loss_tokens
from opencomposer.types import TrainBatch


@dataclass
class LossInputs:
    """What a loss reads; every tensor is ``[rows, seq]`` and aligned with the *target* token."""

    logprobs: torch.Tensor  # log π_θ(target), recomputed by the trainer, differentiable
    advantages: torch.Tensor  # the episode's advantage on each of its tokens (0 where masked)
    loss_mask: torch.Tensor  # true (or 1) on model-sampled tokens only
    sampler_logprobs: torch.Tensor  # log π_sampler(target) reported by the inference engine
    sequence_ids: torch.Tensor | None = None  # int; equal ids = one sequence (needed by grpo, dr_grpo)
    sequence_tokens: torch.Tensor | None = None  # float; model tokens of each token's whole sequence
    entropy: torch.Tensor | None = None  # entropy of π_θ at each position, metrics only
    ref_logprobs: torch.Tensor | None = None  # log π_ref(target); KL metric and in-loss KL
    kl_tokens: torch.Tensor | None = None  # coef·k(t) when the KL is placed in the loss
    num_tokens: float | None = None  # model tokens of the whole step, when split into micro-batches
    num_sequences: float | None = None  # sequences of the whole step, likewise

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.shape != self.logprobs.shape:
                raise ValueError(
                    f"LossInputs.{f.name}: shape {tuple(value.shape)}, expected {tuple(self.logprobs.shape)}"
                )

    @property
    def mask(self) -> torch.Tensor:  # [rows, seq] bool
        return self.loss_mask.bool()

    @classmethod
    def from_batch(
        cls, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None = None
    ) -> LossInputs:
        """Inputs for a packed ``TrainBatch``: a sequence is an episode when the batch says which
        (a self-summary chain, whose segments are separate rows, counts once), else one (row,
        segment id) pair."""
        by_episode = batch.episode_ids is not None
        return cls(
            logprobs=logprobs,
            advantages=batch.advantages,
            loss_mask=batch.loss_mask,
            sampler_logprobs=batch.sampler_logprobs,
            sequence_ids=batch.episode_ids if by_episode else packed_sequence_ids(batch.segment_ids),
            sequence_tokens=batch.episode_tokens if by_episode else None,
            entropy=entropy,
            ref_logprobs=batch.ref_logprobs,
        )


def packed_sequence_ids(segment_ids: torch.Tensor) -> torch.Tensor:  # [rows, seq] -> [rows, seq]
    """One id per (row, segment id) pair, for packings whose segment ids restart in every row."""
    rows = torch.arange(segment_ids.shape[0], device=segment_ids.device)[:, None]
    return rows * (int(segment_ids.max()) + 1) + segment_ids.long()


# ----------------------------------------------------------------------------------------------
# Per-token objectives ([rows, seq] -> [rows, seq])


def clipped_surrogate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO: -min(ρA, clip(ρ, 1-eps_low, 1+eps_high)·A) per token, ρ = exp(logprobs - behaviour).
    Also the tokens where the clipped branch wins (their gradient is zero), by side."""
    ratio = torch.exp(logprobs - behaviour_logprobs)
    per_token = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages)
    clipped = {
        "low": (ratio < 1.0 - eps_low) & (advantages < 0),
        "high": (ratio > 1.0 + eps_high) & (advantages > 0),
    }
    return per_token, clipped


def truncated_importance_weight(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(π_θ/π_sampler, C), detached: the TIS correction for sampling with other weights or kernels."""
    return torch.exp(logprobs.detach() - sampler_logprobs).clamp(max=cap)


# ----------------------------------------------------------------------------------------------
# Aggregations ([rows, seq] -> scalar); masked tokens add nothing to the value or the gradient
# (their inputs must still be finite: 0·inf is NaN in a backward pass)


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, per_token, 0.0).sum()


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """Σ over model tokens / their number (this batch's, or the step's ``num_tokens``)."""
    count = mask.sum() if num_tokens is None else per_token.new_tensor(num_tokens)
    return masked_sum(per_token, mask) / count.clamp(min=1)


def sequence_mean(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    sequence_ids: torch.Tensor,
    num_sequences: float | None = None,
    sequence_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean; packed rows may hold several sequences.
    ``sequence_tokens`` (each token's sequence length, when a sequence spans rows or micro-batches)
    makes each token's share ``value / length``, so micro-batches add up to the step's mean."""
    if sequence_tokens is not None:
        count = count_sequences(mask, sequence_ids)
        shares = per_token[mask] / sequence_tokens[mask].clamp(min=1)
        return shares.sum() / max(num_sequences if num_sequences is not None else count, 1)
    values = per_token[mask]
    _, index = torch.unique(sequence_ids[mask], return_inverse=True)
    count = int(index.max()) + 1 if index.numel() else 0
    sums = values.new_zeros(count).index_add(0, index, values)
    lengths = values.new_zeros(count).index_add(0, index, torch.ones_like(values))
    return (sums / lengths).sum() / max(num_sequences if num_sequences is not None else count, 1)


def count_sequences(mask: torch.Tensor, sequence_ids: torch.Tensor) -> int:
    """Sequences with at least one model token."""
    return int(torch.unique(sequence_ids[mask]).numel())


# ----------------------------------------------------------------------------------------------
# The losses


def _with_kl(per_token: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    return per_token if inputs.kl_tokens is None else per_token + inputs.kl_tokens


def _sequence_ids(inputs: LossInputs, name: str) -> torch.Tensor:
    if inputs.sequence_ids is None:
        raise ValueError(f"the {name} loss needs LossInputs.sequence_ids (which tokens form one sequence)")
    return inputs.sequence_ids


def composer_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Report §4.1: -Σ_t A_t·log π_θ(a_t) over model tokens / token_budget. No ratio, no clip, no
    length normalisation, no overlong mask: each token's gradient is -A/token_budget · ∇log π."""
    per_token = -inputs.advantages * inputs.logprobs
    loss = masked_sum(_with_kl(per_token, inputs), inputs.mask) / config.token_budget
    return loss, loss_metrics(inputs)


def ppo_clip_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Ablation: the composer loss with PPO ratio clipping (symmetric, clip_eps) against the sampler.
    At ρ = 1 its gradient equals the composer loss's."""
    per_token, clipped = clipped_surrogate(
        inputs.logprobs, inputs.sampler_logprobs, inputs.advantages, config.clip_eps, config.clip_eps
    )
    loss = masked_sum(_with_kl(per_token, inputs), inputs.mask) / config.token_budget
    return loss, loss_metrics(inputs, clipped=clipped)


def tis_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Ablation: the composer loss with truncated importance sampling, weight min(π_θ/π_sampler, C)
    detached (Yao et al., "Your efficient RL framework secretly brings you off-policy RL
    training"), for when sampling runs ahead of training or its kernels differ."""
    weight = truncated_importance_weight(inputs.logprobs, inputs.sampler_logprobs, config.tis_cap)
    per_token = -weight * inputs.advantages * inputs.logprobs
    loss = masked_sum(_with_kl(per_token, inputs), inputs.mask) / config.token_budget
    return loss, loss_metrics(inputs, truncated=weight >= config.tis_cap)


def grpo_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Ablation, GRPO (DeepSeekMath): clipped surrogate, mean over each sequence's tokens, then over
    sequences. Pair with ``rl.advantage.std_normalize = true`` for the original."""
    per_token, clipped = clipped_surrogate(
        inputs.logprobs, inputs.sampler_logprobs, inputs.advantages, config.clip_eps, config.clip_eps
    )
    sequence_ids = _sequence_ids(inputs, "grpo")
    loss = sequence_mean(_with_kl(per_token, inputs), inputs.mask, sequence_ids, inputs.num_sequences,
                         inputs.sequence_tokens)
    return loss, loss_metrics(inputs, clipped=clipped)


def dr_grpo_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Ablation, Dr. GRPO (Liu et al., "Understanding R1-Zero-like training"): GRPO's clipped
    surrogate with each 1/|o_i| replaced by the constant 1/max_sequence_tokens."""
    per_token, clipped = clipped_surrogate(
        inputs.logprobs, inputs.sampler_logprobs, inputs.advantages, config.clip_eps, config.clip_eps
    )
    sequences = inputs.num_sequences
    if sequences is None:
        sequences = count_sequences(inputs.mask, _sequence_ids(inputs, "dr_grpo"))
    normaliser = max(sequences, 1) * config.max_sequence_tokens
    loss = masked_sum(_with_kl(per_token, inputs), inputs.mask) / normaliser
    return loss, loss_metrics(inputs, clipped=clipped)


def dapo_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Ablation, DAPO (Yu et al.): asymmetric "clip-higher" (1-clip_eps, 1+clip_eps_high) and a
    token mean over the whole batch. (DAPO's dynamic sampling and overlong shaping are not losses.)"""
    per_token, clipped = clipped_surrogate(
        inputs.logprobs, inputs.sampler_logprobs, inputs.advantages, config.clip_eps, config.clip_eps_high
    )
    loss = token_mean(_with_kl(per_token, inputs), inputs.mask, inputs.num_tokens)
    return loss, loss_metrics(inputs, clipped=clipped)


LOSSES: dict[str, Callable[[LossInputs, LossConfig], tuple[torch.Tensor, dict[str, float]]]] = {
    "composer": composer_loss,
    "ppo_clip": ppo_clip_loss,
    "tis": tis_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
}


def rl_loss(
    inputs: LossInputs, config: LossConfig, kl: KLConfig | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The configured loss; with ``kl.placement = "loss"`` the per-token KL joins it first."""
    if kl is not None and kl.placement == "loss" and kl.coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError('rl.kl.placement = "loss" needs LossInputs.ref_logprobs (the reference forward)')
        kl_tokens = kl_loss_tokens(inputs.logprobs, inputs.ref_logprobs, kl.estimator, kl.coef)
        inputs = dataclasses.replace(inputs, kl_tokens=kl_tokens)
    return LOSSES[config.name](inputs, config)


# ----------------------------------------------------------------------------------------------
# Metrics


@torch.no_grad()
def loss_metrics(
    inputs: LossInputs,
    clipped: dict[str, torch.Tensor] | None = None,
    truncated: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means over this batch's model tokens. ``kl_sampler`` is k3 of KL(π_sampler ‖ π_θ) on the
    sampler's own tokens (low variance while the two agree, which is the regime it watches)."""
    mask = inputs.mask
    tokens = mask.sum().clamp(min=1)
    logprobs = inputs.logprobs.detach()

    def mean(values: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, values, 0.0).sum() / tokens

    ratio = torch.exp(logprobs - inputs.sampler_logprobs)
    out = {
        "tokens": mask.sum().to(logprobs.dtype),
        "neg_logprob": mean(-logprobs),
        "kl_sampler": mean(k3(inputs.sampler_logprobs, logprobs)),
        "kl_sampler_k1": mean(k1(inputs.sampler_logprobs, logprobs)),
        "ratio_max": torch.where(mask, ratio, 0.0).max(),
        "ratio_min": torch.where(mask, ratio, float("inf")).min(),
    }
    if inputs.entropy is not None:
        out["entropy"] = mean(inputs.entropy.detach())
    if inputs.ref_logprobs is not None:
        out["kl_ref"] = mean(k1(logprobs, inputs.ref_logprobs))
    if inputs.kl_tokens is not None:
        out["kl_loss_term"] = mean(inputs.kl_tokens.detach())
    if clipped is not None:
        out["clip_fraction_low"] = mean(clipped["low"].to(logprobs.dtype))
        out["clip_fraction_high"] = mean(clipped["high"].to(logprobs.dtype))
        out["clip_fraction"] = out["clip_fraction_low"] + out["clip_fraction_high"]
    if truncated is not None:
        out["tis_truncated_fraction"] = mean(truncated.to(logprobs.dtype))
    values = torch.stack([v.to(torch.float64) for v in out.values()]).tolist()  # one device sync
    return dict(zip(out, values, strict=True))


@torch.no_grad()
def ratio_metrics(log_ratios: torch.Tensor) -> dict[str, float]:
    """Importance-ratio statistics of a step: ``log_ratios`` [tokens] is log π_θ − log π_sampler on
    every model token of the step. ``ratio_mean`` is the mean of ρ: 1 on-policy, and in expectation
    under the sampler π_θ's mass on what the sampler can draw, so a mean clearly below 1 means π_θ
    has moved mass to tokens the sampler does not produce. ``log_ratio_abs_p99`` is the 99th
    percentile of |log ρ| (nearest rank), the tail that clipping or truncation would act on. Empty
    when there are no tokens."""
    if log_ratios.numel() == 0:
        return {}
    distance = log_ratios.detach().double().abs().sort().values
    rank = max(math.ceil(0.99 * distance.numel()), 1)
    values = torch.stack([log_ratios.detach().double().exp().mean(), distance[rank - 1]]).tolist()
    return {"ratio_mean": values[0], "log_ratio_abs_p99": values[1]}


@torch.no_grad()
def mismatch_kl(log_ratios: torch.Tensor) -> dict[str, float]:
    """``mismatch_kl``: the per-token KL(π_sampler ‖ π_θ) of a step, averaged over its model
    tokens; ``log_ratios`` [tokens] is log π_θ − log π_sampler on each. Each token is estimated by
    k3 = ρ − 1 − log ρ (Schulman's estimator, ``rl.kl.k3``): unbiased for tokens drawn from the
    sampler, never negative, and of low variance while the two agree, the regime a
    sampler/trainer mismatch lives in (k1 is reported as ``kl_sampler_k1``). The same number as
    the token-weighted ``kl_sampler``, computed once over the step in float64; it is the
    quantity router replay is meant to lower (R3, arXiv 2510.11370). Empty when there are no
    tokens."""
    if log_ratios.numel() == 0:
        return {}
    log_ratios = log_ratios.detach().double()
    return {"mismatch_kl": float(k3(torch.zeros_like(log_ratios), log_ratios).mean())}


@torch.no_grad()
def staleness_metrics(versions: torch.Tensor, trainer_version: int) -> dict[str, float]:
    """How far the sampler was behind the weights being trained: ``versions`` [tokens] (int) is the
    policy version that sampled each model token of the step, and a token's staleness is
    ``trainer_version - version`` (0: on-policy). Returns ``staleness_mean``, ``staleness_max`` and
    ``staleness_hist/s``, the number of tokens of staleness s, for every s from 0 to the max (zero
    counts included). Empty when there are no tokens. A token without a version (-1) or newer than
    ``trainer_version`` is a bookkeeping error and raises."""
    if versions.numel() == 0:
        return {}
    if int(versions.min()) < 0:
        raise ValueError("staleness: a model token has no sampler version (-1); its turn lost its versions")
    staleness = trainer_version - versions.long()
    if int(staleness.min()) < 0:
        raise ValueError(
            f"staleness: tokens sampled by version {int(versions.max())}, newer than the trained version "
            f"{trainer_version}"
        )
    counts = torch.bincount(staleness.cpu()).tolist()
    out = {"staleness_mean": float(staleness.double().mean()), "staleness_max": float(len(counts) - 1)}
    out.update({f"staleness_hist/{s}": float(count) for s, count in enumerate(counts)})
    return out
