"""KL regulariser to a reference policy: the k1/k2/k3 estimators and where the penalty goes.

Report §4.1 (docs/recipe.md §4): the policy q is kept near a reference p with the **k1** estimator.
For a token a sampled from q, with r = p(a)/q(a) = exp(logp_ref - logp):

    k1 = -log r             = logp - logp_ref          unbiased for KL(q‖p), any variance
    k2 = (log r)^2 / 2                                 biased (E[k2] = KL only to second order)
    k3 = (r - 1) - log r                               unbiased, >= 0; its variance grows like
                                                       E_q[r^2] and explodes as q drifts from p

(J. Schulman's "Approximating KL divergence" notes.) The report picks k1 over k3 for the last
reason and over k2 for its bias. The coefficient and the reference policy are not given: ours are
in ``KLConfig`` (reference = the initial checkpoint, coef = 1e-3).

Placement matters more than the estimator. E_q[∇_θ k1] = E_q[∇_θ log q] = 0 (the score-function
identity), so **k1 added to the loss contributes no gradient in expectation**. The gradient of
KL(q‖p) is E_q[k1 · ∇_θ log q]: k1 must act as a *reward*, detached, multiplying the score.
Hence ``placement = "reward"`` (our default, the correct one): each episode's reward is reduced
by coef · Σ_t k1(t) over its model tokens before the advantage is taken. ``placement = "loss"``
adds coef · k(t) to each token's loss, as GRPO does with k3 (whose loss gradient is that of
the *forward* KL(p‖q), not KL(q‖p)); tests/rl/test_kl.py measures all of this by Monte Carlo.

The estimators take NumPy arrays or torch tensors (gradients flow through torch inputs); this
module imports neither torch nor anything heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def _expm1(x: Any) -> Any:
    return x.expm1() if hasattr(x, "expm1") else np.expm1(x)  # torch tensors have .expm1()


def k1(logp: Any, logp_ref: Any) -> Any:
    """k1 = -log r = logp - logp_ref, elementwise; logp is the sampling policy's."""
    return logp - logp_ref


def k2(logp: Any, logp_ref: Any) -> Any:
    """k2 = (log r)^2 / 2, elementwise."""
    return 0.5 * (logp_ref - logp) ** 2


def k3(logp: Any, logp_ref: Any) -> Any:
    """k3 = (r - 1) - log r, elementwise, with r - 1 = expm1(logp_ref - logp) for accuracy near r = 1.
    No clamping: the tail is the point of the comparison."""
    log_r = logp_ref - logp
    return _expm1(log_r) - log_r


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def kl_loss_tokens(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str, coef: float) -> torch.Tensor:
    """Placement ``"loss"``: coef · k(t) per token, ``[rows, seq]``, differentiable through ``logp``.
    The loss function aggregates it like the policy-gradient term (and masks it)."""
    return coef * ESTIMATORS[estimator](logp, logp_ref.detach())


def sequence_kl_penalty(
    logp: torch.Tensor,  # [rows, seq] log-probs of the sampled tokens under the policy
    logp_ref: torch.Tensor,  # [rows, seq] the same tokens under the reference
    loss_mask: torch.Tensor,  # [rows, seq] true on model-sampled tokens
    sequence_ids: torch.Tensor,  # [rows, seq] int, which episode a token belongs to, in [0, num_sequences)
    num_sequences: int,
    coef: float,
    estimator: str = "k1",
) -> torch.Tensor:  # [num_sequences]
    """Placement ``"reward"``: coef · Σ_t k(t) over each episode's model tokens, detached.

    Subtract it from the episode's reward (``rewards.episode_reward(kl_penalty=...)``) before the
    group advantage. Tokens of one episode may sit in several rows (a self-summary chain, or
    packing); ``sequence_ids`` gathers them.
    """
    per_token = ESTIMATORS[estimator](logp.detach(), logp_ref.detach())  # [rows, seq]
    mask = loss_mask.bool()
    totals = per_token.new_zeros(num_sequences)
    totals.index_add_(0, sequence_ids[mask].long(), per_token[mask])
    return coef * totals
