"""Errors land where they belong: a chat template that re-renders the model's text differently fails
that episode as a scored format error (the rest of an RL step goes on), and a token-level policy
that returns no logprobs is an infrastructure error, not a sampler that was certain."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from opencomposer.agent.policies.scripted import ScriptedPolicy, call, oracle_script
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.model.tokenizer import CHAT_TEMPLATE
from opencomposer.tasks.format import load_task
from opencomposer.types import EpisodeStatus, PolicyOutput

from .conftest import FIXTURES

pytestmark = pytest.mark.bwrap

# A real-world kind of instability: earlier assistant turns are re-rendered trimmed (as templates
# that rewrite past turns do), so a turn the model ended with blank lines changes once more follows.
CONTENT = "{{ message.content }}{% if message.tool_calls %}"
TRIMMING = CONTENT.replace("{{ message.content }}", "{% if message.role == 'assistant' and not loop.last %}"
                           "{{ message.content | trim }}{% else %}{{ message.content }}{% endif %}")


@pytest.fixture(scope="module")
def trimming_tokenizer(tokenizer):
    assert CHAT_TEMPLATE.count(CONTENT) == 1
    unstable = copy.deepcopy(tokenizer)
    unstable.chat_template = CHAT_TEMPLATE.replace(CONTENT, TRIMMING)
    return unstable


def test_an_unstable_template_fails_the_episode_as_a_scored_format_error(trimming_tokenizer):
    task = load_task(FIXTURES / "fix-add")
    script = ['<tool_call>\n{"name": "list_dir", "arguments": {"path": "."}}\n</tool_call>\n\n',
              [call("finish", message="done")]]
    episode = run_episode(task, ScriptedPolicy(script, tokenizer=trimming_tokenizer), Config())  # returns, no raise
    assert episode.status == EpisodeStatus.FORMAT_ERROR and episode.scored
    assert "not prefix-stable" in episode.error
    assert episode.grade is not None and not episode.grade.resolved  # graded as it stands
    [turn] = episode.turns
    assert turn.format_error == episode.error and episode.metrics["format_errors"] == 1.0  # a broken turn


def test_a_stable_template_records_the_same_turn(tokenizer):
    script = ['<tool_call>\n{"name": "list_dir", "arguments": {"path": "."}}\n</tool_call>\n\n',
              [call("finish", message="done")]]
    episode = run_episode(load_task(FIXTURES / "fix-add"), ScriptedPolicy(script, tokenizer=tokenizer), Config())
    assert episode.status == EpisodeStatus.OK and episode.metrics["format_errors"] == 0.0


class NoLogprobs(ScriptedPolicy):
    def act(self, context) -> PolicyOutput:
        return dataclasses.replace(super().act(context), logprobs=None)


def test_token_ids_without_logprobs_are_a_policy_error(tokenizer):
    episode = run_episode(load_task(FIXTURES / "fix-add"), NoLogprobs(oracle_script, tokenizer=tokenizer), Config())
    assert episode.status == EpisodeStatus.INFRA_ERROR and not episode.scored
    assert episode.error.startswith("PolicyError:") and "without their logprobs" in episode.error


def test_the_scripted_policy_reports_its_certainty_as_logprob_zero(tokenizer):
    episode = run_episode(load_task(FIXTURES / "fix-add"), ScriptedPolicy(oracle_script, tokenizer=tokenizer), Config())
    assert episode.status == EpisodeStatus.OK and episode.grade.resolved
    assert all(turn.logprobs == [0.0] * len(turn.token_ids) and turn.token_ids for turn in episode.turns)
