"""Off-policy metrics of a train step: staleness of every model token against the trained version,
and importance-ratio statistics, aggregated over micro-batches; they leave the loss unchanged."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.config import Config, RLConfig
from opencomposer.rl.losses import ratio_metrics, staleness_metrics
from opencomposer.rl.step import train_step
from opencomposer.rl.trainer import ScoredStep, Trainer
from opencomposer.training.packing import collate, episode_rows, micro_batches
from opencomposer.types import Completion, Context, Episode, Segment, Task, TokenKind, Turn
from tests.training.test_forward import SMALL


@pytest.fixture(scope="module")
def small(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    return load_model(SMALL, tiny_tokenizer, seed=5)


def test_staleness_metrics_count_tokens_per_staleness_up_to_the_max():
    versions = torch.tensor([5, 5, 4, 2, 5, 2])  # staleness 0 0 1 3 0 3 against version 5
    assert staleness_metrics(versions, 5) == {
        "staleness_mean": 7 / 6, "staleness_max": 3.0,
        "staleness_hist/0": 3.0, "staleness_hist/1": 1.0, "staleness_hist/2": 0.0, "staleness_hist/3": 2.0,
    }
    assert staleness_metrics(torch.tensor([9, 9]), 9) == {"staleness_mean": 0.0, "staleness_max": 0.0,
                                                          "staleness_hist/0": 2.0}
    assert staleness_metrics(torch.zeros(0, dtype=torch.long), 3) == {}
    with pytest.raises(ValueError, match="newer than the trained version 4"):
        staleness_metrics(torch.tensor([3, 5]), 4)
    with pytest.raises(ValueError, match="no sampler version"):
        staleness_metrics(torch.tensor([3, -1]), 4)


def test_ratio_metrics_mean_and_nearest_rank_p99_of_the_log_ratio_size():
    sizes = 0.01 * np.arange(1, 201)  # |log ρ| = 0.01 .. 2.00; nearest rank of p99 in 200 values: the 198th
    signs = np.where(np.arange(200) % 2 == 0, 1.0, -1.0)
    log_ratios = torch.tensor(sizes * signs)
    got = ratio_metrics(log_ratios)
    assert got["log_ratio_abs_p99"] == pytest.approx(1.98, abs=1e-12)
    assert got["ratio_mean"] == pytest.approx(np.exp(sizes * signs).mean(), rel=1e-12)
    assert ratio_metrics(torch.zeros(1)) == {"ratio_mean": 1.0, "log_ratio_abs_p99": 0.0}
    assert ratio_metrics(torch.zeros(0)) == {}


def versioned_episode(rng, versions_per_turn: list[list[int]]) -> Episode:
    """One segment; turn i samples len(versions_per_turn[i]) tokens at those versions."""
    turns = []
    for versions in versions_per_turn:
        n = len(versions)
        turns.append(Turn(token_ids=rng.integers(200, 3000, n).tolist(), logprobs=(-rng.random(n) - 0.5).tolist(),
                          token_kinds=[TokenKind.TOOL_CALL] * n, policy_version=versions[0],
                          token_versions=list(versions), observation_ids=rng.integers(200, 3000, 3).tolist(),
                          observation_kinds=[TokenKind.TOOL_OUTPUT] * 3))
    return Episode(task_id="t", segments=[Segment(prompt_ids=rng.integers(100, 160, 20).tolist(), turns=turns)])


def test_train_step_reports_staleness_over_all_micro_batches_and_leaves_the_loss_alone(small):
    model, _ = small
    rng = np.random.default_rng(0)
    episodes = [versioned_episode(rng, [[7, 7, 8], [8, 8]]),  # an episode spanning versions 7 and 8
                versioned_episode(rng, [[9, 9, 9, 9]]),
                versioned_episode(rng, [[6] * 6])]
    rows = episode_rows(episodes, [1.0, -0.5, 0.25])
    batches = [collate(chunk, pad_id=0) for chunk in micro_batches(rows, max_tokens=40)]
    assert len(batches) == 3
    config = RLConfig()

    def step(version):
        trained = copy.deepcopy(model)
        loss, metrics = train_step(trained, torch.optim.SGD(trained.parameters(), lr=0.1), batches, config,
                                   trainer_version=version)
        return loss, metrics, trained

    loss, metrics, trained = step(9)
    # staleness against version 9: 2 tokens at 2, 3 at 1, 4 at 0, 6 at 3
    assert metrics["staleness_max"] == 3.0 and metrics["staleness_mean"] == pytest.approx((2 * 2 + 3 + 6 * 3) / 15)
    assert [metrics[f"staleness_hist/{s}"] for s in range(4)] == [4.0, 3.0, 2.0, 6.0]
    assert "staleness_hist/4" not in metrics and metrics["tokens"] == 15.0
    assert metrics["ratio_min"] <= metrics["ratio_mean"] <= metrics["ratio_max"]
    widest = max(abs(math.log(metrics["ratio_min"])), abs(math.log(metrics["ratio_max"])))
    assert metrics["log_ratio_abs_p99"] == pytest.approx(widest, rel=1e-6)  # 15 tokens: p99 is the largest
    assert metrics["kl_sampler"] > 0
    # without a version: no staleness, and the same loss and update bit for bit
    plain_loss, plain_metrics, plain = step(None)
    assert not any(name.startswith("staleness") for name in plain_metrics)
    assert plain_loss == loss
    for a, b in zip(trained.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="newer than the trained version 8"):
        step(8)
    with pytest.raises(ValueError, match="carries no sampler versions"):
        train_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.1),
                   [dataclasses.replace(batches[0], versions=None)], config, trainer_version=9)


def test_trainer_train_takes_the_version_and_reports_staleness_on_skipped_steps_too(small):
    model, tokenizer = small
    config = Config()
    config.rl.kl.coef = 0.0
    trainer = Trainer(copy.deepcopy(model), tokenizer, config)
    rng = np.random.default_rng(1)
    rows = episode_rows([versioned_episode(rng, [[3, 4]]), versioned_episode(rng, [[4, 4, 4]])], [0.5, -0.5])
    _, metrics = trainer.train(ScoredStep(rows=rows), version=4)
    assert metrics["skipped"] == 0.0 and metrics["staleness_hist/1"] == 1.0 and metrics["staleness_hist/0"] == 4.0
    assert "ratio_mean" in metrics and "log_ratio_abs_p99" in metrics
    for row in rows:
        row.advantage = 0.0
    _, metrics = trainer.train(ScoredStep(rows=rows), version=5)
    assert metrics["skipped"] == 1.0 and metrics["staleness_max"] == 2.0 and metrics["staleness_hist/1"] == 4.0
    _, metrics = trainer.train(ScoredStep(rows=rows))
    assert not any(name.startswith("staleness") for name in metrics)


class _SwitchingEngine:
    """An engine whose answer spans two versions (as an in-flight update leaves it)."""

    policy_version = 3
    max_positions = 512

    def generate(self, prompts, params, n=1):
        return [Completion(token_ids=[10, 11, 12], logprobs=[-0.1] * 3, finish_reason="length",
                           policy_version=2, token_versions=[2, 3, 3])]


def test_the_engine_policy_hands_on_every_token_version(tiny_tokenizer):
    policy = EnginePolicy(_SwitchingEngine(), tiny_tokenizer)
    task = Task(id="t", instruction="x", repo=Path("."))
    output = policy.act(Context(task=task, messages=[], token_ids=[1, 2], turn_index=0, max_new_tokens=8))
    assert (output.policy_version, output.token_versions) == (2, [2, 3, 3])
    turn = Turn(token_ids=output.token_ids, logprobs=output.logprobs, token_kinds=[TokenKind.THINKING] * 3,
                policy_version=output.policy_version, token_versions=list(output.token_versions))
    assert Episode(task_id="t", segments=[Segment(prompt_ids=[1, 2], turns=[turn])]).policy_versions == [2, 3]
