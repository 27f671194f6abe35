"""Router replay in RL: the routes of real episodes reach the trainer whole, the trainer replays them
(``rl.router_replay``), and the step reports ``router_replay_replace_rate`` and ``mismatch_kl``."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import Config, ConfigError, RLConfig
from opencomposer.model.routing import RouteRecorder, moe_routers
from opencomposer.rl.losses import mismatch_kl
from opencomposer.rl.step import train_step
from opencomposer.rl.trainer import ScoredStep, Trainer
from opencomposer.training.packing import collate, episode_rows
from opencomposer.types import EpisodeStatus, Grade, Group
from tests.training.test_forward import SMALL

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def _grade(resolved: bool) -> Grade:
    return Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=1, tests_failed=0,
                 tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1,
                 lines_added=1, lines_removed=0, lines_changed=1, todo_added=0, comment_lines_added=0, lint_added=0,
                 grading_s=0.0)


@pytest.fixture(scope="module")
def sampled(tiny_tokenizer):
    """Two two-turn episodes of a tiny Qwen3-MoE in the real loop and sandbox, and the model: the
    second turn's prefill gives the first turn's tool output its routes."""
    from opencomposer.agent.loop import AgentLoop
    from opencomposer.agent.policies.local import EnginePolicy
    from opencomposer.config import SamplingConfig
    from opencomposer.inference.local import LocalEngine
    from opencomposer.model.loading import load_model
    from opencomposer.sandbox.workspace import Sandbox
    from opencomposer.tasks.format import load_task

    model, tokenizer = load_model(SMALL, tiny_tokenizer, seed=2)
    with torch.no_grad():  # decisive routers (random init scores every expert about alike)
        for router in moe_routers(model):
            router.weight.mul_(30.0)
    policy = EnginePolicy(LocalEngine(copy.deepcopy(model), tokenizer), tokenizer,
                          SamplingConfig(max_new_tokens=16, temperature=1.0))
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_turns = 2
    episodes = []
    for seed in (1, 2):
        with Sandbox(task.repo) as sandbox:
            episode = AgentLoop(policy, task, sandbox, seed=seed).run()
        episode.grade = _grade(resolved=seed == 1)
        episodes.append(episode)
    return model, tokenizer, task, episodes


@pytest.mark.integration
@pytest.mark.bwrap
def test_every_position_of_a_real_episode_carries_the_route_the_engine_ran_it_with(sampled):
    model, _, _, episodes = sampled
    for episode in episodes:
        [segment] = episode.segments
        assert len(segment.turns) == 2
        routes = segment.routes()
        ids = segment.token_ids()
        last_observation = len(segment.turns[-1].observation_ids)
        assert routes.shape == (len(ids), 2, 2) and last_observation > 0
        assert (routes[len(ids) - last_observation :] == -1).all()  # no call ran the last tool output
        known = routes[: len(ids) - last_observation]
        with RouteRecorder(model) as recorder, torch.no_grad():
            model(torch.tensor([ids]))
            fresh = recorder.take(1, len(ids))[0].numpy()
        # the engine's prefill and decode steps route as a plain forward does (up to near-ties)
        agree = (known == fresh[: len(known)]).all(axis=(1, 2)).mean()
        assert agree > 0.98, agree


@pytest.mark.integration
@pytest.mark.bwrap
def test_a_filtered_replay_step_trains_on_real_episodes_and_reports_its_metrics(sampled):
    model, tokenizer, task, episodes = sampled
    config = Config()
    config.rl.kl.reference, config.rl.kl.coef, config.rl.length_penalty.coef = "none", 0.0, 0.0
    config.rl.router_replay, config.rl.lr = "filtered", 1e-3
    trainer = Trainer(copy.deepcopy(model), tokenizer, config)
    scored = trainer.score([Group(task=task, episodes=copy.deepcopy(episodes))])
    assert all(row.routes is not None for row in scored.rows) and len(scored.rows) == 2
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    _, metrics = trainer.train(scored, version=0)
    # the sampler had the trainer's weights: its experts are the trainer's own, none implausible
    assert metrics["router_replay_replace_rate"] == 0.0
    assert metrics["router_replay_agreement"] > 0.98
    assert 0.0 <= metrics["mismatch_kl"] < 1e-4
    assert metrics["mismatch_kl"] == pytest.approx(metrics["kl_sampler"], rel=1e-5, abs=1e-12)
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert any(n.endswith("gate.weight") for n in moved)  # the router learns under replay

    # routes from elsewhere (here: random) are replayed, and the filter replaces the implausible ones
    rows = [dataclasses.replace(row) for row in scored.rows]
    generator = np.random.default_rng(0)
    for row in rows:
        row.routes = np.argsort(generator.random((*row.routes.shape[:2], 4)), axis=-1)[..., :2].astype(np.int32)
    _, metrics = trainer.train(ScoredStep(rows=rows), version=1)
    assert 0.05 < metrics["router_replay_replace_rate"] < 0.95
    assert metrics["router_replay_agreement"] < 0.9


def test_replay_needs_routes_and_an_moe_model(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from opencomposer.model.loading import load_model

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    config = Config()
    config.rl.router_replay, config.rl.kl.reference, config.rl.kl.coef = "filtered", "none", 0.0
    with pytest.raises(ConfigError, match="rl.router_replay = 'filtered': router replay needs an MoE model"):
        Trainer(dense, tiny_tokenizer, config)
    model, _ = load_model(SMALL, tiny_tokenizer, seed=0)
    rows = episode_rows([_episode_without_routes()], [1.0])
    batch = collate(rows, pad_id=0)
    assert batch.routes is None
    with pytest.raises(ValueError, match="the batch carries no routes"):
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), [batch], RLConfig(router_replay="replay"))
    with pytest.raises(ConfigError, match="rl.router_replay_threshold"):
        RLConfig(router_replay_threshold=1.5)


def _episode_without_routes():
    from opencomposer.types import Episode, Segment, TokenKind, Turn

    turn = Turn(token_ids=[300, 301, 302], logprobs=[-1.0] * 3, token_kinds=[TokenKind.FINAL_MESSAGE] * 3)
    return Episode("t", [Segment(prompt_ids=list(range(100, 120)), turns=[turn])], status=EpisodeStatus.OK,
                   grade=_grade(True))


def test_mismatch_kl_is_the_mean_k3_of_the_sampler_to_trainer_kl():
    log_ratios = torch.tensor([0.1, -0.2, 0.0, 0.3])  # log π_θ − log π_sampler
    expected = sum(math.exp(r) - 1 - r for r in (0.1, -0.2, 0.0, 0.3)) / 4
    assert mismatch_kl(log_ratios)["mismatch_kl"] == pytest.approx(expected, rel=1e-7)
    assert mismatch_kl(torch.zeros(3)) == {"mismatch_kl": 0.0}
    assert mismatch_kl(torch.zeros(0)) == {}


@pytest.mark.integration
@pytest.mark.bwrap
def test_the_rl_loop_runs_with_filtered_router_replay(tmp_path):
    from opencomposer.config import load_recipe
    from opencomposer.rl.loop import run_rl
    from tests.rl.test_loop import SMALL_RUN

    # seed 0: the step's advantages are not all zero (the length penalty and the other shaped terms
    # tell its episodes apart), so it trains, and replays the sampler's routes
    overrides = [*SMALL_RUN, f"run.out_dir={tmp_path}", "run.name=replay", "run.seed=0", "rl.steps=1",
                 "rl.eval_every=0", "rl.router_replay=filtered"]
    run_rl(load_recipe(None, overrides), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "replay" / "metrics.jsonl").read_text().splitlines()]
    [train] = [r for r in rows if r["kind"] == "train"]
    assert train["skipped"] == 0 and train["episodes_in_loss"] > 0
    assert train["router_replay_replace_rate"] == 0.0 and train["router_replay_agreement"] > 0.95
    assert 0.0 <= train["mismatch_kl"] < 1e-3
