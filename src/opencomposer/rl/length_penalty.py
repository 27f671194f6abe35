"""The length penalty: a concave cost of a weighted episode length, added to the reward.

Report §4.2 (docs/recipe.md §4):

    C(x) = ((1 + k·x)^(1-q) - 1) / (k·(1-q)),      C(0) = 0,   C'(x) = (1 + k·x)^(-q),
    C(x) -> ln(1 + k·x) / k  as q -> 1,

increasing and, for q > 0, concave in x: an extra step costs more on a short (easy) rollout than
on a long (hard) one, which teaches the model to issue tool calls in parallel rather than lengthen
easy tasks. x is a weighted sum of thinking tokens, tool-call tokens, tool-output tokens,
final-message tokens, the number of tool calls and the number of turns.

Where we depart or fill gaps:
- k, q, the weights and the coefficient are not given; ``LengthPenaltyConfig`` holds ours.
- Self-summary tokens are not part of x: the report lists exactly the six features above, and
  charging for summaries would push the policy away from compaction, a separate decision.
- Evaluation: C = expm1((1-q)·ln(1+kx)) / (k(1-q)), accurate to rounding for every q; within
  1e-8 of q = 1 the series ln(1+kx)·(1 + u/2 + u²/6)/k with u = (1-q)·ln(1+kx) replaces it
  (relative truncation error u³/24 < 1e-24·ln(1+kx)³; exact at q = 1).

``length_penalty`` takes Python numbers, NumPy arrays or torch tensors (differentiable); this
module imports NumPy only.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from opencomposer.types import Episode

_NEAR_LOG = 1e-8  # |1 - q| below this uses the series around the logarithmic limit


def _log1p(x: Any) -> Any:
    return x.log1p() if hasattr(x, "log1p") else np.log1p(x)  # torch tensors have .log1p()


def _expm1(x: Any) -> Any:
    return x.expm1() if hasattr(x, "expm1") else np.expm1(x)


def length_penalty(x: Any, k: float, q: float) -> Any:
    """C(x) = ((1 + kx)^(1-q) - 1) / (k(1-q)); ln(1 + kx)/k at q = 1. Elementwise; x >= 0, k > 0."""
    if k <= 0:
        raise ValueError(f"k: must be > 0, got {k}")
    a = 1.0 - q
    log_growth = _log1p(k * x)  # ln(1 + kx)
    if abs(a) < _NEAR_LOG:
        u = a * log_growth
        return log_growth * (1.0 + u / 2.0 + u * u / 6.0) / k
    return _expm1(a * log_growth) / (a * k)


class LengthWeights(Protocol):
    """The six weights of x; ``opencomposer.config.LengthPenaltyConfig`` is one."""

    thinking_tokens: float
    tool_call_tokens: float
    tool_output_tokens: float
    final_message_tokens: float
    tool_calls: float
    turns: float


LENGTH_FEATURES = (
    "thinking_tokens",
    "tool_call_tokens",
    "tool_output_tokens",
    "final_message_tokens",
    "tool_calls",
    "turns",
)


def length_counts(episode: Episode) -> dict[str, int]:
    """The six raw features of x, over every segment of the episode's chain."""
    counts = episode.token_counts()
    return {
        "thinking_tokens": counts["thinking"],
        "tool_call_tokens": counts["tool_call"],
        "tool_output_tokens": counts["tool_output"],
        "final_message_tokens": counts["final_message"],
        "tool_calls": counts["tool_calls"],
        "turns": counts["turns"],
    }


def length_features(episode: Episode, weights: LengthWeights) -> float:
    """x = Σ_f weight_f · count_f over the six features (``LENGTH_FEATURES``)."""
    counts = length_counts(episode)
    return float(sum(getattr(weights, name) * counts[name] for name in LENGTH_FEATURES))
