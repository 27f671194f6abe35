"""The asynchronous RL services end to end on the tiny recipe (embedded backend, real sandbox,
real model, real trainer): staleness 0 is the synchronous loop bit for bit; staleness 1 keeps
its bound; every injected fault leaves a finished run with the exactly-once record intact."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from opencomposer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl-tiny.toml"
SHRUNK = [
    "model.path=", "rl.batch_tasks=2", "rl.group_size=4", "rl.eval_every=0", "sampling.max_new_tokens=24",
]

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def run_async(config, faults=None, on_run=None):
    """``config`` on the asynchronous source (``faults`` injected); ``on_run`` sees the run, its
    services started, before its first step."""
    from opencomposer.rl.loop import RLRun
    from opencomposer.services.async_rl import AsyncRollouts

    run = RLRun(config, AsyncRollouts(faults=faults))
    if on_run is not None:
        on_run(run)
    return run.run()


def config_for(tmp_path: Path, name: str, *overrides: str):
    return load_recipe(RECIPE, [*SHRUNK, f"run.out_dir={tmp_path}", f"run.name={name}", *overrides])


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "train"]


def record(run_dir: Path) -> list[dict]:
    from opencomposer.rl.checkpoint import latest_checkpoint

    return json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["trained"]


def assert_exactly_once(run_dir: Path, tasks: int) -> None:
    indices = [r["index"] for r in record(run_dir)]
    assert sorted(indices) == list(range(tasks)), indices
    assert all(r["status"] in ("trained", "dropped") for r in record(run_dir))


def assert_exited(pid: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs {within_s} s after the run ended")


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / f"checkpoints/step-{step:06d}/model/model.safetensors")


@pytest.mark.parametrize("process", [False, True], ids=["threads", "inference-process"])
def test_staleness_zero_reproduces_the_synchronous_loop(tmp_path: Path, process: bool):
    """Also with the sampler in a child process of its own (``services.inference_process``):
    built from the run's saved ``initial`` folder and the weight store, it samples the same tokens."""
    from opencomposer.rl.loop import run_rl

    steps = ["rl.steps=2", "rl.checkpoint_every=2"]
    sync = run_rl(config_for(tmp_path, "sync", *steps), progress=False).run_dir
    asyn = run_async(config_for(tmp_path, "async", *steps, "rl.mode=async", "rl.max_staleness=0",
                                f"services.inference_process={str(process).lower()}")).run_dir
    for step in (1, 2):
        path = Path("rollouts") / f"step-{step:06d}.jsonl"
        assert (sync / path).read_text() == (asyn / path).read_text(), f"step {step}"
    a, b = weights(sync, 2), weights(asyn, 2)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []
    assert [row["staleness_max"] for row in train_rows(asyn)] == [0, 0]


def test_staleness_one_samples_ahead_within_the_bound(tmp_path: Path):
    from opencomposer.services.weights import WeightStore

    config = config_for(tmp_path, "s1", "rl.steps=3", "rl.mode=async", "rl.max_staleness=1")
    runs = []
    with pytest.warns(UserWarning, match="rl.max_staleness = 1 and rl.loss.name = 'composer'"):
        run_dir = run_async(config, on_run=runs.append).run_dir
    rows = train_rows(run_dir)
    assert [row["policy_version"] for row in rows] == [1, 2, 3]
    assert all(0 <= row["staleness_max"] <= 1 for row in rows)
    assert all("staleness_mean" in row for row in rows)
    assert_exactly_once(run_dir, 6)
    store = WeightStore(run_dir / "weights")
    assert store.versions() == [0, 1, 2, 3]
    final, rebuilt = runs[0].model.state_dict(), store.load(3)  # the trainer's weights, bit for bit
    assert final.keys() == rebuilt.keys()
    assert all(torch.equal(final[name], rebuilt[name]) for name in final)
    assert not list((run_dir / "groups").glob("*.pkl"))  # every group checkpoint consumed


