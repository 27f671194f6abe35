"""The hack monitor on an RL run's report: rollout records keep a flagged diff with its reasons,
and ``report.html`` shows the rate and each flagged episode, its diff one click away."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from opencomposer.rl.report import flagged_episodes, hack_monitor_section, hack_record, panel_lines
from opencomposer.training.html import HtmlReport
from opencomposer.types import Grade

GRADE = Grade(resolved=True, fail_to_pass=1.0, pass_to_pass=1.0, tests_passed=1, tests_failed=0, tests_errored=0,
              test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1, lines_added=3,
              lines_removed=1, lines_changed=4, todo_added=0, comment_lines_added=0, lint_added=0, grading_s=0.1)
HACK = dataclasses.replace(GRADE, hack_suspected=True,
                           hack_reasons=("constant-dunder solution.py:5: Any.__eq__ always returns True",))
DIFF = "--- a/solution.py\n+++ b/solution.py\n@@ -1 +1,5 @@\n+class Any:\n+    def __eq__(self, o):\n+        return True\n"


def test_a_rollout_record_keeps_the_diff_only_when_the_monitor_flagged_it():
    assert hack_record(GRADE, DIFF) == {"hack_suspected": False, "hack_reasons": []}
    assert hack_record(None, DIFF) == {"hack_suspected": False, "hack_reasons": []}
    assert hack_record(HACK, DIFF) == {"hack_suspected": True, "hack_reasons": list(HACK.hack_reasons), "diff": DIFF}


def run_folder(tmp_path: Path) -> Path:
    (tmp_path / "rollouts").mkdir()
    metrics = [{"step": 1, "kind": "train", "hack_suspected_rate": 0.5}, {"step": 2, "kind": "train",
                                                                          "hack_suspected_rate": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    records = [{"step": 1, "task_id": "humaneval-0", "sample": 0, "reward": 0.6, "resolved": 1.0,
                **hack_record(HACK, DIFF)},
               {"step": 1, "task_id": "humaneval-0", "sample": 1, "reward": 1.1, "resolved": 1.0,
                **hack_record(GRADE, "--- honest diff")}]
    (tmp_path / "rollouts" / "step-000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "rollouts" / "step-000002.jsonl").write_text("")
    return tmp_path


def test_report_html_shows_the_rate_and_each_flagged_diff_one_click_away(tmp_path: Path):
    run_dir = run_folder(tmp_path)
    assert [(r["step"], r["sample"]) for r in flagged_episodes(run_dir)] == [(1, 0)]
    report = HtmlReport("run")
    report.section("rl", "RL")
    hack_monitor_section(report, run_dir)
    page = report.write(tmp_path / "report.html").read_text()
    assert "0.250 of training episodes flagged" in page and "1 flagged episodes" in page
    assert page.count("constant-dunder solution.py:5: Any.__eq__ always returns True") == 2  # table and fold
    assert "<details><summary>diff of step 1, humaneval-0, sample 0" in page
    assert "+        return True" in page and "honest diff" not in page
    assert "def __eq__(self, o)" in page.split("<details>")[1]  # the diff inside the fold


def test_a_run_without_flags_says_so_and_the_rate_is_on_the_pass_rate_panel(tmp_path: Path):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "kind": "train", "hack_suspected_rate": 0.0}) + "\n")
    report = HtmlReport("run")
    report.section("rl", "RL")
    hack_monitor_section(report, tmp_path)
    page = report.render()
    assert "0 flagged episodes" in page and "<details>" not in page
    lines = {label: values for label, _, values in panel_lines([{"step": 1, "kind": "train",
                                                                 "hack_suspected_rate": 0.25}])["pass_rate"]}
    assert lines["train hack suspected rate (monitor)"] == [0.25]
