"""Group advantages (report §4.1): golden values, a pure-Python reference, and the exclusion of
infrastructure failures."""

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencomposer.rl import episode_advantages, group_advantages
from opencomposer.types import Episode, EpisodeStatus


def test_group_advantages_golden():
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.0, 1.0]
    np.testing.assert_array_equal(
        group_advantages(rewards, 4),
        [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0, 0.0625, -0.1875, -0.4375, 0.5625],
    )


def test_std_normalize_matches_statistics_module():
    rewards = [0.2, 0.9, 0.4, 1.3, 2.0, -1.0]
    got = group_advantages(rewards, 3, std_normalize=True, eps=1e-6)
    expected = []
    for group in (rewards[:3], rewards[3:]):
        mean, std = statistics.fmean(group), statistics.stdev(group)  # stdev: ddof = 1
        expected += [(r - mean) / (std + 1e-6) for r in group]
    np.testing.assert_allclose(got, expected, rtol=1e-14)


def test_no_std_division_keeps_tiny_differences_tiny():
    """The report's reason for not dividing: three perfect rollouts and one 0.001 worse get
    advantages of order 1e-3 as they should; GRPO's division inflates them to order 1."""
    rewards = [1.0, 1.0, 1.0, 0.999]
    plain = group_advantages(rewards, 4)
    grpo = group_advantages(rewards, 4, std_normalize=True)
    np.testing.assert_allclose(plain, [0.00025, 0.00025, 0.00025, -0.00075], atol=1e-15)
    # group std (ddof = 1) is 0.0005; eps = 1e-6 shifts the quotient by 0.2%
    np.testing.assert_allclose(grpo, [0.499002, 0.499002, 0.499002, -1.497006], rtol=1e-6)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=24), st.integers(2, 6))
def test_each_group_sums_to_zero(values, group_size):
    rewards = values[: len(values) // group_size * group_size]
    if not rewards:
        return
    advantages = group_advantages(rewards, group_size).reshape(-1, group_size)
    np.testing.assert_allclose(advantages.sum(axis=1), 0.0, atol=1e-12)


@pytest.mark.parametrize(
    ("rewards", "group_size", "message"),
    [([1.0, 0.0], 1, "group_size"), ([1.0, 0.0, 1.0], 2, "do not split"), ([1.0, float("nan")], 2, "finite")],
)
def test_group_advantages_rejects_bad_input(rewards, group_size, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, group_size)


def _episode(reward, status=EpisodeStatus.OK):
    return Episode(task_id="t", reward=reward, status=status)


def test_infra_errors_leave_the_mean_and_the_loss_and_small_groups_drop():
    infra = EpisodeStatus.INFRA_ERROR
    groups = [
        # one infrastructure failure: the mean is over the three scored episodes (1, 0, 0.5 -> 0.5)
        [_episode(1.0), _episode(0.0), _episode(0.0, infra), _episode(0.5)],
        # a timeout is a scored outcome, not a failure
        [_episode(0.0, EpisodeStatus.TIMEOUT), _episode(1.0)],
        # one scored episode left: no baseline, the whole group is dropped
        [_episode(1.0), _episode(0.0, infra), _episode(0.0, infra)],
        # equal rewards: kept, but carries no signal
        [_episode(0.3), _episode(0.3)],
    ]
    advantages, metrics = episode_advantages(groups)
    assert advantages == [[0.5, -0.5, None, 0.0], [-0.5, 0.5], [None, None, None], [0.0, 0.0]]
    assert metrics == {
        "groups": 4.0,
        "groups_dropped": 1.0,
        "groups_zero_signal": 1.0,
        "episodes_infra_error": 3.0,
        "episodes_in_loss": 7.0,
        # every scored episode, the dropped group's one too (as resolved_rate and reward/* count)
        "reward_mean": pytest.approx((1.0 + 0.0 + 0.5 + 0.0 + 1.0 + 1.0 + 0.3 + 0.3) / 8),
    }


def test_infra_error_is_not_scored_zero():
    """Scoring the failure as 0 would have shifted the mean to 0.5 and the advantages to ±0.5."""
    advantages, _ = episode_advantages(
        [[_episode(1.0), _episode(1.0), _episode(0.0, EpisodeStatus.INFRA_ERROR)]]
    )
    assert advantages == [[0.0, 0.0, None]]
