"""The distribution a sample is drawn from: temperature, then the top-k / top-p cut, renormalised.

One rule, used by the sampler (``inference.rows.sample_tokens``) to draw tokens and record their
logprobs, and by the trainer (``training.forward.token_logprobs``) to score the same tokens, for
the policy and for the KL reference alike. With a cut (``top_p < 1`` or ``top_k > 0``) the
sampled distribution is not the softmax of the logits: it is that softmax restricted to the kept
tokens and renormalised,

    π_cut(v) = exp(z_v) / Σ_{u kept} exp(z_u)  for kept v, 0 otherwise,   z = logits / temperature.

Recording log π_cut (and training on it) keeps RL on-policy: the ratio π_θ/π_sampler and the k1
estimate log q − log p compare the distributions the tokens really came from. Scoring the full
softmax instead would make the gradient off-policy and hand the k1 penalty a bonus of
−log(kept mass) per token, largest on high-entropy positions.

**Which tokens are kept.** Tokens are ranked by probability, most likely first. A token is kept
when it is among the first ``top_k`` (``top_k = 0``: no limit) and the probability mass ranked
strictly before it is below ``top_p``, so the token that crosses ``top_p`` is kept and the
most likely token always is. Tied probabilities are ranked in ``torch.sort``'s order.

**What is not differentiated.** The kept set is a discrete choice: its gradient is zero almost
everywhere and the trainer treats it as fixed; log π_cut is differentiated through the kept
logits only. Away from ties and from the top-p boundary this is the exact gradient.

Not here: greedy decoding (temperature 0), which the sampler handles itself, and sampling order
(``sample_tokens`` draws by inverse CDF in vocabulary order).
"""

from __future__ import annotations

import torch


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 at least: half precision upcast, float64 kept."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


FIXED_POINT_BITS = 40
"""Fraction bits of ``prefix_sums``'s fixed-point sums in deterministic mode: probabilities are
counted in steps of 2^-40 (over a vocabulary of 152k the sums are off by at most 7e-8, about
float32's own rounding near 1), and a total of up to 2^23 fits in int64."""


def prefix_sums(x: torch.Tensor) -> torch.Tensor:
    """Running sums along the last dimension of non-negative ``x`` (probabilities): ``x.cumsum(-1)``,
    except under torch's deterministic mode (``run.deterministic``), where torch has no
    deterministic floating-point ``cumsum`` on CUDA and refuses it.

    There each value is rounded to a whole number of 2^-``FIXED_POINT_BITS`` steps and the steps
    are summed as int64, which is exact, so the sums are the same on every device and in every
    batch, never decrease, and stay flat over zeros: an inverse-CDF draw never lands on a token
    the top-p cut removed, and ``searchsorted`` gets sorted input. (A scan of float adds would be
    deterministic too, but neighbouring positions round differently there, so its sums dip and
    rise at zeros.) Float64 arithmetic; ``x``'s dtype back."""
    if not (torch.are_deterministic_algorithms_enabled() and x.is_floating_point()):
        return x.cumsum(dim=-1)
    scale = 2.0**FIXED_POINT_BITS
    steps = (x.double() * scale).round().long()  # exact: scaling by a power of two, then whole numbers
    return (steps.cumsum(dim=-1).double() / scale).to(x.dtype)


def truncates(top_p: float, top_k: int) -> bool:
    """Whether ``top_p`` / ``top_k`` cut anything (``top_p = 1`` and ``top_k = 0`` do not)."""
    return top_k > 0 or top_p < 1.0


@torch.no_grad()
def kept_tokens(scaled_logits: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Which tokens survive the cut (see module doc): a bool mask shaped like ``scaled_logits``
    ``[..., V]``, the logits already divided by the temperature. Probabilities are computed in
    float32 at least (float64 stays float64)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not truncates(top_p, top_k):
        return torch.ones_like(scaled_logits, dtype=torch.bool)
    probs = torch.softmax(widened(scaled_logits), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [..., V]
    keep_sorted = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k:
        keep_sorted[..., top_k:] = False
    if top_p < 1.0:
        before = prefix_sums(sorted_probs) - sorted_probs  # mass ranked strictly before each token
        keep_sorted &= before < top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def truncated_logprobs(scaled_logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """log π_cut over the vocabulary, ``[..., V]``: the log-softmax of the kept logits, −inf
    elsewhere (``keep = None``: the plain log-softmax). Differentiable in the kept logits."""
    if keep is None:
        return torch.log_softmax(scaled_logits, dim=-1)
    return torch.log_softmax(scaled_logits.masked_fill(~keep, float("-inf")), dim=-1)
