"""The synchronous loop end to end on CPU: real sandboxes, grader, sampler and trainer; its records,
its resume, its report, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opencomposer.config import load_recipe

SMALL_RUN = [
    "run.threads=1", "model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
    "model.moe_intermediate_size=64", "sampling.max_new_tokens=12", "grading.lint=false",
    "rl.task_family=tiny", "rl.batch_tasks=2", "rl.group_size=2", "rl.lr=1e-3",
    "rl.eval_every=2", "rl.eval_tasks=2", "rl.eval_samples=2",
]


@pytest.mark.integration
@pytest.mark.bwrap
def test_rl_loop_records_steps_evaluations_checkpoints_and_resumes(tmp_path):
    from opencomposer.rl.checkpoint import list_checkpoints
    from opencomposer.rl.loop import run_rl
    from opencomposer.rl.report import draw_report

    overrides = [*SMALL_RUN, f"run.out_dir={tmp_path}", "run.name=loop"]
    summary = run_rl(load_recipe(None, [*overrides, "rl.steps=2"]), progress=False)
    run_dir = tmp_path / "loop"
    assert summary.steps == 2 and [e["step"] for e in summary.evaluations] == [0, 2]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    train = rows[1]
    assert train["groups"] == 2 and train["episodes_in_loss"] + train["episodes_infra_error"] == 4
    assert train["engine_rows"] == 4 and train["engine_calls"] <= 2  # 2 tasks x 2 samples, batched
    assert train["reward_mean"] == pytest.approx(
        sum(r["reward/" + t] for r in [train] for t in ("resolved", "fail_to_pass", "pass_to_pass", "succinctness",
            "lint_added", "todo_unfinished", "broken_tool_calls", "reasoning_in_comments", "run_tool_collapse",
            "hack_suspected", "length_penalty", "kl_penalty")), abs=1e-9)
    assert train["hack_suspected_rate"] == 0.0  # the oracle-free small run writes nothing the monitor flags
    evaluation = rows[0]
    assert evaluation["tasks"] == 2 and evaluation["k"] == 2 and evaluation["episodes"] + evaluation["episodes_infra_error"] == 4
    assert 0.0 <= evaluation["pass_at_1"] <= evaluation["best_of_k"] <= 1.0
    assert 0.0 <= evaluation["format_error_rate"] <= 1.0
    # every held-out episode is on record, its turns' text with them
    held_out = [json.loads(line) for line in (run_dir / "eval" / "step-000000.jsonl").read_text().splitlines()]
    assert len(held_out) == 4 and all(e["turns"] and "text" in e["turns"][0] for e in held_out)
    errors = sum(t["format_error"] is not None for e in held_out for t in e["turns"])
    assert errors / sum(len(e["turns"]) for e in held_out) == pytest.approx(evaluation["format_error_rate"])
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000001", "step-000002"]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "initial" / "model.safetensors").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["final_model"].endswith("step-000002/model")

    # the same folder with more steps resumes at step 2: nothing before it is repeated
    summary = run_rl(load_recipe(None, [*overrides, "rl.steps=3"]), progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2),
                                                      ("train", 3), ("eval", 3)]
    state = json.loads((run_dir / "checkpoints" / "step-000003" / "state.json").read_text())
    assert [r["index"] for r in state["trained"]] == list(range(6))
    episodes = [json.loads(line) for line in (run_dir / "rollouts" / "step-000003.jsonl").read_text().splitlines()]
    assert {v for e in episodes for v in e["policy_versions"]} == {2}
    assert all(e["hack_suspected"] is False and e["hack_reasons"] == [] and "diff" not in e for e in episodes)

    # a torn last line (a kill mid-write) is dropped on resume; a changed task stream is refused
    with (run_dir / "metrics.jsonl").open("a") as log:
        log.write('{"step": 3, "kind": "tra')
    from opencomposer.config import ConfigError

    with pytest.raises(ConfigError, match="task stream changed"):
        run_rl(load_recipe(None, [*overrides, "rl.steps=4", "run.seed=1"]), progress=False)
    with pytest.raises(ConfigError, match="task stream changed"):
        run_rl(load_recipe(None, [*overrides, "rl.steps=4", "rl.batch_tasks=1"]), progress=False)

    # one process per run folder: a second one is turned away before it touches anything
    from opencomposer.rl.loop import lock_run_folder

    held = lock_run_folder(run_dir)
    with pytest.raises(RuntimeError, match="in use by another"):
        run_rl(load_recipe(None, [*overrides, "rl.steps=4"]), progress=False)
    held.close()

    paths = draw_report(run_dir)
    names = sorted(p.name for p in paths)
    assert "report.png" in names and {"reward.png", "pass_rate.png", "loss.png", "kl.png", "entropy.png",
                                      "lengths.png", "reward_terms.png"} <= set(names)
    assert all(p.stat().st_size > 5000 for p in paths)


def test_only_a_step_failed_on_infrastructure_across_tasks_stops_the_run():
    """The stop needs every episode of two tasks or more to be an infrastructure error: one task's
    broken environment, or a step where any episode ran, is left to the usual drop."""
    from opencomposer.rl.loop import check_not_all_failed
    from opencomposer.types import Episode, EpisodeStatus, Group, InfrastructureDown, Task

    def group(task_id, *statuses):
        task = Task(id=task_id, instruction="p", repo=Path("."))
        return Group(task, [Episode(task_id=task_id, status=status, error=f"{task_id}: down") for status in statuses])

    down, ok = EpisodeStatus.INFRA_ERROR, EpisodeStatus.OK
    check_not_all_failed([group("a", down, down)], 1)  # one task: its own environment may be broken
    check_not_all_failed([group("a", down, down), group("b", down, ok)], 1)  # one episode ran
    check_not_all_failed([], 1)
    with pytest.raises(InfrastructureDown, match=r"step 4 \(4\).*a: down"):
        check_not_all_failed([group("a", down, down), group("b", down, down)], 4)


def engine_dies_after_the_first_checkpoint(monkeypatch) -> dict[str, bool]:
    """From the first checkpoint on, every ``LocalEngine.generate`` fails (the synchronous loop's
    and the async services' alike) until the caller sets ``["dead"]`` back to False."""
    from opencomposer.inference.local import LocalEngine
    from opencomposer.rl.loop import RLRun

    state = {"dead": False, "checkpoints": 0}
    generate, checkpoint = LocalEngine.generate, RLRun.checkpoint

    def failing_generate(self, *args, **kwargs):
        if state["dead"]:
            raise RuntimeError("the GPU fell off the bus")
        return generate(self, *args, **kwargs)

    def checkpoint_then_die(self):
        path = checkpoint(self)
        state["checkpoints"] += 1
        state["dead"] = state["dead"] or state["checkpoints"] == 1
        return path

    monkeypatch.setattr(LocalEngine, "generate", failing_generate)
    monkeypatch.setattr(RLRun, "checkpoint", checkpoint_then_die)
    return state


@pytest.mark.integration
@pytest.mark.bwrap
def test_a_step_whose_every_episode_fails_on_infrastructure_stops_the_run_and_resumes(tmp_path, monkeypatch):
    """An engine that fails every call turns every episode into an infrastructure error. Rather
    than train (and record as dropped) step after step of nothing, the run stops at the first such
    step with the error, before recording it; the same command then resumes from the checkpoint
    before it and samples those prompts again."""
    from opencomposer.rl.loop import InfrastructureDown, run_rl

    engine = engine_dies_after_the_first_checkpoint(monkeypatch)  # after step 1's checkpoint
    overrides = [*SMALL_RUN, f"run.out_dir={tmp_path}", "run.name=down", "rl.eval_every=0", "rl.steps=3"]
    with pytest.raises(InfrastructureDown, match=r"every episode of step 2 \(4\).*GPU fell off the bus"):
        run_rl(load_recipe(None, overrides), progress=False)
    run_dir = tmp_path / "down"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("train", 1)]  # step 2 left no trace
    assert not (run_dir / "rollouts" / "step-000002.jsonl").exists()

    engine["dead"] = False  # fixed; the same command resumes at step 1
    summary = run_rl(load_recipe(None, overrides), progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary.steps == 3 and [r["step"] for r in rows] == [1, 2, 3]
    step2 = [json.loads(line) for line in (run_dir / "rollouts" / "step-000002.jsonl").read_text().splitlines()]
    assert len(step2) == 4 and all(e["status"] != "infra_error" for e in step2)


def test_report_panels_hold_the_logged_series(tmp_path):
    from opencomposer.rl.report import panel_lines

    rows = [{"step": 0, "kind": "eval", "pass_at_1": 0.25, "best_of_k": 0.5, "mean_reward": 0.1},
            {"step": 1, "kind": "train", "reward_mean": 0.2, "resolved_rate": 0.3, "loss": -0.01, "entropy": 1.5,
             "reward/resolved": 0.3, "reward/length_penalty": -0.01},
            {"step": 2, "kind": "eval", "pass_at_1": 0.5, "best_of_k": 0.75, "mean_reward": float("nan")}]
    panels = panel_lines(rows)
    pass_rate = {label: (steps, values) for label, steps, values in panels["pass_rate"]}
    assert pass_rate["held-out pass@1"] == ([0, 2], [0.25, 0.5])
    assert pass_rate["train resolved rate"] == ([1], [0.3])
    assert {label: values for label, _, values in panels["reward"]}["held-out mean reward"] == [0.1]  # NaN skipped
    assert sorted(label for label, _, _ in panels["reward_terms"]) == ["length_penalty", "resolved"]
    assert panels["kl"] == []


def test_cli_registers_sft_rl_and_report_without_importing_torch():
    code = ("import sys; from opencomposer.cli import build_parser; p = build_parser(); "
            "a = p.parse_args(['rl', '--recipe', 'r.toml', '--set', 'rl.steps=3']); "
            "b = p.parse_args(['report', 'runs/x']); c = p.parse_args(['sft']); "
            "print(a.handler, b.handler, c.handler, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["opencomposer.commands.rl:main", "opencomposer.commands.report:main", "opencomposer.commands.sft:main",
                   "False"]
