"""In-process batched sampler for transformers causal LMs (CPU or one GPU).

``LocalEngine.generate`` decodes many prompts at once with a key/value cache:

1. **Prefill.** Each prompt of a chunk is run through the model on its own, so its cache and first
   logits are a function of the prompt alone; the cache is then repeated ``n`` times, so the ``n``
   samples of a prompt share one prefill (the report's fixed-size groups make this the common
   case).
2. **Decode.** Each step feeds the last token of every live row. Llama- and Qwen-style models run
   through ``inference.invariant.InvariantDecoder`` (fixed-shape matmuls, attention in fixed key
   blocks, each row's keys from its own position 0); other architectures through their
   transformers forward (``inference.decoders.HFDecoder``).
3. **Compaction.** Finished rows are dropped from the batch once enough of them have accumulated.
4. **Sampling.** Temperature, then the top-k / top-p cut (``inference.sampling``), then
   inverse-CDF sampling in vocabulary order with one
   uniform number per row and step drawn from that row's own generator, seeded from
   ``(seed, prompt index, sample index)``, or given by the caller (``row_seeds``).

What it guarantees (Llama/Qwen-style models): **a row does not depend on what shares its batch.**
With the same weights, torch build, machine and torch thread count, a prompt sampled with a given
row seed yields the same tokens, log-probabilities (bit for bit) and routes whether it is
generated alone or among other prompts of any lengths, with any ``n``, at any position of the
call, in any chunking, before or after compaction (``tests/inference/test_invariant.py``). The
batching front-end's timing therefore cannot change what an episode samples, and an RL run is
reproducible bit for bit (``tests/rl/test_reproducible.py``). Not guaranteed: across machines,
torch builds or thread counts; equality with the trainer's forward or with the previous fast path
(they agree to float32 rounding, not bitwise); other architectures (DeepSeek-V3 decodes through
its transformers forward, whose rows move with the batch). The price is 4-17% of decode
throughput (docs/LOG.md, 2026-12-03); ``batch_invariant=False`` keeps the previous path (one
left-padded prefill, ``LeanDecoder`` steps) as the benchmark's reference.

Every completion carries the sampler's log-probability of each token under the distribution it
was drawn from: temperature-scaled, cut by top-k / top-p and renormalised (``inference.sampling``,
the rule the trainer scores tokens with too; at temperature 0, greedy, the log-softmax at
temperature 1) and, for MoE models,
the experts each token was routed to, ``[tokens, moe_layers, top_k]``, and those of every prompt
position in the prefill (``Completion.prompt_routed_experts``, ``[len(prompt), moe_layers,
top_k]``), so that together they give a route for every input position of the context the call
ran: the trainer replays them (``model.routing.RouterReplay``). A token's route is known only once
it has been fed back as input, so a row that finishes rides along for one more forward before it is
dropped.

**In-flight weight updates.** ``load_weights`` may be called from another thread while
``generate`` runs (an asynchronous trainer publishing a new policy version). The update is staged
under a lock and the decode loop copies it into the parameters, in place, before its next forward
(before the prefill of the next chunk, or between two decode steps), so every token sampled after
that is drawn from the new version; with no generation running it is copied in at once. Each
token records the version whose logits it was drawn from (``Completion.token_versions``), so one
completion, and one episode, can span versions. As in PipelineRL, the key/value cache computed by
the older weights is kept: the tokens after the switch attend to keys and values the previous
version wrote, so they are the new version's continuation of the old version's cache, not what a
fresh forward under the new weights would give; the importance ratio against the trainer's
forward measures that gap like any other staleness. A MoE token's route is recorded when it is fed
back, so the token sampled last before a switch carries the route of the new weights. No decoder
keeps a weight-derived tensor across steps (each step reads the modules' parameters), so an
in-place copy is all a switch takes. The batch-invariance guarantee holds for a fixed sequence
of weights: with the same update applied before the same decode step, a row is what it would
be in any batch; the step at which an update lands depends on the caller's timing.

Not here: paged attention, continuous batching across calls, CUDA graphs (vLLM's job at scale).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from opencomposer.inference.decoders import HFDecoder, LeanDecoder, lean_supported
from opencomposer.inference.invariant import InvariantDecoder
from opencomposer.inference.sampling import kept_tokens, truncated_logprobs, truncates
from opencomposer.model.routing import RouteRecorder, route_dtype
from opencomposer.model.tokenizer import stop_token_ids
from opencomposer.numerics.convert import is_converted
from opencomposer.types import Completion, SamplingParams


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
    scaled = logits / params.temperature
    keep = kept_tokens(scaled, params.top_p, params.top_k) if truncates(params.top_p, params.top_k) else None
    logp = truncated_logprobs(scaled, keep)  # [B, V], -inf outside the kept tokens
    cdf = logp.exp().cumsum(dim=-1)  # flat over cut tokens, so a draw never lands on one
    total = cdf[:, -1]
    draw = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))  # < total, rounding too
    tokens = torch.searchsorted(cdf, draw[:, None], right=True)[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """Seed of the generator of sample ``sample_index`` of prompt ``prompt_index`` in a call seeded ``seed``."""
    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1)[0])


class _Row:
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
        batch_invariant: bool = True,
    ):
        """``batch_invariant``: decode Llama/Qwen-style models with ``inference.invariant``, so that
        a row's result does not depend on its batch (see module doc); False takes the previous
        decoder, a shared left-padded prefill and ``LeanDecoder`` steps, 4-17% faster
        (docs/LOG.md, 2026-12-03), kept as the benchmark's reference. Other architectures always
        run through their transformers forward and are not batch-invariant."""
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
        # the invariant decoder reads the weights directly, past [numerics]' converted modules
        self.batch_invariant = batch_invariant and self.lean and not is_converted(model)
        self._seed_rng = np.random.default_rng()
        # in-flight updates (module doc): the lock guards the two fields below and every copy into
        # the parameters
        self._weights_lock = threading.Lock()
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None  # waiting for the next forward
        self._generating = 0  # generate calls running

    # ------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Take the weights ``state_dict`` as policy ``version``; safe to call from any thread.

        Strict: every key must name a parameter or buffer of the model, with its shape (checked
        here, so a bad update fails in the caller). With no ``generate`` running the weights are
        copied in at once and ``policy_version`` is ``version`` on return. While one runs they
        are staged, as a copy (the caller may go on training its tensors), and applied before the
        next forward of the decode loop (module doc); a newer update replaces a staged one that
        has not been applied yet."""
        own = self.model.state_dict()
        unexpected = [k for k in state_dict if k not in own]
        if unexpected:
            missing = [k for k in own if k not in state_dict]
            raise ValueError(f"load_weights: unexpected keys {unexpected[:5]}, missing {missing[:5]}")
        wrong = [f"{k}: {tuple(v.shape)} (expected {tuple(own[k].shape)})"
                 for k, v in state_dict.items() if v.shape != own[k].shape]
        if wrong:
            raise ValueError(f"load_weights: wrong shapes {wrong[:5]}")
        with self._weights_lock:
            if self._generating:
                staged = {k: v.detach().to(self.device, copy=True) for k, v in state_dict.items()}
                self._staged = (staged, version)
            else:
                self._staged = None
                self._copy_in(state_dict, version)

    def _copy_in(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` into the parameters in place (the caller holds the lock)."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=False)
        self.policy_version = version

    def _apply_staged(self) -> None:
        """Apply a staged update, if any (the decode loop calls this between forwards)."""
        if self._staged is None:  # read without the lock: a staged update is picked up next time
            return
        with self._weights_lock:
            if self._staged is not None:
                self._copy_in(*self._staged)
                self._staged = None

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
        with self._weights_lock:
            self._generating += 1
        try:
            for start in range(0, len(prompts), per_chunk):
                indices = list(range(start, min(start + per_chunk, len(prompts))))
                for completion in self._generate_chunk(prompts, indices, params, n, seed, row_seeds):
                    results[completion.prompt_index * n + completion.sample_index] = completion
        finally:
            with self._weights_lock:
                self._generating -= 1
                if not self._generating and self._staged is not None:  # staged after the last forward
                    self._copy_in(*self._staged)
                    self._staged = None
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
        self._apply_staged()
        first_version = version = self.policy_version  # version: of the weights the next logits come from
        if params.max_new_tokens == 0:
            return [self._completion(row, first_version) for row in rows]
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
        with RouteRecorder(self.model) as recorder:
            if self.batch_invariant:
                decoder = InvariantDecoder(self.model, recorder)
            else:
                decoder = LeanDecoder(self.model) if self.lean else HFDecoder(self.model)
            logits = decoder.prefill(input_ids.to(dev), mask.to(dev), position_ids.to(dev))
            prompt_routes = self._prompt_routes(decoder, recorder, lengths, width)
            for row in rows:
                row.prompt_routes = prompt_routes[row.slot // n]  # the n samples share one prefill
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
                        row.versions.append(version)
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
                self._apply_staged()
                version = self.policy_version
                logits = decoder.step(step_ids, step_pos)[:, -1, :].float()
                routes = recorder.take(len(live), 1)
                routes = routes[:, 0].cpu().numpy() if routes is not None else None  # [rows, layers, k]
                for k, row in enumerate(live):
                    row.position += 1
                    if routes is not None and len(row.routes) < len(row.tokens):
                        row.routes.append(routes[k])
        return [self._completion(row, first_version) for row in rows]

    def _prompt_routes(
        self, decoder: Any, recorder: RouteRecorder, lengths: list[int], width: int
    ) -> list[np.ndarray | None]:
        """Each prompt's prefill routes, ``[length, moe_layers, top_k]`` (None for dense models).
        The batch-invariant decoder prefills prompt by prompt and keeps them per row; the others
        prefill the left-padded batch, whose padding is cut off."""
        if not self.is_moe:
            recorder.clear()
            return [None] * len(lengths)
        if isinstance(decoder, InvariantDecoder):
            routes = decoder.prompt_routes
        else:
            padded = recorder.take(len(lengths), width)  # [prompts, width, layers, k]
            routes = [padded[r, width - length :] for r, length in enumerate(lengths)]
        return [r.cpu().numpy().astype(self.route_dtype) for r in routes]

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

    def _completion(self, row: _Row, version: int) -> Completion:
        """``version``: that of the first token (of the prefill's weights)."""
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
            prompt_routed_experts=row.prompt_routes,
            prompt_index=row.prompt_index,
            sample_index=row.sample_index,
            policy_version=version,
            token_versions=list(row.versions),
        )
