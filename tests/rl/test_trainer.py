"""The trainer: its gradient, clipping, micro-batching, Adam, scoring order and weight push,
each against an independent computation."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import Config, RLConfig
from opencomposer.rl.step import train_step
from opencomposer.rl.trainer import Trainer
from opencomposer.training.packing import collate, common_prefix, episode_rows, micro_batches
from opencomposer.types import Episode, EpisodeStatus, Grade, Group, Segment, Task, TokenKind, Turn
from tests.training.test_forward import SMALL

PROMPT = list(range(100, 160))  # 60 shared prompt ids


@pytest.fixture(scope="module")
def small(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model(SMALL, tiny_tokenizer, seed=5)
    return model, tokenizer


def episode(rng, resolved: float, status=EpisodeStatus.OK, n_model: int = 6) -> Episode:
    ids = rng.integers(200, 3000, n_model).tolist()
    turn = Turn(token_ids=ids, logprobs=(-rng.random(n_model)).tolist(), token_kinds=[TokenKind.TOOL_CALL] * n_model,
                observation_ids=rng.integers(200, 3000, 4).tolist(), observation_kinds=[TokenKind.TOOL_OUTPUT] * 4)
    turn2 = Turn(token_ids=rng.integers(200, 3000, 3).tolist(), logprobs=[-0.5] * 3, token_kinds=[TokenKind.FINAL_MESSAGE] * 3)
    grade = Grade(resolved=resolved == 1.0, fail_to_pass=resolved, pass_to_pass=1.0, tests_passed=1 + int(resolved),
                  tests_failed=1 - int(resolved), tests_errored=0, test_exit_code=1 - int(resolved),
                  test_timed_out=False, rubric_ok=True, files_changed=1, lines_added=1, lines_removed=1,
                  lines_changed=2, todo_added=0, comment_lines_added=0, lint_added=0, grading_s=0.1)
    return Episode(task_id="t", segments=[Segment(prompt_ids=list(PROMPT), turns=[turn, turn2])], status=status,
                   grade=grade, diff="")


def manual_gradient(model, rows, token_budget: int) -> dict[str, torch.Tensor]:
    """−Σ A·log π / budget over model tokens, from one plain forward per row."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for row in rows:
        logits = model(input_ids=torch.from_numpy(row.input_ids)[None]).logits[0].double()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(row.target_ids)[:, None])[:, 0]
        total = total - (row.advantage * logp[torch.from_numpy(row.loss_mask)]).sum() / token_budget
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def sgd_update(model, batches, config: RLConfig) -> dict[str, torch.Tensor]:
    """Parameter change of one train_step under SGD(lr=1): minus the (clipped) gradient."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batches, config)
    delta = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(before[n])
    return delta


def test_train_step_gradient_is_the_composer_policy_gradient_and_micro_batches_add_up(small):
    model, _ = small
    rng = np.random.default_rng(0)
    episodes = [episode(rng, r) for r in (1.0, 0.0, 0.0, 1.0, 0.0)]
    rows = episode_rows(episodes, [0.6, -0.4, -0.4, 0.6, -0.4])
    config = RLConfig(grad_clip=0.0)
    config.loss.token_budget = 64
    expected = manual_gradient(model, rows, config.loss.token_budget)
    whole = sgd_update(model, [collate(rows, 0)], config)
    split = sgd_update(model, [collate(c, 0) for c in micro_batches(rows, max_tokens=2 * 75)], config)
    assert len(micro_batches(rows, max_tokens=2 * 75)) == 3
    for name, grad in expected.items():
        scale = float(grad.abs().max()) + 1e-12
        assert float((-whole[name] - grad).abs().max()) / scale < 1e-3, name
        assert float((split[name] - whole[name]).abs().max()) / scale < 1e-3, name
    untouched = [n for n, d in whole.items() if n not in expected]
    assert all(float(whole[n].abs().max()) == 0.0 for n in untouched)


def test_micro_batches_that_count_the_shared_prefix_once_leave_the_update_alone(small):
    """``micro_batches(..., prefix)``: rows sharing a 59-position prompt go five to a micro-batch of
    150 positions (59 + 5 × 13) where the padded count fits two (2 × 72); the update is the same,
    and the prefix is the one the shared-prefix forward finds (control: rows without it cut as
    before)."""
    from opencomposer.training.forward import MIN_SHARED_PREFIX, shared_prefix_length

    model, _ = small
    rng = np.random.default_rng(3)
    rows = episode_rows([episode(rng, r) for r in (1.0, 0.0, 0.0, 1.0, 0.0)], [0.6, -0.4, -0.4, 0.6, -0.4])
    prefix = common_prefix(rows, MIN_SHARED_PREFIX)
    assert prefix == shared_prefix_length(collate(rows, 0)) == len(PROMPT) - 1
    counted_once = micro_batches(rows, 150, prefix)
    assert [len(c) for c in counted_once] == [5] and len(micro_batches(rows, 150)) == 3
    config = RLConfig(grad_clip=0.0)
    config.loss.token_budget = 64
    padded = sgd_update(model, [collate(c, 0) for c in micro_batches(rows, 150)], config)
    once = sgd_update(model, [collate(c, 0) for c in counted_once], config)
    for name, delta in padded.items():
        scale = float(delta.abs().max()) + 1e-12
        assert float((once[name] - delta).abs().max()) / scale < 1e-3, name
    assert common_prefix(rows[:1], MIN_SHARED_PREFIX) == 0 and common_prefix(rows, 100) == 0


@pytest.mark.parametrize("bf16", [False, True])
def test_the_step_runs_the_prefix_its_micro_batches_share_once(small, monkeypatch, bf16: bool):
    """``training.forward.StepPrefix``: three micro-batches behind one 59-position prompt run it
    through the model once, not once per micro-batch (twice, and the last one, a single row, in
    full), and the update is the one of recomputing it per
    micro-batch (control: the step prefix turned off). A batch whose rows do not begin with the
    prefix is refused."""
    import opencomposer.rl.step as step_module
    from opencomposer.training.forward import StepPrefix, step_prefix_length, token_logprobs

    model, _ = small
    rng = np.random.default_rng(4)
    rows = episode_rows([episode(rng, r) for r in (1.0, 0.0, 0.0, 1.0, 0.0)], [0.6, -0.4, -0.4, 0.6, -0.4])
    batches = [collate(c, 0) for c in micro_batches(rows, 150)]
    assert len(batches) == 3 and step_prefix_length(batches) == len(PROMPT) - 1
    assert step_prefix_length(batches[:1]) == 0  # one micro-batch: its own prefix path does the same
    config = RLConfig(grad_clip=0.0, bf16=bf16)
    config.loss.token_budget = 64
    widths = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        once = sgd_update(model, batches, config)
        once_widths, widths[:] = list(widths), []
        monkeypatch.setattr(step_module, "step_prefix_length", lambda *a, **k: 0)
        each = sgd_update(model, batches, config)
    finally:
        hook.remove()
    prefix = (1, len(PROMPT) - 1)  # then 13 positions a row; the last micro-batch holds one row
    assert [tuple(w) for w in once_widths] == [prefix, (2, 13), (2, 13), (1, 13)]
    assert [tuple(w) for w in widths] == [prefix, (2, 13), prefix, (2, 13), (1, 72)]
    for name, delta in each.items():
        scale = float(delta.abs().max()) + 1e-12
        # float32: a parameter near 1 holds 6e-8; bf16: the gradient into the prefix rounds to
        # 2^-8 once instead of once per micro-batch (largest difference seen 0.0074)
        error = float((once[name] - delta).abs().max()) / scale
        assert error < (2e-2 if bf16 else 1e-4), (name, error)
    other = episode_rows([episode(np.random.default_rng(5), 1.0)], [1.0])[0]
    other.input_ids[0] += 1  # a row that does not begin with the prefix
    with pytest.raises(ValueError, match="do not all begin"):
        token_logprobs(model, collate([rows[0], other], 0), step_prefix=StepPrefix(model, batches[0], prefix[1]))


def test_gradient_clipping_bounds_the_update_norm(small):
    model, _ = small
    rows = episode_rows([episode(np.random.default_rng(1), 1.0)], [1.0])
    config = RLConfig(grad_clip=1e-3)
    config.loss.token_budget = 1  # a gradient far above the clip
    delta = sgd_update(model, [collate(rows, 0)], config)
    norm = torch.sqrt(sum((d.double() ** 2).sum() for d in delta.values()))
    assert float(norm) == pytest.approx(1e-3, rel=1e-4)


def test_optimizer_is_full_parameter_adam_with_the_recipe_betas_and_eps(small):
    model, tokenizer = small
    config = Config()
    config.rl.lr, config.rl.adam_betas, config.rl.adam_eps, config.rl.kl.reference = 3e-4, [0.8, 0.95], 1e-6, "none"
    optimizer = Trainer(model, tokenizer, config).optimizer
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-4, (0.8, 0.95), 1e-6, 0.0)
    assert sum(p.numel() for p in group["params"]) == sum(p.numel() for p in model.parameters())


def test_score_puts_the_k1_penalty_into_the_reward_before_the_group_advantage(small):
    model, tokenizer = small
    policy = copy.deepcopy(model)
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy, so the KL is not zero
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    config = Config()
    config.rl.kl.coef = 0.05
    config.rl.length_penalty.coef = 0.0
    trainer = Trainer(policy, tokenizer, config, reference=reference)
    rng = np.random.default_rng(2)
    task = Task(id="t", instruction="x", repo=Path("."))
    groups = [Group(task, [episode(rng, 1.0), episode(rng, 0.0), episode(rng, 0.0, EpisodeStatus.INFRA_ERROR)]),
              Group(task, [episode(rng, 1.0), episode(rng, 1.0, EpisodeStatus.INFRA_ERROR)])]
    scored = trainer.score(groups)
    # independent KL: coef · Σ_t (sampler logprob − reference logprob) over each episode's model tokens
    for group in groups[:1]:
        for ep in group.episodes[:2]:
            row = episode_rows([ep])[0]
            with torch.no_grad():
                logits = reference(input_ids=torch.from_numpy(row.input_ids)[None]).logits[0].double()
            ref = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(row.target_ids)[:, None])[:, 0].numpy()
            expected_kl = 0.05 * float(np.sum((row.sampler_logprobs.astype(np.float64) - ref)[row.loss_mask]))
            assert ep.reward_terms["kl_penalty"] == pytest.approx(-expected_kl, abs=1e-5)
            assert ep.reward == pytest.approx(sum(ep.reward_terms.values()), abs=1e-12)
    first = groups[0].episodes
    mean = (first[0].reward + first[1].reward) / 2
    assert groups[0].advantages[:2] == pytest.approx([first[0].reward - mean, first[1].reward - mean], abs=1e-12)
    assert np.isnan(groups[0].advantages[2])  # infrastructure failure: no advantage, not in the loss
    assert all(np.isnan(a) for a in groups[1].advantages)  # one scored episode left: group dropped
    assert scored.metrics["groups_dropped"] == 1.0 and scored.metrics["episodes_infra_error"] == 2.0
    assert sorted({row.episode for row in scored.rows}) == [0, 1]
    assert groups[1].episodes[0].reward_terms["resolved"] == 1.0  # scored, yet out of the loss
    # the step's means are over the same three scored episodes (the dropped group's one included),
    # so the logged terms add up to the logged mean reward
    scored_episodes = [groups[0].episodes[0], groups[0].episodes[1], groups[1].episodes[0]]
    assert scored.metrics["reward_mean"] == pytest.approx(np.mean([e.reward for e in scored_episodes]), abs=1e-12)
    assert scored.metrics["resolved_rate"] == pytest.approx(2 / 3)
    terms = sum(v for k, v in scored.metrics.items() if k.startswith("reward/"))
    assert terms == pytest.approx(scored.metrics["reward_mean"], abs=1e-9)


def test_publish_pushes_the_weights_into_the_engine_with_a_version(small):
    from opencomposer.inference.local import LocalEngine

    model, tokenizer = small
    policy = copy.deepcopy(model)
    engine = LocalEngine(copy.deepcopy(model), tokenizer)
    config = Config()
    config.rl.kl.reference = "none"
    config.rl.kl.coef = 0.0
    trainer = Trainer(policy, tokenizer, config)
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    trainer.publish(engine, version=7)
    assert engine.policy_version == 7
    for (name, a), (_, b) in zip(policy.state_dict().items(), engine.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_learning_rate_warms_up_linearly_then_stays_constant(tiny_moe):
    from opencomposer.config import Config
    from opencomposer.rl.trainer import Trainer

    model, tokenizer = tiny_moe
    config = Config()
    config.rl.lr, config.rl.lr_warmup_steps, config.rl.kl.reference = 1e-3, 4, "none"
    trainer = Trainer(model, tokenizer, config)
    assert [trainer.learning_rate(s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    config.rl.lr_warmup_steps = 0
    assert trainer.learning_rate(0) == 1e-3
    # cosine after a 2-update warm-up, over 10 steps, down to a tenth: closed form per update
    config.rl.lr_warmup_steps, config.rl.steps, config.rl.lr_schedule, config.rl.min_lr_ratio = 2, 10, "cosine", 0.1
    expected = [5e-4, 1e-3] + [1e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * k / 8))) for k in range(1, 9)]
    assert [trainer.learning_rate(u) for u in range(10)] == pytest.approx(expected, rel=1e-12)
    assert trainer.learning_rate(9) == pytest.approx(1e-4) and trainer.learning_rate(50) == pytest.approx(1e-4)


def test_a_rollout_of_the_unchanged_policy_pays_no_kl_and_trains_at_ratio_one(small):
    """With a top-p cut the sampler records, and the trainer scores, the cut distribution for the
    policy and the reference alike: k1 of a rollout from the policy the reference equals is 0, and
    the first update's ratios are 1. Scoring the reference on the full softmax would charge
    −Σ log(kept mass) instead."""
    from opencomposer.inference.local import LocalEngine
    from opencomposer.training.forward import reference_logprobs
    from opencomposer.types import SamplingParams

    model, tokenizer = small
    config = Config()
    config.sampling.temperature, config.sampling.top_p = 0.9, 0.8
    config.rl.kl.coef, config.rl.length_penalty.coef = 1.0, 0.0
    trainer = Trainer(copy.deepcopy(model), tokenizer, config, reference=copy.deepcopy(model))
    engine = LocalEngine(copy.deepcopy(model), tokenizer)
    params = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=0.8, seed=3)
    completions = engine.generate([PROMPT], params, n=4)
    rng = np.random.default_rng(0)
    episodes = []
    for j, completion in enumerate(completions):
        ep = episode(rng, float(j % 2))
        ids = completion.token_ids
        ep.segments = [Segment(prompt_ids=list(PROMPT), turns=[
            Turn(token_ids=ids, logprobs=completion.logprobs, token_kinds=[TokenKind.THINKING] * len(ids))])]
        episodes.append(ep)
    scored = trainer.score([Group(Task(id="t", instruction="x", repo=Path(".")), episodes)])
    penalties = [ep.reward_terms["kl_penalty"] for ep in episodes]
    assert max(abs(p) for p in penalties) < 1e-3, penalties
    batch = collate(episode_rows(episodes[:1]), trainer.pad_id)
    full = reference_logprobs(model, batch, temperature=0.9)  # no cut: what the reference used to be scored with
    full_k1 = float((batch.sampler_logprobs - full)[batch.loss_mask].sum())
    assert full_k1 > 1.0  # log q_cut − log p_full = −log(kept mass) > 0 at every token
    _, metrics = trainer.train(scored)
    assert metrics["skipped"] == 0.0
    assert 1 - 1e-3 < metrics["ratio_min"] <= metrics["ratio_max"] < 1 + 1e-3
    assert abs(metrics["kl_sampler_k1"]) < 1e-4


def test_the_record_tells_trained_tasks_from_dropped_groups_and_skipped_steps(small):
    from opencomposer.rl.loop import step_records

    model, tokenizer = small
    config = Config()
    config.rl.kl.coef, config.rl.length_penalty.coef = 0.0, 0.0
    trainer = Trainer(copy.deepcopy(model), tokenizer, config)
    rng = np.random.default_rng(7)
    learns, failed = Task(id="learns", instruction="x", repo=Path(".")), Task(id="failed", instruction="x", repo=Path("."))
    groups = [Group(learns, [episode(rng, 1.0), episode(rng, 0.0)]),
              Group(failed, [episode(rng, 1.0), episode(rng, 1.0, EpisodeStatus.INFRA_ERROR)])]
    _, metrics = trainer.train(trainer.score(groups))
    trained, dropped = step_records([4, 5], groups, 3, skipped=bool(metrics["skipped"]))
    assert (trained.index, trained.task_id, trained.step, trained.status, trained.reason) == (4, "learns", 3, "trained", "")
    assert (dropped.task_id, dropped.status) == ("failed", "dropped")
    assert dropped.reason.startswith("group dropped: 1 of 2 episodes scored")

    same = [Group(learns, [episode(rng, 1.0), episode(rng, 1.0)])]  # every reward equal: nothing to learn
    _, metrics = trainer.train(trainer.score(same))
    assert metrics["skipped"] == 1.0
    [skipped] = step_records([6], same, 4, skipped=True)
    assert skipped.status == "dropped" and skipped.reason.startswith("step skipped")


def test_step_metrics_count_tampered_episodes_beside_resolved_ones():
    """``tampered_rate`` is the share of scored episodes whose grade is ``tampered``; an
    infrastructure error is in neither rate."""
    import dataclasses

    rng = np.random.default_rng(3)
    episodes = [episode(rng, 1.0), episode(rng, 0.0), episode(rng, 0.0), episode(rng, 0.0, EpisodeStatus.INFRA_ERROR)]
    for ep in episodes[1:3] + episodes[3:]:
        ep.grade = dataclasses.replace(ep.grade, tampered=True)
    episodes[0].grade = dataclasses.replace(episodes[0].grade, diff_round_trip_failed=True)
    metrics = Trainer._reward_metrics(episodes)
    assert (metrics["resolved_rate"], metrics["tampered_rate"]) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert metrics["diff_round_trip_failures"] == 1.0
    assert metrics["hack_suspected_rate"] == 0.0


def test_step_metrics_give_the_share_of_episodes_the_hack_monitor_flagged():
    import dataclasses

    rng = np.random.default_rng(4)
    episodes = [episode(rng, 1.0), episode(rng, 0.0), episode(rng, 0.0, EpisodeStatus.INFRA_ERROR)]
    episodes[0].grade = dataclasses.replace(episodes[0].grade, hack_suspected=True, hack_reasons=("swallowing x.py:1",))
    episodes[2].grade = dataclasses.replace(episodes[2].grade, hack_suspected=True)  # never scored: not counted
    assert Trainer._reward_metrics(episodes)["hack_suspected_rate"] == pytest.approx(1 / 2)
