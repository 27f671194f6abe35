"""The learning-rate schedule of every trainer: a linear warm-up, then a cosine decay to a floor.

At 0-based step ``s``, with peak rate η, ``W`` warm-up steps, ``T`` steps in all and floor ratio r:

    s < W:   η · (s + 1) / W
    s ≥ W:   η · (r + (1 − r) · ½ · (1 + cos(π · p))),   p = min(1, (s − W + k) / max(1, T − W))

r = 1 gives a constant rate after the warm-up (RL's default ``rl.lr_schedule = "constant"``).
Past ``T`` the rate stays at the floor (pretraining can run its schedule by wall-clock time and
overshoot).

``k`` is where the callers have always differed, and the schedule keeps both so that no run's
numbers move: pretraining and SFT use k = 0 (the first step after the warm-up runs at the peak
again, and the floor would be reached at step ``T``, one past the last); RL uses k = 1
(``floor_on_last_step``: the peak is the last warm-up step, and the last update, ``T − 1``, runs
at the floor). Tests in ``tests/training/test_schedule.py`` pin both against the closed form.
"""

from __future__ import annotations

import math


def warmup_cosine_lr(
    step: int,
    *,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
    floor_on_last_step: bool = False,
) -> float:
    """The learning rate at 0-based ``step`` (see the module doc for the formula and ``k``)."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    shift = 1 if floor_on_last_step else 0
    progress = min(1.0, (step - warmup_steps + shift) / max(1, total_steps - warmup_steps))
    return peak_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
