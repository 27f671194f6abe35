"""The exploring oracle (``explore_script``): grep for the function at fault, read exactly its
lines, fix it with the smallest unique edits, run the tests, finish; it resolves generated bug
tasks through the real sandbox and grader, and falls back to the one-turn replay for patches it
cannot express."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opencomposer.agent.policies.scripted import ScriptedPolicy, _minimal_edits, explore_script, oracle_script
from opencomposer.config import Config, ConfigError, SFTConfig, TasksConfig
from opencomposer.episode import run_episode
from opencomposer.sandbox.patch import file_diff, parse_patch
from opencomposer.tasks.generators.registry import TaskFactory, generate
from opencomposer.types import EpisodeStatus, Task

BROKEN = '''"""Money helpers."""


def total(prices):
    result = 0
    for price in prices:
        result -= price
    return result


def mean(values):
    if not values:
        return 0
    return total(values) / len(values)
'''


def bug_task(tmp_path: Path, broken: str = BROKEN, fixed: str | None = None) -> Task:
    fixed = fixed if fixed is not None else broken.replace("result -= price", "result += price")
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "money.py").write_text(broken)
    return Task(id="money", instruction="`total` in `src/money.py` has a bug.", repo=repo,
                gold_patch=file_diff("src/money.py", broken, fixed), test_command="python -m pytest -q")


def test_the_turns_are_grep_read_edit_test_finish(tmp_path):
    task = bug_task(tmp_path)
    turns = explore_script(task)
    assert [[c.name for c in turn] for turn in turns] == [["grep"], ["read_file"], ["edit"], ["run"], ["finish"]]
    grep, read, edit, test = turns[0][0], turns[1][0], turns[2][0], turns[3][0]
    # the whole workspace: the path and line the next turn reads come from this turn's output
    assert grep.arguments == {"pattern": r"def total\b"}
    # exactly the function's lines: `def total` is line 4, its last line 8
    assert read.arguments == {"path": "src/money.py", "offset": 4, "limit": 5}
    # only the changed line, not the hunk's context
    assert edit.arguments == {"path": "src/money.py", "old": "        result -= price\n", "new": "        result += price\n"}
    assert test.arguments == {"command": "python -m pytest -q"}


def test_an_edit_is_widened_until_its_old_text_is_unique(tmp_path):
    broken = "def f(x):\n    y = x\n    y = x\n    return y\n"
    fixed = "def f(x):\n    y = x\n    y = x + 1\n    return y\n"
    hunks = parse_patch(file_diff("a.py", broken, fixed))[0].hunks
    (edit,) = _minimal_edits(broken, hunks)
    old, new = edit
    assert broken.count(old) == 1 and broken.replace(old, new) == fixed
    assert old == "    y = x\n    y = x\n"  # one line of context before makes it unique
    # a change outside any function reads the lines around it instead of grepping
    top = "A = 1\nB = 2\n"
    task = bug_task(tmp_path / "top", broken=top, fixed="A = 1\nB = 3\n")
    turns = explore_script(task)
    assert [[c.name for c in turn] for turn in turns] == [["read_file"], ["edit"], ["run"], ["finish"]]
    assert turns[0][0].arguments["offset"] == 1


def test_patches_it_cannot_express_fall_back_to_the_one_turn_replay(tmp_path):
    task = bug_task(tmp_path)
    created = Task(id="new", instruction="add a file", repo=task.repo,
                   gold_patch=file_diff("src/new.py", None, "X = 1\n"))
    assert explore_script(created) == oracle_script(created)
    assert explore_script(Task(id="none", instruction="?", repo=task.repo)) == oracle_script(
        Task(id="none", instruction="?", repo=task.repo))


def test_bug_styles_and_max_turns_shape_the_generated_pool(tmp_path):
    config = TasksConfig(multi_bug_fraction=0.0, bug_styles=["function"], max_turns=8)
    results = generate(TaskFactory("bugs", seed=0, split="train", config=config), 3, tmp_path / "pool")
    tasks = [r.task for r in results if r.task is not None]
    assert len(tasks) == 3
    for task in tasks:
        assert task.metadata["difficulty"] == "easy" and len(task.metadata["files"]) == 1
        assert task.budgets.max_turns == 8
        path = task.metadata["files"][0]  # the report names the file (or its module) at fault
        module = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        assert path in task.instruction or module in task.instruction, task.instruction
    with pytest.raises(ConfigError, match="bug_styles"):
        TasksConfig(bug_styles=["vague"]).validate()
    with pytest.raises(ConfigError, match="max_turns"):
        TasksConfig(max_turns=0).validate()


@pytest.mark.integration
def test_the_exploring_oracle_resolves_generated_bug_tasks(tmp_path):
    config = TasksConfig(multi_bug_fraction=0.0, bug_styles=["function"], max_turns=8)
    results = generate(TaskFactory("bugs", seed=1, split="heldout", config=config), 2, tmp_path / "pool")
    tasks = [r.task for r in results if r.task is not None]
    assert len(tasks) == 2  # the generator verified both: the loop below runs on each
    for task in tasks:
        episode = run_episode(task, ScriptedPolicy(explore_script), Config())
        assert episode.status == EpisodeStatus.OK, episode.error
        assert episode.grade.resolved, task.id
        assert [t.tool_calls[0].name for t in episode.turns] == ["grep", "read_file", "edit", "run", "finish"]
        grep, read = episode.turns[0].tool_calls[0].arguments, episode.turns[1].tool_calls[0].arguments
        assert "path" not in grep  # the read's path and line are what a workspace-wide grep prints
        assert re.match(grep["pattern"], (task.repo / read["path"]).read_text().splitlines()[read["offset"] - 1].strip())


def test_sft_demonstrations_is_checked():
    with pytest.raises(ConfigError, match="sft.demonstrations"):
        SFTConfig(demonstrations="guess").validate()


def test_flat_layout_moves_a_src_project_to_the_root_and_keeps_its_tests_passing(tmp_path):
    from opencomposer.tasks.generators.source import flat_layout, project, with_layouts

    shipped = project("inventory")
    flat = flat_layout(shipped)
    assert flat is not None and flat.name == "inventory" and flat.root == shipped.root
    assert not any(p.startswith("src/") for p in flat.tree)
    assert sorted(p.removeprefix("src/") for p in shipped.tree) == sorted(flat.tree)
    assert 'pythonpath = ["."]' in flat.tree["pyproject.toml"].decode()
    assert flat_layout(project("ledger")) is None  # flat already
    assert [s.tree is shipped.tree for s in with_layouts([shipped], ["as_shipped", "flat"])] == [True, False]
    assert len(with_layouts([project("ledger")], ["flat"])) == 1
    with pytest.raises(ConfigError, match="tasks.layouts"):
        TasksConfig(layouts=["nested"]).validate()


@pytest.mark.integration
def test_tasks_in_the_flat_layout_verify_and_the_exploring_oracle_resolves_them(tmp_path):
    config = TasksConfig(multi_bug_fraction=0.0, bug_styles=["function"], max_turns=8, layouts=["flat"],
                         train_projects=["inventory"])
    results = generate(TaskFactory("bugs", seed=2, split="train", config=config), 2, tmp_path / "pool")
    tasks = [r.task for r in results if r.task is not None]
    assert len(tasks) == 2  # verified like every task: gold resolves, the broken state fails
    for task in tasks:
        assert not task.metadata["files"][0].startswith("src/") and (task.repo / "inventory").is_dir()
        assert not (task.repo / "src").exists()
        episode = run_episode(task, ScriptedPolicy(explore_script), Config())
        assert episode.grade.resolved, task.id
