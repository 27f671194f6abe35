"""How specs name policies, and the policy error. The ``Policy`` protocol itself lives in
``opencomposer.protocols``; ``Context`` and ``PolicyOutput`` in ``opencomposer.types``.

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
from typing import TYPE_CHECKING

from opencomposer.protocols import Policy
from opencomposer.types import Context, PolicyOutput

__all__ = ["POLICIES", "Context", "Policy", "PolicyError", "PolicyOutput", "make_policy", "turn_token_cap"]

if TYPE_CHECKING:
    from opencomposer.config import Config


class PolicyError(RuntimeError):
    """The policy backend failed (server unreachable after retries, engine crash): an
    infrastructure error, recorded as ``EpisodeStatus.INFRA_ERROR``."""


def turn_token_cap(sampling_max_new_tokens: int, context: Context) -> int:
    """New tokens a policy may sample for ``context``, at least 1. A work turn: the smaller of
    ``sampling.max_new_tokens`` and what the loop leaves (budgets, window). A summary or compaction
    call (``context.summary``): the loop's cap alone, which already is the smaller of
    ``agent.summary_max_tokens`` (``agent.compaction_max_tokens``) and what is left, so a short
    per-turn cap for tool calls does not cut a summary short."""
    if context.summary:
        return max(1, context.max_new_tokens)
    return max(1, min(sampling_max_new_tokens, context.max_new_tokens))


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
