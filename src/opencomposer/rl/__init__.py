"""The RL recipe of the Composer 2 report (§4.1, §4.2; docs/recipe.md §4), one formula per module.

- ``advantages``: reward minus the group mean; infrastructure failures excluded.
- ``kl``: the k1/k2/k3 estimators; the KL penalty in the reward (default) or in the loss.
- ``length_penalty``: C(x) = ((1+kx)^(1-q) - 1)/(k(1-q)) on a weighted episode length x.
- ``rewards``: the named-term episode reward.
- ``losses``: the Composer policy-gradient loss and the GRPO/Dr. GRPO/DAPO/PPO/TIS ablations.

``docs/rl.md`` has the formulas, the citations and the defaults. Importing this package loads
NumPy only; the torch losses load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from opencomposer.rl import kl
from opencomposer.rl.advantages import episode_advantages, group_advantages
from opencomposer.rl.kl import k1, k2, k3, sequence_kl_penalty
from opencomposer.rl.length_penalty import LENGTH_FEATURES, length_counts, length_features, length_penalty
from opencomposer.rl.rewards import behaviour_counts, episode_reward

_LAZY = {  # name -> module; these import torch
    "LOSSES": "opencomposer.rl.losses",
    "LossInputs": "opencomposer.rl.losses",
    "rl_loss": "opencomposer.rl.losses",
    "composer_loss": "opencomposer.rl.losses",
    "grpo_loss": "opencomposer.rl.losses",
    "dr_grpo_loss": "opencomposer.rl.losses",
    "dapo_loss": "opencomposer.rl.losses",
    "ppo_clip_loss": "opencomposer.rl.losses",
    "tis_loss": "opencomposer.rl.losses",
    "packed_sequence_ids": "opencomposer.rl.losses",
    "token_logprobs_and_entropy": "opencomposer.training.forward",
}

__all__ = [
    "LENGTH_FEATURES",
    "behaviour_counts",
    "episode_advantages",
    "episode_reward",
    "group_advantages",
    "k1",
    "k2",
    "k3",
    "kl",
    "length_counts",
    "length_features",
    "length_penalty",
    "sequence_kl_penalty",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opencomposer.rl' has no attribute {name!r}")
