"""In-process batched sampler for transformers causal LMs (CPU or one GPU).

``LocalEngine.generate`` decodes many prompts at once with a key/value cache:

1. **Prefill.** Each prompt of a chunk is run through the model on its own, so its cache and first
   logits are a function of the prompt alone; the cache is then repeated ``n`` times, so the ``n``
   samples of a prompt share one prefill (the report's fixed-size groups make this the common
   case) and, in the batch-invariant decoder, one copy of the prompt's full key/value blocks,
   which its decode attention reads for all of them at once (``inference.invariant``).
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

**Prefix cache** (``prefix_cache_tokens > 0``; off by default, and then nothing above changes).
An agent's next call extends its previous one: its prompt is the previous prompt, the sampled
completion and a few new tokens (a tool's output, or the self-summary request appended to the
live context). The engine keeps the keys and values of the sequences it ran, so such a prompt
prefills only the new tokens:

- *What is stored.* When a row leaves the batch (compacted out, or at the end of the chunk), the
  keys and values of every position it has fed (its prompt and the sampled tokens fed back) are
  copied out of the decode cache, with the routes of those positions for MoE models, under the
  exact token sequence (``PrefixCache``). ``prefix_cache_tokens`` bounds the positions held in
  all; the least recently used entries are evicted first. A sequence that is a prefix of a stored
  one is not stored twice, and a new sequence replaces the stored ones it extends. Entries stay
  on the model's device, ``2 * layers * kv_heads * head_dim`` numbers a position (SmolLM2-135M in
  float32: 45 KiB, so 16k positions take 720 MiB).
- *What is reused.* Before a prompt's prefill, the stored sequence sharing the longest common
  prefix with it is looked up; if that is at least ``MIN_PREFIX_TOKENS`` long, the prefill starts
  from its keys and values and runs only the rest of the prompt (at least its last token, whose
  logits start the sampling). A common prefix, not only a whole stored sequence, qualifies: the
  keys and values of a position depend only on the tokens up to it, so a prompt that follows a
  completion cut short (``inference.batching`` cuts a request back to its own cap) or re-rendered
  differently from some point on still reuses everything before that point. The ``n`` samples of
  a prompt still share one prefill, and ``prompt_routed_experts`` still covers the whole prompt
  (the stored routes for the reused positions).
- *Validity.* Keys and values belong to the weights that computed them. Every copy of new weights
  into the model (``load_weights`` with nothing generating, or an in-flight update applied
  between forwards) empties the cache; a row is stored only if no weights were copied in since
  its chunk's prefill began, so every stored position was computed under one version, the
  current one. (A staged update that has not been applied yet leaves the cache as it is: the
  model still runs the weights it was computed with.)
- *Where.* Only the batch-invariant decoder (Llama/Qwen-style models, the tiny MoE included)
  prefills prompt by prompt and keeps each row's keys at its own positions, which is what
  reusing a row's cache takes; ``batch_invariant=False``, models converted with per-tensor NVFP4
  activation scales and other architectures (DeepSeek-V3, through ``HFDecoder``) run without it
  (``prefix_cache`` is None).
- *Numerics.* Reuse changes rounding, not results: the reused keys and values of a completion
  were written one token at a time by decode steps (fixed-shape tiled matmuls), those of the
  previous prompt by its own prefill, where a fresh prefill would compute all of them in one
  forward over the whole prompt. Logits therefore agree with a fresh prefill to float32 rounding
  (``tests/inference/test_prefix_cache.py``: greedy tokens identical, log-probabilities within
  1e-4), not bit for bit, and the batch-invariance guarantee above becomes: a row does not depend
  on what shares its batch, but it may depend, at that rounding level, on which earlier calls
  left a prefix in the cache (with the batching front-end, on their timing and on evictions).
  Runs that must reproduce bit for bit leave the cache off.
- *Memory.* The stored keys and values are many buffers of a megabyte or two (one per layer and
  entry), allocated and freed as entries come and go, from every rollout thread. glibc's malloc
  keeps such freed buffers in its per-thread heaps rather than returning them, and the process
  grew past 20 GB on SmolLM2 agent evaluations with a 3 GB cache (docs/LOG.md, issue 17). With the
  cache on, the engine has glibc serve every allocation of ``MMAP_THRESHOLD_BYTES`` or more by
  ``mmap`` (``mmap_large_allocations``), whose buffers go back to the system when freed: the same
  run stayed at about 5 GB. (Setting ``MALLOC_MMAP_THRESHOLD_`` in the environment does the same.)
- *Stats.* ``LocalEngine.stats`` counts the prompt positions prefilled
  (``prefill_tokens``) and those served from the cache (``prefill_tokens_reused``), cache on or
  off, for the agent loop's metrics and ``benchmarks/prefix_cache.py``.

Not here: paged attention, continuous batching across calls, CUDA graphs (vLLM's job at scale).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from opencomposer.inference.decoders import HFDecoder, LeanDecoder, lean_supported
from opencomposer.inference.invariant import InvariantDecoder, Prefix, batch_dependent_format
from opencomposer.inference.rows import Row, row_seed, sample_tokens
from opencomposer.model.routing import RouteRecorder, route_dtype
from opencomposer.model.tokenizer import stop_token_ids
from opencomposer.types import Completion, SamplingParams

MIN_PREFIX_TOKENS = 16
"""Shortest common prefix the prefix cache reuses: below it the saved positions are worth less
than copying the stored keys into a fresh cache."""


@dataclass
class EngineStats:
    """Prefill work of a ``LocalEngine`` since it was built (module doc, prefix cache).

    Counts are per prompt, not per sample: the ``n`` samples of a prompt share one prefill.
    ``prefill_tokens``: prompt positions run through the model (left padding not counted);
    ``prefill_tokens_reused``: prompt positions whose keys and values came from the prefix cache
    instead; ``prefills``: prompts prefilled; ``prefix_hits``: those that reused a stored prefix.
    ``draft_tokens`` / ``draft_accepted``: MTP drafts verified and kept by speculative calls
    (``sampling.speculative = "mtp"``, ``inference.speculative``).
    Read it before and after a call (``dataclasses.replace`` copies it) for that call's share."""

    prefills: int = 0
    prefix_hits: int = 0
    prefill_tokens: int = 0
    prefill_tokens_reused: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0

    @property
    def reused_fraction(self) -> float:
        """Share of all prompt positions that were served from the cache."""
        total = self.prefill_tokens + self.prefill_tokens_reused
        return self.prefill_tokens_reused / total if total else 0.0


