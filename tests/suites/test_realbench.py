"""The realbench suite (suites/realbench, docs/realbench.md): tasks mined from public repositories.

Fast checks read every ``task.toml`` without building any repository: what each task records
(kind, date, mutation score over the floor, its change's size, its environment), that its base is
one of the packed snapshots with the repository's licence beside it, the counts the suite README
states. One task is then loaded from the packed storage into a fresh cache: the archive is unpacked
once under its hash, the setup patch rebuilds the starting commit, and the gold patch applies to
it. The slow test grades a task of each of three repositories through the real grader, as
``tasks validate`` does: gold resolves, the untouched repository does not.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import statistics
import tomllib
from pathlib import Path

import pytest

import opencomposer
from opencomposer.sandbox.patch import apply_patch, copy_tree, diff_stats
from opencomposer.tasks.format import load_task
from opencomposer.tasks.mutation import MUTATION_FLOOR

SUITES = Path(opencomposer.__file__).parent / "suites"
REALBENCH = SUITES / "realbench"
FOLDERS = sorted(p.parent for p in REALBENCH.glob("*/task.toml"))


def table(folder: Path) -> dict:
    return tomllib.loads((folder / "task.toml").read_text())


def test_every_task_records_what_the_benchmark_promises():
    assert FOLDERS, "suites/realbench holds no task"
    for folder in FOLDERS:
        data = table(folder)
        meta = data["metadata"]
        assert meta["source"] == "mined" and meta["kind"] in ("fix", "feature", "refactor"), folder.name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", meta["date"]), folder.name
        assert MUTATION_FLOOR <= meta["mutation_score"] <= 1.0, folder.name
        assert meta["non_test_files"] >= 2, folder.name
        assert data["environment"]["install_repo"] is True, folder.name
        repo = data["repo"]["base"].split("/")[2]
        assert data["repo"]["base"] == f"../_repos/{repo}/base.tar.xz" and folder.name.startswith(f"{repo}-")
        store = REALBENCH / "_repos" / repo
        assert (store / "base.tar.xz").is_file() and list(store.glob("LICEN*")), repo
        gold = diff_stats((folder / "solution" / "gold.patch").read_text())
        assert gold.files_changed >= 2, folder.name
        assert (folder / "tests" / "files").is_dir()


def test_the_suite_readme_states_the_counts_and_medians():
    readme = (SUITES / "README.md").read_text()
    match = re.search(r"realbench/\s+(\d+) tasks mined from (\d+) public repositories", readme)
    assert match, "suites/README.md no longer states realbench's size"
    repos = {folder.name.rsplit("-", 1)[0] for folder in FOLDERS}
    assert (int(match[1]), int(match[2])) == (len(FOLDERS), len(repos))
    prompt_chars = [len((f / "instruction.md").read_text().strip()) for f in FOLDERS]
    assert statistics.median(prompt_chars) <= 400


def test_a_task_loads_from_the_packed_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCOMPOSER_HOME", str(tmp_path / "cache"))
    folder = FOLDERS[0]
    repo = table(folder)["repo"]["base"].split("/")[2]
    copy_tree(folder, tmp_path / "suite" / folder.name)
    copy_tree(REALBENCH / "_repos" / repo, tmp_path / "suite" / "_repos" / repo)
    task = load_task(tmp_path / "suite" / folder.name)
    archive = (REALBENCH / "_repos" / repo / "base.tar.xz").read_bytes()
    unpacked = tmp_path / "cache" / "task-bases" / hashlib.sha256(archive).hexdigest()[:32]
    assert unpacked.is_dir() and (unpacked / "pyproject.toml").is_file()
    assert task.repo.is_relative_to(tmp_path / "cache" / "task-repos") and (task.repo / "pyproject.toml").is_file()
    assert load_task(tmp_path / "suite" / folder.name).repo == task.repo  # built once
    work = tmp_path / "work"
    shutil.copytree(task.repo, work)
    changed = apply_patch(work, task.gold_patch)
    assert len(changed) >= 2
    for rel in (p.relative_to(task.tests_dir).as_posix() for p in task.tests_dir.rglob("*") if p.is_file()):
        assert rel.startswith("tests/") or "test" in rel


@pytest.mark.slow
def test_three_realbench_tasks_hold_through_the_grader():
    from opencomposer.tasks.validation import check_task

    first_of_each: dict[str, Path] = {}
    for folder in FOLDERS:
        first_of_each.setdefault(folder.name.rsplit("-", 1)[0], folder)
    for folder in list(first_of_each.values())[:3]:
        check = check_task(load_task(folder))
        assert not check.problems, (folder.name, check.problems)
        assert check.gold.resolved and not check.broken.resolved
