"""``rl.task_sampling = "harder_later"`` (``rl.tasks``): the difficulty estimate, the weighted
draws against a reference computed here, single epoch, the record of why a task was drawn, and a
resume that draws the same tasks. The rollouts are simulated (a task with K notes is solved with a
probability falling with K), so every test but the last runs in well under a second; the last runs
the real loop for three steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.rl.checkpoint import RunState
from opencomposer.rl.tasks import POOL, DifficultyEstimator, Draw, TaskStream
from opencomposer.tasks.generators.tiny import split_size, tiny_spec
from opencomposer.types import Episode, Grade, Group, Segment, Task, TokenKind, Turn

PASS_RATE = {3: 1.0, 4: 0.75, 5: 0.25, 6: 0.0}  # of a simulated policy on tiny-long, by K notes


def _grade(resolved: bool) -> Grade:
    return Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=1, tests_failed=0,
                 tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1,
                 lines_added=1, lines_removed=0, lines_changed=1, todo_added=0, comment_lines_added=0, lint_added=0,
                 grading_s=0.0)


def _episode(resolved: bool, turns: int, tokens_per_turn: int) -> Episode:
    turn = [Turn(token_ids=[0] * tokens_per_turn, logprobs=[0.0] * tokens_per_turn,
                 token_kinds=[TokenKind.THINKING] * tokens_per_turn) for _ in range(turns)]
    return Episode(task_id="t", segments=[Segment(prompt_ids=[1], turns=turn)], grade=_grade(resolved))


def _group(episodes: list[Episode]) -> Group:
    return Group(task=Task(id="t", instruction="", repo=Path(".")), episodes=episodes)


def _simulated_group(k: int, rng: np.random.Generator, size: int = 4) -> Group:
    """A group of ``size`` rollouts of a K-note task: K + 2 turns of 20 tokens, solved at PASS_RATE[K]."""
    return _group([_episode(bool(rng.random() < PASS_RATE[k]), k + 2, 20) for _ in range(size)])


def _stream(tmp_path: Path, *overrides: str) -> TaskStream:
    config = load_recipe(None, ["rl.task_family=tiny-long", "rl.batch_tasks=4", "rl.task_sampling=harder_later",
                                "rl.harder_from_step=3", *overrides])
    return TaskStream(config, tmp_path)


def _k(stream: TaskStream, pool_index: int) -> int:
    return tiny_spec(stream.config.run.seed, "train", pool_index, "tiny-long").k


def _train(stream: TaskStream, steps: range, rollouts: np.random.Generator) -> None:
    """What RLRun.step does with the stream: draw the step's tasks, roll them out, observe them."""
    for step in steps:
        for draw in stream.draw(step):
            index = stream.draws.index(draw)
            stream.observe(index, _simulated_group(_k(stream, draw.pool_index), rollouts))


def test_difficulty_is_the_failure_rate_plus_the_relative_turns_and_tokens():
    estimator = DifficultyEstimator()
    alike, other = ("task:a", "fam/max_turns=12", "family:fam"), ("task:b", "gen/max_turns=3", "family:gen")
    assert estimator.difficulty(alike) is None  # nothing observed: no estimate at all
    estimator.observe(alike, _group([_episode(True, 1, 10), _episode(False, 3, 10)]))  # 2 turns, 20 tokens
    # alone in the pool, its turns and tokens are the pool's means: 0.5 + ¼·½ + ¼·½
    assert estimator.difficulty(alike) == pytest.approx(0.75)
    estimator.observe(other, _group([_episode(True, 4, 10), _episode(True, 4, 10)]))  # 4 turns, 40 tokens
    # means now 3 turns and 30 tokens: 0.5 + ¼·2/5 + ¼·20/50
    assert estimator.difficulty(alike) == pytest.approx(0.7)
    assert estimator.difficulty(("task:c", "fam/max_turns=12", "family:fam")) == pytest.approx(0.7)  # alike, unseen
    # a task of an unseen family: the pool's means, failure ¼: 0.25 + ¼·3/6 + ¼·30/60
    assert estimator.difficulty(("task:d", "new/max_turns=1", "family:new")) == pytest.approx(0.5)
    # a group whose every episode failed on infrastructure says nothing
    estimator.observe(alike, _group([Episode(task_id="t", status="infra_error")]))
    assert estimator.sums[POOL][0] == 2


