"""``opencomposer tasks stats``: the hand-written suite has the medians its README promises.

suites/README.md states, over all 29 tasks (the three no-edit tasks count as 0 lines and 0
files): a median of 51 lines changed, 3 files touched and 310 prompt characters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import opencomposer
from opencomposer.cli import main
from opencomposer.tasks.format import load_suite
from opencomposer.tasks.stats import REFERENCES, TaskStats, plot, summarize, task_stats

CURSORBENCH = Path(opencomposer.__file__).parent / "suites" / "cursorbench"


def test_the_handwritten_suite_has_the_promised_medians():
    rows = [task_stats(t) for t in load_suite(CURSORBENCH)]
    summary = summarize(rows)
    assert len(rows) == 29
    assert summary["lines_changed"].median == 51
    assert summary["files_touched"].median == 3
    assert summary["prompt_chars"].median == 310
    assert (summary["lines_changed"].minimum, summary["lines_changed"].maximum) == (0, 235)
    assert (summary["prompt_chars"].minimum, summary["prompt_chars"].maximum) == (120, 420)
    by_id = {r.task_id: r for r in rows}
    assert by_id["textkit-if-conditions"] == TaskStats("textkit-if-conditions", 235, 2, 367)
    assert by_id["ledger-concurrency-review"] == TaskStats("ledger-concurrency-review", 0, 0, 243)


def test_quantiles_interpolate_between_ranks():
    rows = [TaskStats(str(i), lines, 1, 100) for i, lines in enumerate([1, 2, 3, 4, 10])]
    s = summarize(rows)["lines_changed"]
    assert (s.median, s.mean, s.p25, s.p75) == (3, 4, 2, 4)
    assert (s.p10, s.p90) == (pytest.approx(1.4), pytest.approx(7.6))  # 1 + 0.4 * (2 - 1), 4 + 0.6 * (10 - 4)


def test_stats_command_prints_medians_and_draws_the_histogram(tmp_path, capsys):
    png = tmp_path / "stats.png"
    assert main(["tasks", "stats", str(CURSORBENCH), "--png", str(png)]) == 0
    printed = capsys.readouterr().out
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in printed.splitlines() if line.startswith("│")}
    assert lines["lines"][0] == "51" and lines["lines"][-2:] == ["181", "7-10"]
    assert lines["files"][0] == "3"
    assert lines["prompt chars"][0] == "310" and lines["prompt chars"][-2:] == ["390", "1,185-3,055"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_references_are_the_reports_figures():
    assert REFERENCES["lines_changed"] == {"CursorBench": 181, "SWE-bench": (7, 10)}
    assert REFERENCES["prompt_chars"] == {"CursorBench": 390, "SWE-bench": (1185, 3055)}


def test_plot_of_a_one_task_suite(tmp_path):
    path = plot([TaskStats("t", 0, 0, 40)], tmp_path / "one.png", "one task")
    assert path.is_file()
