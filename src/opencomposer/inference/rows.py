"""What the local sampler and its speculative variant share: drawing a token from one row's logits
(``sample_tokens``), the seed of each (prompt, sample) pair's generator (``row_seed``) and a row's
decoding state (``Row``). ``inference.local`` runs the plain decode loop and ``inference.speculative``
the MTP-drafted one; both build on this module, so neither imports the other's internals.
"""

from __future__ import annotations

import numpy as np
import torch

from opencomposer.inference.sampling import kept_tokens, prefix_sums, truncated_logprobs, truncates
from opencomposer.types import SamplingParams


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. ``logits`` [B, V] float32, ``uniforms`` [B] in [0, 1).

    Returns ``(tokens [B], logprobs [B])``; logprobs are those of the distribution sampled from:
    temperature-scaled, cut by top-k / top-p and renormalised (``inference.sampling``); for
    greedy, the log-softmax at temperature 1.
    """
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens, logprobs
    scaled = logits if params.temperature == 1 else logits / params.temperature  # x / 1 is x: a pass saved
    keep = kept_tokens(scaled, params.top_p, params.top_k) if truncates(params.top_p, params.top_k) else None
    logp = truncated_logprobs(scaled, keep)  # [B, V], -inf outside the kept tokens
    cdf = prefix_sums(logp.exp())  # flat over cut tokens, so a draw never lands on one
    total = cdf[:, -1]
    draw = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))  # < total, rounding too
    tokens = torch.searchsorted(cdf, draw[:, None], right=True)[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """Seed of the generator of sample ``sample_index`` of prompt ``prompt_index`` in a call seeded ``seed``."""
    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1)[0])


class Row:
    """Decoding state of one (prompt, sample) pair."""

    __slots__ = ("slot", "prompt_index", "sample_index", "tokens", "logprobs", "versions", "routes",
                 "prompt_routes", "finish", "position")

    def __init__(self, slot: int, prompt_index: int, sample_index: int, position: int):
        self.slot = slot  # row of the chunk's uniform-number table
        self.prompt_index = prompt_index
        self.sample_index = sample_index
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []  # policy version that sampled each token
        self.routes: list[np.ndarray] = []
        self.prompt_routes: np.ndarray | None = None  # [len(prompt), layers, k], from the prefill
        self.finish: str | None = None
        self.position = position  # position id of the next token to feed