def test_in_order_is_the_stream_of_before(tmp_path):
    config = load_recipe(None, ["rl.task_family=tiny", "rl.batch_tasks=4"])
    stream = TaskStream(config, tmp_path)
    assert stream.draw(1) == [] and stream.state_dict() == {}
    assert [stream.task(i).id for i in range(stream.size)] == [tiny_spec(0, "train", i).task_id for i in range(20)]
    assert all(stream.drawn(i) == Draw(i, "order", None) for i in range(stream.size))


def test_harder_later_draws_every_task_once_and_in_order_before_its_step(tmp_path):
    stream = _stream(tmp_path, "rl.harder_from_step=3")
    steps = math.ceil(split_size("train", "tiny-long") / 4)
    _train(stream, range(1, steps + 1), np.random.default_rng(0))
    pools = [d.pool_index for d in stream.draws]
    assert sorted(pools) == list(range(stream.size))  # single epoch: all drawn, none twice
    assert pools[:8] == list(range(8)) and {d.drawn_by for d in stream.draws[:8]} == {"order"}
    assert {d.drawn_by for d in stream.draws[8:]} == {"harder_later"}
    assert stream.draws[0].difficulty is None and stream.draws[8].difficulty is not None
    assert stream.draw(steps + 1) == []  # nothing left
    with pytest.raises(IndexError, match="not drawn yet"):
        _stream(tmp_path).drawn(0)


def test_harder_tasks_are_drawn_earlier(tmp_path):
    """In the first 80 steps (320 of 1,288 tasks, about a quarter of each K in pool order), the
    draws from step 2 on take K = 6 tasks (never solved) more than twice as often as K = 3 tasks
    (always solved), and K = 5 and 6 together make most of them; drawn in order, each K makes about
    a quarter."""
    stream = _stream(tmp_path, "rl.harder_from_step=2", "rl.harder_weight=1.0")
    _train(stream, range(1, 81), np.random.default_rng(1))
    position = {k: [i for i, d in enumerate(stream.draws) if _k(stream, d.pool_index) == k] for k in PASS_RATE}
    assert len(position[6]) > 2 * len(position[3])
    assert len(position[6]) + len(position[5]) > 0.6 * 320
    in_order = _stream(tmp_path, "rl.harder_from_step=1000")  # the same pool, never by difficulty
    _train(in_order, range(1, 81), np.random.default_rng(1))
    counts = [sum(_k(in_order, d.pool_index) == k for d in in_order.draws) for k in PASS_RATE]
    assert all(60 <= count <= 100 for count in counts), counts  # about 80 of each K


def test_first_draw_of_a_step_follows_the_weights_of_a_reference_computation(tmp_path):
    """The estimator holds one observed group per K; the step's first draw over 1,000 generator
    seeds is tested against P(K) = n_K w_K / Σ n w, with d_K and w_K = exp(β z_K) computed here from
    the formula (a chi-square test at the 0.1 % level)."""
    from scipy.stats import chisquare

    beta = 0.8
    stream = _stream(tmp_path, "rl.harder_from_step=1", f"rl.harder_weight={beta}")
    observed_pass = {3: 1.0, 4: 0.5, 5: 0.5, 6: 0.0}
    for k, rate in observed_pass.items():
        index = next(j for j in range(stream.size) if _k(stream, j) == k)
        group = _group([_episode(i < 2 * rate, k + 2, 20) for i in range(2)])
        stream.estimator.observe(stream.levels[index], group)
    ks = np.array([_k(stream, j) for j in range(stream.size)])
    counts = {k: int((ks == k).sum()) for k in observed_pass}
    mean_turns, mean_tokens = np.mean([k + 2 for k in observed_pass]), np.mean([20 * (k + 2) for k in observed_pass])
    d = {k: (1 - observed_pass[k]) + 0.25 * (k + 2) / (k + 2 + mean_turns) + 0.25 * 20 * (k + 2) / (20 * (k + 2) + mean_tokens)
         for k in observed_pass}
    per_task = np.array([d[k] for k in ks])
    z = {k: (d[k] - per_task.mean()) / per_task.std() for k in d}
    total = sum(counts[k] * math.exp(beta * z[k]) for k in d)
    expected = {k: counts[k] * math.exp(beta * z[k]) / total for k in d}
    state = stream.state_dict()
    draws = []
    for seed in range(1000):
        stream.load_state_dict(state, 0)
        stream.rng = np.random.default_rng(seed)
        draws.append(_k(stream, stream.draw(1)[0].pool_index))
    seen = [draws.count(k) for k in d]
    assert chisquare(seen, [1000 * expected[k] for k in d]).pvalue > 1e-3
    assert expected[6] > expected[5] > expected[3]  # the reference itself ranks harder first


