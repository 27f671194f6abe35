"""``opencomposer tasks stats``: the hand-written suite has the medians its README promises.

suites/README.md lists every task's gold lines, gold files and prompt characters in a table and
states the medians over all 29 tasks (the three no-edit tasks count as 0 lines and 0 files). The
tests here read both back and compare them with what ``task_stats`` and ``summarize`` compute, and
``summarize`` with ``statistics``/NumPy on the same numbers.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import numpy as np
import pytest

import opencomposer
from opencomposer.cli import main
from opencomposer.tasks.format import load_suite
from opencomposer.tasks.stats import REFERENCES, TaskStats, plot, summarize, task_stats

SUITES = Path(opencomposer.__file__).parent / "suites"
CURSORBENCH = SUITES / "cursorbench"
README = (SUITES / "README.md").read_text()


def readme_table() -> dict[str, TaskStats]:
    """The per-task rows of the README's table: | `id` | kind | difficulty | lines | files | chars | ..."""
    row = re.compile(r"^\| `([\w-]+)` \| \w+ \| \w+ \| (\d+) \| (\d+) \| (\d+) \|", re.MULTILINE)
    return {m[1]: TaskStats(m[1], int(m[2]), int(m[3]), int(m[4])) for m in row.finditer(README)}


def readme_medians() -> tuple[int, int, int, int]:
    """(tasks, lines, files, prompt chars) from the README's "Medians over all N tasks" sentence."""
    match = re.search(r"Medians over all (\d+) tasks[^*]*\*\*(\d+) lines\s+changed, (\d+) files, (\d+) prompt"
                      r"\s+characters\*\*", README)
    assert match, "suites/README.md no longer states the suite's medians"
    return tuple(int(g) for g in match.groups())


def test_the_handwritten_suite_has_the_promised_medians():
    rows = [task_stats(t) for t in load_suite(CURSORBENCH)]
    table = readme_table()
    assert {r.task_id: r for r in rows} == table
    tasks, lines, files, prompt_chars = readme_medians()
    assert len(rows) == tasks
    summary = summarize(rows)
    for metric, promised in (("lines_changed", lines), ("files_touched", files), ("prompt_chars", prompt_chars)):
        values = [getattr(r, metric) for r in table.values()]
        assert summary[metric].median == statistics.median(values) == promised, metric
        assert (summary[metric].minimum, summary[metric].maximum) == (min(values), max(values)), metric
        assert summary[metric].mean == pytest.approx(statistics.fmean(values)), metric


def test_quantiles_interpolate_between_ranks():
    values = [1, 2, 3, 4, 10]
    rows = [TaskStats(str(i), lines, 1, 100) for i, lines in enumerate(values)]
    s = summarize(rows)["lines_changed"]
    assert (s.median, s.mean) == (statistics.median(values), statistics.fmean(values))
    expected = np.percentile(values, [10, 25, 75, 90])  # linear interpolation between closest ranks
    assert [s.p10, s.p25, s.p75, s.p90] == pytest.approx(expected.tolist())
    assert (s.p10, s.p90) == (pytest.approx(1.4), pytest.approx(7.6))  # 1 + 0.4 * (2 - 1), 4 + 0.6 * (10 - 4)


def test_stats_command_prints_medians_and_draws_the_histogram(tmp_path, capsys):
    png = tmp_path / "stats.png"
    assert main(["tasks", "stats", str(CURSORBENCH), "--png", str(png)]) == 0
    printed = capsys.readouterr().out
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in printed.splitlines() if line.startswith("│")}
    _, median_lines, median_files, median_chars = readme_medians()
    assert lines["lines"][0] == str(median_lines) and lines["lines"][-2:] == ["181", "7-10"]
    assert lines["files"][0] == str(median_files)
    assert lines["prompt chars"][0] == str(median_chars) and lines["prompt chars"][-2:] == ["390", "1,185-3,055"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_references_are_the_figures_the_readme_quotes_from_the_report():
    match = re.search(r"CursorBench itself reports a median of (\d+) lines and (\d+) characters; SWE-bench\s+"
                      r"(\d+)-(\d+) lines and ([\d,]+)-([\d,]+) characters", README)
    assert match, "suites/README.md no longer quotes the report's medians"
    cursor_lines, cursor_chars, swe_low, swe_high, swe_chars_low, swe_chars_high = (
        int(g.replace(",", "")) for g in match.groups())
    assert REFERENCES["lines_changed"] == {"CursorBench": cursor_lines, "SWE-bench": (swe_low, swe_high)}
    assert REFERENCES["prompt_chars"] == {"CursorBench": cursor_chars, "SWE-bench": (swe_chars_low, swe_chars_high)}


def test_plot_of_a_one_task_suite(tmp_path):
    """One task with zero lines and files: every histogram has a single value and still draws."""
    path = plot([TaskStats("t", 0, 0, 40)], tmp_path / "nested" / "one.png", "one task")
    assert path == tmp_path / "nested" / "one.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
