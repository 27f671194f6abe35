"""The length penalty C(x) (report §4.2): closed forms, finite-difference derivatives, concavity,
the q -> 1 limit against 50-digit arithmetic, and the episode's weighted length x."""

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opencomposer.config import LengthPenaltyConfig
from opencomposer.rl import length_counts, length_features, length_penalty
from opencomposer.types import Episode, Segment, TokenKind, ToolCall, Turn

K = 1e-3


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 2000.0 * (math.sqrt(2.0) - 1.0)),  # 2(√(1+kx) - 1)/k
        (1.0, math.log(2.0) / K),  # the logarithmic limit, exactly
        (0.0, 1000.0),  # linear
        (2.0, 1000.0 / 2.0),  # x/(1+kx), saturating at 1/k
    ],
)
def test_closed_forms_at_x_1000(q, expected):
    assert length_penalty(1000.0, K, q) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("q", [0.0, 0.3, 1.0, 1.0 + 1e-12, 2.5])
def test_zero_at_zero(q):
    assert length_penalty(0.0, K, q) == 0.0


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0 - 1e-9, 1.0, 1.7])
def test_derivative_matches_finite_differences(q):
    x = np.linspace(0.0, 50_000.0, 41) + 1.0
    h = 1e-3
    numeric = (length_penalty(x + h, K, q) - length_penalty(x - h, K, q)) / (2 * h)
    np.testing.assert_allclose(numeric, (1.0 + K * x) ** (-q), rtol=1e-7)
    # and through torch autograd
    xt = torch.tensor(x, requires_grad=True)
    length_penalty(xt, K, q).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), (1.0 + K * x) ** (-q), rtol=1e-12)


@pytest.mark.parametrize("q", [0.25, 0.5, 1.0, 3.0])
def test_increasing_and_concave(q):
    """An extra step costs more on a short rollout than on a long one."""
    x = np.linspace(0.0, 100_000.0, 2001)
    c = length_penalty(x, K, q)
    assert np.all(np.diff(c) > 0)
    assert np.all(np.diff(c, n=2) < 1e-9)
    step = 500.0
    assert length_penalty(1000.0 + step, K, q) - length_penalty(1000.0, K, q) > (
        length_penalty(20_000.0 + step, K, q) - length_penalty(20_000.0, K, q)
    )


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-8, 3e-9, 1e-11, 1e-15, -1e-15, -1e-9, -1e-6])
@pytest.mark.parametrize("x", [1.0, 1e3, 1e6])
def test_near_q_equal_one_matches_50_digit_arithmetic(delta, x):
    """Both sides of the series switch (|1-q| = 1e-8) agree with the formula evaluated in
    50-digit arithmetic to 1e-14. The naive ((1+kx)^(1-q) - 1)/(k(1-q)) in float64 is off by
    4e-11 (relative) at delta = 1e-3, 8e-5 at 1e-9, 0.11 at 1e-12 and 100% at 1e-15 (x = 1)."""
    mpmath.mp.dps = 50
    q = mpmath.mpf(1) - mpmath.mpf(delta)  # delta is exactly representable as a double
    a = 1 - q
    exact = ((1 + mpmath.mpf(K) * x) ** a - 1) / (mpmath.mpf(K) * a)
    assert length_penalty(x, K, 1.0 - delta) == pytest.approx(float(exact), rel=1e-14)


def test_limit_at_q_one_is_log():
    x = np.array([0.0, 1.0, 10.0, 1e4, 1e7])
    np.testing.assert_allclose(length_penalty(x, K, 1.0), np.log1p(K * x) / K, rtol=1e-15)


def test_numpy_torch_and_python_agree():
    x = [0.0, 3.0, 700.0, 12_345.0]
    for q in (0.5, 1.0):
        a = length_penalty(np.array(x), K, q)
        b = length_penalty(torch.tensor(x, dtype=torch.float64), K, q).numpy()
        c = [length_penalty(v, K, q) for v in x]
        np.testing.assert_allclose(a, b, rtol=1e-15)
        np.testing.assert_allclose(a, c, rtol=1e-15)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e7, allow_subnormal=False), st.floats(0.0, 4.0), st.floats(1e-5, 1e-1))
def test_bounds_from_concavity(x, q, k):
    """C(0) = 0, C' = (1+kx)^-q ∈ (0, 1]: so x·C'(x) <= C(x) <= x."""
    c = length_penalty(x, k, q)
    tiny = 1e-300  # near the smallest normal float, rounding is absolute, not relative
    assert x * (1.0 + k * x) ** (-q) * (1 - 1e-12) - tiny <= c <= x * (1 + 1e-12) + tiny


def test_rejects_non_positive_k():
    with pytest.raises(ValueError, match="k: must be > 0"):
        length_penalty(1.0, 0.0, 0.5)


def _turn(kinds, observation, calls=0):
    return Turn(
        token_ids=list(range(len(kinds))),
        logprobs=[0.0] * len(kinds),
        token_kinds=kinds,
        tool_calls=[ToolCall("run", {}) for _ in range(calls)],
        observation_ids=list(range(observation)),
        observation_kinds=[TokenKind.TOOL_OUTPUT] * observation,
    )


def test_length_features_weighted_sum_over_the_chain():
    th, tc, fm, su = TokenKind.THINKING, TokenKind.TOOL_CALL, TokenKind.FINAL_MESSAGE, TokenKind.SUMMARY
    episode = Episode(
        task_id="t",
        segments=[
            Segment(prompt_ids=[1] * 50, turns=[_turn([th] * 7 + [tc] * 5, 30, calls=2), _turn([su] * 9, 0)]),
            Segment(prompt_ids=[1] * 20, turns=[_turn([th] * 3 + [tc] * 4, 11, calls=1), _turn([fm] * 6, 0)]),
        ],
    )
    assert length_counts(episode) == {
        "thinking_tokens": 10,
        "tool_call_tokens": 9,
        "tool_output_tokens": 41,
        "final_message_tokens": 6,
        "tool_calls": 3,
        "turns": 4,
    }
    weights = LengthPenaltyConfig(
        thinking_tokens=1.0,
        tool_call_tokens=2.0,
        tool_output_tokens=0.5,
        final_message_tokens=3.0,
        tool_calls=10.0,
        turns=100.0,
    )
    # prompts and summary tokens are not in x
    assert length_features(episode, weights) == 10 * 1.0 + 9 * 2.0 + 41 * 0.5 + 6 * 3.0 + 3 * 10.0 + 4 * 100.0
