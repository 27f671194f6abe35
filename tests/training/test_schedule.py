"""The shared warm-up + cosine schedule against its closed form, in both step conventions
(pretraining and SFT: the peak on the first step after the warm-up; RL: the floor on the last step)."""

from __future__ import annotations

import math

import pytest

from opencomposer.training.schedule import warmup_cosine_lr


def test_sft_and_pretraining_schedule_warms_up_then_decays_by_cosine_to_a_tenth():
    def lr(step: int) -> float:
        return warmup_cosine_lr(step, peak_lr=1e-3, warmup_steps=5, total_steps=25, min_lr_ratio=0.1)

    expected = [1e-3 * (s + 1) / 5 for s in range(5)]
    expected += [1e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * (s - 5) / 20))) for s in range(5, 25)]
    assert [lr(s) for s in range(25)] == pytest.approx(expected, rel=1e-12)
    assert lr(5) == pytest.approx(1e-3) and lr(25) == pytest.approx(1e-4)
    assert lr(15) == pytest.approx(5.5e-4, rel=1e-12)  # half-way through the decay: (1 + 0.1) / 2
    assert lr(400) == pytest.approx(1e-4)  # past the end (pretraining by wall-clock time): the floor


def test_rl_schedule_reaches_the_floor_on_the_last_update():
    def lr(update: int) -> float:
        return warmup_cosine_lr(update, peak_lr=1e-3, warmup_steps=2, total_steps=10, min_lr_ratio=0.1,
                                floor_on_last_step=True)

    expected = [5e-4, 1e-3] + [1e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * k / 8))) for k in range(1, 9)]
    assert [lr(u) for u in range(10)] == pytest.approx(expected, rel=1e-12)
    assert lr(5) == pytest.approx(5.5e-4, rel=1e-12)  # 4 of 8 decay steps
    assert lr(9) == pytest.approx(1e-4) and lr(50) == pytest.approx(1e-4)


def test_a_floor_ratio_of_one_is_a_constant_rate_after_the_warm_up():
    rates = [warmup_cosine_lr(s, peak_lr=1e-3, warmup_steps=4, total_steps=10, min_lr_ratio=1.0,
                              floor_on_last_step=True) for s in range(12)]
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert rates[4:] == [1e-3] * 8  # exactly the peak, not merely close
    assert warmup_cosine_lr(0, peak_lr=1e-3, warmup_steps=0, total_steps=10, min_lr_ratio=1.0) == 1e-3
