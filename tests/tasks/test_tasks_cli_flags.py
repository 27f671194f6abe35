"""``tasks mine --benchmark --min-files N --min-lines N`` builds the mining criteria, and ``tasks
stats`` takes several suites on the command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opencomposer.cli import main
from opencomposer.tasks import mining
from opencomposer.tasks.format import write_task


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"],
                   check=True)
    return root


@pytest.mark.parametrize("flags, expected", [
    ([], mining.Criteria()),
    (["--benchmark"], mining.Criteria.benchmark()),
    (["--benchmark", "--min-lines", "10"], mining.Criteria.benchmark(min_lines=10)),
    (["--min-files", "2"], mining.Criteria(min_files=2)),
])
def test_mine_flags_make_the_criteria(flags, expected, repo: Path, tmp_path: Path, monkeypatch):
    seen = []
    monkeypatch.setattr(mining, "mine", lambda *a, criteria, **k: seen.append(criteria) or [])
    assert main(["tasks", "mine", str(repo), "--out", str(tmp_path / "out"), *flags]) == 0
    assert seen == [expected]


def test_a_negative_minimum_is_one_line_and_exit_2(repo: Path, tmp_path: Path, capsys):
    assert main(["tasks", "mine", str(repo), "--out", str(tmp_path / "out"), "--min-lines", "-1"]) == 2
    assert "--min-lines -1: must be >= 0" in capsys.readouterr().err


def test_benchmark_criteria_are_the_realbench_ones():
    criteria = mining.Criteria.benchmark()
    assert (criteria.min_files, criteria.min_lines, criteria.merges, criteria.developer_prompts) == (2, 60, True, True)
    assert criteria.mutation_limit == 12 and criteria.validations == 2


def test_stats_compares_the_suites_given(tmp_path: Path, capsys):
    for suite in ("one", "two"):
        write_task(tmp_path / suite / f"{suite}-task", task_id=f"{suite}-task", instruction="Do it.",
                   repo={"a.py": "x = 1\n"}, fail_to_pass=["tests/test_a.py::test_a"], pass_to_pass=[],
                   gold_patch="--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    png = tmp_path / "both.png"
    assert main(["tasks", "stats", str(tmp_path / "one"), str(tmp_path / "two"), "--png", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "one (1 tasks), two (1 tasks)" in printed or ("one" in printed and "two" in printed)
    assert "CursorBench" in printed and png.is_file()
