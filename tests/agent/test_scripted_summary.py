"""The scripted policy under a context policy: it answers a summary request with a plain-text
summary (the notes of the turns played so far and the steps that remain), indexes its script past
its summaries, and the oracle plays a task folder's ``solution/script.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.agent.policies.scripted import (
    NotedTurn,
    ScriptedPolicy,
    call,
    latest_by_label,
    load_script,
    oracle_script,
    render_turn,
)
from opencomposer.agent.protocol import encode, initial_messages, parse_turn
from opencomposer.model.tokenizer import IM_END
from opencomposer.sandbox.patch import file_diff
from opencomposer.tasks.format import write_task
from opencomposer.types import Context, EpisodeStatus, Message, Task

SCRIPT = [
    NotedTurn([call("read_file", path="notes/a.txt")], note="notes/a.txt: key = tree"),
    NotedTurn([call("read_file", path="notes/b.txt")], note="notes/b.txt: key = node"),
    NotedTurn([call("write_file", path="out.txt", content="tree node\n")], note="wrote out.txt: tree node"),
    NotedTurn([call("finish", message="done")]),
]


def context(task: Task, turn_index: int, summaries: int, summary: bool = False, messages=None) -> Context:
    messages = messages or initial_messages(task.instruction)
    return Context(task=task, messages=list(messages), token_ids=None, turn_index=turn_index, max_new_tokens=512,
                   summary=summary, summaries=summaries)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return Task(id="notes", instruction="Read notes/a.txt and notes/b.txt; write their keys to out.txt.",
                repo=tmp_path)


def test_a_summary_request_is_answered_with_the_notes_so_far_and_what_remains(task, tokenizer):
    policy = ScriptedPolicy(SCRIPT, tokenizer=tokenizer)
    output = policy.act(context(task, turn_index=2, summaries=0, summary=True))
    assert output.text == (
        "Progress: 2 of 4 planned steps done.\n"
        "Done:\n- notes/a.txt: key = tree\n- notes/b.txt: key = node\n"
        "Remaining:\n- write_file out.txt\n- finish"
    )
    assert "tree node\n" not in output.text  # what remains is named, not its content
    assert not parse_turn(output.text).calls  # plain text, no tool call
    # tokens exactly as a scripted turn: the text's tokens, the end-of-turn token, logprob 0 each
    assert output.token_ids == encode(tokenizer, output.text) + [tokenizer.convert_tokens_to_ids(IM_END)]
    assert output.logprobs == [0.0] * len(output.token_ids) and output.finish_reason == "stop"


def test_the_script_is_indexed_past_summaries(task):
    policy = ScriptedPolicy(SCRIPT)
    # turns so far: read a, summary, read b: the next work turn is script turn 2 (the write)
    assert policy.act(context(task, turn_index=3, summaries=1)).text == render_turn(SCRIPT[2])
    assert policy.act(context(task, turn_index=5, summaries=2)).text == render_turn(SCRIPT[3])
    # past the script's end it finishes, whatever the summaries
    assert '"finish"' in policy.act(context(task, turn_index=9, summaries=4)).text
    with pytest.raises(ValueError, match="summaries"):
        policy.act(context(task, turn_index=1, summaries=2))


def test_summaries_carry_earlier_facts_forward(task):
    """After a summary the context is the prompt plus that summary; the next summary still holds
    every note played, because it is computed from the script position."""
    policy = ScriptedPolicy(SCRIPT)
    first = policy.act(context(task, turn_index=1, summaries=0, summary=True)).text
    assert "notes/a.txt: key = tree" in first and "- read_file notes/b.txt" in first
    resumed = [*initial_messages(task.instruction), Message("user", f"<summary>\n{first}\n</summary>"),
               Message("assistant", render_turn(SCRIPT[1])), Message("tool", "key: node")]
    second = policy.act(context(task, turn_index=3, summaries=1, summary=True, messages=resumed)).text
    assert "notes/a.txt: key = tree" in second and "notes/b.txt: key = node" in second
    assert second == policy.act(context(task, turn_index=2, summaries=0, summary=True)).text  # deterministic


def test_a_script_without_notes_is_summarised_as_compact_calls(task):
    script = [[call("grep", pattern="def total", path="src"), call("edit", path="src/app.py", old="a", new="b")],
              [call("run", command="python -m pytest -q")], "I am thinking out loud."]
    text = ScriptedPolicy(script).act(context(task, turn_index=1, summaries=0, summary=True)).text
    assert "- grep def total in src\n- edit src/app.py\nRemaining:\n- run python -m pytest -q" in text
    assert "old" not in text and "new" not in text
    assert ScriptedPolicy(script).act(context(task, turn_index=3, summaries=0, summary=True)).text.endswith(
        "- a reply without tool calls\nRemaining:\n- finish")


def walkthrough_task(tmp_path: Path, turns) -> Task:
    task = write_task(tmp_path / "task", task_id="walk", instruction="Copy the key of notes/a.txt into out.txt.",
                      repo={"notes/a.txt": "noise\nkey: tree\nnoise\n"}, fail_to_pass=[], pass_to_pass=[],
                      gold_patch=file_diff("out.txt", None, "tree\n"))
    (task.path / "solution" / "script.json").write_text(json.dumps(turns))
    return task


WALK = [
    {"calls": [{"name": "read_file", "arguments": {"path": "notes/a.txt"}}], "note": "notes/a.txt: key = tree"},
    {"calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "tree\n"}}]},
    {"calls": [{"name": "finish", "arguments": {"message": "done"}}]},
]


def test_the_oracle_reads_script_json(tmp_path):
    task = walkthrough_task(tmp_path, WALK)
    turns = oracle_script(task)
    assert [[c.name for c in turn] for turn in turns] == [["read_file"], ["write_file"], ["finish"]]
    assert [turn.note for turn in turns] == ["notes/a.txt: key = tree", "", ""]


@pytest.mark.parametrize("bad, message", [
    ({"calls": []}, "a non-empty JSON list"),
    ([], "a non-empty JSON list"),
    ([{"note": "x"}], "'calls' and an optional 'note'"),
    ([{"calls": [], "note": "x"}], "non-empty list of tool calls"),
    ([{"calls": [{"name": "read_file"}]}], "a call must be"),
    ([{"calls": [{"name": "delete", "arguments": {}}]}], "unknown tool 'delete'"),
    ([{"calls": [{"name": "finish", "arguments": {}}], "note": 3}], "'note' must be a string"),
    ([{"calls": [{"name": "finish", "arguments": {}}], "scratch": ["x"]}], "'scratch' must be a string"),
    ([{"calls": [{"name": "finish", "arguments": {}}], "thought": "x"}], "optional 'note' and 'scratch'"),
])
def test_a_malformed_walkthrough_is_refused_with_its_turn(tmp_path, bad, message):
    path = tmp_path / "script.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=message):
        load_script(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the walkthrough"):
        load_script(path)


@pytest.mark.bwrap
def test_the_oracle_plays_the_walkthrough_in_the_loop(tmp_path, tokenizer):
    from opencomposer.agent.loop import AgentLoop
    from opencomposer.sandbox.workspace import Sandbox

    task = walkthrough_task(tmp_path, WALK)
    with Sandbox(task.repo) as sandbox:
        episode = AgentLoop(ScriptedPolicy(oracle_script, tokenizer=tokenizer), task, sandbox).run()
        diff = sandbox.diff()
    assert episode.status == EpisodeStatus.OK and len(episode.turns) == 3
    assert "key: tree" in episode.segments[0].messages[3].content  # the read's output
    assert diff == task.gold_patch


def test_a_summary_right_after_a_turn_with_scratch_thinks_it_first(task, tokenizer):
    """The scratch of the turn just played opens the summary in a ``<think>`` block; a summary
    after a turn without one, or before any turn, has none."""
    script = [NotedTurn([call("read_file", path="notes/a.txt")], note="found: tree", scratch="key: tree"),
              NotedTurn([call("read_file", path="notes/b.txt")], note="found: tree node")]
    policy = ScriptedPolicy(script, tokenizer=tokenizer)
    first = policy.act(context(task, turn_index=1, summaries=0, summary=True)).text
    assert first.startswith("<think>\nkey: tree\n</think>\nProgress: 1 of 2")
    assert not policy.act(context(task, turn_index=3, summaries=1, summary=True)).text.startswith("<think>")
    assert not policy.act(context(task, turn_index=0, summaries=0, summary=True)).text.startswith("<think>")
    parsed = parse_turn(first)
    assert not parsed.calls


def test_a_later_note_with_the_same_label_replaces_the_earlier_one(task, tokenizer):
    """A running fact (``LABEL: text``) appears once in a summary, as it stands; notes with other
    labels, and lines without one, are all kept in order."""
    running = [
        NotedTurn([call("read_file", path="a.txt")], note="found so far: tree"),
        NotedTurn([call("read_file", path="b.txt")], note="b.txt: empty"),
        NotedTurn([call("read_file", path="c.txt")], note="found so far: tree node"),
        NotedTurn([call("run", command="ls")]),
    ]
    summary = ScriptedPolicy(running, tokenizer=tokenizer).act(context(task, turn_index=4, summaries=0, summary=True)).text
    assert "Done:\n- b.txt: empty\n- found so far: tree node\n- run ls\nRemaining:" in summary
    assert latest_by_label(["x: 1", "y", "x: 2", "y", "z: 3"]) == ["y", "x: 2", "y", "z: 3"]
