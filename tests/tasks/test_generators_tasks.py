"""Generated tasks end to end, through the real sandbox and grader.

Each generator, run on the built-in source projects, makes task folders that validate (the gold
patch resolves them, the untouched repository does not, every FAIL_TO_PASS fails and every
PASS_TO_PASS passes there); the agent's workspace holds neither the hidden tests nor any trace of
the code it must write; task ``i`` is a pure function of (seed, i); the held-out split shares no
file with the training split; ``tasks validate`` catches a task that drifted.

The default selection makes one task per generator plus two held-out ones (about a minute on two
cores); the ``slow`` tests make several of each kind and multi-file bug tasks.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opencomposer.cli import main
from opencomposer.config import TasksConfig
from opencomposer.sandbox.patch import apply_patch, copy_tree, diff_trees
from opencomposer.tasks.format import PROJECTS_DIR, load_suite, load_task
from opencomposer.tasks.generators.registry import TaskFactory, generate, stream
from opencomposer.tasks.generators.source import find_traces, project, read_tree, write_tree
from opencomposer.tasks.validation import validate_suite
from opencomposer.types import Task

pytestmark = pytest.mark.integration

MADE = [("bugs", "train", 0), ("deletion", "train", 0), ("refactor", "train", 0), ("bugs", "heldout", 0),
        ("deletion", "heldout", 0)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[tuple[str, str], Task]:
    """One task of each (kind, split) in ``MADE``, each in a suite folder of its split."""
    root = tmp_path_factory.mktemp("generated")
    factories = {(kind, split): TaskFactory(kind, seed=0, split=split) for kind, split, _ in MADE}

    def make(item):
        kind, split, index = item
        result = factories[(kind, split)].make(index, root / split)
        assert result.task is not None, [(a.label, a.reason) for a in result.attempts]
        return (kind, split), result.task

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(make, MADE))


def tree_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_each_generator_makes_tasks_that_validate(made):
    train = [made[(kind, "train")] for kind in ("bugs", "deletion", "refactor")]
    assert [t.metadata["source"] for t in train] == ["bug_injection", "feature_deletion", "refactor"]
    checks = validate_suite(train, workers=2)
    assert [c.problems for c in checks] == [[], [], []]
    for task, check in zip(train, checks):
        assert task.fail_to_pass and task.pass_to_pass and task.gold_patch
        assert check.gold.resolved and check.gold.fail_to_pass == 1.0
        assert check.broken.fail_to_pass == 0.0 and check.broken.pass_to_pass == 1.0
        assert task.test_command == "python -m pytest -q --continue-on-collection-errors"
        assert task.protected_paths == ["tests"]


def test_the_workspace_holds_no_hidden_test_and_no_trace(made):
    for task in made.values():
        assert find_traces(task.repo) == [], task.id
        hidden = read_tree(task.tests_dir)
        visible = read_tree(task.repo)
        assert hidden, task.id
        for path, data in hidden.items():
            assert visible.get(path) != data, f"{task.id}: {path} is visible as it will be graded"
        for node in task.fail_to_pass:
            path, name = node.split("::")[0], node.split("::")[-1].split("[")[0]
            graded = hidden.get(path, visible.get(path, b"")).decode()
            assert f"def {name}(" in graded, node
            if path in visible and task.metadata["source"] == "bug_injection":
                assert f"def {name}(" not in visible[path].decode(), f"{task.id}: {node} is visible"
        assert "def test_" not in task.instruction and "assert " not in task.instruction


def test_deleted_code_is_nowhere_in_the_workspace(made):
    for split in ("train", "heldout"):
        task = made[("deletion", split)]
        for deleted in task.metadata["deleted"]:
            qualname = deleted.split(":")[1]
            name = qualname.split(".")[-1]
            assert re.search(rf"^\+\s*(def|class) {name}\b", task.gold_patch, re.M), deleted
            if "." not in qualname:  # a module-level definition: its header is in no file at all
                for path, data in read_tree(task.repo).items():
                    assert not re.search(rf"^(def|class) {name}\b", data.decode(errors="replace"), re.M), \
                        f"{task.id}: {name} is defined in {path}"
        assert f"`{task.metadata['deleted'][0].split(':')[1].split('.')[-1]}" in task.instruction
        # a test module that imported the feature fails to collect without it, so all its tests are
        # FAIL_TO_PASS; the visible copy keeps those that do not use the feature
        names = {d.split(":")[1] for d in task.metadata["deleted"] if "." not in d.split(":")[1]}
        for path, data in read_tree(task.repo).items():
            if path.startswith("tests/") and names:
                assert not names & set(re.findall(r"\w+", data.decode())), f"{task.id}: {path} uses {names}"


LEAK = re.compile(r"(^|/)(__pycache__|\.mypy_cache|\.ruff_cache|\.pytest_cache)(/|$)|\.py[co]$|~$|\.orig$|\.rej$"
                  r"|(^|/)\.[^/]*\.sw[po]$")


def leaks(root: Path) -> list[str]:
    """Caches, bytecode and editor or patch backups under ``root`` (folders included)."""
    return sorted(rel for p in root.rglob("*") if LEAK.search(rel := p.relative_to(root).as_posix()))


@pytest.mark.bwrap
def test_a_deletion_task_carries_no_cache_or_backup_of_the_deleted_code(made, tmp_path):
    """Bytecode compiled before the deletion, a type checker's or linter's cache, or an editor's
    backup would hand the deleted code back. None is in a generated deletion task; planted into a
    copy of its repository (as a stale source project might hold them), the tree a generator reads,
    a materialised repository and the agent's sandbox copy all leave them out, and the agent's diff
    does not count them as deleted."""
    from opencomposer.sandbox.workspace import Sandbox
    from opencomposer.tasks.format import materialize_repo

    for split in ("train", "heldout"):
        task = made[("deletion", split)]
        assert leaks(task.repo) == [] and leaks(task.path) == [], task.id
        deleted = re.search(r"^\+((?:def|class) \w+.*)$", task.gold_patch, re.M).group(1).encode()
        module = next(rel for rel in read_tree(task.repo) if rel.endswith(".py") and not rel.startswith("tests/"))
        stale = tmp_path / split
        copy_tree(task.repo, stale)
        folder, name = (stale / module).parent, (stale / module).name
        planted = {
            folder / "__pycache__" / name.replace(".py", ".cpython-311.pyc"): b"\0bytecode " + deleted,
            stale / ".mypy_cache" / "3.11" / name.replace(".py", ".data.json"): b'{"defs": "' + deleted + b'"}',
            stale / ".ruff_cache" / "0.1" / "1234": deleted,
            stale / ".pytest_cache" / "v" / "cache" / "lastfailed": deleted,
            folder / (name + "~"): deleted,
            folder / (name + ".orig"): deleted,
            folder / (name + ".rej"): deleted,
            folder / f".{name}.swp": deleted,
        }
        for path, data in planted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        traces = find_traces(stale)  # what realize() rejects a candidate for
        for path in planted:
            rel = path.relative_to(stale).as_posix()
            assert any(rel == t or rel.startswith(t + "/") for t in traces), rel
        assert not any(LEAK.search(rel) for rel in read_tree(stale))
        assert leaks(materialize_repo(stale, "")) == []
        with Sandbox(stale) as sandbox:
            assert leaks(sandbox.workspace) == []
            assert sandbox.diff() == ""


def test_a_task_is_a_pure_function_of_seed_and_index(made, tmp_path):
    again = TaskFactory("bugs", seed=0, split="train").make(0, tmp_path).task
    first = made[("bugs", "train")]
    assert again.id == first.id == "bugs-train-s0-00000"
    assert tree_of(again.path) == tree_of(first.path)


def test_the_heldout_split_shares_no_file_with_training(made):
    config = TasksConfig()
    assert not set(config.train_projects) & set(config.heldout_projects)

    def contents(task: Task) -> set[str]:
        states = [read_tree(task.repo), read_tree(task.tests_dir)]
        gold = write_tree(read_tree(task.repo), task.path.parent / f".gold-{task.id}")
        apply_patch(gold, task.gold_patch)
        states.append(read_tree(gold))
        shutil.rmtree(gold)
        return {hashlib.sha256(data).hexdigest() for state in states for data in state.values()}

    train = set().union(*(contents(t) for (kind, split), t in made.items() if split == "train"))
    heldout = set().union(*(contents(t) for (kind, split), t in made.items() if split == "heldout"))
    assert train and heldout and not train & heldout
    sources = {name: {hashlib.sha256(d).hexdigest() for d in project(name).tree.values()}
               for name in config.train_projects + config.heldout_projects}
    assert not set().union(*(sources[n] for n in config.train_projects)) & set().union(
        *(sources[n] for n in config.heldout_projects))
    assert {t.metadata["family"] for (k, s), t in made.items() if s == "heldout"} <= set(config.heldout_projects)


def test_generate_command_reuses_made_tasks_and_reports(made, capsys):
    out = made[("bugs", "train")].path.parent
    assert main(["tasks", "generate", "--kind", "bugs", "--count", "1", "--out", str(out), "--seed", "0"]) == 0
    printed = capsys.readouterr().out
    assert "1 verified task(s)" in printed
    assert "bugs/train 1/1  bugs-train-s0-00000  rejected" in printed  # not a terminal: a plain progress line
    report = json.loads((out / "generation.json").read_text())
    assert report["kind"] == "bugs" and report["tasks"][0]["task_id"] == "bugs-train-s0-00000"
    tasks = stream(TaskFactory("bugs", seed=0), out)  # the unbounded stream starts with the same task
    assert next(tasks).id == "bugs-train-s0-00000"


def test_validate_command_reports_drifted_tasks(made, tmp_path, capsys):
    suite = tmp_path / "suite"
    for kind in ("bugs", "refactor"):
        task = made[(kind, "train")]
        shutil.copytree(task.path, suite / task.id)
    assert main(["tasks", "validate", str(suite), "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "all 2 task(s) hold" in printed
    assert len(re.findall(r"^validate [12]/2  \S+ holds  drifted 0", printed, re.MULTILINE)) == 2  # a line per task
    fixed = load_task(suite / "bugs-train-s0-00000")
    fixed_repo = tmp_path / "fixed"
    copy_tree(fixed.repo, fixed_repo)
    apply_patch(fixed_repo, fixed.gold_patch)  # someone fixed the bug in the task's starting repository
    (fixed.path / "setup.patch").write_text(diff_trees(PROJECTS_DIR / fixed.metadata["family"], fixed_repo))
    listed = suite / "refactor-train-s0-00000" / "tests" / "tests.json"
    lists = json.loads(listed.read_text())
    lists["PASS_TO_PASS"].append(lists["FAIL_TO_PASS"].pop())  # a test filed under the wrong list
    listed.write_text(json.dumps(lists))
    assert main(["tasks", "validate", str(suite), "--workers", "2"]) == 1
    printed = capsys.readouterr().out
    assert "2 of 2 task(s) drifted:" in printed
    assert "bugs-train-s0-00000: grading failed: the agent's diff does not apply" in printed
    assert re.search(r"refactor-train-s0-00000: only \d+% of PASS_TO_PASS pass without any change", printed)


@pytest.mark.slow
def test_multi_file_bug_tasks_validate(tmp_path):
    factory = TaskFactory("bugs", seed=3, split="train", config=TasksConfig(multi_bug_fraction=1.0))
    results = generate(factory, 3, tmp_path, workers=2)
    tasks = [r.task for r in results if r.task is not None]
    assert len(tasks) == 3
    for task in tasks:
        assert len(task.metadata["files"]) in (2, 3) and len(task.metadata["operators"]) == len(task.metadata["files"])
    assert [c.problems for c in validate_suite(tasks, workers=2)] == [[], [], []]


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_a_mixed_stream_of_each_split_validates(tmp_path, split):
    factory = TaskFactory("mixed", seed=7, split=split)
    results = generate(factory, 9, tmp_path, workers=2)
    tasks = load_suite(tmp_path)
    assert len(tasks) == 9 and len({t.instruction for t in tasks}) == 9
    assert {t.metadata["family"] for t in tasks} <= set(TasksConfig().__getattribute__(f"{split}_projects"))
    assert all(not c.problems for c in validate_suite(tasks, workers=2))
    assert sum(r.task is None for r in results) == 0


@pytest.mark.slow
def test_any_python_repository_with_tests_is_a_source(tmp_path):
    repo = tmp_path / "repo"
    write_tree({
        "pyproject.toml": b"[tool.pytest.ini_options]\npythonpath = ['.']\n",
        "geometry/__init__.py": b"",
        "geometry/shapes.py": (b"def area(width, height):\n    return width * height\n\n\n"
                               b"def perimeter(width, height):\n    if width < 0 or height < 0:\n"
                               b"        raise ValueError('negative side')\n    return 2 * (width + height)\n"),
        "tests/test_shapes.py": (b"import pytest\n\nfrom geometry.shapes import area, perimeter\n\n\n"
                                 b"def test_area():\n    assert area(2, 3) == 6\n\n\n"
                                 b"def test_perimeter():\n    assert perimeter(2, 3) == 10\n\n\n"
                                 b"def test_negative_sides():\n    with pytest.raises(ValueError):\n"
                                 b"        perimeter(-1, 2)\n"),
    }, repo)
    out = tmp_path / "out"
    assert main(["tasks", "generate", "--kind", "bugs", "--count", "2", "--out", str(out), "--source",
                 str(repo), "--workers", "1"]) == 0
    tasks = load_suite(out)
    assert len(tasks) == 2 and all(t.metadata["family"] == "repo" for t in tasks)
    assert all(not c.problems for c in validate_suite(tasks))
