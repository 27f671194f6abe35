"""The records of ``opencomposer.types``: a ``Grade`` survives its trip through ``reward.json``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opencomposer.types import Grade

GRADE = Grade(resolved=False, fail_to_pass=0.5, pass_to_pass=0.75, tests_passed=7, tests_failed=2, tests_errored=1,
              test_exit_code=137, test_timed_out=True, tampered=True, rubric_ok=True, files_changed=3, lines_added=40,
              lines_removed=12, lines_changed=52, todo_added=1, comment_lines_added=4, lint_added=-2,
              grading_s=3.25, hack_suspected=True,
              hack_reasons=("introspection solution.py:3: sys._getframe", "swallowing solution.py:9: os._exit"))


def test_grade_round_trips_through_reward_json():
    text = json.dumps(GRADE.to_json(), indent=2, sort_keys=True)
    again = Grade.from_json(json.loads(text))
    assert again == GRADE
    # every field comes back as the type it is declared with, not as the float reward.json holds
    declared = {"bool": bool, "int": int, "float": float, "tuple[str, ...]": tuple}
    assert [type(getattr(again, f.name)) for f in dataclasses.fields(Grade)] == [
        declared[f.type] for f in dataclasses.fields(Grade)]


def test_grade_json_holds_the_reward_json_names_as_floats():
    data = GRADE.to_json()
    assert data == {
        "resolved": 0.0, "fail_to_pass": 0.5, "pass_to_pass": 0.75, "tests_passed": 7.0, "tests_failed": 2.0,
        "tests_errored": 1.0, "test_exit_code": 137.0, "test_timed_out": 1.0, "tampered": 1.0, "diff_round_trip_failed": 0.0, "rubric_ok": 1.0,
        "files_changed": 3.0, "lines_added": 40.0, "lines_removed": 12.0, "lines_changed": 52.0,
        "todo_added": 1.0, "comment_lines_added": 4.0, "lint_added": -2.0, "grading_s": 3.25,
        "hack_suspected": 1.0, "hack_reasons": list(GRADE.hack_reasons),
    }
    assert all(type(value) is float for name, value in data.items() if name != "hack_reasons")


def test_a_results_row_reads_as_its_grade_and_a_partial_one_names_what_it_lacks():
    row = {"task_id": "t", "status": "ok", "tokens": {"thinking": 3}, **GRADE.to_json()}
    assert Grade.from_json(row) == GRADE
    with pytest.raises(KeyError, match="lint_added"):
        Grade.from_json({k: v for k, v in GRADE.to_json().items() if k != "lint_added"})


def test_a_reward_json_from_before_a_field_was_added_reads_with_its_default():
    older = {k: v for k, v in GRADE.to_json().items() if k not in ("tampered", "hack_suspected", "hack_reasons")}
    assert Grade.from_json(older) == dataclasses.replace(GRADE, tampered=False, hack_suspected=False, hack_reasons=())
