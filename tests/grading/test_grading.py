"""Grading: gold patches resolve, empty diffs do not, editing tests gains nothing, quality counts."""

from __future__ import annotations

import json
import time
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


@pytest.fixture
def task_copy(tmp_path: Path):
    """A private copy of the fix-add task folder, free to edit, and the function that loads it."""
    import shutil

    folder = tmp_path / "fix-add"
    shutil.copytree(FIXTURES / "fix-add", folder)
    return folder


def counting_grades(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Replace ``grade`` under the cache by one that records each call and grades nothing."""
    import dataclasses

    from opencomposer.grading import grade as grading

    calls: list[tuple] = []

    def fake(task, diff, final_message=None, sandbox_config=None, config=None, out_dir=None):
        calls.append((diff, final_message))
        return dataclasses.replace(GOOD, resolved=len(calls) % 2 == 1)

    monkeypatch.setattr(grading, "grade", fake)
    return calls


def test_grade_cache_key_changes_with_every_part_grading_reads(task_copy: Path, monkeypatch: pytest.MonkeyPatch):
    """Each part of the key, dropped, would let one of these reuse a grade it must not: the final
    message, a hidden test, task.toml, a repo file, a file of the task folder grading never names
    (a verifier or environment file), the grading and the sandbox settings."""
    from opencomposer.config import SandboxConfig
    from opencomposer.grading.grade import GradeCache

    calls = counting_grades(monkeypatch)
    cache = GradeCache()
    task = load_task(task_copy)
    cache.grade(task, "d", "first answer")
    cache.grade(task, "d", "first answer", config=GradingConfig())  # no settings = the default settings
    cache.grade(load_task(task_copy), "d", "first answer")  # the same folder loaded again
    assert len(calls) == 1 and cache.hits == 2
    hidden = task_copy / "tests" / "files" / "tests" / "test_add.py"
    toml = task_copy / "task.toml"
    changes = [  # (what changes, then the arguments graded with); each must be graded afresh, once
        (lambda: None, {"final_message": "another answer"}),
        (lambda: None, {"final_message": None}),
        (lambda: hidden.write_text("def test_x():\n    pass\n"), {}),
        (lambda: toml.write_text(toml.read_text() + "# edited\n"), {}),
        (lambda: (task_copy / "repo" / "calc.py").write_text("def add(a, b):\n    return 0\n"), {}),
        (lambda: (task_copy / "verifier").mkdir() or (task_copy / "verifier" / "test.sh").write_text("exit 0\n"), {}),
        (lambda: None, {"config": GradingConfig(timeout_s=7)}),
        (lambda: None, {"sandbox_config": SandboxConfig(isolation="none")}),
    ]
    for number, (change, different) in enumerate(changes, 2):
        change()
        arguments = {"final_message": None, **different}
        cache.grade(task, "d", **arguments)
        cache.grade(task, "d", **arguments)
        assert len(calls) == number, f"change {number - 1} did not change the key"


def test_grade_cache_digest_of_a_folder_is_computed_once_per_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import os

    from opencomposer.grading import grade as grading

    (tmp_path / "a.txt").write_text("one")
    settled = (time.time_ns() - 10**10,) * 2
    os.utime(tmp_path / "a.txt", ns=settled)  # ten seconds old (its ctime is now: hashed again, see below)
    monkeypatch.setattr(grading, "RACY_S", 0.0)
    first = grading.folder_digest(tmp_path)
    reads = []
    monkeypatch.setattr(grading, "read_entry", lambda path: reads.append(path) or None)
    assert grading.folder_digest(tmp_path) == first and reads == []  # unchanged: no file is read again
    monkeypatch.undo()
    (tmp_path / "a.txt").write_text("two")  # same size, and mtime and ctime maybe in the same clock tick
    os.utime(tmp_path / "a.txt", ns=settled)  # even set back: the recent ctime makes it hashed again
    assert grading.folder_digest(tmp_path) != first
    other = tmp_path.parent / (tmp_path.name + "-copy")
    other.mkdir()
    (other / "a.txt").write_text("two")
    assert grading.folder_digest(other) == grading.folder_digest(tmp_path)  # content, not place
    assert grading.folder_digest(tmp_path / "absent") == "absent"


@pytest.mark.bwrap
def test_grade_cache_never_lends_a_rubric_verdict_to_a_different_final_message(tmp_path: Path):
    from opencomposer.grading.grade import GradeCache

    task = write_task(tmp_path / "question", task_id="question", instruction="What is 6 x 7? Change nothing.",
                      repo={"notes.txt": "x\n"}, fail_to_pass=[], pass_to_pass=[],
                      rubric={"expect_no_edit": True, "final_message_must_match": [r"\b42\b"]})
    cache = GradeCache()
    right = cache.grade(task, "", "It is 42.")
    wrong = cache.grade(task, "", "It is 41.")
    assert (right.rubric_ok, right.resolved) == (True, True)
    assert (wrong.rubric_ok, wrong.resolved) == (False, False)
    assert cache.hits == 0


@pytest.mark.bwrap
def test_grade_cache_regrades_after_a_hidden_test_is_edited(task_copy: Path):
    from opencomposer.grading.grade import GradeCache

    cache = GradeCache()
    task = load_task(task_copy)
    assert cache.grade(task, task.gold_patch, "Fixed add.").resolved
    hidden = task_copy / "tests" / "files" / "tests" / "test_add.py"
    hidden.write_text(hidden.read_text().replace("== ", "== 1 + "))  # every expected sum off by one
    assert not cache.grade(task, task.gold_patch, "Fixed add.").resolved
    assert (cache.hits, cache.misses) == (0, 2)


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