def test_a_resume_from_the_state_draws_the_same_tasks(tmp_path):
    straight = _stream(tmp_path)
    _train(straight, range(1, 9), np.random.default_rng(7))
    resumed = _stream(tmp_path)
    rollouts = np.random.default_rng(7)
    _train(resumed, range(1, 5), rollouts)
    state = RunState.from_json(RunState(step=4, cursor=16, sampling=resumed.state_dict()).to_json())  # state.json
    fresh = _stream(tmp_path)
    fresh.load_state_dict(state.sampling, state.cursor)
    _train(fresh, range(5, 9), rollouts)
    assert fresh.draws == straight.draws
    assert fresh.state_dict() == json.loads(json.dumps(straight.state_dict()))


def test_config_refuses_what_cannot_hold():
    with pytest.raises(ConfigError, match="rl.harder_weight: must be >= 0"):
        load_recipe(None, ["rl.harder_weight=-1"])
    with pytest.raises(ConfigError, match="rl.harder_from_step: must be >= 1"):
        load_recipe(None, ["rl.harder_from_step=0"])
    with pytest.raises(ConfigError, match='use rl.mode = "sync"'):
        load_recipe(None, ["rl.task_sampling=harder_later", "rl.mode=async"])
    with pytest.raises(ConfigError, match="in_order"):
        load_recipe(None, ["rl.task_sampling=hardest"])


@pytest.mark.integration
@pytest.mark.bwrap
def test_the_real_loop_records_why_and_a_resumed_run_draws_what_a_straight_one_did(tmp_path):
    from opencomposer.rl.loop import run_rl

    small = ["run.threads=1", "model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
             "model.moe_intermediate_size=64", "sampling.max_new_tokens=12", "grading.lint=false",
             "rl.task_family=tiny", "rl.batch_tasks=2", "rl.group_size=2", "rl.lr=1e-3", "rl.eval_every=0",
             "rl.task_sampling=harder_later", "rl.harder_from_step=2", f"run.out_dir={tmp_path}"]
    run_rl(load_recipe(None, [*small, "run.name=straight", "rl.steps=3"]), progress=False)
    run_rl(load_recipe(None, [*small, "run.name=resumed", "rl.steps=2"]), progress=False)
    run_rl(load_recipe(None, [*small, "run.name=resumed", "rl.steps=3"]), progress=False)

    def records(name: str) -> list[dict]:
        return json.loads((tmp_path / name / "checkpoints" / "step-000003" / "state.json").read_text())["trained"]

    straight = records("straight")
    assert [r["drawn_by"] for r in straight] == ["order"] * 2 + ["harder_later"] * 4
    assert straight[0]["difficulty"] is None and all(r["difficulty"] is not None for r in straight[2:])
    assert len({r["task_id"] for r in straight}) == 6  # single epoch
    assert records("resumed") == straight
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [row.get("drawn_harder_share") for row in rows] == [0.0, 1.0, 1.0]
