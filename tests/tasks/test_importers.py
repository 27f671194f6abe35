"""Importers (HumanEval, SWE-bench, Harbor) and exporters (Harbor, SWE-bench predictions)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from opencomposer.agent.policies.scripted import noop_policy, oracle_policy
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.sandbox.patch import apply_patch
from opencomposer.tasks.exporters import export_harbor, export_swebench_predictions
from opencomposer.tasks.format import TaskFormatError, load_suite
from opencomposer.tasks.importers import humaneval_problems, humaneval_task, import_harbor, import_swebench
from tests.conftest import skip_missing

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


@pytest.fixture(scope="module")
def problems() -> list[dict[str, str]]:
    try:
        return humaneval_problems()
    except RuntimeError as e:  # offline machine without the cached wheel (`make setup` fetches it)
        skip_missing(str(e))


def test_humaneval_problem_becomes_a_task(problems, tmp_path: Path):
    assert len(problems) == 164
    task = humaneval_task(problems[0], tmp_path / "he0")
    stub = (task.repo / "solution.py").read_text()
    assert task.id == "humaneval-0" and stub == problems[0]["prompt"] + "    raise NotImplementedError\n"
    assert task.fail_to_pass == ["tests/test_solution.py::test_check"] and task.protected_paths == ["tests"]
    hidden = (task.tests_dir / "tests" / "test_solution.py").read_text()
    assert hidden.startswith("from solution import *  # noqa: F403\nfrom solution import has_close_elements as _candidate\n")
    assert problems[0]["test"].strip() in hidden and hidden.endswith("def test_check():\n    check(_candidate)\n")
    solved = tmp_path / "solved"
    shutil.copytree(task.repo, solved)
    apply_patch(solved, task.gold_patch)
    assert (solved / "solution.py").read_text() == problems[0]["prompt"] + problems[0]["canonical_solution"]


def _humaneval_suite(problems, folder: Path, count: int) -> list:
    for problem in problems[:count]:
        humaneval_task(problem, folder / problem["task_id"].replace("/", "-"))
    return load_suite(folder)


@pytest.mark.bwrap
def test_oracle_resolves_and_noop_fails_first_humaneval_tasks(problems, tmp_path: Path):
    config = Config()
    for task in _humaneval_suite(problems, tmp_path, 4):
        assert run_episode(task, oracle_policy(), config).grade.resolved, task.id
        assert run_episode(task, noop_policy(), config).grade.resolved is False, task.id


def _resolved(episode) -> bool:
    return episode.grade is not None and episode.grade.resolved


@pytest.mark.slow
@pytest.mark.bwrap
def test_oracle_resolves_every_humaneval_task(problems, tmp_path: Path):
    config = Config()
    unresolved = [t.id for t in _humaneval_suite(problems, tmp_path, len(problems))
                  if not _resolved(run_episode(t, oracle_policy(), config))]
    assert unresolved == []


# ----------------------------------------------------------------------------------------------
# SWE-bench


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "checkout"
    (repo / "mathlib" / "tests").mkdir(parents=True)
    (repo / "mathlib" / "__init__.py").write_text("def double(x):\n    return x + x\n\n\ndef half(x):\n    return x * 2\n")
    (repo / "mathlib" / "tests" / "test_basic.py").write_text(
        "from mathlib import double\n\n\ndef test_double():\n    assert double(2) == 4\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "mathlib" / "__init__.py").write_text("changed after base\n")
    git(repo, "commit", "-qam", "later")  # the importer must use base_commit, not HEAD
    return repo, base


def instance(base: str, **changes) -> dict:
    data = {
        "instance_id": "acme__mathlib-1", "repo": "acme/mathlib", "base_commit": base,
        "problem_statement": "half(x) doubles x instead of halving it.",
        "patch": "diff --git a/mathlib/__init__.py b/mathlib/__init__.py\n--- a/mathlib/__init__.py\n"
                 "+++ b/mathlib/__init__.py\n@@ -3,4 +3,4 @@ def double(x):\n \n \n def half(x):\n-    return x * 2\n"
                 "+    return x / 2\n",
        "test_patch": "diff --git a/mathlib/tests/test_basic.py b/mathlib/tests/test_basic.py\n"
                      "--- a/mathlib/tests/test_basic.py\n+++ b/mathlib/tests/test_basic.py\n@@ -1,5 +1,9 @@\n"
                      "-from mathlib import double\n+from mathlib import double, half\n \n \n def test_double():\n"
                      "     assert double(2) == 4\n+\n+\n+def test_half():\n+    assert half(4) == 2\n",
        "FAIL_TO_PASS": '["mathlib/tests/test_basic.py::test_half"]',
        "PASS_TO_PASS": ["mathlib/tests/test_basic.py::test_double"],
        "version": "1.0",
    }
    data.update(changes)
    return data


@pytest.mark.bwrap
def test_swebench_instance_imports_and_the_oracle_resolves_it(checkout, tmp_path: Path):
    repo, base = checkout
    source = tmp_path / "instances.jsonl"
    source.write_text(json.dumps(instance(base)) + "\n")
    [task] = import_swebench(source, repo, tmp_path / "suite")
    assert task.id == "acme__mathlib-1" and task.instruction.startswith("half(x) doubles x")
    assert (task.repo / "mathlib" / "__init__.py").read_text().endswith("return x * 2\n")  # base_commit's tree
    assert not (task.repo / ".git").exists()
    assert task.protected_paths == ["mathlib/tests/test_basic.py"]
    assert task.test_command == "python -m pytest -q mathlib/tests/test_basic.py"
    assert "def test_half" in (task.tests_dir / "mathlib" / "tests" / "test_basic.py").read_text()
    assert task.metadata["base_commit"] == base and task.metadata["source"] == "swebench"
    config = Config()
    assert run_episode(task, oracle_policy(), config).grade.resolved
    assert run_episode(task, noop_policy(), config).grade.resolved is False


def test_swebench_bad_input_is_named(checkout, tmp_path: Path):
    repo, base = checkout
    cases = {
        "unittest": (instance(base, FAIL_TO_PASS=["test_half (mathlib.tests.TestX)"]), "FAIL_TO_PASS", "unittest id"),
        "commit": (instance("0" * 40), "base_commit", "git archive"),
        "patch": (instance(base, patch=instance(base)["patch"].replace("x * 2", "x ** 3")), "patch", "does not apply"),
    }
    for name, (data, field, problem) in cases.items():
        source = tmp_path / f"{name}.json"
        source.write_text(json.dumps(data))
        with pytest.raises(TaskFormatError, match=problem) as info:
            import_swebench(source, repo, tmp_path / f"out-{name}")
        assert field in str(info.value), name
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"instance_id": "x"}))
    with pytest.raises(TaskFormatError, match=r"missing fields \['repo'"):
        import_swebench(missing, repo, tmp_path / "out-missing")


# ----------------------------------------------------------------------------------------------
# Harbor


def harbor_folder(root: Path) -> Path:
    task = root / "count-lines"
    (task / "environment" / "app").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "files"\n\n'
                                    "[agent]\ntimeout_sec = 300.0\n")
    (task / "instruction.md").write_text("Write the number of lines of /app/data.txt into /app/count.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nCOPY app/ /app/\n")
    (task / "environment" / "app" / "data.txt").write_text("a\nb\nc\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\npytest /tests/test_outputs.py\n")
    (task / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\n\ndef test_count():\n    assert Path('/app/count.txt').read_text().strip() == '3'\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nwc -l < /app/data.txt > /app/count.txt\n")
    return task


@pytest.mark.bwrap
def test_harbor_folder_imports_with_a_solution_derived_gold_patch(tmp_path: Path):
    [task] = import_harbor(harbor_folder(tmp_path / "harbor"), tmp_path / "suite")
    assert task.id == "count-lines" and task.workdir == "/app"
    assert sorted(p.name for p in task.repo.iterdir()) == ["data.txt"]
    assert task.fail_to_pass == ["tests/test_outputs.py::test_count"] and task.protected_paths == ["tests"]
    assert task.gold_patch == ("diff --git a/count.txt b/count.txt\nnew file mode 100644\n--- /dev/null\n"
                               "+++ b/count.txt\n@@ -0,0 +1 @@\n+3\n")
    assert task.budgets.max_wall_s == 300.0 and task.metadata["family"] == "files"
    assert run_episode(task, oracle_policy(), Config()).grade.resolved


@pytest.mark.bwrap
def test_harbor_export_imports_back_to_the_same_task(tmp_path: Path):
    for original in load_suite(FIXTURES):
        exported = export_harbor(original, tmp_path / "harbor" / original.id)
        assert (exported / "tests" / "test.sh").stat().st_mode & 0o111
        assert "COPY repo/ /workspace/" in (exported / "environment" / "Dockerfile").read_text()
        [back] = import_harbor(exported, tmp_path / "back", run_solutions=False)
        for field in ("id", "instruction", "test_command", "fail_to_pass", "pass_to_pass", "protected_paths",
                      "metadata", "gold_patch", "workdir", "budgets"):
            assert getattr(back, field) == getattr(original, field), (original.id, field)
        files = lambda root: {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}  # noqa: E731
        assert files(back.repo) == files(original.repo) and files(back.tests_dir) == files(original.tests_dir)
    with pytest.raises(FileExistsError):
        export_harbor(original, tmp_path / "harbor" / original.id)


def test_swebench_predictions_from_results(tmp_path: Path):
    rows = [
        {"task_id": "a", "instance_id": "org__a-1", "policy": "oracle", "status": "ok", "diff": "D1"},
        {"task_id": "a", "instance_id": "org__a-1", "policy": "oracle", "status": "ok", "diff": "D2"},
        {"task_id": "b", "instance_id": None, "policy": "oracle", "status": "timeout", "diff": ""},
        {"task_id": "c", "policy": "oracle", "status": "infra_error", "diff": None},
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert export_swebench_predictions(results, tmp_path / "preds.jsonl", "my-model") == 2
    lines = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert lines == [{"instance_id": "org__a-1", "model_name_or_path": "my-model", "model_patch": "D1"},
                     {"instance_id": "b", "model_name_or_path": "my-model", "model_patch": ""}]


def test_swebench_predictions_of_one_policy_from_a_resumed_multi_policy_eval(tmp_path: Path):
    rows = [
        {"task_id": "a", "policy": "noop", "pass": 0, "status": "ok", "diff": ""},
        {"task_id": "a", "policy": "oracle", "pass": 1, "status": "ok", "diff": "second"},  # a resume appends
        {"task_id": "a", "policy": "oracle", "pass": 0, "status": "ok", "diff": "first"},
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match="2 policies.*'noop', 'oracle'"):
        export_swebench_predictions(results, tmp_path / "preds.jsonl")
    with pytest.raises(ValueError, match="no episode of policy 'gpt'"):
        export_swebench_predictions(results, tmp_path / "preds.jsonl", policy="gpt")
    assert export_swebench_predictions(results, tmp_path / "preds.jsonl", policy="oracle") == 1
    [line] = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert line == {"instance_id": "a", "model_name_or_path": "oracle", "model_patch": "first"}
