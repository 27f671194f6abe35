"""End to end: the real loop, sandbox and LocalEngine sampling a randomly initialised tiny MoE.

It solves nothing; the point is the record: every id the engine sampled, with its logprob and
route, and every id the environment appended, adding up to exactly the context the engine saw.
"""

from __future__ import annotations

import numpy as np
import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.protocol import message_dicts
from opencomposer.agent.tools import tool_schemas
from opencomposer.config import ModelConfig, SamplingConfig
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import load_task
from opencomposer.types import MODEL_KINDS, EpisodeStatus, TokenKind

from .conftest import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


class RecordingEngine:
    """Passes every call to the real engine and keeps what it was asked and what it answered."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []
        self.max_positions = engine.max_positions

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def generate(self, prompts, params, n=1):
        completions = self.engine.generate(prompts, params, n)
        self.calls.append((list(prompts[0]), params, completions[0]))
        return completions

    def load_weights(self, state_dict, version):
        self.engine.load_weights(state_dict, version)


def test_tiny_moe_episode_record_is_complete_and_consistent(tokenizer):
    from opencomposer.inference import LocalEngine
    from opencomposer.model import load_model

    model_config = ModelConfig(kind="tiny_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                               head_dim=16, num_experts=4, top_k=2, moe_intermediate_size=64)
    model, tokenizer = load_model(model_config, tokenizer, seed=0)
    engine = RecordingEngine(LocalEngine(model, tokenizer, policy_version=7))
    policy = EnginePolicy(engine, tokenizer, SamplingConfig(max_new_tokens=24, temperature=1.0))
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_turns = 3
    with Sandbox(task.repo) as sandbox:
        episode = AgentLoop(policy, task, sandbox, seed=11).run()

    assert episode.status == EpisodeStatus.TIMEOUT and episode.error == "turn budget used up (3 turns)"
    [segment] = episode.segments
    assert len(episode.turns) == len(engine.calls) == 3
    context = list(segment.prompt_ids)
    for turn, (prompt, params, completion) in zip(episode.turns, engine.calls):
        assert prompt == context  # the engine saw exactly the recorded context
        assert params.max_new_tokens == 24 and params.stop_token_ids
        assert turn.token_ids == completion.token_ids and turn.logprobs == completion.logprobs
        assert len(turn.token_kinds) == len(turn.token_ids) and set(turn.token_kinds) <= MODEL_KINDS
        assert all(np.isfinite(turn.logprobs)) and max(turn.logprobs) <= 0.0
        assert turn.routes.shape == (len(turn.token_ids), 2, 2) and np.array_equal(turn.routes, completion.routed_experts)
        assert turn.routes.max() < 4 and turn.policy_version == 7
        assert turn.format_error and turn.observation_ids  # garbage output: each turn gets a FormatError back
        assert turn.observation_kinds == [TokenKind.TOOL_OUTPUT] * len(turn.observation_ids)
        context += turn.token_ids + turn.observation_ids
    assert context == segment.token_ids()
    rendered = tokenizer.apply_chat_template(message_dicts(segment.messages), tools=tool_schemas(),
                                             add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(context, skip_special_tokens=False) == rendered  # ids = the tokenised transcript
    assert sum(segment.loss_mask()) == sum(len(t.token_ids) for t in episode.turns) == episode.metrics["completion_tokens"]


def test_a_summary_turn_has_the_summary_cap_not_the_work_turn_cap(tokenizer):
    """``sampling.max_new_tokens`` caps work turns only: a summary may take ``agent.summary_max_tokens``
    (a K = 6 tiny-long plan is longer than the tool-call cap of recipes/tiny-long.toml, and a summary
    cut at that cap dropped the last note from the plan it handed on)."""
    from opencomposer.config import AgentConfig
    from opencomposer.inference import LocalEngine
    from opencomposer.model import load_model

    model_config = ModelConfig(kind="tiny_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                               head_dim=16, num_experts=4, top_k=2, moe_intermediate_size=64)
    model, tokenizer = load_model(model_config, tokenizer, seed=0)
    engine = RecordingEngine(LocalEngine(model, tokenizer))
    policy = EnginePolicy(engine, tokenizer, SamplingConfig(max_new_tokens=8, temperature=1.0))
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_turns = 2
    config = AgentConfig(context_policy="self_summary", summary_trigger_tokens=1, summary_max_tokens=40)
    with Sandbox(task.repo) as sandbox:
        episode = AgentLoop(policy, task, sandbox, config, seed=3).run()

    kinds = ["summary" if t.summary else "work" for t in episode.turns]
    assert kinds[:3] == ["work", "summary", "work"], kinds
    caps = [params.max_new_tokens for _, params, _ in engine.calls]
    assert caps[:3] == [8, 40, 8]
    summary = episode.turns[1]
    assert 8 < len(summary.token_ids) <= 40  # random weights rarely stop early: it ran past the work-turn cap
    assert all(len(t.token_ids) <= 8 for t in episode.turns if not t.summary)