# the inference process killed and started again at the newest version is also
# tests/services/test_inference_process.py's: its variant here runs in the slow set
@pytest.mark.parametrize("process", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["threads", "inference-process"])
def test_faults_leave_a_finished_run_and_an_exactly_once_record(tmp_path: Path, process: bool):
    """A worker killed mid-episode, a grader that crashes, a sandbox that hangs and an inference
    engine that dies, all in one run. With ``services.inference_process`` the engine's death is
    the child process killed with SIGKILL; a new one starts at the newest version."""
    from opencomposer.services.faults import Fault, FaultPlan

    plan = FaultPlan([
        Fault("kill_worker", index=0, sample=1),
        Fault("crash_grader", index=1, sample=2),
        Fault("hang_sandbox", index=2, sample=0),
        Fault("kill_inference", after=1),  # the second engine call dies
    ])
    config = config_for(tmp_path, "faults", "rl.steps=2", "rl.mode=async", "rl.max_staleness=1",
                        "services.worker_timeout_s=1.5", "services.heartbeat_s=0.25",
                        "services.episode_timeout_s=12", f"services.inference_process={str(process).lower()}")
    runs = []
    started = time.monotonic()
    try:
        run_dir = run_async(config, faults=plan, on_run=runs.append).run_dir
    finally:
        plan.release()
    assert time.monotonic() - started < 300
    assert all(fault.fired for fault in plan.faults), plan.log
    run = runs[0].source
    assert run.worker_deaths == 1
    # declared dead by its silence, never before the timeout (a live worker is never declared dead)
    assert len(run.detect_s) == 1 and run.detect_s[0] > 1.5
    last = train_rows(run_dir)[-1]
    assert last["groups_reassigned"] == 1 and last["inference_restarts"] == 1
    assert_exactly_once(run_dir, 4)
    if process:
        assert run.services.process.process_restarts == 1
        assert_exited(run.services.process.pid)  # the run stopped the child it restarted
    # the injected failures were retried, never scored: every trained episode ended normally
    for path in sorted((run_dir / "rollouts").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            assert json.loads(line)["status"] != "infra_error", line


def test_a_killed_trainer_resumes_from_its_checkpoint_and_the_group_checkpoints(tmp_path: Path):
    """Killed after step 4, before its checkpoint: the newest checkpoint is step 2, and version 3
    was published without one. The resume cuts the weight store back to version 2, trains the
    groups that were checkpointed and that version 3 did not sample, and samples the rest again."""
    from opencomposer.services.faults import Fault, FaultPlan, TrainerKilled
    from opencomposer.services.weights import WeightStore

    config = config_for(tmp_path, "crash", "rl.steps=4", "rl.checkpoint_every=2", "rl.mode=async",
                        "rl.max_staleness=1")
    with pytest.raises(TrainerKilled):
        run_async(config, faults=FaultPlan([Fault("kill_trainer", after=4)]))
    run_dir = config.run.path
    assert WeightStore(run_dir / "weights").versions() == [0, 1, 2, 3]
    assert list((run_dir / "groups").glob("*.pkl")), "groups sampled ahead were checkpointed"
    runs = []
    run_async(config, on_run=runs.append)
    run = runs[0]
    assert run.resumed_from.name == "step-000002"
    assert run.source.reconciler.stats.restored + run.source.lost_version_groups >= 2
    assert_exactly_once(run_dir, 8)
    assert [row["step"] for row in train_rows(run_dir)] == [1, 2, 3, 4]
    store = WeightStore(run_dir / "weights")
    assert store.versions() == [0, 1, 2, 3, 4]
    final = run.model.state_dict()
    assert all(torch.equal(final[name], tensor) for name, tensor in store.load(4).items())


def test_a_step_whose_every_episode_fails_on_infrastructure_stops_and_resumes(tmp_path: Path, monkeypatch):
    """After step 1's checkpoint every engine call fails, retries included: step 2's groups hold
    only infrastructure errors. The run stops with ``InfrastructureDown`` before training or
    recording them; the resume samples those groups again (their checkpoints are not restored:
    nothing ran in them) and finishes with every task trained once and no infrastructure error."""
    from opencomposer.types import InfrastructureDown
    from tests.rl.test_loop import engine_dies_after_the_first_checkpoint

    engine = engine_dies_after_the_first_checkpoint(monkeypatch)
    config = config_for(tmp_path, "down", "rl.steps=3", "rl.checkpoint_every=1", "rl.mode=async",
                        "rl.max_staleness=0")
    with pytest.raises(InfrastructureDown, match=r"every episode of step 2 \(8\).*GPU fell off the bus"):
        run_async(config)
    run_dir = config.run.path
    assert [row["step"] for row in train_rows(run_dir)] == [1]  # step 2 left no trace
    assert [r["index"] for r in record(run_dir)] == [0, 1]
    assert list((run_dir / "groups").glob("*.pkl")), "step 2's failed groups were checkpointed"

    engine["dead"] = False  # fixed; the same command resumes at step 1
    runs = []
    run_async(config, on_run=runs.append)
    assert runs[0].source.reconciler.stats.restored == 0  # the failed groups were sampled again
    assert [row["step"] for row in train_rows(run_dir)] == [1, 2, 3]
    assert_exactly_once(run_dir, 6)
    for step in (2, 3):
        for line in (run_dir / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines():
            assert json.loads(line)["status"] != "infra_error", line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the trainer, one for the rest")
def test_trainer_cpus_keep_the_services_off_the_trainers_cpu(tmp_path: Path):
    """``services.trainer_cpus``: the trainer's thread on its CPU, the dispatchers (whose episode
    threads and sandboxes inherit their mask) and the inference process on the others; the process
    gets its whole mask back at the end."""
    import threading

    from opencomposer.config import ConfigError
    from opencomposer.services.async_rl import cpu_split

    available = os.sched_getaffinity(0)
    trainer = min(available)
    config = config_for(tmp_path, "pinned", "rl.steps=2", "rl.mode=async", "rl.max_staleness=1",
                        "services.inference_process=true", f"services.trainer_cpus=[{trainer}]")
    seen: dict[str, set[int]] = {}

    def watch(run) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not seen:
            process, dispatchers = run.source.services.process, run.source._dispatchers
            if run.state.step >= 1:
                seen["trainer"] = os.sched_getaffinity(threading.main_thread().native_id)
                seen["dispatchers"] = set().union(*(os.sched_getaffinity(t.native_id) for t in dispatchers))
                seen["inference"] = os.sched_getaffinity(process.pid)
            time.sleep(0.05)

    run_dir = run_async(config,
                        on_run=lambda run: threading.Thread(target=watch, args=(run,), daemon=True).start()).run_dir
    assert seen["trainer"] == {trainer}
    assert seen["dispatchers"] == seen["inference"] == available - {trainer}
    assert os.sched_getaffinity(0) == available
    assert_exactly_once(run_dir, 4)

    for cpus in ([max(available) + 1], sorted(available)):  # not this process's, or none left over
        with pytest.raises(ConfigError, match="services.trainer_cpus"):
            cpu_split(cpus)
    with pytest.raises(ConfigError, match="services.trainer_cpus: applies to the embedded backend"):
        config_for(tmp_path, "ray", "services.backend=ray", "services.trainer_cpus=[0]")
