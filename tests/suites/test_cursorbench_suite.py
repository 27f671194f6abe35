"""The hand-written CursorBench-style suite (``opencomposer/suites/cursorbench``) is sound.

Every task folder follows docs/task-format.md; its broken state (the starting repository, its
project plus ``setup.patch``, with the hidden tests overlaid) fails every FAIL_TO_PASS test and passes every PASS_TO_PASS test; its gold
state (``solution/gold.patch`` applied) passes both; and the suite as a whole has the shape
of CursorBench (report §5, docs/recipe.md §8): terse prompts, changes of tens of lines over
several files, and targeted tasks for intent, instruction following and not editing.

The full sweep over every task runs pytest twice per task and is marked ``slow``; a sample
of three tasks runs in the default selection.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opencomposer.sandbox.patch import diff_stats
from opencomposer.tasks.format import load_task

from .conftest import CURSORBENCH, PROJECTS, Workspaces, apply_patch

TASK_DIRS = sorted(p for p in CURSORBENCH.iterdir() if (p / "task.toml").is_file())
TASK_IDS = [p.name for p in TASK_DIRS]
KINDS = ("fix", "feature", "refactor", "intent", "instructions", "no_edit")
SAMPLE = ["inventory-shipping", "ledger-filter-bugs", "textkit-wide-chars-question"]


def read_task(folder: Path) -> dict:
    """Everything the checks need from one task folder."""
    rubric_path = folder / "rubric.toml"
    patch_path = folder / "solution" / "gold.patch"
    return {
        "toml": tomllib.loads((folder / "task.toml").read_text()),
        "instruction": (folder / "instruction.md").read_text(),
        "tests": json.loads((folder / "tests" / "tests.json").read_text()),
        "rubric": tomllib.loads(rubric_path.read_text()) if rubric_path.exists() else {},
        "patch": patch_path.read_text() if patch_path.exists() else None,
    }


def patch_stats(patch: str | None) -> tuple[list[str], int]:
    """Files touched and lines changed (added + removed) by a unified diff."""
    if not patch:
        return [], 0
    stats = diff_stats(patch)
    return stats.paths, stats.lines_changed


# --------------------------------------------------------------------------- folder format


def test_suite_size_and_targeted_kinds():
    kinds = [read_task(folder)["toml"]["metadata"]["kind"] for folder in TASK_DIRS]
    assert len(kinds) >= 20
    for kind in ("intent", "instructions", "no_edit"):
        assert kinds.count(kind) >= 2, f"only {kinds.count(kind)} {kind} task(s)"
    assert set(kinds) == set(KINDS)


def test_suite_loads_with_the_task_loader():
    from opencomposer.tasks.format import load_suite

    tasks = load_suite(CURSORBENCH)
    assert [t.id for t in tasks] == TASK_IDS
    assert all(t.metadata["source"] == "handwritten" for t in tasks)


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_task_folder(task_dir: Path):
    task = read_task(task_dir)
    repo = load_task(task_dir).repo  # [repo] base + setup.patch, materialised
    toml, tests, rubric = task["toml"], task["tests"], task["rubric"]
    assert toml["id"] == task_dir.name
    assert toml["test_command"] == "python -m pytest -q"
    assert "tests" in toml["protected_paths"]
    metadata = toml["metadata"]
    assert metadata["source"] == "handwritten"
    assert (PROJECTS / metadata["family"]).is_dir()
    assert metadata["difficulty"] in ("easy", "medium", "hard")
    assert metadata["kind"] in KINDS
    assert task["instruction"].strip()

    f2p, p2p = tests["FAIL_TO_PASS"], tests["PASS_TO_PASS"]
    assert set(tests) == {"FAIL_TO_PASS", "PASS_TO_PASS"}
    assert p2p and not set(f2p) & set(p2p)
    assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p)
    for node in f2p + p2p:
        test_file = node.split("::", 1)[0]
        assert (repo / test_file).is_file() or (
            task_dir / "tests" / "files" / test_file
        ).is_file()
    assert not list(task_dir.rglob("__pycache__")) and not list(task_dir.rglob(".pytest_cache"))

    files, _ = patch_stats(task["patch"])
    if metadata["kind"] == "no_edit":
        assert task["patch"] is None and f2p == []
        assert rubric["expect_no_edit"] is True
        patterns = rubric["final_message_must_match"]
        answer = (task_dir / "solution" / "answer.md").read_text()
        assert all(re.search(p, answer) for p in patterns), "the reference answer must satisfy the rubric"
        assert not all(re.search(p, "") for p in patterns), "an empty final message must not satisfy it"
    else:
        assert f2p and files
        assert not any(f.startswith("tests/") for f in files), "gold patches change code, not tests"
        assert not any(f in rubric.get("forbidden_paths", []) for f in files)
        assert len(files) <= rubric.get("max_files_changed", len(files))
    if metadata["kind"] == "instructions":
        assert rubric.get("forbidden_paths") and rubric.get("max_files_changed")


@pytest.mark.parametrize(
    "task_dir", [d for d in TASK_DIRS if (d / "solution" / "gold.patch").exists()], ids=lambda d: d.name
)
def test_gold_patch_applies_with_git_and_with_patch(task_dir: Path, workspaces: Workspaces):
    patch = (task_dir / "solution" / "gold.patch").read_text()
    assert re.match(r"diff --git a/\S+ b/\S+\n", patch)
    repo = load_task(task_dir).repo
    apply_patch(workspaces.copy(repo), patch)
    workspace = workspaces.copy(repo)
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "--dry-run"],
        cwd=workspace,
        input=patch,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- statistics


def suite_statistics() -> dict[str, float]:
    tasks = [read_task(folder) for folder in TASK_DIRS]
    prompts = [len(t["instruction"].strip()) for t in tasks]
    stats = [patch_stats(t["patch"]) for t in tasks]
    edits = [s for s, t in zip(stats, tasks, strict=True) if t["patch"]]
    return {
        "tasks": len(tasks),
        "median_prompt_chars": statistics.median(prompts),
        "median_lines_changed": statistics.median(lines for _, lines in stats),
        "median_files_changed": statistics.median(len(files) for files, _ in stats),
        "median_lines_changed_edit_tasks": statistics.median(lines for _, lines in edits),
        "median_files_changed_edit_tasks": statistics.median(len(files) for files, _ in edits),
    }


def test_statistics_match_cursorbench():
    """Medians over every task (a task that must not edit counts as 0 lines and 0 files)."""
    stats = suite_statistics()
    assert stats["median_prompt_chars"] <= 400, stats
    assert stats["median_lines_changed"] >= 40, stats
    assert stats["median_files_changed"] >= 2, stats


# --------------------------------------------------------------------------- task states


def check_task_states(task_dir: Path, workspaces: Workspaces) -> None:
    """Broken state fails FAIL_TO_PASS and passes PASS_TO_PASS; gold passes both."""
    task = read_task(task_dir)
    f2p, p2p = task["tests"]["FAIL_TO_PASS"], task["tests"]["PASS_TO_PASS"]
    hidden = task_dir / "tests" / "files"
    repo = load_task(task_dir).repo
    broken = workspaces.copy(repo, hidden)
    states = [broken]
    if task["patch"] is not None:
        patched = workspaces.copy(repo)
        apply_patch(patched, task["patch"])
        states.append(workspaces.copy(patched, hidden))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(workspaces.run_pytest, states))

    before = runs[0]
    unexpected = {n: o for n, o in before.outcomes.items() if o not in ("passed", "failed", "error")}
    assert not unexpected, f"{unexpected}\n{before.output[-3000:]}"
    still_passing = [node for node in f2p if before.outcomes.get(node) == "passed"]
    assert not still_passing, f"FAIL_TO_PASS tests that pass before the change: {still_passing}"
    broken_p2p = {node: before.outcomes.get(node, "not run") for node in p2p if node not in before.passed}
    assert not broken_p2p, f"PASS_TO_PASS tests that fail before the change: {broken_p2p}"
    if len(runs) == 2:
        after = runs[1]
        assert after.exit_code == 0 and not after.not_passed(), after.output[-3000:]
        missing = [node for node in f2p + p2p if node not in after.passed]
        assert not missing, f"listed tests that did not pass with the gold patch: {missing}"
        assert set(after.outcomes) == set(f2p) | set(p2p), "every test of the gold state is listed"


@pytest.mark.bwrap
@pytest.mark.parametrize("task_id", SAMPLE)
def test_task_states_sample(task_id: str, workspaces: Workspaces):
    check_task_states(CURSORBENCH / task_id, workspaces)


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_task_states(task_dir: Path, workspaces: Workspaces):
    check_task_states(task_dir, workspaces)
