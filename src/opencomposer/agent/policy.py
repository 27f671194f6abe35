"""The ``Policy`` protocol: what the agent loop asks of a model, and how specs name policies.

A policy turns the current context into one model turn. Token-in/token-out policies (the local
sampler, the scripted policy given a tokenizer) expose ``tokenizer`` and read
``Context.token_ids``; they return the sampled ids with logprobs and routes, which the loop
records for training. Text policies (an OpenAI-compatible server) read ``Context.messages`` and
may return native tool calls. Policies keep no per-episode state, so one policy object can serve
parallel episodes.

Specs (``--policy``): ``oracle``, ``noop``, ``local``, ``local:CHECKPOINT``, ``openai:MODEL``;
each name maps to a factory import path in ``POLICIES`` and is imported on use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from opencomposer.types import Message, Task, ToolCall

if TYPE_CHECKING:
    from opencomposer.config import Config


class PolicyError(RuntimeError):
    """The policy backend failed (server unreachable after retries, engine crash): an
    infrastructure error, recorded as ``EpisodeStatus.INFRA_ERROR``."""


@dataclass
class Context:
    """What a policy sees before its turn."""

    task: Task
    messages: list[Message]  # the segment's chat transcript so far
    token_ids: list[int] | None  # the exact context ids, for token-in/token-out policies
    turn_index: int  # turns taken so far in this episode
    max_new_tokens: int  # what the budgets leave for this turn
    seed: int = 0  # per-episode seed for sampling


@dataclass
class PolicyOutput:
    """One model turn. ``token_ids`` / ``logprobs`` / ``routes`` (``[tokens, moe_layers, top_k]``)
    come from token-level policies; ``tool_calls`` from servers with native function calling
    (None means: parse them from ``text``)."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    routes: np.ndarray | None = None
    finish_reason: str = "stop"
    tool_calls: list[ToolCall] | None = None
    format_error: str | None = None  # native tool calls that could not be read
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    policy_version: int = 0


@runtime_checkable
class Policy(Protocol):
    name: str
    tokenizer: Any | None  # set for token-in/token-out policies

    def act(self, context: Context) -> PolicyOutput: ...


POLICIES = {
    "oracle": "opencomposer.agent.policies.scripted:oracle_policy",
    "noop": "opencomposer.agent.policies.scripted:noop_policy",
    "local": "opencomposer.agent.policies.local:local_policy",
    "openai": "opencomposer.agent.policies.http:openai_policy",
}


def make_policy(spec: str, config: Config) -> Policy:
    """Build the policy a spec names (``NAME`` or ``NAME:ARGUMENT``)."""
    name, _, argument = spec.partition(":")
    if name not in POLICIES:
        from opencomposer.config import ConfigError

        raise ConfigError(f"policy {spec!r}: unknown name {name!r}; expected one of {', '.join(POLICIES)}")
    module, func = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), func)(argument, config)
