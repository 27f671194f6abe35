"""Crash test: ``opencomposer rl`` killed with SIGKILL at random points and resumed trains on every
task of the stream exactly once (asserted from the run's own records), and ends where a run that
was never interrupted ends: the same rollouts at every step, the same final weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]

STEPS, TASKS_PER_STEP, GROUP = 5, 2, 2
RECIPE = f"""
[run]
name = "crash"
seed = 3
threads = 1

[model]
kind = "tiny_moe"
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 16
num_experts = 4
top_k = 2
moe_intermediate_size = 64

[sampling]
max_new_tokens = 8

[grading]
lint = false

[rl]
task_family = "tiny"
steps = {STEPS}
batch_tasks = {TASKS_PER_STEP}
group_size = {GROUP}
lr = 1e-3
checkpoint_every = 1
keep_checkpoints = 2
"""


def progress(run_dir: Path) -> int:
    """Train steps logged so far (the log is cut back to the checkpoint on resume)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip() and json.loads(line)["kind"] == "train")


def launch(recipe: Path, out_dir: Path, log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "opencomposer.cli", "rl", "--recipe", str(recipe), "--set", f"run.out_dir={out_dir}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )


def wait_for(condition, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Poll ``condition`` until it holds; fails if the run exits first or never gets there."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, "the run ended before the event the test waits for"
        assert time.monotonic() < deadline, "the run never reached the event the test waits for"
        time.sleep(0.05)


def test_sigkill_at_random_points_then_resume_trains_each_task_exactly_once(tmp_path):
    from opencomposer.config import load_recipe
    from opencomposer.tasks.generators.tiny import tiny_spec

    recipe = tmp_path / "crash.toml"
    recipe.write_text(RECIPE)
    run_dir = tmp_path / "runs" / "crash"
    rng = random.Random(20260401)
    log_path = tmp_path / "runs.log"
    kills = []
    with log_path.open("w") as log:
        # killed at events, each at a random point before the next one: while starting (model
        # build, initial checkpoint: once it holds the run folder's lock), then within the step
        # after the run logged its 1st, 2nd and 3rd (inside rollouts, scoring, training or
        # checkpointing); every kill lands while the run still has steps to go
        for target in (0, 1, 2, 3):
            proc = launch(recipe, tmp_path / "runs", log)
            wait_for(lambda t=target: (run_dir / ".lock").exists() and progress(run_dir) >= t, proc)
            before = progress(run_dir)
            deadline = time.monotonic() + rng.uniform(0.0, 3.0)  # a random point, at the latest the next step's log
            wait_for(lambda d=deadline, b=before: time.monotonic() >= d or progress(run_dir) > b, proc)
            assert proc.poll() is None, log_path.read_text()[-3000:]
            proc.send_signal(signal.SIGKILL)
            kills.append((target, progress(run_dir)))
            proc.wait()
        proc = launch(recipe, tmp_path / "runs", log)
        assert proc.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    assert [target for target, _ in kills] == [0, 1, 2, 3]

    state = json.loads(sorted((run_dir / "checkpoints").glob("step-*/state.json"))[-1].read_text())
    seed = load_recipe(recipe).run.seed
    expected = [tiny_spec(seed, "train", i).task_id for i in range(STEPS * TASKS_PER_STEP)]
    assert state["step"] == STEPS and state["cursor"] == STEPS * TASKS_PER_STEP
    assert [r["index"] for r in state["trained"]] == list(range(STEPS * TASKS_PER_STEP))  # each position once
    assert [r["task_id"] for r in state["trained"]] == expected  # the stream, in order, no repeats, no gaps
    assert [r["step"] for r in state["trained"]] == [s for s in range(1, STEPS + 1) for _ in range(TASKS_PER_STEP)]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, STEPS + 1))  # logged once each
    for step in range(1, STEPS + 1):
        episodes = [json.loads(line) for line in (run_dir / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]
        assert len(episodes) == TASKS_PER_STEP * GROUP
        assert sorted({e["task_id"] for e in episodes}) == sorted(expected[(step - 1) * TASKS_PER_STEP : step * TASKS_PER_STEP])
        assert {v for e in episodes for v in e["policy_versions"]} == {step - 1}  # sampled by the weights of the step before
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no partial leftovers

    # the same recipe, never interrupted, in another folder
    with log_path.open("a") as log:
        proc = launch(recipe, tmp_path / "straight", log)
        assert proc.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    straight = tmp_path / "straight" / "crash"

    def sampled(folder: Path, step: int) -> list[tuple]:
        lines = (folder / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()
        return sorted((e["task_id"], e["sample"], e["final_turn"], e["reward"]) for e in map(json.loads, lines))

    for step in range(1, STEPS + 1):  # resumed steps replay the stream with the same seeds and weights
        assert sampled(run_dir, step) == sampled(straight, step), f"step {step}"
    from safetensors.torch import load_file

    final = f"checkpoints/step-{STEPS:06d}/model/model.safetensors"
    resumed, uninterrupted = load_file(run_dir / final), load_file(straight / final)
    assert resumed.keys() == uninterrupted.keys()
    # bit for bit: the sampler's rows do not depend on how the episodes happened to be batched
    assert [name for name in resumed if not torch.equal(resumed[name], uninterrupted[name])] == []
