"""Group-relative advantages: reward minus the mean reward of the task's group.

Report §4.1 (docs/recipe.md §4): several rollouts per prompt with a fixed group size G; the advantage
of a rollout is its reward minus the group mean, and **not** divided by the group's standard
deviation (that division turns tiny behavioural differences into full-size advantages when every
rollout of a group is equally correct). Every model token of an episode, summaries included,
shares the episode's advantage; spreading it over tokens is the trainer's job.

Where we depart or fill gaps:
- ``std_normalize=True`` is the GRPO ablation: divide by the unbiased (ddof = 1) group standard
  deviation plus ``eps``, as DeepSeekMath-style implementations do. The report never divides.
- Infrastructure failures (``EpisodeStatus.INFRA_ERROR``) are not the policy's doing: they are
  left out of the group mean and out of the loss, never scored as zero. A group left with fewer
  than two scored episodes has no baseline and is dropped (counted in the metrics).
- The group mean includes the episode itself, so the policy gradient is scaled by (G-1)/G
  relative to a leave-one-out baseline; the KL Monte Carlo test measures exactly this factor.

This module imports NumPy only; rewards are a handful of floats per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from opencomposer.types import Episode

MIN_SCORED_PER_GROUP = 2  # fewer scored episodes leave no baseline to subtract


def group_advantages(
    rewards: ArrayLike, group_size: int, std_normalize: bool = False, eps: float = 1e-6
) -> np.ndarray:
    """A_i = r_i - mean_{j in group(i)} r_j, optionally / (std_group + eps).

    ``rewards`` is ``[num_groups * group_size]`` with each group contiguous; returns float64 of the
    same shape. Every reward must be finite (drop infrastructure failures first, or use
    ``episode_advantages``).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards: expected a flat array [num_groups * group_size], got shape {r.shape}")
    if group_size < MIN_SCORED_PER_GROUP:
        raise ValueError(
            f"group_size: must be >= {MIN_SCORED_PER_GROUP} to have a baseline, got {group_size}"
        )
    if r.size % group_size:
        raise ValueError(f"rewards: {r.size} values do not split into groups of {group_size}")
    if not np.all(np.isfinite(r)):
        raise ValueError(
            "rewards: every reward must be finite; infrastructure failures are excluded, not scored"
        )
    groups = r.reshape(-1, group_size)  # [num_groups, G]
    advantages = groups - groups.mean(axis=1, keepdims=True)
    if std_normalize:
        advantages = advantages / (groups.std(axis=1, ddof=1, keepdims=True) + eps)
    return advantages.reshape(-1)


def episode_advantages(
    groups: Sequence[Sequence[Episode]], std_normalize: bool = False, eps: float = 1e-6
) -> tuple[list[list[float | None]], dict[str, float]]:
    """Advantages from ``episode.reward`` for groups of episodes, skipping infrastructure failures.

    Returns one list per group, aligned with its episodes: a float for each episode that enters
    the loss, ``None`` for an episode that does not (an infrastructure failure, or any episode of
    a group left with fewer than two scored episodes). Groups may differ in size once failures are
    removed; each is centred on its own scored episodes. Metrics count what was left out;
    ``reward_mean`` is over every scored episode, a dropped group's included.
    """
    out: list[list[float | None]] = []
    dropped_groups = infra_errors = used = zero_signal = 0
    scored_rewards: list[float] = []
    for episodes in groups:
        scored = [i for i, episode in enumerate(episodes) if episode.scored]
        infra_errors += len(episodes) - len(scored)
        advantages: list[float | None] = [None] * len(episodes)
        scored_rewards += [episodes[i].reward for i in scored]
        if len(scored) < MIN_SCORED_PER_GROUP:
            dropped_groups += 1
            out.append(advantages)
            continue
        rewards = [episodes[i].reward for i in scored]
        values = group_advantages(rewards, len(scored), std_normalize=std_normalize, eps=eps)
        for i, value in zip(scored, values, strict=True):
            advantages[i] = float(value)
        used += len(scored)
        zero_signal += int(np.all(values == 0.0))
        out.append(advantages)
    metrics = {
        "groups": float(len(groups)),
        "groups_dropped": float(dropped_groups),
        "groups_zero_signal": float(zero_signal),  # every scored reward equal: no gradient from it
        "episodes_infra_error": float(infra_errors),
        "episodes_in_loss": float(used),
        # over every scored episode, those of dropped groups too: the same episodes as the
        # trainer's resolved_rate and reward/* terms, so the terms add up to this mean
        "reward_mean": float(np.mean(scored_rewards)) if scored_rewards else float("nan"),
    }
    return out, metrics
