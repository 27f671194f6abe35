"""Mining a git history (``opencomposer tasks mine``) on a repository built here, commit by commit.

The history holds exactly two commits that make tasks (a fix and a feature, each with tests) and
one of every kind that cannot: the root commit, a merge, a docs-only commit, a tests-only commit
and a commit whose new test already passes before it (unverifiable). The miner must find exactly
the two tasks, with FAIL_TO_PASS lists computed by running the tests, and report every other
commit with its reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from opencomposer.cli import main
from opencomposer.tasks.format import load_suite
from opencomposer.tasks.generators.source import find_traces, read_tree
from opencomposer.tasks.mining import MiningError, mine
from opencomposer.tasks.validation import validate_suite

pytestmark = pytest.mark.integration

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return b - a\n"
TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def build_history(root: Path) -> dict[str, str]:
    """A small repository with a known history; returns commit subject -> sha."""
    root.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout

    def write(rel: str, text: str) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)

    def commit(message: str) -> None:
        git("add", "-A")
        git("-c", "user.name=Dev", "-c", "user.email=dev@example.com", "commit", "-q", "-m", message)

    git("init", "-q", "-b", "main")
    write("pyproject.toml", "[tool.pytest.ini_options]\ntestpaths = ['tests']\npythonpath = ['.']\n")
    write("calc.py", CALC)
    write("tests/test_calc.py", TEST_ADD)
    commit("Start a calculator")
    write("calc.py", CALC.replace("return b - a", "return a - b"))
    write("tests/test_calc.py", TEST_ADD.replace("import add", "import add, sub")
          + "\n\ndef test_sub():\n    assert sub(5, 3) == 2\n\n\ndef test_sub_negative():\n    assert sub(3, 5) == -2\n")
    commit("Fix sub: it subtracted the wrong way round\n\nReported by users.\n\nSigned-off-by: Dev <dev@example.com>")
    write("calc.py", (root / "calc.py").read_text() + "\n\ndef mul(a, b):\n    return a * b\n")
    write("tests/test_mul.py", "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n\n\n"
                               "def test_mul_by_zero():\n    assert mul(7, 0) == 0\n")
    commit("Add mul")
    git("checkout", "-q", "-b", "docs")
    write("README.md", "# calc\n\nSmall arithmetic helpers.\n")
    commit("Add a README")
    git("checkout", "-q", "main")
    git("-c", "user.name=Dev", "-c", "user.email=dev@example.com", "merge", "-q", "--no-ff", "-m", "Merge docs", "docs")
    write("tests/test_calc.py", (root / "tests/test_calc.py").read_text() + "\n\ndef test_add_zero():\n"
                                                                           "    assert add(0, 0) == 0\n")
    commit("More tests for add")
    write("calc.py", (root / "calc.py").read_text().replace("    return a + b", "    total = a + b\n    return total"))
    write("tests/test_calc.py", (root / "tests/test_calc.py").read_text() + "\n\ndef test_add_negative():\n"
                                                                           "    assert add(-1, -1) == -2\n")
    commit("Refactor add and test negatives")
    log = git("log", "--format=%H %s", "--topo-order")
    return {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in log.splitlines()}


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    root = tmp_path_factory.mktemp("mining")
    shas = build_history(root / "calc")
    records = mine(root / "calc", root / "tasks", workers=2)
    return shas, records, root


def test_mining_finds_exactly_the_expected_tasks(history):
    shas, records, root = history
    assert [r.subject for r in records] == ["Start a calculator", "Fix sub: it subtracted the wrong way round",
                                            "Add mul", "Add a README", "Merge docs", "More tests for add",
                                            "Refactor add and test negatives"]
    kept = {r.subject: (r.task_id, r.fail_to_pass) for r in records if r.task_id}
    assert kept == {
        "Fix sub: it subtracted the wrong way round": (
            f"calc-{shas['Fix sub: it subtracted the wrong way round'][:10]}",
            ["tests/test_calc.py::test_sub", "tests/test_calc.py::test_sub_negative"]),
        "Add mul": (f"calc-{shas['Add mul'][:10]}", ["tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_by_zero"]),
    }
    assert sorted(p.name for p in (root / "tasks").iterdir()) == sorted([*(t for t, _ in kept.values()), "mining.json"])


def test_every_other_commit_is_reported_with_its_reason(history):
    _, records, root = history
    reasons = {r.subject: r.reason for r in records if not r.task_id}
    assert reasons == {
        "Start a calculator": "root commit: there is no earlier state to start from",
        "Add a README": "changes no tests: nothing can tell a fix from a non-fix",
        "Merge docs": "merge commit: its change is not one developer's step",
        "More tests for add": "changes no code (only tests, docs or data)",
        "Refactor add and test negatives": "no test fails in the broken state (the change is not covered by any test)",
    }
    report = json.loads((root / "tasks" / "mining.json").read_text())
    assert [(r["subject"], r["reason"]) for r in report if not r["task_id"]] == list(reasons.items())


def test_a_mined_task_is_the_parent_state_with_the_fix_held_back(history):
    shas, _, root = history
    tasks = {t.metadata["subject"]: t for t in load_suite(root / "tasks")}
    fix, feature = tasks["Fix sub: it subtracted the wrong way round"], tasks["Add mul"]
    assert fix.instruction == "Fix sub: it subtracted the wrong way round\n\nReported by users.\n"
    assert fix.metadata["kind"] == "fix" and feature.metadata["kind"] == "feature"
    assert fix.metadata["base_commit"] == shas["Start a calculator"]
    assert fix.pass_to_pass == ["tests/test_calc.py::test_add"]
    repo = read_tree(fix.repo)
    assert sorted(repo) == ["calc.py", "pyproject.toml", "tests/test_calc.py"]
    assert repo["calc.py"].decode() == CALC and repo["tests/test_calc.py"].decode() == TEST_ADD
    assert find_traces(fix.repo) == []  # no .git: nothing later than the base commit
    assert sorted(read_tree(fix.tests_dir)) == ["tests/test_calc.py"]
    assert fix.gold_patch == ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -3,4 +3,4 @@\n \n \n"
                              " def sub(a, b):\n-    return b - a\n+    return a - b\n")
    assert sorted(read_tree(feature.tests_dir)) == ["tests/test_mul.py"]
    assert "tests/test_mul.py" not in read_tree(feature.repo)
    assert [c.problems for c in validate_suite([fix, feature])] == [[], []]


def test_mine_command_prints_the_table(history, tmp_path, capsys):
    _, _, root = history
    assert main(["tasks", "mine", str(root / "calc"), "--out", str(tmp_path), "--limit", "2"]) == 0
    printed = capsys.readouterr().out
    assert "0 task(s) from 2 commit(s)" in printed and "changes no code" in printed
    assert [line.split()[1] for line in printed.splitlines() if line.startswith("mine ")] == ["1/2", "2/2"]
    with pytest.raises(MiningError, match="not a git repository"):
        mine(tmp_path, tmp_path / "out")
