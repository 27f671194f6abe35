"""``tasks.mining.Criteria``: which changes a CursorBench-style suite takes, and the prompts it gives.

A small history built here holds one change of each sort: a one-file fix (too few files), a
two-file feature whose message names its new function, a merged pull request whose tests use two
new names its title does not give (the prompt names them on one line) and a change whose tests use
more new names than a prompt may list (refused as unsolvable). No test runs here: these are the
checks made before the sandbox, on git alone (``candidate_for``); ``test_mining.py`` runs the whole
miner.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opencomposer.tasks.mining import (
    Criteria,
    candidate_for,
    commits_to_mine,
    developer_prompt,
    kind_of,
    new_test_names,
    unnamed_test_names,
)

CRITERIA = Criteria(min_files=2, min_lines=3, merges=True, focus_tests=True, developer_prompts=True, max_named=2)
TEXT = "def words(text):\n    return text.split()\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("criteria") / "textual"
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
    write("textual.py", TEXT)
    write("README.md", "# textual\n")
    write("tests/test_words.py", "from textual import words\n\n\ndef test_words():\n    assert words('a b') == ['a', 'b']\n")
    commit("Start")
    write("textual.py", TEXT.replace("text.split()", "text.split(' ')"))
    write("tests/test_words.py", (root / "tests/test_words.py").read_text() + "\n\ndef test_space():\n"
                                                                           "    assert words('a') == ['a']\n")
    commit("Fix words on one space")
    write("textual.py", (root / "textual.py").read_text() + "\n\ndef count_words(text):\n    return len(words(text))\n")
    write("README.md", "# textual\n\n`count_words(text)` counts words.\n")
    write("tests/test_count.py", "from textual import count_words\n\n\ndef test_count():\n"
                                 "    assert count_words('a b c') == 3\n")
    commit("Add count_words (#12)\n\nCounting is what most callers did by hand; see #11.\n\n"
           "Signed-off-by: Dev <dev@example.com>")
    git("checkout", "-q", "-b", "feature")
    write("textual.py", (root / "textual.py").read_text() + "\n\ndef longest(text, ignore_case=False):\n"
                        "    items = words(text.lower() if ignore_case else text)\n    return max(items, key=len)\n")
    write("README.md", (root / "README.md").read_text() + "\n`longest(text)` is the longest word.\n")
    write("tests/test_longest.py", "from textual import longest\n\n\ndef test_longest():\n"
                                   "    assert longest('a bbb cc') == 'bbb'\n    assert longest('A', ignore_case=True) == 'a'\n")
    commit("wip")
    git("checkout", "-q", "main")
    git("-c", "user.name=Dev", "-c", "user.email=dev@example.com", "merge", "-q", "--no-ff", "-m",
        "Merge pull request #14 from dev/feature\n\nFind the longest word", "feature")
    write("textual.py", (root / "textual.py").read_text() + "\n\ndef first(text):\n    return words(text)[0]\n\n\n"
                        "def last(text):\n    return words(text)[-1]\n\n\ndef middle(text):\n"
                        "    items = words(text)\n    return items[len(items) // 2]\n")
    write("README.md", (root / "README.md").read_text() + "\nPositions.\n")
    write("tests/test_positions.py", "from textual import first, last, middle\n\n\ndef test_positions():\n"
                                     "    assert (first('a b c'), last('a b c'), middle('a b c')) == ('a', 'c', 'b')\n")
    commit("Word positions")
    log = git("log", "--first-parent", "--format=%H %s")
    return root, {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in log.splitlines()}


def candidate(history, subject):
    root, shas = history
    return candidate_for(root, shas[subject], "python -m pytest -q", None, CRITERIA)


def test_the_first_parent_chain_is_visited_and_a_merge_is_its_change(history):
    root, shas = history
    chain = commits_to_mine(root, first_parent=True)
    assert chain == [shas[s] for s in ("Start", "Fix words on one space", "Add count_words (#12)",
                                       "Merge pull request #14 from dev/feature", "Word positions")]
    found, reason, _ = candidate_for(root, shas["Merge pull request #14 from dev/feature"], "python -m pytest -q")
    assert found is None and reason.startswith("merge commit")  # the plain miner still refuses merges


def test_a_change_to_one_file_is_too_small(history):
    found, reason, _ = candidate(history, "Fix words on one space")
    assert found is None and reason == "changes 1 non-test file(s); at least 2 wanted"


def test_a_feature_gets_the_developer_prompt_and_its_own_test_module(history):
    found, reason, _ = candidate(history, "Add count_words (#12)")
    assert reason == ""
    assert found.instruction == "Add count_words.\n\nCounting is what most callers did by hand."
    assert found.source.task_command == "python -m pytest -q tests/test_count.py --continue-on-collection-errors"
    assert found.metadata["kind"] == "feature" and found.metadata["api_change"] is True
    assert found.metadata["non_test_files"] == 2 and found.metadata["date"].count("-") == 2


def test_a_merged_request_names_the_new_names_its_tests_use(history):
    found, reason, _ = candidate(history, "Merge pull request #14 from dev/feature")
    assert reason == ""
    assert found.instruction == "Find the longest word.\n\nThe tests use: `ignore_case`."  # it says "longest"
    assert set(found.gold_code["textual.py"].decode().splitlines()) >= {"def longest(text, ignore_case=False):"}


def test_a_change_whose_tests_need_more_unnamed_names_is_refused(history):
    found, reason, _ = candidate(history, "Word positions")
    assert found is None
    assert reason.startswith("unsolvable from its message: the tests use 3 new names it does not give "
                             "(first, last, middle)")


def test_developer_prompt_drops_what_a_request_would_not_say():
    message = ("Merge pull request #7 from someone/branch\n\nSupport TOML files (fixes #3)\n\n"
               "Loaders pick the format by suffix, see https://github.com/o/r/issues/3 for the [discussion](http://x).\n\n"
               "* wip\n* more wip\n\nCo-authored-by: A <a@example.com>")
    assert developer_prompt(message) == ("Support TOML files.\n\nLoaders pick the format by suffix, "
                                         "see for the discussion.")
    long = "Rework parsing\n\n" + " ".join(f"Sentence number {i} says a little more." for i in range(40))
    prompt = developer_prompt(long)
    assert len(prompt) <= 400 and prompt.endswith("more.")
    assert developer_prompt("Signed-off-by: A <a@b>") == ""
    assert developer_prompt("Merge pull request #234 from someone/deprecate-private_functions\n") == \
        "Deprecate private functions."


def test_the_solvability_check_and_the_kind_read_the_code():
    before = {"m.py": b"def old(x):\n    return x\n", "tests/test_m.py": b"from m import old\n"}
    after = {"m.py": b"def new(x, strict=True):\n    return x\n",
             "tests/test_m.py": b"from m import new\n\ndef test():\n    new(1, strict=False)\n"}
    assert new_test_names(before, after, ["tests/test_m.py"]) == ["new", "strict"]
    assert unnamed_test_names("Rename old to new, with a strict flag", before, after, ["tests/test_m.py"]) == []
    assert unnamed_test_names("Rename old", before, after, ["tests/test_m.py"]) == ["new", "strict"]
    assert kind_of("Rename old to new", "", before, after) == ("refactor", True)
    assert kind_of("Handle empty input without a crash", "", before, before) == ("fix", False)
    assert kind_of("Support strict mode", "", before, after)[0] == "feature"
