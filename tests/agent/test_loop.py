"""The agent loop driven by the ScriptedPolicy in a real sandbox: records, errors, budgets, hooks."""

from __future__ import annotations

import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.scripted import ScriptedPolicy, call, oracle_script
from opencomposer.agent.protocol import message_dicts
from opencomposer.agent.tools import tool_schemas
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import load_task
from opencomposer.types import EpisodeStatus, Message, TokenKind

from .conftest import FIXTURES

pytestmark = pytest.mark.bwrap


def episode_of(policy, task=None, **loop_args):
    task = task or load_task(FIXTURES / "fix-add")
    with Sandbox(task.repo) as sandbox:
        episode = AgentLoop(policy, task, sandbox, **loop_args).run()
        episode.diff = sandbox.diff()
    return episode


def test_oracle_episode_is_recorded_token_for_token(tokenizer):
    task = load_task(FIXTURES / "fix-add")
    episode = episode_of(ScriptedPolicy(oracle_script, tokenizer=tokenizer), task)
    assert episode.status == EpisodeStatus.OK and episode.final_message == "I applied the reference change."
    assert episode.diff == task.gold_patch
    [segment] = episode.segments
    rendered = tokenizer.apply_chat_template(message_dicts(segment.messages), tools=tool_schemas(), tokenize=False)
    ids = segment.token_ids()
    assert tokenizer.decode(ids, skip_special_tokens=False) + "\n" == rendered  # the final "\n" is never sampled
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)[: len(ids)]
    first, last = episode.turns
    assert [c.name for c in first.tool_calls] == ["edit"] and [c.name for c in last.tool_calls] == ["finish"]
    assert first.observation_kinds == [TokenKind.TOOL_OUTPUT] * len(first.observation_ids) and first.observation_ids
    assert last.observation_ids == []  # nothing follows the final turn
    assert set(last.token_kinds) == {TokenKind.FINAL_MESSAGE, TokenKind.THINKING}  # the call, then <|im_end|>
    assert sum(segment.loss_mask()) == len(first.token_ids) + len(last.token_ids)
    counts = episode.token_counts()
    assert (counts["turns"], counts["tool_calls"], counts["prompt"]) == (2, 2, len(segment.prompt_ids))
    assert counts["tool_call"] + counts["final_message"] + counts["thinking"] == sum(segment.loss_mask())
    assert episode.metrics["turns"] == 2.0 and episode.metrics["format_errors"] == 0.0


def test_format_errors_and_rejected_calls_go_back_to_the_model(tokenizer):
    script = [
        "I think the bug is in add.",
        '<tool_call>{"name": "read_file", "arguments": {"path": "calc.py"}</tool_call>',
        [call("read_file", path="calc.py", lines=3), call("read_file", path="calc.py", offset=4, limit=1)],
        [call("finish", message="gave up")],
    ]
    episode = episode_of(ScriptedPolicy(script, tokenizer=tokenizer))
    messages = episode.segments[0].messages
    assert episode.status == EpisodeStatus.OK and episode.metrics["format_errors"] == 2.0
    assert messages[3] == Message("user", episode.turns[0].format_error)
    assert "contains no tool call" in messages[3].content
    assert "tool call 1 is not valid JSON (Expecting ',' delimiter at character 54)" in messages[5].content
    assert messages[7].content.startswith("Error: read_file: unknown argument 'lines'")
    assert messages[8].content == "     4\tdef add(a: int, b: int) -> int:\n[lines 4-4 of 11; call read_file with offset=5 for more]"
    assert episode.turns[2].rejected_tool_calls == 1 and episode.metrics["rejected_tool_calls"] == 1.0


def test_calls_after_finish_in_the_same_turn_do_not_run():
    episode = episode_of(ScriptedPolicy([[call("finish", message="early"), call("write_file", path="x.py", content="")]]))
    assert episode.status == EpisodeStatus.OK and episode.final_message == "early" and episode.diff == ""


@pytest.mark.parametrize(
    ("budgets", "script", "reason"),
    [
        ({"max_turns": 2}, [[call("list_dir", path=".")]] * 5, "turn budget used up (2 turns)"),
        ({"max_wall_s": 0.3}, [[call("run", command="sleep 0.4")]] * 5, "wall-time budget used up"),
        ({"max_tokens": 2600}, [[call("read_file", path="calc.py")]] * 50, "token budget used up"),
    ],
)
def test_budgets_end_the_episode_as_a_scored_timeout(tokenizer, budgets, script, reason):
    task = load_task(FIXTURES / "fix-add")
    for key, value in budgets.items():
        setattr(task.budgets, key, value)
    episode = episode_of(ScriptedPolicy(script, tokenizer=tokenizer), task)
    assert episode.status == EpisodeStatus.TIMEOUT and episode.scored
    assert reason in episode.error
    # the budget is recorded for the reports' "ended by" (turn_budget, wall_budget, token_budget)
    assert episode.end_reason == episode.limit and reason.startswith(episode.limit.value.split("_")[0])
    if "max_tokens" in budgets:
        assert sum(len(s.token_ids()) for s in episode.segments) >= 2600 > len(episode.segments[0].prompt_ids)


def test_sandbox_failure_is_an_infra_error_not_a_zero():
    task = load_task(FIXTURES / "fix-add")
    task.workdir = "/proc/sys/cannot-mount-here"
    episode = run_episode(task, ScriptedPolicy([[call("run", command="ls")]]), Config())
    assert episode.status == EpisodeStatus.INFRA_ERROR and not episode.scored
    assert "bubblewrap failed to set up the jail" in episode.error and episode.grade is None


def test_a_crashing_grader_is_an_infra_error_with_its_traceback():
    task = load_task(FIXTURES / "fix-add")
    task.rubric = {"final_message_must_match": [None]}  # bypasses load_task's checks: re.search(None) raises
    episode = run_episode(task, ScriptedPolicy(oracle_script), Config())
    assert episode.status == EpisodeStatus.INFRA_ERROR and episode.diff == task.gold_patch
    assert episode.error.startswith("the grader crashed:") and "TypeError" in episode.error


class SummarizeEvery:
    """A stand-in for self-summarisation: closes the segment every ``turns`` turns."""

    def __init__(self, turns: int):
        self.turns = turns

    def should_summarize(self, loop: AgentLoop) -> bool:
        return len(loop.segment.turns) >= self.turns

    def summarize(self, loop: AgentLoop) -> list[Message]:
        done = len(loop.episode.turns)
        return [loop.messages[0], Message("user", f"{loop.task.instruction}\n\nSummary: {done} turns so far.")]


def test_summarizer_hook_opens_a_new_segment(tokenizer):
    script = [[call("list_dir", path=".")]] * 3 + [[call("finish", message="ok")]]
    episode = episode_of(ScriptedPolicy(script, tokenizer=tokenizer), summarizer=SummarizeEvery(2))
    assert [len(s.turns) for s in episode.segments] == [2, 2]
    second = episode.segments[1]
    assert second.messages[1].content.endswith("Summary: 2 turns so far.")
    rendered = tokenizer.apply_chat_template(message_dicts(second.messages), tools=tool_schemas(), tokenize=False)
    assert tokenizer.decode(second.token_ids(), skip_special_tokens=False) + "\n" == rendered
