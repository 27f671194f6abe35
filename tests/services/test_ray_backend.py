"""The Ray backend end to end on the tiny recipe: inference, two episode workers and
evaluation as Ray actors of a local cluster, the trainer as the driver (real sandbox, real model,
real trainer). A run finishes with staleness metrics, its evaluations and an exactly-once record,
without a traceback;
a worker actor killed under a group is declared dead by its silence and its group is sampled
again elsewhere, and a killed inference actor restarts without failing an episode."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from opencomposer.config import load_recipe

pytest.importorskip("ray")

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl-tiny.toml"
SHRUNK = [
    "model.path=", "rl.steps=2", "rl.batch_tasks=2", "rl.group_size=4", "sampling.max_new_tokens=24",
    "rl.mode=async", "rl.max_staleness=1", "services.backend=ray", "services.env_workers=2",
]

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def config_for(tmp_path: Path, name: str, *overrides: str):
    return load_recipe(RECIPE, [*SHRUNK, f"run.out_dir={tmp_path}", f"run.name={name}", *overrides])


def run_on_ray(config, on_source):
    """``config`` on the asynchronous source; ``on_source`` sees it, its actors started, before the
    first step."""
    from opencomposer.rl.loop import RLRun
    from opencomposer.services.async_rl import AsyncRollouts

    source = AsyncRollouts()
    run = RLRun(config, source, progress=False)
    on_source(source)
    return run.run()


def rows(run_dir: Path, kind: str) -> list[dict]:
    every = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in every if row["kind"] == kind]


def recorded_indices(run_dir: Path) -> list[int]:
    from opencomposer.rl.checkpoint import latest_checkpoint

    trained = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["trained"]
    assert all(r["status"] in ("trained", "dropped") for r in trained), trained
    return sorted(r["index"] for r in trained)


def test_an_async_run_on_ray_actors_trains_evaluates_records_every_group_once_and_ends_quietly(tmp_path: Path, capfd):
    """Quietly: the actors are shut down in order (dispatchers, workers, then inference and
    evaluation), so nothing prints an actor-killed traceback at the end."""
    import ray

    from opencomposer import protocols

    # one GPU declared to the local cluster (none is there: Ray only counts it) and asked for by the
    # inference actor, so Ray schedules it on that GPU and hands it the device
    config = config_for(tmp_path, "ray", "rl.eval_every=2", "rl.eval_tasks=2", "rl.eval_samples=2",
                        "services.ray_num_gpus=1", "services.ray_inference_gpus=1")
    seams: list[bool] = []
    placement: list[dict] = []

    def check_the_seams(source) -> None:
        """While Ray is up (a property of a proxy may be a remote call): the proxies are the seams."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not seams:
            services = source.services
            if services.workers:
                seams.extend([isinstance(services.inference, protocols.InferenceService),
                              isinstance(services.workers[0], protocols.EpisodeWorker),
                              isinstance(services.evaluation, protocols.EvaluationService)])
                placement.append(ray.get(services.inference.actor.placement.remote()))
            time.sleep(0.05)

    summary = run_on_ray(config, lambda source: threading.Thread(
        target=check_the_seams, args=(source,), daemon=True).start())

    assert seams == [True, True, True]
    assert placement[0]["gpu_ids"] == ["0"]  # the actor holds the GPU it asked for
    assert placement[0]["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert not ray.is_initialized()  # the backend stopped the local cluster it started
    train = rows(summary.run_dir, "train")
    assert [row["policy_version"] for row in train] == [1, 2]
    assert all(0 <= row["staleness_max"] <= 1 and 0 <= row["staleness_mean"] <= row["staleness_max"]
               for row in train)
    assert recorded_indices(summary.run_dir) == [0, 1, 2, 3]
    assert [row["step"] for row in rows(summary.run_dir, "eval")] == [0, 2]  # from the evaluation actor
    for path in sorted((summary.run_dir / "rollouts").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            assert json.loads(line)["status"] != "infra_error", line
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "ActorDied" not in out + err, (out + err)[-3000:]


@pytest.mark.slow  # ~40 s; the embedded backend's fault test (tests/services/test_async_rl.py) runs in make test
def test_killed_actors_a_worker_replaced_and_inference_restarted_and_the_run_finishes(tmp_path: Path):
    """A worker actor killed under its group is declared dead by its silence and the group is
    sampled again by a new one; the inference actor, killed too, restarts at the newest version
    and the generate calls in flight are re-issued (no episode fails)."""
    import ray

    config = config_for(tmp_path, "kill", "rl.eval_every=0", "services.heartbeat_s=0.25",
                        "services.worker_timeout_s=1.5")
    killed: list[int] = []

    def kill_a_busy_worker_then_inference(source) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            services = source.services
            busy = [w for w in services.workers if w.running is not None]
            if busy:
                killed.append(busy[0].running)
                ray.kill(busy[0].actor)
                ray.kill(services.inference.actor, no_restart=False)
                return
            time.sleep(0.02)

    runs: list = []

    def on_source(source) -> None:
        runs.append(source)
        threading.Thread(target=kill_a_busy_worker_then_inference, args=(source,), daemon=True).start()

    summary = run_on_ray(config, on_source)

    assert killed, "no worker was seen running a group"
    run = runs[0]
    assert run.worker_deaths >= 1, killed
    assert min(run.detect_s) > 1.5, run.detect_s  # declared dead by its silence, never before the timeout
    last = rows(summary.run_dir, "train")[-1]
    assert last["worker_deaths"] >= 1 and last["groups_reassigned"] >= 1, last
    assert last["inference_restarts"] == 1, last
    assert recorded_indices(summary.run_dir) == [0, 1, 2, 3]
    for path in sorted((summary.run_dir / "rollouts").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            assert json.loads(line)["status"] != "infra_error", line


def test_gpu_requests_ray_could_never_place_are_refused_before_any_actor_starts(caplog, monkeypatch):
    from opencomposer.config import ConfigError, ServicesConfig
    from opencomposer.services.ray_backend import check_gpu_requests

    def config(*sets: str):
        return load_recipe(None, ["run.device=cpu", *sets])

    check_gpu_requests(config("services.ray_inference_gpus=1", "services.ray_evaluation_gpus=0.5"), [2.0], True)
    check_gpu_requests(config("services.ray_inference_gpus=1", "services.ray_evaluation_gpus=1"), [1.0], False)
    with pytest.raises(ConfigError, match=r"ray_inference_gpus = 1, but no node .* \(the most on one: 0\)"):
        check_gpu_requests(config("services.ray_inference_gpus=1"), [], True)
    with pytest.raises(ConfigError, match=r"ray_inference_gpus = 2, but no node"):  # two 1-GPU nodes
        check_gpu_requests(config("services.ray_inference_gpus=2"), [1.0, 1.0], True)
    with pytest.raises(ConfigError, match=r"\+ ray_evaluation_gpus = 2, but the Ray cluster has 1 GPUs"):
        check_gpu_requests(config("services.ray_inference_gpus=1", "services.ray_evaluation_gpus=1"), [1.0], True)
    with pytest.raises(ConfigError, match="fewer than the 2 GPUs of inference.tensor_parallel_size"):
        check_gpu_requests(config("services.ray_inference_gpus=1", "inference.backend=vllm",
                                  "inference.tensor_parallel_size=2"), [8.0], True)
    with caplog.at_level("WARNING", logger="opencomposer.services.ray_backend"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        check_gpu_requests(load_recipe(None, ["run.device=auto"]), [8.0], True)  # the trainer on the CPU
        assert "samples on the CPU" not in caplog.text
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        check_gpu_requests(load_recipe(None, ["run.device=auto"]), [8.0], True)
    assert "samples on the CPU of its node" in caplog.text
    for bad in (-1, 1.5):
        with pytest.raises(ConfigError, match="services.ray_inference_gpus: expected >= 0"):
            ServicesConfig(ray_inference_gpus=bad)
