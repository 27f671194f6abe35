"""Task folders load into Tasks; broken folders fail with the file and the field named."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from opencomposer.tasks.format import TaskFormatError, dumps_toml, load_suite, load_task, write_task

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def test_fixture_task_loads_with_every_field():
    task = load_task(FIXTURES / "fix-add")
    assert task.id == "fix-add"
    assert task.instruction == "`add` in calc.py subtracts instead of adding. Fix it.\n"
    assert task.repo == FIXTURES / "fix-add" / "repo"
    assert task.tests_dir == FIXTURES / "fix-add" / "tests" / "files"
    assert task.fail_to_pass == ["tests/test_add.py::test_add", "tests/test_add.py::test_add_negative"]
    assert task.pass_to_pass == ["tests/test_mul.py::test_mul"]
    assert task.protected_paths == ["tests"]
    assert task.test_command == "python -m pytest -q tests"
    assert task.budgets.max_turns == 8 and task.budgets.max_tokens == 16_384  # the rest are defaults
    assert task.metadata == {"source": "handwritten", "family": "calc", "difficulty": "easy", "kind": "fix"}
    assert task.gold_patch.startswith("diff --git a/calc.py b/calc.py\n")
    assert task.workdir == "/workspace" and task.rubric is None


def test_suite_loads_sorted_by_id():
    assert [t.id for t in load_suite(FIXTURES)] == ["feature-slugify", "fix-add", "refactor-drop-legacy"]


def _edit(rel: str, text: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return apply


def _remove(rel: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        target = folder / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return apply


def _toml(**changes) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        import tomllib

        data = tomllib.loads((folder / "task.toml").read_text())
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        (folder / "task.toml").write_text(dumps_toml(data))
    return apply


BROKEN = {
    "no task.toml": (_remove("task.toml"), "task.toml", "missing"),
    "bad toml": (_edit("task.toml", "id = \n"), "task.toml", "not valid TOML"),
    "bad id": (_toml(id="has space"), "task.toml: id", "letters, digits"),
    "no id": (_toml(id=None), "task.toml: id", "must be a string"),
    "typo key": (_toml(test_comand="pytest"), "task.toml: test_comand", "did you mean 'test_command'"),
    "empty command": (_toml(test_command=" "), "task.toml: test_command", "non-empty"),
    "protected escape": (_toml(protected_paths=["../x"]), "task.toml: protected_paths[0]", "no '..'"),
    "relative workdir": (_toml(workdir="app"), "task.toml: workdir", "absolute path"),
    "bad difficulty": (_toml(metadata={"difficulty": "trivial"}), "task.toml: metadata.difficulty", "easy, medium, hard"),
    "negative budget": (_toml(budgets={"max_turns": -1}), "task.toml: budgets.max_turns", "positive"),
    "float turns": (_toml(budgets={"max_turns": 2.5}), "task.toml: budgets.max_turns", "integer"),
    "unknown budget": (_toml(budgets={"max_money": 1}), "task.toml: budgets.max_money", "unknown budget"),
    "no instruction": (_remove("instruction.md"), "instruction.md", "missing"),
    "empty instruction": (_edit("instruction.md", "  \n"), "instruction.md", "is empty"),
    "no repo": (_remove("repo"), "repo", "missing"),
    "no tests.json": (_remove("tests/tests.json"), "tests/tests.json", "missing"),
    "tests.json not json": (_edit("tests/tests.json", "{"), "tests/tests.json", "not valid JSON"),
    "tests.json missing list": (_edit("tests/tests.json", '{"FAIL_TO_PASS": []}'), "tests/tests.json: PASS_TO_PASS",
                                "expected a list"),
    "tests.json extra key": (_edit("tests/tests.json", '{"FAIL_TO_PASS": [], "PASS_TO_PASS": [], "X": 1}'),
                             "tests/tests.json: X", "unknown key"),
    "tests.json duplicate": (_edit("tests/tests.json", '{"FAIL_TO_PASS": ["a", "a"], "PASS_TO_PASS": []}'),
                             "tests/tests.json: FAIL_TO_PASS", "twice"),
    "files not a folder": (lambda f: (shutil.rmtree(f / "tests/files"), (f / "tests/files").write_text("x")),
                           "tests/files", "must be a folder"),
    "bad gold patch": (_edit("solution/gold.patch", "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-a\n"), "solution/gold.patch",
                       "not a valid unified diff"),
    "unknown rubric rule": (_edit("rubric.toml", "be_nice = true\n"), "rubric.toml: be_nice", "unknown rubric rule"),
    "rubric bad regex": (_edit("rubric.toml", 'final_message_must_match = ["(unclosed"]\n'),
                         "rubric.toml: final_message_must_match[0]", "not a regex"),
    "rubric wrong type": (_edit("rubric.toml", "max_files_changed = true\n"), "rubric.toml: max_files_changed",
                          "expected int"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_folders_name_the_file_and_field(case: str, tmp_path: Path):
    mutate, where, problem = BROKEN[case]
    folder = tmp_path / "task"
    shutil.copytree(FIXTURES / "fix-add", folder)
    mutate(folder)
    with pytest.raises(TaskFormatError) as info:
        load_task(folder)
    assert f"{folder / where.split(':')[0]}" in str(info.value)
    assert where.split(": ")[-1] in str(info.value) and problem in str(info.value)
    assert (folder / "repo").exists() or case == "no repo"  # loading never changes the folder


def test_suite_reports_every_broken_folder_and_duplicate_ids(tmp_path: Path):
    for name in ("a", "b", "c", "d"):
        shutil.copytree(FIXTURES / "fix-add", tmp_path / name)
    (tmp_path / "a" / "instruction.md").unlink()
    (tmp_path / "b" / "tests" / "tests.json").write_text("[]")
    with pytest.raises(TaskFormatError) as info:
        load_suite(tmp_path)
    message = str(info.value)
    assert "3 broken task folder(s)" in message
    assert f"{tmp_path / 'a' / 'instruction.md'}: missing" in message
    assert f"{tmp_path / 'b' / 'tests' / 'tests.json'}: expected a JSON object" in message
    assert "'fix-add' is also the id of" in message


def test_write_task_round_trips_and_never_overwrites(tmp_path: Path):
    task = write_task(
        tmp_path / "t", task_id="t-1", instruction="Do it.", repo={"m.py": "x = 1\n"},
        hidden_tests={"tests/test_m.py": "def test_m():\n    pass\n"}, fail_to_pass=["tests/test_m.py::test_m"],
        pass_to_pass=[], protected_paths=["tests"], metadata={"source": "mined", "notes": {"k": [1, "two"]}},
        budgets={"max_turns": 3, "max_wall_s": 12.5}, rubric={"expect_no_edit": True}, workdir="/app",
    )
    assert (task.id, task.workdir, task.budgets.max_turns, task.budgets.max_wall_s) == ("t-1", "/app", 3, 12.5)
    assert task.metadata == {"source": "mined", "notes": {"k": [1, "two"]}} and task.rubric == {"expect_no_edit": True}
    assert json.loads((tmp_path / "t" / "tests" / "tests.json").read_text())["FAIL_TO_PASS"] == ["tests/test_m.py::test_m"]
    with pytest.raises(FileExistsError, match="already exists"):
        write_task(tmp_path / "t", task_id="t-1", instruction="x", repo={}, fail_to_pass=[], pass_to_pass=[])
    assert (tmp_path / "t" / "repo" / "m.py").read_text() == "x = 1\n"