class _Entry:
    """One stored sequence: its tokens, keys and values (per layer ``[kv_heads, len, D]``) and
    routes (``[len, moe_layers, top_k]``, None for dense models)."""

    __slots__ = ("tokens", "keys", "values", "routes")

    def __init__(self, tokens: np.ndarray, keys: list[torch.Tensor], values: list[torch.Tensor],
                 routes: torch.Tensor | None):
        self.tokens, self.keys, self.values, self.routes = tokens, keys, values, routes


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


MMAP_THRESHOLD_BYTES = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def mmap_large_allocations(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Have glibc's malloc serve allocations of ``threshold_bytes`` or more with ``mmap``, so that
    they return to the system when freed (module doc, prefix cache: memory). Process-wide; True if
    it took effect, False where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        return False


class PrefixCache:
    """Keys and values of token sequences the engine ran, for later prompts that extend them.

    Holds at most ``max_tokens`` positions over all entries, evicting the least recently used
    entry (stored or reused) first; an entry longer than that is not stored. Entries are keyed
    by their exact token sequence; a lookup takes the entry sharing the longest common prefix
    with the prompt (``MIN_PREFIX_TOKENS`` at least). ``epoch`` counts ``invalidate`` calls (one
    per copy of new weights): an insert made with an older epoch is dropped, so nothing computed
    under replaced weights is stored after they were replaced. Entries share no storage (n
    samples of one prompt hold n copies of its keys); the lookup compares the prompt with every
    entry, which costs microseconds per thousand stored positions. Thread-safe."""

    def __init__(self, max_tokens: int, min_tokens: int = MIN_PREFIX_TOKENS):
        if max_tokens < 1:
            raise ValueError(f"PrefixCache: max_tokens must be positive, got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_tokens = max(1, min_tokens)
        self.tokens = 0  # positions held
        self.epoch = 0
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def sequences(self) -> list[tuple[int, ...]]:
        """The stored token sequences, least recently used first."""
        with self._lock:
            return list(self._entries)

    def invalidate(self) -> None:
        """Drop every entry (the weights they were computed with are gone) and start a new epoch."""
        with self._lock:
            self._entries.clear()
            self.tokens = 0
            self.epoch += 1

    def lookup(self, prompt: Sequence[int]) -> Prefix | None:
        """The longest stored prefix of ``prompt``, at most ``len(prompt) - 1`` positions (the
        last one is always run, for its logits), or None below ``min_tokens``. Marks the entry
        used."""
        ids = np.asarray(prompt, dtype=np.int64)
        best, best_length = None, 0
        with self._lock:
            for key, entry in self._entries.items():
                if len(entry.tokens) <= best_length or entry.tokens[0] != ids[0]:
                    continue
                length = _common_prefix(entry.tokens, ids)
                if length > best_length:
                    best, best_length = key, length
            best_length = min(best_length, len(ids) - 1)
            if best is None or best_length < self.min_tokens:
                return None
            entry = self._entries[best]
            self._entries.move_to_end(best)
        return Prefix(entry.keys, entry.values, entry.routes, best_length)

    def insert(self, tokens: Sequence[int], keys: list[torch.Tensor], values: list[torch.Tensor],
               routes: torch.Tensor | None, epoch: int) -> bool:
        """Store the keys and values of ``tokens`` (per layer ``[kv_heads, len(tokens), D]``) and
        their routes, computed in ``epoch``; True if stored. Not stored: a stale epoch, a sequence
        shorter than ``min_tokens`` or longer than ``max_tokens``, or one that a stored sequence
        already starts with (that entry is marked used instead). Stored entries that the new
        sequence extends are dropped, then the least recently used ones until it fits."""
        ids = np.asarray(tokens, dtype=np.int64)
        if not self.min_tokens <= len(ids) <= self.max_tokens:
            return False
        with self._lock:
            if epoch != self.epoch:
                return False
            common = {key: _common_prefix(entry.tokens, ids) for key, entry in self._entries.items()}
            for key, length in common.items():
                if length == len(ids):  # already covered
                    self._entries.move_to_end(key)
                    return False
            for key, length in common.items():
                if length == len(self._entries[key].tokens):  # the new sequence extends it
                    self.tokens -= length
                    del self._entries[key]
            while self.tokens + len(ids) > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self.tokens -= len(evicted.tokens)
            self._entries[tuple(ids.tolist())] = _Entry(ids, keys, values, routes)
            self.tokens += len(ids)
        return True


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
        prefix_cache_tokens: int = 0,
    ):
        """``batch_invariant``: decode Llama/Qwen-style models with ``inference.invariant``, so that
        a row's result does not depend on its batch (see module doc); False takes the previous
        decoder, a shared left-padded prefill and ``LeanDecoder`` steps, 4-17% faster
        (docs/LOG.md, 2026-12-03), kept as the benchmark's reference. Other architectures always
        run through their transformers forward and are not batch-invariant, and so do models
        converted with NVFP4 activations scaled per tensor (``invariant.batch_dependent_format``).

        ``prefix_cache_tokens``: keep the keys and values of up to that many positions of earlier
        calls, so that a prompt extending a previous prompt and completion prefills only its new
        tokens (module doc, prefix cache); 0 (the default) keeps no cache and changes nothing.
        Used by the batch-invariant decoder only; ``prefix_cache`` is None where it does not
        apply."""
        if prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
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
        # converted ([numerics]) modules are followed by the invariant decoder, except for NVFP4
        # activations with one scale per tensor, which depend on the batch by definition
        self.batch_invariant = batch_invariant and self.lean and batch_dependent_format(model) is None
        self._seed_rng = np.random.default_rng()
        # in-flight updates (module doc): the lock guards the two fields below and every copy into
        # the parameters
        self._weights_lock = threading.Lock()
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None  # waiting for the next forward
        self._generating = 0  # generate calls running
        self.prefix_cache = (PrefixCache(prefix_cache_tokens)
                             if prefix_cache_tokens and self.batch_invariant else None)
        if self.prefix_cache is not None:
            mmap_large_allocations()  # its churn of megabyte buffers would otherwise pile up (module doc)
        self.stats = EngineStats()

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
        if self.prefix_cache is not None:  # its keys and values belong to the weights just replaced
            self.prefix_cache.invalidate()

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
        if params.speculative == "mtp":
            from opencomposer.inference.speculative import speculative_support

            why = speculative_support(self)
            if why is not None:
                raise ValueError(f'sampling.speculative = "mtp": {why}')
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
        if params.speculative == "mtp":
            from opencomposer.inference.speculative import speculative_chunk

            return speculative_chunk(self, prompts, indices, params, n, seed, row_seeds)
        lengths, input_ids, mask, position_ids = self._left_padded(prompts, indices)
        width = input_ids.shape[1]
        rows = [Row(r * n + j, i, j, lengths[r]) for r, i in enumerate(indices) for j in range(n)]
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
        cache = self.prefix_cache
        epoch = cache.epoch if cache is not None else 0  # weights the chunk's rows are computed with
        prefixes = [cache.lookup(prompts[i]) for i in indices] if cache is not None else None
        reused = sum(p.length for p in prefixes if p is not None) if prefixes is not None else 0
        self.stats.prefills += len(indices)
        self.stats.prefix_hits += sum(p is not None for p in prefixes) if prefixes is not None else 0
        self.stats.prefill_tokens += sum(lengths) - reused
        self.stats.prefill_tokens_reused += reused
        with RouteRecorder(self.model) as recorder:
            if self.batch_invariant:
                decoder = InvariantDecoder(self.model, recorder)
            else:
                decoder = LeanDecoder(self.model) if self.lean else HFDecoder(self.model)
            if prefixes is not None:
                logits = decoder.prefill(input_ids.to(dev), mask.to(dev), position_ids.to(dev), prefixes)
            else:
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
                    if cache is not None:
                        dropped = set(range(len(live))) - set(needs_forward)
                        self._store_rows(decoder, [(k, live[k]) for k in sorted(dropped)], prompts, epoch)
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
            if cache is not None:
                self._store_rows(decoder, list(enumerate(live)), prompts, epoch)
        return [self._completion(row, first_version) for row in rows]

    def _left_padded(self, prompts: list[list[int]], indices: list[int]
                     ) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chunk's prompts as a left-padded batch: lengths, input ids, mask (1 on real tokens)
        and position ids, ``[prompts, longest]``."""
        lengths = [len(prompts[i]) for i in indices]
        width = max(lengths)
        input_ids = torch.full((len(indices), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        for r, i in enumerate(indices):
            input_ids[r, width - lengths[r] :] = torch.tensor(prompts[i])
            mask[r, width - lengths[r] :] = 1
        return lengths, input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _store_rows(
        self, decoder: InvariantDecoder, rows: list[tuple[int, Row]], prompts: list[list[int]], epoch: int
    ) -> None:
        """Put each ``(cache row, row)`` into the prefix cache: the positions it has fed, which
        are its prompt and the sampled tokens fed back (a finished row that rode along was fed
        its last token again after that, at a position past them)."""
        for k, row in rows:
            prompt = prompts[row.prompt_index]
            length = min(row.position, len(prompt) + len(row.tokens))
            if self.is_moe:
                length = min(length, len(prompt) + len(row.routes))
            if not self.prefix_cache.min_tokens <= length <= self.prefix_cache.max_tokens:
                continue
            tokens = (prompt + row.tokens)[:length]
            routes = None
            if self.is_moe:  # [length, moe_layers, top_k]: the prefill's, then those of the fed tokens
                fed = row.routes[: length - len(prompt)]
                routes = np.concatenate([row.prompt_routes, np.stack(fed).astype(self.route_dtype)]) if fed \
                    else row.prompt_routes
                routes = torch.from_numpy(routes)
            keys, values = decoder.row_prefix(k, length)
            self.prefix_cache.insert(tokens, keys, values, routes, epoch)

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
        self, row: Row, token: int, params: SamplingParams, stop_ids: set[int], stop_window: int,
        position: int | None = None,
    ) -> str | None:
        """Why the row stops after ``token`` (appended already), at sequence position ``position``
        (default: the row's next position to feed, where a plain decode step puts it), or None."""
        position = row.position if position is None else position
        if token in stop_ids:
            return "stop"
        if params.stop:
            tail = self.tokenizer.decode(row.tokens[-stop_window:], skip_special_tokens=False)
            if any(s in tail for s in params.stop):
                return "stop"
        if len(row.tokens) >= params.max_new_tokens or position + 1 >= self.max_positions:
            return "length"
        return None

    def _completion(self, row: Row, version: int) -> Completion:
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
