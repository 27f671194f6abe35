"""Grading: gold patches resolve, empty diffs do not, editing tests gains nothing, quality counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.config import GradingConfig
from opencomposer.grading.grade import GradingInfraError, grade
from opencomposer.sandbox.patch import file_diff
from opencomposer.tasks.format import load_task, write_task
from opencomposer.types import Grade

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"
REWARD_NAMES = {
    "resolved", "fail_to_pass", "pass_to_pass", "tests_passed", "tests_failed", "tests_errored", "test_exit_code",
    "test_timed_out", "tampered", "diff_round_trip_failed", "rubric_ok", "files_changed", "lines_added",
    "lines_removed", "lines_changed", "todo_added", "comment_lines_added", "lint_added", "grading_s",
    "hack_suspected", "hack_reasons",
}
GOOD = Grade(resolved=True, fail_to_pass=1.0, pass_to_pass=1.0, tests_passed=3, tests_failed=0, tests_errored=0,
             test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1, lines_added=1, lines_removed=1,
             lines_changed=2, todo_added=0, comment_lines_added=0, lint_added=0, grading_s=0.2)


def without_time(reward: Grade) -> dict[str, object]:
    return {k: v for k, v in reward.to_json().items() if k != "grading_s"}


@pytest.mark.bwrap
def test_gold_patch_resolves_and_writes_reward_json(tmp_path: Path):
    task = load_task(FIXTURES / "fix-add")
    reward = grade(task, task.gold_patch, "Fixed add.", out_dir=tmp_path)
    assert isinstance(reward, Grade) and reward.resolved is True and reward.tests_passed == 3
    assert set(reward.to_json()) == REWARD_NAMES
    expected = {
        "resolved": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0, "tests_passed": 3.0, "tests_failed": 0.0,
        "tests_errored": 0.0, "test_exit_code": 0.0, "test_timed_out": 0.0, "tampered": 0.0,
        "diff_round_trip_failed": 0.0, "rubric_ok": 1.0,
        "files_changed": 1.0, "lines_added": 1.0, "lines_removed": 1.0, "lines_changed": 2.0, "todo_added": 0.0,
        "comment_lines_added": 0.0, "lint_added": 0.0, "hack_suspected": 0.0, "hack_reasons": [],
    }
    assert without_time(reward) == expected
    # byte for byte what the grader wrote when it returned a dict of floats: sorted keys, 1.0 not true
    # (the hack monitor's reasons, the one list, beside them)
    written = (tmp_path / "reward.json").read_text()
    assert written == json.dumps({**expected, "grading_s": reward.grading_s}, indent=2, sort_keys=True) + "\n"
    assert Grade.from_json(json.loads(written)) == reward


@pytest.mark.bwrap
def test_empty_diff_does_not_resolve():
    task = load_task(FIXTURES / "fix-add")
    reward = grade(task, "")
    assert (reward.resolved, reward.fail_to_pass, reward.pass_to_pass) == (0.0, 0.0, 1.0)
    assert (reward.tests_passed, reward.tests_failed, reward.test_exit_code) == (1.0, 2.0, 1.0)


@pytest.mark.bwrap
def test_editing_or_deleting_tests_gains_nothing():
    task = load_task(FIXTURES / "fix-add")
    cheat = (
        file_diff("tests/test_add.py", None, "def test_add():\n    pass\n\n\ndef test_add_negative():\n    pass\n")
        + file_diff("tests/test_mul.py", (task.repo / "tests/test_mul.py").read_text(), None)
        + file_diff("tests/conftest.py", None, "import calc\ncalc.add = lambda a, b: a + b\n")
    )
    reward = grade(task, cheat)
    assert reward.resolved == 0.0 and reward.fail_to_pass == 0.0 and reward.pass_to_pass == 1.0
    assert reward.files_changed == 3.0  # the attempt is still measured


@pytest.mark.bwrap
def test_quality_measures_of_a_diff():
    task = load_task(FIXTURES / "fix-add")
    old = (task.repo / "calc.py").read_text()
    new = old.replace("    return a - b", "    # TODO: check overflow\n    # add them\n    unused = a\n    return a + b")
    reward = grade(task, file_diff("calc.py", old, new))
    assert reward.resolved == 1.0
    assert (reward.todo_added, reward.comment_lines_added, reward.lint_added) == (1.0, 2.0, 1.0)
    assert (reward.lines_added, reward.lines_removed, reward.files_changed) == (4.0, 1.0, 1.0)  # F841


@pytest.mark.bwrap
def test_hanging_code_scores_as_failing_tests_not_infra():
    task = load_task(FIXTURES / "fix-add")
    old = (task.repo / "calc.py").read_text()
    hang = file_diff("calc.py", old, old.replace("    return a - b", "    while True:\n        pass"))
    reward = grade(task, hang, config=GradingConfig(timeout_s=20, per_test_timeout_s=1))
    assert reward.resolved == 0.0 and reward.fail_to_pass == 0.0
    assert reward.tests_failed == 2.0 and reward.pass_to_pass == 1.0  # pytest-timeout failed the two

    reward = grade(task, hang, config=GradingConfig(timeout_s=3, per_test_timeout_s=60))
    assert reward.test_timed_out == 1.0 and reward.resolved == 0.0 and reward.tests_passed == 0.0


@pytest.mark.bwrap
def test_rubric_rules(tmp_path: Path):
    task = write_task(
        tmp_path / "intent", task_id="intent", instruction="Why does x exist? Do not change code.",
        repo={"x.py": "x = 1\n", "legacy.py": "y = 2\n"}, fail_to_pass=[], pass_to_pass=[],
        metadata={"kind": "intent"},
        rubric={"expect_no_edit": True, "final_message_must_match": ["(?i)backwards compat"],
                "forbidden_paths": ["legacy.py"], "max_files_changed": 0},
    )
    assert grade(task, "", "It exists for backwards compatibility.").resolved == 1.0
    assert grade(task, "", "No idea.").rubric_ok == 0.0
    edit = file_diff("x.py", "x = 1\n", "x = 2\n")
    reward = grade(task, edit, "Backwards compat.")
    assert (reward.rubric_ok, reward.resolved, reward.test_exit_code) == (0.0, 0.0, 0.0)


@pytest.mark.bwrap
def test_ruff_running_past_its_limit_is_a_grader_error(monkeypatch: pytest.MonkeyPatch):
    """lint_added needs ruff's answer; a ruff that hangs is the harness's failure, named as such."""
    from opencomposer.grading import grade as grading

    monkeypatch.setattr(grading, "RUFF_TIMEOUT_S", 0.001)
    task = load_task(FIXTURES / "fix-add")
    with pytest.raises(GradingInfraError, match=r"ruff timed out: it ran past 0\.001 s on 1 file\(s\) \(calc\.py\)"):
        grade(task, task.gold_patch)
    assert grade(task, task.gold_patch, config=GradingConfig(lint=False)).resolved  # without lint, no ruff


@pytest.mark.bwrap
def test_a_grading_sandbox_that_cannot_start_is_an_infra_error():
    task = load_task(FIXTURES / "fix-add")
    task.workdir = "/proc/sys/cannot-mount-here"
    with pytest.raises(GradingInfraError, match="could not be started"):
        grade(task, task.gold_patch)
    with pytest.raises(GradingInfraError, match="does not apply"):
        grade(load_task(FIXTURES / "fix-add"), file_diff("calc.py", "not the file\n", "x\n"))


def test_grading_works_without_isolation_too():
    from opencomposer.config import SandboxConfig

    task = load_task(FIXTURES / "fix-add")
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        reward = grade(task, task.gold_patch, sandbox_config=SandboxConfig(isolation="none"))
    assert reward.resolved == 1.0 and reward.tests_passed == 3.0


@pytest.mark.bwrap
def test_grade_cache_reuses_the_grade_of_an_identical_change(tmp_path: Path):
    from opencomposer.grading.grade import GradeCache

    task = load_task(FIXTURES / "fix-add")
    cache = GradeCache()
    fresh = grade(task, task.gold_patch, "Fixed add.")
    first = cache.grade(task, task.gold_patch, "Fixed add.", out_dir=tmp_path / "a")
    again = cache.grade(task, task.gold_patch, "Fixed add.", out_dir=tmp_path / "b")
    other = cache.grade(task, "", "Fixed add.")
    assert without_time(first) == without_time(again) == without_time(fresh)
    assert without_time(other) != without_time(first) and other.resolved == 0.0
    assert (cache.hits, cache.misses) == (1, 2)
    assert json.loads((tmp_path / "b" / "reward.json").read_text()) == again.to_json()  # written for the reuse too


def test_grade_cache_grades_a_key_once_across_threads_and_forgets_failures(monkeypatch: pytest.MonkeyPatch):
    import dataclasses
    import threading
    import time
    from types import SimpleNamespace

    from opencomposer.grading import grade as grading

    calls = []

    def slow_grade(task, diff, final_message=None, sandbox_config=None, config=None, out_dir=None):
        calls.append(diff)
        time.sleep(0.2)  # long enough for every thread to ask while the first grades
        if diff == "broken":
            raise GradingInfraError("the grading sandbox could not start")
        return dataclasses.replace(GOOD, resolved=diff == "good")

    monkeypatch.setattr(grading, "grade", slow_grade)
    cache = grading.GradeCache(max_entries=2)
    task = SimpleNamespace(id="t", path=Path("/tasks/t"))
    results = [None] * 8
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, cache.grade(task, "good"))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["good"] and all(r.resolved == 1.0 for r in results)  # one grading, eight answers

    for _ in range(2):  # a failure raises for its caller and is not remembered
        with pytest.raises(GradingInfraError):
            cache.grade(task, "broken")
    assert calls.count("broken") == 2

    cache.grade(task, "bad")  # two newer keys ("bad", "worse") push "good" out of a 2-entry cache
    cache.grade(task, "worse")
    cache.grade(task, "good")
    assert calls.count("good") == 2
    other_task = SimpleNamespace(id="u", path=Path("/tasks/u"))
    cache.grade(other_task, "good")  # the same change to another task is graded on its own
    assert calls.count("good") == 3
