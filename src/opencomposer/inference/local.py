"""In-process batched sampler for transformers causal LMs (CPU or one GPU).

``LocalEngine.generate`` decodes many prompts at once with a key/value cache:

1. **Shared prefill.** The prompts of a chunk are left-padded into one batch and run through the
   model once; the cache is then repeated ``n`` times, so the ``n`` samples of a prompt share one
   prefill (the report's fixed-size groups make this the common case).
2. **Decode.** Each step feeds the last token of every live row. The cache grows in place inside a
   preallocated buffer (doubling when full) instead of being re-concatenated every step. Llama- and
   Qwen-style models run through ``LeanDecoder`` (the model's own modules without the
   transformers glue); other architectures through their transformers forward
   (``inference.decoders``).
3. **Compaction.** Finished rows are dropped from the batch once enough of them have accumulated.
4. **Sampling.** Temperature, then top-k / top-p truncation, then inverse-CDF sampling with one
   uniform number per row and step drawn from that row's own generator, seeded from
   ``(seed, prompt index, sample index)``: the same seed gives the same samples.

Every completion carries the sampler's log-probability of each token under the temperature-scaled
distribution *before* truncation (at temperature 1 that is exactly the log-softmax the trainer
recomputes; at temperature 0, greedy, it is the log-softmax at temperature 1) and, for MoE models,
the experts each token was routed to, ``[tokens, moe_layers, top_k]``. A token's route is known
only once it has been fed back as input, so a row that finishes rides along for one more forward
before it is dropped.

Not here: paged attention, continuous batching across calls, CUDA graphs (vLLM's job at scale).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from opencomposer.inference.decoders import HFDecoder, LeanDecoder, lean_supported
from opencomposer.inference.engine import Completion, SamplingParams
from opencomposer.model.routing import RouteRecorder, route_dtype
from opencomposer.model.tokenizer import stop_token_ids


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. ``logits`` [B, V] float32, ``uniforms`` [B] in [0, 1).

    Returns ``(tokens [B], logprobs [B])``; logprobs are under the temperature-scaled, untruncated
    distribution (temperature 1 for greedy).
    """
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens, logprobs
    logp = torch.log_softmax(logits / params.temperature, dim=-1)  # [B, V]
    probs = logp.exp()
    if params.top_k or params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        if params.top_k:
            keep[:, params.top_k :] = False
        if params.top_p < 1.0:
            before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
            keep &= before < params.top_p  # the token that crosses top_p is kept
        sorted_probs = sorted_probs * keep
        cdf = sorted_probs.cumsum(dim=-1)
        pick = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)[:, 0]
        pick = pick.clamp(max=probs.shape[-1] - 1)
        tokens = order.gather(1, pick[:, None])[:, 0]
    else:
        cdf = probs.cumsum(dim=-1)
        pick = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)[:, 0]
        tokens = pick.clamp(max=probs.shape[-1] - 1)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """Seed of the generator of sample ``sample_index`` of prompt ``prompt_index`` in a call seeded ``seed``."""
    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1)[0])


class _Row:
    """Decoding state of one (prompt, sample) pair."""

    __slots__ = ("slot", "prompt_index", "sample_index", "tokens", "logprobs", "routes", "finish", "position")

    def __init__(self, slot: int, prompt_index: int, sample_index: int, position: int):
        self.slot = slot  # row of the chunk's uniform-number table
        self.prompt_index = prompt_index
        self.sample_index = sample_index
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.routes: list[np.ndarray] = []
        self.finish: str | None = None
        self.position = position  # position id of the next token to feed


