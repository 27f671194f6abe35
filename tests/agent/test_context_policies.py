"""Context policies in the agent loop (``agent.context``), driven by a scripted policy in a real
sandbox: self-summary chains, the compaction and truncation baselines, the state block, the
token-exact record of every segment, and one advantage for every model token of a chain."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.agent.context import (
    COMPACTION_PROMPT,
    DROPPED_OUTPUT,
    SUMMARY_REQUEST,
    summary_text,
    trigger_tokens,
)
from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.scripted import call, render_turn
from opencomposer.agent.protocol import encode, message_dicts
from opencomposer.agent.tools import tool_schemas
from opencomposer.config import AgentConfig, ConfigError
from opencomposer.model.tokenizer import IM_END
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.types import Budgets, EndReason, EpisodeStatus, PolicyOutput, Task, TokenKind

pytestmark = pytest.mark.bwrap

FILES = 4
WORDS = ["alpha", "bravo", "charlie", "delta"]


class Reader:
    """Reads ``notes/partK.txt`` one per turn, writes the words to ``out.txt``, finishes. Asked
    for a summary, it writes the words read so far; it indexes its script past its summaries."""

    name = "reader"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.max_context = 0
        self.contexts = []

    def script(self):
        reads = [[call("read_file", path=f"notes/part{k + 1}.txt")] for k in range(FILES)]
        return [*reads, [call("write_file", path="out.txt", content=" ".join(WORDS))], [call("finish", message="done")]]

    def act(self, context):
        self.contexts.append(context)
        if context.summary:
            done = context.turn_index - context.summaries
            text = f"<think>scratch</think>Read so far: {' '.join(WORDS[:done])}. Next: part{done + 1}."
        else:
            text = render_turn(self.script()[context.turn_index - context.summaries])
        ids = encode(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids(IM_END)]
        return PolicyOutput(text=text, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


@pytest.fixture
def task(tmp_path: Path) -> Task:
    repo = tmp_path / "repo"
    (repo / "notes").mkdir(parents=True)
    for k, word in enumerate(WORDS):
        filler = "".join(f"log line {i}: nothing to see here\n" for i in range(12))
        (repo / "notes" / f"part{k + 1}.txt").write_text(f"{filler}key: {word}\n{filler}")
    return Task(id="long-1", instruction="Read notes/part1.txt to part4.txt; write their keys to out.txt.",
                repo=repo, budgets=Budgets(max_turns=FILES + 2, max_tokens=None, max_wall_s=None))


def run(policy, task, **agent):
    config = AgentConfig(**agent)
    config.validate()
    with Sandbox(task.repo) as sandbox:
        loop = AgentLoop(policy, task, sandbox, config)
        episode = loop.run()
        episode.diff = sandbox.diff()
    return episode, loop


def sizes(tokenizer, task) -> tuple[int, int]:
    """Tokens of the first prompt and of one file read (with its turn)."""
    episode, _ = run(Reader(tokenizer), task)
    return len(episode.segments[0].prompt_ids), len(episode.turns[0].token_ids) + len(episode.turns[0].observation_ids)


def window_for(tokenizer, task) -> tuple[int, int]:
    """A window that fits the system prompt and three file reads but not four, and a trigger
    after two reads."""
    first, read = sizes(tokenizer, task)
    trigger = first + 2 * read
    return trigger + read + 160, trigger  # room for one more read, the request and a summary


def assert_token_exact(tokenizer, segment):
    """The segment's ids are the chat template's rendering of its messages (a segment closed after
    a tool output ends at the generation prompt; one closed by a turn lacks the final newline)."""
    observed = bool(segment.turns[-1].observation_ids)
    rendered = tokenizer.apply_chat_template(message_dicts(segment.messages), tools=tool_schemas(), tokenize=False,
                                             add_generation_prompt=observed)
    text = tokenizer.decode(segment.token_ids(), skip_special_tokens=False)
    assert (text if observed else text + "\n") == rendered


def test_without_a_context_policy_the_window_ends_the_episode(tokenizer, task):
    window, _ = window_for(tokenizer, task)
    episode, _ = run(Reader(tokenizer), task, context_window=window)
    assert episode.status == EpisodeStatus.TIMEOUT and episode.limit == EndReason.TOKEN_BUDGET
    assert len(episode.segments) == 1 and "out.txt" not in (episode.diff or "")


def test_self_summary_chains_segments_and_finishes_the_task(tokenizer, task):
    window, trigger = window_for(tokenizer, task)
    policy = Reader(tokenizer)
    episode, loop = run(policy, task, context_window=window, context_policy="self_summary",
                        summary_trigger_tokens=trigger, summary_max_tokens=64)
    assert episode.status == EpisodeStatus.OK, episode.error
    assert "out.txt" in episode.diff and "alpha bravo charlie delta" in episode.diff
    summaries = [t for t in episode.turns if t.summary]
    assert len(episode.segments) == len(summaries) + 1 >= 2
    for segment in episode.segments:
        assert_token_exact(tokenizer, segment)
        assert len(segment.token_ids()) <= window
    for segment in episode.segments[:-1]:
        last = segment.turns[-1]
        assert last.summary and last.token_kinds == [TokenKind.SUMMARY] * len(last.token_ids)
        assert segment.messages[-2].content == SUMMARY_REQUEST  # appended to the live context
        assert not last.tool_calls
    # the summary request was asked with the summary flag and the context it followed
    asked = [c for c in policy.contexts if c.summary]
    assert len(asked) == len(summaries) and all(c.messages[-1].content == SUMMARY_REQUEST for c in asked)
    # the fresh segment: system prompt, task, then the summary (thinking dropped) and the state block
    second = episode.segments[1].messages
    assert [m.role for m in second[:4]] == ["system", "user", "user", "assistant"]
    assert second[1].content == task.instruction
    assert "<summary>\nRead so far: alpha bravo." in second[2].content and "scratch" not in second[2].content
    assert "summaries so far: 1;" in second[2].content
    assert episode.summaries[0] == "Read so far: alpha bravo. Next: part3."
    m = episode.metrics
    assert m["summaries"] == len(summaries) and m["segments"] == len(episode.segments)
    assert m["summary_tokens"] == sum(len(t.token_ids) for t in summaries)
    assert m["summary_prefill_reused"] > trigger - 100  # all the context but the request
    assert m["context_tokens_saved"] > 0
    # summaries do not use up the turn budget (FILES + 2 work turns)
    assert loop.work_turns() == FILES + 2


def test_max_summaries_then_the_window_ends_it(tokenizer, task):
    first, read = sizes(tokenizer, task)  # a summary after the first read; the other three do not fit after it
    episode, _ = run(Reader(tokenizer), task, context_window=first + 2 * read + 100, context_policy="self_summary",
                     summary_trigger_tokens=first + read, summary_max_tokens=64, max_summaries=1)
    assert sum(t.summary for t in episode.turns) == 1
    assert episode.status == EpisodeStatus.TIMEOUT and episode.limit == EndReason.TOKEN_BUDGET


def test_compaction_summarises_in_a_separate_call_that_is_never_trained(tokenizer, task):
    window, trigger = window_for(tokenizer, task)
    policy = Reader(tokenizer)
    episode, _ = run(policy, task, context_window=window * 2, context_policy="compaction",
                     summary_trigger_tokens=trigger)
    assert episode.status == EpisodeStatus.OK, episode.error
    assert len(episode.segments) >= 2 and not any(t.summary for t in episode.turns)
    asked = [c for c in policy.contexts if c.summary]
    assert asked and asked[0].messages[0].content == COMPACTION_PROMPT
    assert "notes/part1.txt" in asked[0].messages[1].content  # the transcript it compacts
    assert episode.metrics["summary_tokens"] == episode.metrics["compaction_tokens"] > 0
    assert episode.metrics["compaction_prompt_tokens"] >= len(asked[0].token_ids)
    # the compaction's tokens are no turn's: what the trainer sees is the work turns only
    assert sum(len(t.token_ids) for t in episode.turns) == sum(
        len(encode(tokenizer, render_turn(turn))) + 1 for turn in policy.script())
    assert "<summary>" in episode.segments[1].messages[2].content


def test_truncate_drops_the_oldest_tool_outputs(tokenizer, task):
    window, trigger = window_for(tokenizer, task)
    episode, _ = run(Reader(tokenizer), task, context_window=window, context_policy="truncate",
                     summary_trigger_tokens=trigger)
    assert episode.status == EpisodeStatus.OK, episode.error
    assert len(episode.segments) >= 2
    second = episode.segments[1]
    tools = [m for m in second.messages if m.role == "tool"]
    assert tools[0].content == DROPPED_OUTPUT and tools[-1].content != DROPPED_OUTPUT
    _, read = sizes(tokenizer, task)  # the dropped output is what the fresh segment saves
    assert len(second.prompt_ids) < len(episode.segments[0].token_ids()) - read // 2
    assert episode.metrics["context_tokens_saved"] > read // 2
    for segment in episode.segments:
        assert_token_exact(tokenizer, segment)


def test_every_model_token_of_a_chain_carries_the_episode_advantage(tokenizer, task):
    from opencomposer.training.packing import episode_rows

    window, trigger = window_for(tokenizer, task)
    episode, _ = run(Reader(tokenizer), task, context_window=window, context_policy="self_summary",
                     summary_trigger_tokens=trigger, summary_max_tokens=64)
    rows = episode_rows([episode], [0.75])
    assert len(rows) == len(episode.segments)
    assert {row.advantage for row in rows} == {0.75}
    trained = sum(int(row.loss_mask.sum()) for row in rows)
    assert trained == sum(len(t.token_ids) for t in episode.turns)  # summaries included
    summary_ids = [i for t in episode.turns if t.summary for i in t.token_ids]
    assert summary_ids and trained > len(summary_ids)


def test_summary_text_and_trigger():
    assert summary_text("<think>plan</think>\nFacts: a=1.\n<tool_call>{}</tool_call>") == "Facts: a=1."
    config = AgentConfig(context_policy="self_summary", summary_max_tokens=1000)
    assert trigger_tokens(config, 8192) == 8192 - 1000 - 512
    assert trigger_tokens(config, 0) == 0
    assert trigger_tokens(AgentConfig(summary_trigger_tokens=300), 8192) == 300


@pytest.mark.parametrize(("agent", "match"), [
    ({"context_policy": "summarize"}, "agent.context_policy"),
    ({"context_window": 1000, "summary_trigger_tokens": 1000}, "below agent.context_window"),
    ({"summary_max_tokens": 4}, "summary_max_tokens"),
])
def test_bad_context_settings_are_refused(agent, match):
    with pytest.raises(ConfigError, match=match):
        AgentConfig(**agent).validate()


def test_chain_metrics_count_episodes_and_success_after_n_summaries():
    from types import SimpleNamespace

    from opencomposer.agent.context import chain_metrics
    from opencomposer.types import Episode, Segment

    def episode(segments: int, resolved: bool) -> Episode:
        e = Episode(task_id="t", segments=[Segment(prompt_ids=[]) for _ in range(segments)])
        e.summaries = ["s"] * (segments - 1)
        e.grade = SimpleNamespace(resolved=resolved)  # all chain_metrics reads of a grade
        e.metrics = {"segments": float(segments), "summaries": float(segments - 1), "summary_tokens": 10.0 * (segments - 1),
                     "context_tokens_saved": 100.0 * (segments - 1)}
        return e

    episodes = [episode(1, True), episode(2, True), episode(2, False), episode(5, False)]
    m = chain_metrics(episodes)
    assert m["chain_segments"] == (1 + 2 + 2 + 5) / 4 and m["chain_summaries"] == (0 + 1 + 1 + 4) / 4
    assert m["chain_summary_tokens"] == 10.0 * 6 / 4
    assert m["resolved_after_summaries_0"] == 1.0 and m["resolved_after_summaries_1"] == 0.5
    assert m["resolved_after_summaries_3plus"] == 0.0 and "resolved_after_summaries_2" not in m
    assert chain_metrics([episode(1, True)]) == {}  # no chain, no chain metrics


def test_compaction_output_counts_against_the_token_budget(tokenizer, task):
    window, trigger = window_for(tokenizer, task)
    policy = Reader(tokenizer)
    free, _ = run(policy, task, context_window=window * 2, context_policy="compaction", summary_trigger_tokens=trigger)
    last = free.turns[-1]  # the budget is checked before each turn: before the last one, the segments held
    before_last = sum(len(s.token_ids()) for s in free.segments) - len(last.token_ids) - len(last.observation_ids)
    # a budget the segments alone leave room under, but not with what the compaction calls wrote
    task.budgets.max_tokens = before_last + int(free.metrics["compaction_tokens"]) // 2
    capped, _ = run(Reader(tokenizer), task, context_window=window * 2, context_policy="compaction",
                    summary_trigger_tokens=trigger)
    assert capped.status == EpisodeStatus.TIMEOUT and capped.limit == EndReason.TOKEN_BUDGET
