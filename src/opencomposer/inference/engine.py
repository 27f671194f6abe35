"""The inference interface every policy backend implements.

An ``Engine`` turns token-id prompts into sampled continuations, token in and token out, and
reports what the trainer needs to stay on-policy: the sampler's log-probability of each token and,
for MoE models, the experts each token was routed to (RECIPE.md §6, router replay). Backends: the
in-process ``LocalEngine`` (PyTorch, CPU or one GPU), vLLM (gpu extra) and OpenAI-compatible HTTP
servers (text in, text out; the agent harness wraps those separately).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class SamplingParams:
    """How to sample. ``temperature = 0`` is greedy decoding.

    Logprobs are always those of the temperature-scaled distribution *before* top-p/top-k
    truncation, so that at temperature 1 they equal the raw log-softmax the trainer recomputes.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    stop: list[str] = field(default_factory=list)  # stop strings; the match is kept in the output
    stop_token_ids: list[int] = field(default_factory=list)  # added to the tokenizer's EOS ids
    seed: int | None = None  # per-request seed; sample j of prompt i uses (seed, i, j)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    ``routed_experts``: ``[len(token_ids), moe_layers, top_k]`` uint8 (uint16 above 256 experts)
    for MoE models, None for dense ones. ``finish_reason``: ``"stop"`` (EOS, stop token or stop
    string) or ``"length"`` (max_new_tokens reached).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    routed_experts: np.ndarray | None = None
    prompt_index: int = 0
    sample_index: int = 0
    policy_version: int = 0


@runtime_checkable
class Engine(Protocol):
    """Generates token continuations; ``generate`` returns ``len(prompts) * n`` completions,
    prompt-major (all samples of prompt 0, then prompt 1, ...)."""

    policy_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Completion]: ...

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...
