"""The task folder format (docs/task-format.md): loading, validating and writing task folders.

``load_task(folder)`` reads one folder into a ``Task``; every problem raises ``TaskFormatError``
naming the file and the field. ``load_suite(folder)`` loads every task folder below a suite folder
and reports all broken ones at once. ``write_task`` creates a folder (importers use it) and never
overwrites an existing one unless asked.

Not here: importers from other formats (``tasks.importers``), exporters (``tasks.exporters``),
grading (``envs.grading``).
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from opencomposer.sandbox.patch import PatchError, copy_tree, parse_patch
from opencomposer.types import Budgets, Task

TASK_ID = re.compile(r"^[A-Za-z0-9._-]+$")
TOP_LEVEL_KEYS = ("id", "test_command", "protected_paths", "workdir", "metadata", "budgets")
METADATA_CHOICES = {
    "source": ("handwritten", "bug_injection", "feature_deletion", "refactor", "mined", "humaneval", "swebench",
               "harbor"),
    "difficulty": ("easy", "medium", "hard"),
    "kind": ("fix", "feature", "refactor", "intent", "instructions", "no_edit"),
}
RUBRIC_KEYS = {"expect_no_edit": bool, "final_message_must_match": list, "forbidden_paths": list,
               "max_files_changed": int}
TESTS_JSON_KEYS = ("FAIL_TO_PASS", "PASS_TO_PASS")


class TaskFormatError(ValueError):
    """A task folder that breaks the format; the message names the file and the field."""

    def __init__(self, file: Path | str, field: str, problem: str):
        self.file, self.field, self.problem = Path(file), field, problem
        where = f"{file}: {field}" if field else f"{file}"
        super().__init__(f"{where}: {problem}")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(path, "", f"not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise TaskFormatError(path, "", "not UTF-8 text") from None


def _relative_path(value: Any, file: Path, field: str) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
        raise TaskFormatError(file, field, f"{value!r} must be a relative path inside the repository (no '..')")
    return value.strip("/")


def load_task(folder: Path | str) -> Task:
    """Read and validate a task folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskFormatError(folder, "", "not a folder")
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(toml_path, "", "missing; every task folder needs a task.toml")
    data = _read_toml(toml_path)
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(key, TOP_LEVEL_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TaskFormatError(toml_path, key, f"unknown key{hint}; valid keys: {', '.join(TOP_LEVEL_KEYS)}")

    task_id = data.get("id")
    if not isinstance(task_id, str) or not TASK_ID.match(task_id):
        raise TaskFormatError(toml_path, "id", f"{task_id!r} must be a string of letters, digits, '.', '_' or '-'")
    test_command = data.get("test_command", "python -m pytest -q")
    if not isinstance(test_command, str) or not test_command.strip():
        raise TaskFormatError(toml_path, "test_command", f"{test_command!r} must be a non-empty string")
    protected = data.get("protected_paths", [])
    if not isinstance(protected, list):
        raise TaskFormatError(toml_path, "protected_paths", f"expected a list of paths, got {protected!r}")
    protected = [_relative_path(p, toml_path, f"protected_paths[{i}]") for i, p in enumerate(protected)]
    workdir = data.get("workdir", "/workspace")
    if not isinstance(workdir, str) or not workdir.startswith("/") or workdir == "/" or ".." in workdir.split("/"):
        raise TaskFormatError(toml_path, "workdir", f"{workdir!r} must be an absolute path below / (e.g. /workspace)")
    metadata = _check_metadata(data.get("metadata", {}), toml_path)
    budgets = _check_budgets(data.get("budgets", {}), toml_path)

    instruction_path = folder / "instruction.md"
    if not instruction_path.is_file():
        raise TaskFormatError(instruction_path, "", "missing; it holds what the agent is asked")
    instruction = instruction_path.read_text(encoding="utf-8")
    if not instruction.strip():
        raise TaskFormatError(instruction_path, "", "is empty")
    repo = folder / "repo"
    if not repo.is_dir():
        raise TaskFormatError(repo, "", "missing; repo/ is the starting snapshot copied into the workspace")

    fail_to_pass, pass_to_pass = _read_tests_json(folder / "tests" / "tests.json")
    files = folder / "tests" / "files"
    if files.exists() and not files.is_dir():
        raise TaskFormatError(files, "", "must be a folder of hidden test files")

    gold_patch = None
    gold_path = folder / "solution" / "gold.patch"
    if gold_path.is_file():
        gold_patch = gold_path.read_text(encoding="utf-8")
        try:
            parse_patch(gold_patch)
        except PatchError as e:
            raise TaskFormatError(gold_path, "", f"not a valid unified diff: {e}") from None

    rubric = None
    rubric_path = folder / "rubric.toml"
    if rubric_path.is_file():
        rubric = _check_rubric(_read_toml(rubric_path), rubric_path)

    return Task(
        id=task_id,
        instruction=instruction,
        repo=repo,
        test_command=test_command,
        tests_dir=files if files.is_dir() else None,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        protected_paths=protected,
        budgets=budgets,
        metadata=metadata,
        gold_patch=gold_patch,
        rubric=rubric,
        path=folder,
        workdir=workdir,
    )


def _check_metadata(metadata: Any, file: Path) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise TaskFormatError(file, "metadata", f"expected a table, got {metadata!r}")
    for key, choices in METADATA_CHOICES.items():
        if key in metadata and metadata[key] not in choices:
            raise TaskFormatError(file, f"metadata.{key}", f"{metadata[key]!r} is not one of {', '.join(choices)}")
    return dict(metadata)


def _check_budgets(table: Any, file: Path) -> Budgets:
    if not isinstance(table, dict):
        raise TaskFormatError(file, "budgets", f"expected a table, got {table!r}")
    names = [f.name for f in fields(Budgets)]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise TaskFormatError(file, f"budgets.{key}", f"unknown budget; valid: {', '.join(names)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise TaskFormatError(file, f"budgets.{key}", f"{value!r} must be a positive number")
        if key in ("max_turns", "max_tokens") and not isinstance(value, int):
            raise TaskFormatError(file, f"budgets.{key}", f"{value!r} must be an integer")
        values[key] = value
    return Budgets(**values)


def _read_tests_json(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        raise TaskFormatError(path, "", 'missing; it lists the tests: {"FAIL_TO_PASS": [...], "PASS_TO_PASS": [...]}')
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskFormatError(path, "", f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TaskFormatError(path, "", f"expected a JSON object, got {type(data).__name__}")
    for key in data:
        if key not in TESTS_JSON_KEYS:
            raise TaskFormatError(path, key, f"unknown key; expected {' and '.join(TESTS_JSON_KEYS)}")
    lists = []
    for key in TESTS_JSON_KEYS:
        value = data.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise TaskFormatError(path, key, f"expected a list of pytest node ids, got {value!r}")
        if len(set(value)) != len(value):
            raise TaskFormatError(path, key, "lists a test twice")
        lists.append(list(value))
    return lists[0], lists[1]


def _check_rubric(data: dict[str, Any], file: Path) -> dict[str, Any]:
    for key, value in data.items():
        if key not in RUBRIC_KEYS:
            raise TaskFormatError(file, key, f"unknown rubric rule; valid: {', '.join(RUBRIC_KEYS)}")
        expected = RUBRIC_KEYS[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise TaskFormatError(file, key, f"expected {expected.__name__}, got {value!r}")
    for i, pattern in enumerate(data.get("final_message_must_match", [])):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as e:
            raise TaskFormatError(file, f"final_message_must_match[{i}]", f"{pattern!r} is not a regex: {e}") from None
    for i, path in enumerate(data.get("forbidden_paths", [])):
        _relative_path(path, file, f"forbidden_paths[{i}]")
    if data.get("max_files_changed", 0) < 0:
        raise TaskFormatError(file, "max_files_changed", "must be >= 0")
    return data


def load_suite(folder: Path | str) -> list[Task]:
    """Every task below ``folder`` (a folder of task folders, or one task folder), sorted by id.

    Broken folders are all reported in one ``TaskFormatError``; duplicate ids are an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskFormatError(folder, "", "suite folder not found")
    if (folder / "task.toml").is_file():
        return [load_task(folder)]
    tasks, problems = [], []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (child / "task.toml").exists() and not (child / "instruction.md").exists():
            continue
        try:
            tasks.append(load_task(child))
        except TaskFormatError as e:
            problems.append(str(e))
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.id in seen:
            problems.append(f"{task.path / 'task.toml'}: id: {task.id!r} is also the id of {seen[task.id]}")
        seen[task.id] = task.path
    if problems:
        raise TaskFormatError(folder, "", f"{len(problems)} broken task folder(s):\n  " + "\n  ".join(problems))
    if not tasks:
        raise TaskFormatError(folder, "", "no task folders (folders with a task.toml) found")
    return sorted(tasks, key=lambda t: t.id)


# ----------------------------------------------------------------------------------------------
# Writing


def write_task(
    folder: Path,
    *,
    task_id: str,
    instruction: str,
    repo: Path | dict[str, str],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    hidden_tests: Path | dict[str, str] | None = None,
    test_command: str = "python -m pytest -q",
    protected_paths: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    budgets: dict[str, Any] | None = None,
    gold_patch: str | None = None,
    rubric: dict[str, Any] | None = None,
    workdir: str = "/workspace",
    overwrite: bool = False,
) -> Task:
    """Create a task folder (``repo`` and ``hidden_tests`` are folders or {path: text} maps) and
    load it back, so what is written is always a valid task."""
    folder = Path(folder)
    if folder.exists():
        if not overwrite:
            raise FileExistsError(f"{folder} already exists; remove it or pass overwrite=True")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    data: dict[str, Any] = {"id": task_id, "test_command": test_command,
                            "protected_paths": list(protected_paths or [])}
    if workdir != "/workspace":
        data["workdir"] = workdir
    data["metadata"] = dict(metadata or {})
    if budgets:
        data["budgets"] = dict(budgets)
    (folder / "task.toml").write_text(dumps_toml(data), encoding="utf-8")
    (folder / "instruction.md").write_text(instruction if instruction.endswith("\n") else instruction + "\n",
                                           encoding="utf-8")
    _write_files(folder / "repo", repo)
    (folder / "tests").mkdir()
    (folder / "tests" / "tests.json").write_text(
        json.dumps({"FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass}, indent=2) + "\n", encoding="utf-8"
    )
    if hidden_tests is not None:
        _write_files(folder / "tests" / "files", hidden_tests)
    if gold_patch:
        (folder / "solution").mkdir()
        (folder / "solution" / "gold.patch").write_text(gold_patch, encoding="utf-8")
    if rubric:
        (folder / "rubric.toml").write_text(dumps_toml(rubric), encoding="utf-8")
    return load_task(folder)


def _write_files(target: Path, source: Path | dict[str, str]) -> None:
    if isinstance(source, dict):
        target.mkdir(parents=True, exist_ok=True)
        for rel, text in source.items():
            _relative_path(rel, target, "file")
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    else:
        copy_tree(Path(source), target)


def dumps_toml(data: dict[str, Any]) -> str:
    """TOML for plain data: scalars and lists at each level, then sub-tables."""
    lines: list[str] = []

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
        if name and (scalars or not any(isinstance(v, dict) for v in table.values())):
            lines.append(f"[{name}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
        if scalars or name:
            lines.append("")
        for k, v in table.items():
            if isinstance(v, dict):
                emit(v, f"{name}.{_key(k)}" if name else _key(k))

    emit(data, "")
    return "\n".join(lines).rstrip("\n") + "\n"


def _key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")
