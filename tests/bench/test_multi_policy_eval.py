"""``opencomposer eval`` with several policies (issue 37 §2): oracle 100 % and no-op 0 % on a slice of
the cursorbench suite, judged on every axis, resumed without rerunning an episode, filtered by
date, priced in dollars, and drawn on a Pareto front."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import opencomposer.bench.eval as bench_eval
from opencomposer.agent.policies.scripted import oracle_policy
from opencomposer.bench.pareto import Point, cost_measure, pareto_front
from opencomposer.bench.summary import AXES, summarize, wilson_interval
from opencomposer.cli import main
from opencomposer.config import Config, ConfigError
from opencomposer.config.bench import Price, parse_price, policy_prices
from opencomposer.rl.evaluate import episode_record
from opencomposer.tasks.format import TaskFormatError, load_suite, load_task
from opencomposer.types import Episode, EpisodeStatus, Grade

CURSORBENCH = Path(__file__).parents[2] / "src" / "opencomposer" / "suites" / "cursorbench"
SLICE = {"confkit-deprecated-keys": "2024-11-02", "confkit-error-paths": "2025-03-14",
         "confkit-secret-leak": "2025-08-30"}


@pytest.fixture
def dated_suite(tmp_path: Path) -> Path:
    """Three cursorbench tasks, each given a ``metadata.date``."""
    suite = tmp_path / "suite"
    for task_id, date in SLICE.items():
        shutil.copytree(CURSORBENCH / task_id, suite / task_id)
        toml = suite / task_id / "task.toml"
        toml.write_text(toml.read_text().replace("[metadata]\n", f'[metadata]\ndate = "{date}"\n'))
    return suite


class Episodes(list):
    """Every episode ``bench.eval`` runs, as (policy, task, sample), and the seed of each."""

    def __init__(self):
        super().__init__()
        self.seeds: dict[tuple[str, str, int], int] = {}


@pytest.fixture
def episodes_run(monkeypatch: pytest.MonkeyPatch) -> Episodes:
    calls = Episodes()
    real = bench_eval.run_episode

    def counted(task, policy, config, **kwargs):
        calls.append((policy.name, task.id, kwargs["sample_index"]))
        calls.seeds[calls[-1]] = kwargs["seed"]
        return real(task, policy, config, **kwargs)

    monkeypatch.setattr(bench_eval, "run_episode", counted)
    return calls


@pytest.mark.bwrap
def test_oracle_and_noop_compared_on_every_axis_resumed_and_filtered_by_date(
        dated_suite: Path, tmp_path: Path, episodes_run: list, capsys: pytest.CaptureFixture):
    out = tmp_path / "eval"
    command = ["eval", "--suite", str(dated_suite), "--policy", "oracle", "--policy", "noop", "--samples", "2",
               "--after", "2025-01-01", "--price", "input=3,output=15", "--out", str(out)]
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert "--after 2025-01-01: 2 of 3 tasks dated on or after it" in printed and "2 policies on" in printed
    newer = sorted(task_id for task_id, date in SLICE.items() if date >= "2025-01-01")
    expected = {(policy, task_id, sample) for policy in ("oracle", "noop") for task_id in newer for sample in (0, 1)}
    assert sorted(episodes_run) == sorted(expected)  # the same tasks and samples for both policies

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(r["policy"], r["task_id"], r["pass"]) for r in rows} == expected
    oracle_rows = [r for r in rows if r["policy"] == "oracle"]
    noop_rows = [r for r in rows if r["policy"] == "noop"]
    assert [r["resolved"] for r in oracle_rows] == [1.0] * 4 and [r["resolved"] for r in noop_rows] == [0.0] * 4
    for row in rows:  # every axis has its measure in the row
        assert {"fail_to_pass", "pass_to_pass", "lint_added", "rubric", "hack_suspected", "turns", "tool_calls",
                "broken_tool_calls", "todo_added", "prompt_tokens", "completion_tokens", "cached_tokens", "dollars",
                "wall_s", "first_edit_s"} <= set(row)
        assert row["dollars"] == 0.0  # scripted policies bill no tokens
    assert all(0 < r["first_edit_s"] <= r["wall_s"] for r in oracle_rows)
    assert all(r["first_edit_s"] is None for r in noop_rows)  # the no-op never edits
    seeds = episodes_run.seeds  # sample j of a task has the same seed under both policies, and no other has it
    assert all(seeds[("oracle", t, j)] == seeds[("noop", t, j)] for _, t, j in expected)
    assert len(set(seeds.values())) == 4
    assert (out / "episodes" / "noop" / newer[0] / "pass-1" / "trajectory.json").is_file()

    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["policies"]) == ["oracle", "noop"]
    oracle, noop = summary["policies"]["oracle"], summary["policies"]["noop"]
    assert (oracle["pass_at_1"], oracle["best_of_k"], oracle["samples"], oracle["tasks"]) == (1.0, 1.0, 2, 2)
    assert (noop["pass_at_1"], noop["best_of_k"]) == (0.0, 0.0)
    assert set(oracle["axes"]) == {measure for measures in AXES.values() for measure, _ in measures}
    assert oracle["axes"]["resolved"] == {"mean": 1.0, "low": pytest.approx(wilson_interval(1.0, 2)[0]),
                                          "high": 1.0, "tasks": 2}
    assert noop["axes"]["first_edit_s"] == {"mean": None, "low": None, "high": None, "tasks": 0}
    page = (out / "report.html").read_text()
    assert "Pareto front" in page and page.count('src="data:image/png;base64,') == 2
    assert "On the Pareto front (no other policy is as cheap and as accurate, and better in one): oracle." in page
    cost = json.loads((out / "cost.json").read_text())  # the run's compute (training.cost), in the page too
    assert cost["kind"] == "eval" and cost["flops"] is None and cost["processes"] == 1  # scripted: no model
    assert cost["wall_s"] > 0 and "Cost" in page and "device-hours" in page

    episodes_run.clear()
    assert main(command) == 0  # everything is there: nothing runs again, the outputs are rewritten alike
    assert episodes_run == []
    assert len((out / "results.jsonl").read_text().splitlines()) == 8
    assert json.loads((out / "summary.json").read_text())["policies"]["oracle"]["pass_at_1"] == 1.0
    assert json.loads((out / "cost.json").read_text())["processes"] == 2  # a resumed eval adds to its cost

    with (out / "results.jsonl").open("a") as f:
        f.write('{"task_id": "torn')  # a kill mid-write
    assert main([*command[:5], *command[7:8], "3", *command[9:]]) == 0  # the oracle alone, a third sample: only it runs
    assert sorted(episodes_run) == [("oracle", t, 2) for t in newer]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 10  # the no-op's rows stay in the file, out of this summary
    assert list(json.loads((out / "summary.json").read_text())["policies"]) == ["oracle"]
    assert json.loads((out / "summary.json").read_text())["policies"]["oracle"]["samples"] == 3


class Billed:
    """The oracle as a hosted model would bill it: 1000 prompt and 100 completion tokens a call."""

    def __init__(self):
        self.oracle = oracle_policy()
        self.name, self.tokenizer = "billed-oracle", None

    def act(self, context):
        return dataclasses.replace(self.oracle.act(context), prompt_tokens=1000, completion_tokens=100)


@pytest.mark.bwrap
def test_a_price_turns_billed_tokens_into_dollars_and_puts_the_policy_on_the_front(tmp_path: Path):
    tasks = [task for task in load_suite(CURSORBENCH) if task.id == "confkit-deprecated-keys"]
    result = bench_eval.run_eval(tasks, Billed(), Config(), tmp_path, progress=False,
                                 prices=[parse_price("input=3,output=15")])
    (billed,) = result.rows
    calls = billed["turns"]
    assert (billed["prompt_tokens"], billed["completion_tokens"]) == (1000 * calls, 100 * calls)
    assert billed["dollars"] == pytest.approx(calls * (1000 * 3 + 100 * 15) / 1e6) and billed["resolved"] == 1.0
    assert result.summary["dollars_total"] == pytest.approx(billed["dollars"])
    assert result.summary["axes"]["dollars"]["mean"] == pytest.approx(billed["dollars"])
    assert cost_measure(result.summaries) == ("dollars", "dollars per episode")


def test_prices_per_policy_in_order_or_one_for_all_and_cached_tokens_billed_apart():
    assert Price(3, 15, 0.3).dollars(1000, 100, cached_tokens=400) == pytest.approx((600 * 3 + 400 * 0.3 + 1500) / 1e6)
    assert parse_price("input=3,output=15") == Price(3.0, 15.0, 3.0)  # no prompt cache: cached at the input rate
    assert policy_prices(["input=1,output=2"], 3) == [Price(1.0, 2.0, 1.0)] * 3
    assert policy_prices([], 2) == [None, None]
    for bad, words in (("input=3", "lacks output"), ("input=3,output=x", "'x' is not a number"),
                       ("input=3,output=15,cache=1", "'cache=1' is not one of"), ("input=-1,output=2", ">= 0")):
        with pytest.raises(ConfigError, match=words):
            parse_price(bad)
    # two prices for three policies, or a day that is not one: refused before any work
    assert main(["eval", "--suite", str(CURSORBENCH), "--policy", "oracle", "--policy", "noop", "--policy", "local",
                 "--price", "input=1,output=1", "--price", "input=2,output=2"]) == 2
    assert main(["eval", "--suite", str(CURSORBENCH), "--after", "2025-13-01"]) == 2


def test_the_pareto_front_keeps_the_points_nothing_beats_on_both_cost_and_accuracy():
    def point(name, x, y):
        return Point(name, x, y, (None, None), (None, None))

    chart = [point("a", 1.0, 0.5), point("b", 2.0, 0.8), point("c", 3.0, 0.7), point("d", 0.5, 0.2),
             point("e", 2.0, 0.5), point("f", 2.0, 0.8)]
    assert [p.name for p in pareto_front(chart)] == ["d", "a", "b", "f"]  # equal points dominate neither


def _row(task: str, resolved: bool, **extra) -> dict:
    grade = Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=1, tests_failed=0,
                  tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1,
                  lines_added=1, lines_removed=0, lines_changed=1, todo_added=0, comment_lines_added=0,
                  lint_added=0, grading_s=0.1)
    return {"task_id": task, "status": "ok", "policy": "p", **grade.to_json(), "rubric": None, **extra}


def test_pass_at_1_is_the_mean_over_samples_and_best_of_k_any_sample():
    rows = [_row("a", True, first_edit_s=2.0, dollars=0.5), _row("a", False, first_edit_s=None, dollars=1.5),
            _row("b", False, first_edit_s=None, dollars=1.0), _row("b", False, first_edit_s=None, dollars=3.0)]
    summary = summarize(rows)
    assert summary["pass_at_1"] == 0.25 and summary["best_of_k"] == 0.5 and summary["samples"] == 2
    assert summary["best_of_k_ci95"] == pytest.approx(list(wilson_interval(0.5, 2)))
    assert summary["axes"]["first_edit_s"] == {"mean": 2.0, "low": None, "high": None, "tasks": 1}
    dollars = summary["axes"]["dollars"]  # task means 1.0 and 2.0: t(1) = 12.706, s = 0.7071
    assert (dollars["mean"], dollars["tasks"]) == (1.5, 2)
    assert dollars["high"] == pytest.approx(1.5 + 12.706205 * 0.5) and dollars["low"] == 0.0  # cut at 0
    assert summary["axes"]["rubric_ok"]["mean"] is None  # no task has a rubric


def test_a_task_date_is_an_iso_day(tmp_path: Path):
    source = CURSORBENCH / "confkit-deprecated-keys"
    for written, read in (('"2025-03-14"', "2025-03-14"), ("2025-03-14", "2025-03-14")):  # a TOML date literal too
        folder = tmp_path / f"ok-{len(written)}"
        shutil.copytree(source, folder)
        toml = folder / "task.toml"
        toml.write_text(toml.read_text().replace("[metadata]\n", f"[metadata]\ndate = {written}\n"))
        assert load_task(folder).metadata["date"] == read
    for bad in ('"2025-13-01"', '"March 2025"', "2025-03-14T10:00:00"):
        folder = tmp_path / "bad"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(source, folder)
        toml = folder / "task.toml"
        toml.write_text(toml.read_text().replace("[metadata]\n", f"[metadata]\ndate = {bad}\n"))
        with pytest.raises(TaskFormatError, match="metadata.date.*expected YYYY-MM-DD"):
            load_task(folder)


def test_rl_episode_records_carry_the_axes_measures():
    grade = Grade.from_json(_row("a", True, hack_suspected=1.0, lint_added=2.0))
    episode = Episode(task_id="a", status=EpisodeStatus.OK, grade=grade,
                      metrics={"rejected_tool_calls": 1.0, "format_errors": 2.0, "prompt_tokens": 50.0,
                               "completion_tokens": 7.0, "wall_s": 1.5})
    record = episode_record(load_task(CURSORBENCH / "confkit-deprecated-keys"), episode)
    assert {k: record[k] for k in ("resolved", "pass_to_pass", "lint_added", "hack_suspected", "broken_tool_calls",
                                   "prompt_tokens", "completion_tokens", "wall_s", "tool_calls")} == {
        "resolved": 1.0, "pass_to_pass": 1.0, "lint_added": 2.0, "hack_suspected": 1.0, "broken_tool_calls": 3.0,
        "prompt_tokens": 50.0, "completion_tokens": 7.0, "wall_s": 1.5, "tool_calls": 0}