class LocalEngine:
    """Batched token-in/token-out sampling with a KV cache, logprobs and routes (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        policy_version: int = 0,
        compact_fraction: float = 0.25,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.policy_version = policy_version
        self.compact_fraction = compact_fraction
        self.device = next(model.parameters()).device
        config_eos = model.generation_config.eos_token_id
        config_eos = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
        self.eos_ids = set(stop_token_ids(tokenizer)) | set(config_eos)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.pad_id = int(pad)
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        routers = RouteRecorder(model).routers
        self.is_moe = bool(routers)
        self.route_shape = (len(routers), int(routers[0].top_k)) if routers else (0, 0)
        self.route_dtype = route_dtype(model)
        self.lean = lean_supported(model)
        self._seed_rng = np.random.default_rng()

    # ------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Swap weights in place (strict: every key must match a parameter or buffer)."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        if unexpected or (missing and len(state_dict) == len(self.model.state_dict())):
            raise ValueError(f"load_weights: unexpected keys {unexpected[:5]}, missing {missing[:5]}")
        self.policy_version = version

    # ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        n: int = 1,
        row_seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Sample ``n`` continuations of each prompt; results are prompt-major.

        ``row_seeds`` (``len(prompts) * n``, prompt-major) replaces the seed of each sample's
        generator, so requests gathered from several callers (``inference.batching``) sample what
        they would have sampled alone: a lone call uses ``row_seed(params.seed, 0, j)``."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if row_seeds is not None and len(row_seeds) != len(prompts) * n:
            raise ValueError(f"row_seeds: expected {len(prompts) * n} seeds, got {len(row_seeds)}")
        prompts = [list(map(int, p)) for p in prompts]
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.vocab_size}): {bad[:5]}")
            if len(prompt) >= self.max_positions:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens, the model's limit is {self.max_positions}")
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**62))
        results: list[Completion | None] = [None] * (len(prompts) * n)
        per_chunk = max(1, self.max_batch_size // n)
        for start in range(0, len(prompts), per_chunk):
            indices = list(range(start, min(start + per_chunk, len(prompts))))
            for completion in self._generate_chunk(prompts, indices, params, n, seed, row_seeds):
                results[completion.prompt_index * n + completion.sample_index] = completion
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], indices: list[int], params: SamplingParams, n: int, seed: int,
        row_seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        lengths = [len(prompts[i]) for i in indices]
        width = max(lengths)
        input_ids = torch.full((len(indices), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        for r, i in enumerate(indices):
            input_ids[r, width - lengths[r] :] = torch.tensor(prompts[i])
            mask[r, width - lengths[r] :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = [_Row(r * n + j, i, j, lengths[r]) for r, i in enumerate(indices) for j in range(n)]
        if params.max_new_tokens == 0:
            return [self._completion(row) for row in rows]
        # one uniform number per row and step, from that row's own generator
        uniforms = torch.stack([
            torch.rand(params.max_new_tokens, generator=torch.Generator().manual_seed(
                row_seed(seed, row.prompt_index, row.sample_index) if row_seeds is None
                else int(row_seeds[row.prompt_index * n + row.sample_index])))
            for row in rows
        ])  # [rows, max_new_tokens]
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        stop_window = max((len(s) for s in params.stop), default=0) + 8
        dev = self.device
        decoder = LeanDecoder(self.model) if self.lean else HFDecoder(self.model)
        with RouteRecorder(self.model) as recorder:
            logits = decoder.prefill(input_ids.to(dev), mask.to(dev), position_ids.to(dev))
            recorder.take(len(indices), width)  # prompt routes are not returned
            logits = logits[:, -1, :].float().repeat_interleave(n, dim=0)  # [rows, V]
            decoder.repeat(n)
            live = rows  # rows still in the batch, aligned with dim 0 of logits and the cache
            while True:
                # 1. sample for rows that are still generating
                generating = [k for k, row in enumerate(live) if row.finish is None]
                if generating:
                    pick = torch.tensor(generating)
                    steps = torch.tensor([len(live[k].tokens) for k in generating])
                    slots = torch.tensor([live[k].slot for k in generating])
                    rows_logits = logits if len(generating) == len(live) else logits[pick.to(dev)]
                    tokens, logprobs = sample_tokens(rows_logits, params, uniforms[slots, steps].to(dev))
                    for k, token, logprob in zip(generating, tokens.tolist(), logprobs.tolist()):
                        row = live[k]
                        row.tokens.append(token)
                        row.logprobs.append(logprob)
                        row.finish = self._finish_reason(row, token, params, stop_ids, stop_window)
                # 2. rows that still need a forward: generating, or finished with their last
                #    token's route not yet recorded (MoE only)
                needs_forward = [
                    k for k, row in enumerate(live)
                    if row.finish is None or (self.is_moe and len(row.routes) < len(row.tokens))
                ]
                if not needs_forward:
                    break
                dead = len(live) - len(needs_forward)
                if dead and dead >= self.compact_fraction * len(live):
                    keep = torch.tensor(needs_forward, device=dev)
                    decoder.select(keep)
                    live = [live[k] for k in needs_forward]
                # 3. feed every live row its last token (rows already done ride along until compaction)
                step_ids = torch.tensor([[row.tokens[-1]] for row in live], device=dev)
                step_pos = torch.tensor([[row.position] for row in live], device=dev)
                logits = decoder.step(step_ids, step_pos)[:, -1, :].float()
                routes = recorder.take(len(live), 1)
                routes = routes[:, 0].cpu().numpy() if routes is not None else None  # [rows, layers, k]
                for k, row in enumerate(live):
                    row.position += 1
                    if routes is not None and len(row.routes) < len(row.tokens):
                        row.routes.append(routes[k])
        return [self._completion(row) for row in rows]

    def _finish_reason(
        self, row: _Row, token: int, params: SamplingParams, stop_ids: set[int], stop_window: int
    ) -> str | None:
        if token in stop_ids:
            return "stop"
        if params.stop:
            tail = self.tokenizer.decode(row.tokens[-stop_window:], skip_special_tokens=False)
            if any(s in tail for s in params.stop):
                return "stop"
        if len(row.tokens) >= params.max_new_tokens or row.position + 1 >= self.max_positions:
            return "length"
        return None

    def _completion(self, row: _Row) -> Completion:
        routes = None
        if self.is_moe:
            routes = (
                np.stack(row.routes).astype(self.route_dtype)
                if row.routes
                else np.zeros((0, *self.route_shape), dtype=self.route_dtype)
            )
        return Completion(
            token_ids=row.tokens,
            logprobs=row.logprobs,
            finish_reason=row.finish or "length",
            text=self.tokenizer.decode(row.tokens, skip_special_tokens=False),
            routed_experts=routes,
            prompt_index=row.prompt_index,
            sample_index=row.sample_index,
            policy_version=self.policy_version,
        )
