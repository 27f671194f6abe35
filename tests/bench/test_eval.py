"""``opencomposer eval``: the oracle resolves every fixture task, the no-op none; outputs and stats."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from opencomposer.agent.policies.scripted import ScriptedPolicy, call, noop_policy, oracle_policy
from opencomposer.bench.eval import run_eval
from opencomposer.bench.summary import summarize, summary_table, wilson_interval
from opencomposer.cli import main
from opencomposer.config import Config
from opencomposer.tasks.format import load_suite
from opencomposer.types import Grade

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


@pytest.mark.bwrap
def test_oracle_resolves_every_fixture_and_noop_none(tmp_path: Path):
    tasks = load_suite(FIXTURES)
    oracle = run_eval(tasks, oracle_policy(), Config(), tmp_path / "oracle", passes=2, workers=2, progress=False)
    noop = run_eval(tasks, noop_policy(), Config(), tmp_path / "noop", progress=False)
    assert [(r["task_id"], r["pass"], r["status"], r["resolved"]) for r in oracle.rows] == [
        (t.id, p, "ok", 1.0) for t in tasks for p in (0, 1)]
    assert [r["resolved"] for r in noop.rows] == [0.0, 0.0, 0.0] and noop.summary["resolved"] == 0.0
    assert oracle.summary["resolved"] == 1.0 and oracle.summary["infra_errors"] == 0
    assert oracle.summary["resolved_ci95"] == pytest.approx(list(wilson_interval(1.0, 3)))
    lines = (tmp_path / "oracle" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["diff"]
    episode_dir = tmp_path / "oracle" / "episodes" / "oracle" / "fix-add" / "pass-1"
    assert json.loads((episode_dir / "reward.json").read_text())["resolved"] == 1.0
    trajectory = json.loads((episode_dir / "trajectory.json").read_text())
    assert [m["role"] for m in trajectory["segments"][0]["messages"]] == ["system", "user", "assistant", "tool",
                                                                         "assistant"]
    assert json.loads((tmp_path / "oracle" / "summary.json").read_text())["policies"]["oracle"]["policy"] == "oracle"


@pytest.mark.bwrap
def test_cli_eval_writes_results_and_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture):
    code = main(["eval", "--suite", str(FIXTURES), "--policy", "noop", "--limit", "1", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "noop on" in out and "resolved" in out and f"results: {tmp_path / 'results.jsonl'}" in out
    assert [json.loads(line)["task_id"] for line in (tmp_path / "results.jsonl").read_text().splitlines()] == [
        "feature-slugify"]


JUNK = "Sure! I would fix the bug by editing calc.py."  # prose, no tool call: a format error every turn


@pytest.mark.bwrap
def test_a_model_that_never_speaks_the_protocol_shows_in_progress_lines_and_summary(tmp_path: Path, capsys):
    """Not a terminal (capsys): one plain progress line per finished episode, and the summary
    and its table say why episodes ended and how many turns failed to parse."""
    tasks = [t for t in load_suite(FIXTURES) if t.id == "fix-add"]  # max_turns = 8
    junk = ScriptedPolicy([JUNK] * 50, name="junk")
    # one valid call, then junk: the turn budget ends it, with 7 of its 8 turns unparsed
    one_call = ScriptedPolicy([[call("run", command="ls")], *[JUNK] * 50], name="one-call")
    result = run_eval(tasks, junk, Config(), tmp_path / "junk", passes=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert all("fix-add#" in line and "(format errors, 8 turns, 8 format errors)" in line for line in lines), lines
    assert [r["ended_by"] for r in result.rows] == ["format_errors", "format_errors"]
    assert result.summary["ended_by"] == {"format_errors": 2}
    assert result.summary["format_errors_per_turn"] == 1.0
    saved = json.loads((tmp_path / "junk" / "results.jsonl").read_text().splitlines()[0])
    assert saved["ended_by"] == "format_errors" and saved["format_errors"] == 8.0

    partial = run_eval(tasks, one_call, Config(), tmp_path / "one-call", progress=False)
    assert partial.summary["ended_by"] == {"turn_budget": 1}
    assert partial.summary["format_errors_per_turn"] == 7 / 8

    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(summary_table(result.summary))
    table = console.export_text()
    assert "format errors 2" in table and "format errors / turn" in table and "1.00" in table
    assert "does not speak the tool protocol" in table


def test_end_reasons_of_rows_written_before_they_were_recorded():
    rows = [{"task_id": "a", "status": "ok", **_grade_fields(True, 1)},
            {"task_id": "b", "status": "timeout", **_grade_fields(False, 1)},
            {"task_id": "c", "status": "infra_error"}]
    assert summarize(rows)["ended_by"] == {"submitted": 1, "infra_error": 1, "unrecorded": 1}


def test_cli_reports_a_broken_suite(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.toml").write_text('id = "t"\n')
    assert main(["eval", "--suite", str(tmp_path), "--policy", "noop"]) == 2
    assert f"{tmp_path / 't' / 'instruction.md'}: missing" in capsys.readouterr().err


def test_help_does_not_import_torch():
    code = "import sys; from opencomposer.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(__file__).parents[2] / "src"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "False"


def test_wilson_interval_golden_values():
    assert wilson_interval(0.5, 10) == pytest.approx((0.2365931, 0.7634069), abs=1e-6)
    assert wilson_interval(0.0, 20) == pytest.approx((0.0, 0.1611252), abs=1e-6)
    assert wilson_interval(1.0, 0) == (0.0, 1.0)


def _grade_fields(resolved: bool, lines_changed: int) -> dict[str, float]:
    """The reward.json numbers a results.jsonl row carries beside its own fields."""
    return Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=2, tests_failed=0,
                 tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1,
                 lines_added=lines_changed, lines_removed=0, lines_changed=lines_changed, todo_added=0,
                 comment_lines_added=0, lint_added=0, grading_s=0.5).to_json()


def test_summary_reports_the_share_of_tampered_episodes_and_reads_rows_from_before_the_field():
    tampered = {**_grade_fields(False, 3), "tampered": 1.0}
    older = {k: v for k, v in _grade_fields(True, 2).items() if k != "tampered"}  # a results.jsonl of before
    rows = [{"task_id": "a", "status": "ok", **tampered}, {"task_id": "b", "status": "ok", **older},
            {"task_id": "c", "status": "ok", **_grade_fields(False, 1), "diff_round_trip_failed": 1.0},
            {"task_id": "c", "status": "infra_error"}]
    summary = summarize(rows)
    assert (summary["tampered_rate"], summary["resolved"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert summary["diff_round_trip_failures"] == 1  # a harness bug shows in the summary, not only in logs


def test_summary_reports_the_share_of_episodes_the_hack_monitor_flagged_and_prints_it():
    from rich.console import Console

    flagged = {**_grade_fields(True, 3), "hack_suspected": 1.0, "hack_reasons": ["swallowing solution.py:2: os._exit"]}
    older = {k: v for k, v in _grade_fields(False, 2).items() if k not in ("hack_suspected", "hack_reasons")}
    rows = [{"task_id": "a", "pass": 0, "status": "ok", **flagged}, {"task_id": "b", "status": "ok", **older},
            {"task_id": "b", "status": "ok", **_grade_fields(False, 1)}, {"task_id": "c", "status": "infra_error"}]
    summary = summarize(rows)
    assert summary["hack_suspected_rate"] == pytest.approx(1 / 3) and summary["resolved"] == pytest.approx(1 / 2)
    console = Console(record=True, width=120)
    console.print(summary_table(summary))
    assert summary["hack_flagged"] == [{"task_id": "a", "pass": 0, "reasons": ["swallowing solution.py:2: os._exit"]}]
    text = console.export_text()
    assert re.search(r"hack suspected.*0\.333", text) and re.search(r"flagged: a pass 0 .*os\._exit", text)


def test_summary_averages_passes_per_task_and_excludes_infra_errors():
    rows = [
        {"task_id": "a", "status": "ok", **_grade_fields(True, 4), "cost": 0.5, "wall_s": 1.0,
         "tokens": {"thinking": 10}},
        {"task_id": "a", "status": "timeout", **_grade_fields(False, 8), "cost": 0.5, "wall_s": 3.0,
         "tokens": {"thinking": 30}},
        {"task_id": "b", "status": "ok", **_grade_fields(True, 12), "cost": 0.0, "wall_s": 2.0, "tokens": {}},
        {"task_id": "b", "status": "infra_error", "cost": 0.25},
    ]
    summary = summarize(rows)
    scored = rows[:3]  # the infrastructure error is counted, never scored
    per_task = {task: statistics.fmean(float(r["resolved"]) for r in scored if r["task_id"] == task)
                for task in ("a", "b")}
    assert summary["resolved"] == statistics.fmean(per_task.values())  # tasks weigh equally, not episodes
    assert summary["resolved"] != statistics.fmean(float(r["resolved"]) for r in scored)
    assert summary["resolved_ci95"] == pytest.approx(list(wilson_interval(summary["resolved"], 2)))
    assert summary["fail_to_pass"] == pytest.approx(statistics.fmean(r["fail_to_pass"] for r in scored))
    assert summary["lines_changed"] == statistics.fmean(r["lines_changed"] for r in scored)
    assert (summary["episodes"], summary["tasks"], summary["infra_errors"], summary["timeouts"]) == (4, 2, 1, 1)
    assert summary["cost_total"] == sum(r["cost"] for r in rows)  # an infrastructure error still costs
    assert summary["cost_per_episode"] == pytest.approx(statistics.fmean(r["cost"] for r in scored))
    assert summary["tokens_thinking"] == pytest.approx(statistics.fmean(r["tokens"].get("thinking", 0) for r in scored))
    assert summary["wall_s_p50"] == statistics.median(r["wall_s"] for r in scored)


@pytest.mark.bwrap
def test_parallel_episodes_of_a_local_model_share_its_calls_and_sample_what_they_would_alone(tmp_path: Path):
    """``eval --workers N`` with a local model: the episodes' turns go through one batching
    front-end, and batch-invariant decoding keeps every episode's tokens, turns and grades those of
    the one-at-a-time run (two samples of a task, two at a time), however the turns were batched."""
    from opencomposer.agent.policies.local import local_policy
    from opencomposer.config import load_recipe
    from opencomposer.inference.batching import BatchingEngine

    tasks = [t for t in load_suite(FIXTURES) if t.id == "fix-add"]
    rows = {}
    for workers in (1, 2):
        config = load_recipe(None, ["sampling.max_new_tokens=12", f"eval.workers={workers}"])
        policy = local_policy("", config)
        assert isinstance(policy.engine, BatchingEngine) == (workers > 1)
        result = run_eval(tasks, policy, config, tmp_path / f"w{workers}", passes=2, workers=workers, progress=False)
        episodes = tmp_path / f"w{workers}" / "episodes" / "local_tiny_moe" / "fix-add"
        said = [[m["content"] for m in json.loads((episodes / f"pass-{p}" / "trajectory.json").read_text())
                 ["segments"][0]["messages"] if m["role"] == "assistant"] for p in range(2)]
        rows[workers] = [(r["task_id"], r["pass"], r["status"], r["turns"], r["tokens"], r["diff"], r["resolved"],
                          said[r["pass"]]) for r in result.rows]
        if workers > 1:
            stats = policy.engine.stats
            # every turn went through the batcher; how many share a call depends on timing (a turn
            # waits at most max_wait_s for the other episode), so it is not asserted here
            assert stats.requests == sum(r["turns"] for r in result.rows) and stats.calls <= stats.requests
    assert rows[2] == rows[1] and len(rows[1]) == 2
    assert len({tuple(row[-1]) for row in rows[1]}) == 2  # two samples, two different episodes
