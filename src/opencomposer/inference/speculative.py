"""Speculative decoding with the model's own MTP layer as the drafter (``sampling.speculative = "mtp"``).

The depth-1 MTP layer (``model.mtp``, ``opencomposer.model.mtp``) reads the main model's hidden
state at position ``i`` and the token at ``i + 1`` and guesses the distribution of the token at
``i + 2``. So once the main model has produced the logits for the next token and that token is
sampled (the *pending* token, not yet fed), the MTP layer drafts the token after it, and one
forward of the main model over ``[pending, draft]`` both scores the draft and yields the logits
after it. Each forward emits one token (draft rejected) or two (accepted), plus the bonus token
drawn from the logits after an accepted draft.

**Lossless.** Let ``p`` be the distribution the plain sampler would draw the token from (logits
over temperature, cut by top-k / top-p, renormalised: ``inference.sampling``) and ``q`` the same
transform of the draft logits. The draft ``d ~ q`` is kept with probability ``min(1, p(d) /
q(d))``; otherwise the token is drawn from ``max(0, p - q)`` renormalised. The token is then
distributed exactly as ``p`` whatever ``q`` is (Leviathan et al. 2023; Chen et al. 2023), so the
drafter's quality changes the speed, never the output distribution (``tests/inference/
test_speculative.py`` tests it statistically at temperature 1). At temperature 0 the draft is
the MTP argmax, kept when it is the main argmax, and replaced by the main argmax otherwise: the
output is plain greedy decoding's. Logprobs are those of ``p`` for every emitted token (what the
plain sampler records, and what the trainer scores), never of ``q`` or of the residual.

**Exact, not only in distribution.** The main model's tokens are fed through
``InvariantDecoder.step`` with two tokens a row, whose logits are bit for bit those of feeding
the same tokens one call at a time. So at temperature 0 the tokens and logprobs equal plain
decoding's bit for bit, and a row still does not depend on what shares its batch: the MTP
layer's forward is tiled the same way (``inference.invariant``) and each row draws its uniform
numbers (four per forward: bonus, draft, accept, residual) from its own generator.

**Routes and versions.** A token's route is recorded when it is fed: the pending token's and an
accepted draft's from the verifying forward; a rejected draft's route is dropped with it. Tokens
from one forward carry the version of the weights that forward ran with.

**What it needs, and what it does not do.** An MTP layer (``model.num_mtp_layers``, trained by the
``mtp`` loss of ``[[pretrain.phases]]``) and the batch-invariant decoder (Llama/Qwen-style
models, ``LocalEngine(batch_invariant=True)``, the default); other setups are refused with the
reason. Depth 1 only: further MTP layers are trained but not used to draft. The prefix cache is
not read or written by speculative calls (the drafter needs the hidden state of every prompt
position, which a reused prefix does not recompute). The MTP layer keeps its own keys and
values per row; a rejected draft's slots in both caches are overwritten by the next forward.
``LocalEngine.stats`` counts ``draft_tokens`` and ``draft_accepted``. RL does not train the MTP
layers: as the policy moves away from the checkpoint they were distilled on, fewer drafts are
kept (slower, never wrong); distil them again in a ``["mtp"]`` phase on the new checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from opencomposer.inference.invariant import (
    BLOCK,
    BlockCache,
    InvariantDecoder,
    block_attention,
    linear_rows,
    pad_rows,
    tiled_linear,
)
from opencomposer.inference.rows import Row, row_seed, sample_tokens
from opencomposer.inference.sampling import kept_tokens, prefix_sums, truncated_logprobs, truncates
from opencomposer.model.mtp import apply_rope, mtp_layers, rope, rope_base
from opencomposer.model.routing import RouteRecorder
from opencomposer.numerics.convert import is_converted
from opencomposer.types import Completion, SamplingParams


def speculative_support(engine: Any) -> str | None:
    """Why ``engine`` cannot decode with MTP drafts, or None when it can. ``engine``, here and below,
    is the calling ``inference.local.LocalEngine``, typed ``Any``: that module imports this one."""
    if not mtp_layers(engine.model):
        return ("the model has no MTP layers (set model.num_mtp_layers and train them with the 'mtp' loss of "
                "[[pretrain.phases]])")
    if not engine.batch_invariant:
        return ("speculative decoding runs on the batch-invariant decoder (Llama/Qwen-style models with "
                "LocalEngine(batch_invariant=True))")
    if is_converted(engine.model):
        return ("speculative decoding of a [numerics]-converted model is not supported: the MTP draft "
                "step reads the unquantised weights")
    return None


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """log p over the vocabulary, ``[B, V]``: the distribution the sampler draws from and records
    (temperature, top-k / top-p cut, renormalised); at temperature 0 the log-softmax, which greedy
    decoding records."""
    if params.temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / params.temperature
    keep = kept_tokens(scaled, params.top_p, params.top_k) if truncates(params.top_p, params.top_k) else None
    return truncated_logprobs(scaled, keep)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of (unnormalised) ``probs`` [B, V] by inverse CDF in vocabulary order."""
    cdf = prefix_sums(probs)
    total = cdf[:, -1]
    point = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point[:, None], right=True)[:, 0].clamp(max=probs.shape[1] - 1)


def verify_drafts(p_log: torch.Tensor, q_log: torch.Tensor, drafts: torch.Tensor, u_accept: torch.Tensor,
                  u_residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of one drafted position per row: ``(tokens, accepted)``, ``[B]`` each.

    ``p_log``, ``q_log`` [B, V]: log-probabilities of the target and of the draft distribution
    (``sampling_logprobs``); ``drafts`` [B] were drawn from ``q``. A draft is kept when
    ``u_accept < p(d) / q(d)``; otherwise the token is drawn from ``max(0, p - q)`` with
    ``u_residual``. The token is distributed as ``p`` (module doc)."""
    p, q = p_log.exp(), q_log.exp()
    p_d = p.gather(1, drafts[:, None])[:, 0]
    q_d = q.gather(1, drafts[:, None])[:, 0]
    accepted = u_accept * q_d < p_d
    residual = draw((p - q).clamp(min=0), u_residual)
    return torch.where(accepted, drafts, residual), accepted


class MTPDrafter:
    """The depth-1 MTP layer run as a drafter, keys and values per row, batch-invariant.

    Cache slot ``i`` of a row holds the layer's key and value at position ``i`` (main hidden state
    at ``i``, token at ``i + 1``). The layer is one block, so a position's key and value need no
    attention: ``prefill`` computes them for a whole prompt at once."""

    def __init__(self, model: torch.nn.Module):
        self.layer = model.mtp.layers[0]
        self.block = self.layer.block
        self.embed = model.get_input_embeddings().weight
        self.head = model.get_output_embeddings()
        self.theta = rope_base(model)
        self.scale = self.block.head_dim ** -0.5
        self.cache: BlockCache | None = None

    def _inputs(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The layer's input rows ``[N, H]`` from main hidden states and next tokens (tiled)."""
        joined = torch.cat([self.layer.enorm(F.embedding(tokens, self.embed)), self.layer.hnorm(hidden)], dim=-1)
        return linear_rows(joined, self.layer.proj.weight)

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries ``[N, heads, D]``, keys and values ``[N, kv_heads, D]`` of input rows ``x``."""
        b = self.block
        y = pad_rows(b.attn_norm(x))
        n = x.shape[0]
        q = tiled_linear(y, b.q_proj.weight)[:n].view(n, b.heads, b.head_dim)
        k = tiled_linear(y, b.k_proj.weight)[:n].view(n, b.kv_heads, b.head_dim)
        v = tiled_linear(y, b.v_proj.weight)[:n].view(n, b.kv_heads, b.head_dim)
        cos, sin = rope(positions, b.head_dim, self.theta, x.dtype)  # [N, D]
        return apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None]), v

    def prefill(self, hidden_rows: list[torch.Tensor], prompts: list[list[int]]) -> None:
        """Keys and values at positions ``0 .. len - 2`` of each prompt (``hidden_rows[r]``: the
        main model's final-norm hidden states of prompt ``r``, ``[len, H]``)."""
        b = self.block
        longest = max(len(p) for p in prompts)
        capacity = -(-(longest + 1) // BLOCK) * BLOCK
        device = self.embed.device
        keys = self.embed.new_zeros(len(prompts), b.kv_heads, capacity, b.head_dim)
        values = torch.zeros_like(keys)
        for r, (hidden, prompt) in enumerate(zip(hidden_rows, prompts, strict=True)):
            if len(prompt) < 2:
                continue
            tokens = torch.tensor(prompt[1:], device=device)
            positions = torch.arange(len(prompt) - 1, device=device)
            _, k, v = self._kv(self._inputs(hidden[: len(prompt) - 1], tokens), positions)
            keys[r, :, : len(prompt) - 1] = k.transpose(0, 1)
            values[r, :, : len(prompt) - 1] = v.transpose(0, 1)
        self.cache = BlockCache(keys, values)

    def step(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Two positions a row (``hidden`` [rows, 2, H], ``tokens``, ``positions`` [rows, 2]): write
        both keys and values, then run the second through the block and the head; draft logits
        [rows, V] for the token two places after the second position's main token."""
        rows = hidden.shape[0]
        b = self.block
        x = self._inputs(hidden.reshape(rows * 2, -1), tokens.reshape(-1))  # [rows * 2, H]
        q, k, v = self._kv(x, positions.reshape(-1))
        k, v, q = k.view(rows, 2, b.kv_heads, -1), v.view(rows, 2, b.kv_heads, -1), q.view(rows, 2, b.heads, -1)
        for t in range(2):
            self.cache.write(k[:, t], v[:, t], positions[:, t])
        out = block_attention(q[:, 1], self.cache.k, self.cache.v, positions[:, 1] + 1, self.scale)
        x = x.view(rows, 2, -1)[:, 1] + linear_rows(out.reshape(rows, -1), b.o_proj.weight)
        y = pad_rows(b.mlp_norm(x))
        gate = tiled_linear(y, b.gate_proj.weight)
        up = tiled_linear(y, b.up_proj.weight)
        x = x + tiled_linear(F.silu(gate) * up, b.down_proj.weight)[:rows]
        return linear_rows(self.layer.norm(x), self.head.weight, self.head.bias)

    def repeat(self, n: int) -> None:
        self.cache.k = self.cache.k.repeat_interleave(n, dim=0)
        self.cache.v = self.cache.v.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.k, self.cache.v = self.cache.k[rows], self.cache.v[rows]


@torch.inference_mode()
def speculative_chunk(engine: Any, prompts: list[list[int]], indices: list[int], params: SamplingParams,
                      n: int, seed: int, row_seeds: Any = None) -> list[Completion]:
    """``LocalEngine._generate_chunk`` with MTP drafts (module doc); same inputs and outputs."""
    dev = engine.device
    lengths, input_ids, mask, position_ids = engine._left_padded(prompts, indices)
    width = input_ids.shape[1]
    rows = [Row(r * n + j, i, j, lengths[r]) for r, i in enumerate(indices) for j in range(n)]
    engine._apply_staged()
    first_version = version = engine.policy_version
    if params.max_new_tokens == 0:
        return [engine._completion(row, first_version) for row in rows]
    # four uniform numbers per row and forward (bonus or first token, draft, accept, residual)
    uniforms = torch.stack([
        torch.rand(params.max_new_tokens + 1, 4, generator=torch.Generator().manual_seed(
            row_seed(seed, row.prompt_index, row.sample_index) if row_seeds is None
            else int(row_seeds[row.prompt_index * n + row.sample_index])))
        for row in rows
    ])  # [rows, forwards, 4]
    forwards = [0] * len(rows)  # per slot: verifying forwards run so far
    stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else engine.eos_ids)
    stop_window = max((len(s) for s in params.stop), default=0) + 8
    engine.stats.prefills += len(indices)
    engine.stats.prefill_tokens += sum(lengths)

    with RouteRecorder(engine.model) as recorder:
        decoder = InvariantDecoder(engine.model, recorder)
        decoder.keep_hidden = True
        logits = decoder.prefill(input_ids.to(dev), mask.to(dev), position_ids.to(dev))
        prompt_routes = engine._prompt_routes(decoder, recorder, lengths, width)
        drafter = MTPDrafter(engine.model)
        drafter.prefill(decoder.prompt_hidden, [prompts[i] for i in indices])
        for row in rows:
            row.prompt_routes = prompt_routes[row.slot // n]
        # the final-norm hidden states at the last two fed positions of each row (one position: twice)
        pair = torch.stack([torch.stack([h[max(len(h) - 2, 0)], h[-1]]) for h in decoder.prompt_hidden])
        pair = pair.repeat_interleave(n, dim=0)  # [rows, 2, H]
        logits = logits[:, -1, :].float().repeat_interleave(n, dim=0)
        decoder.repeat(n)
        drafter.repeat(n)
        tokens, logprobs = sample_tokens(logits, params, uniforms[:, 0, 0].to(dev))
        for row, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            _emit(engine, row, token, logprob, version, params, stop_ids, stop_window, row.position)
        live = rows
        while True:
            needs_forward = [k for k, row in enumerate(live)
                             if row.finish is None or (engine.is_moe and len(row.routes) < len(row.tokens))]
            if not needs_forward:
                break
            dead = len(live) - len(needs_forward)
            if dead and dead >= engine.compact_fraction * len(live):
                keep = torch.tensor(needs_forward, device=dev)
                decoder.select(keep)
                drafter.select(keep)
                pair = pair[keep]
                live = [live[k] for k in needs_forward]
            # 1. draft the token after the pending one, for every live row
            seqs = [prompts[row.prompt_index] + row.tokens for row in live]
            fed = [row.position for row in live]
            # the token each row feeds now: its pending one; a finished row whose tokens were all fed
            # rides along until compaction feeding its last one again (harmless: nothing reads it)
            pending = [s[f] if f < len(s) else s[-1] for s, f in zip(seqs, fed, strict=True)]
            first = [max(f - 2, 0) for f in fed]  # a one-token prompt's first draft reads position 0 twice
            draft_tokens = torch.tensor([[s[min(a + 1, len(s) - 1)], x] for s, a, x in zip(seqs, first, pending, strict=True)],
                                        device=dev)
            draft_pos = torch.tensor([[a, f - 1] for a, f in zip(first, fed, strict=True)], device=dev)
            draft_logits = drafter.step(pair, draft_tokens, draft_pos).float()  # [rows, V]
            q_log = sampling_logprobs(draft_logits, params)
            slots = torch.tensor([row.slot for row in live])
            steps = torch.tensor([forwards[row.slot] + 1 for row in live])
            u = uniforms[slots, steps].to(dev)  # [rows, 4]
            drafts = draft_logits.argmax(-1) if params.temperature == 0 else draw(q_log.exp(), u[:, 1])
            # 2. verify: feed [pending, draft] at [fed, fed + 1]
            engine._apply_staged()
            version = engine.policy_version
            step_ids = torch.stack([torch.tensor(pending, device=dev), drafts], dim=1)
            step_pos = torch.tensor([[f, f + 1] for f in fed], device=dev)
            logits2 = decoder.step(step_ids, step_pos).float()  # [rows, 2, V]
            hidden2 = decoder.last_hidden
            routes = recorder.take(len(live), 2)
            routes = routes.cpu().numpy() if routes is not None else None  # [rows, 2, layers, k]
            p_log = sampling_logprobs(logits2[:, 0], params)
            if params.temperature == 0:
                target = logits2[:, 0].argmax(-1)
                accepted = drafts == target
                tokens = target
            else:
                tokens, accepted = verify_drafts(p_log, q_log, drafts, u[:, 2], u[:, 3])
            # every row's candidates at once (one small op each, not one per row): the verified
            # token and its log p, the bonus token after the draft, the hidden states to draft from
            bonus, bonus_logprobs = sample_tokens(logits2[:, 1], params, u[:, 0])
            token_logprobs = p_log.gather(1, tokens[:, None])[:, 0]
            pair = torch.where(accepted[:, None, None], hidden2, torch.stack([pair[:, 1], hidden2[:, 0]], dim=1))
            tokens, accepted, token_logprobs = tokens.tolist(), accepted.tolist(), token_logprobs.tolist()
            bonus, bonus_logprobs = bonus.tolist(), bonus_logprobs.tolist()
            for k, row in enumerate(live):
                if routes is not None and len(row.routes) < len(row.tokens):
                    row.routes.append(routes[k, 0])  # the pending token, fed now
                if row.finish is not None:  # rode along for that route only (or until compaction)
                    row.position += 1
                    continue
                forwards[row.slot] += 1
                engine.stats.draft_tokens += 1
                _emit(engine, row, tokens[k], token_logprobs[k], version, params, stop_ids, stop_window,
                      row.position + 1)
                if accepted[k]:
                    engine.stats.draft_accepted += 1
                    if routes is not None:
                        row.routes.append(routes[k, 1])  # the draft was fed as the token it became
                    row.position += 2
                    if row.finish is None:  # the bonus token, from the logits after the draft
                        _emit(engine, row, bonus[k], bonus_logprobs[k], version, params, stop_ids, stop_window,
                              row.position)
                else:
                    row.position += 1
    return [engine._completion(row, first_version) for row in rows]


def _emit(engine: Any, row: Any, token: int, logprob: float, version: int, params: SamplingParams,
          stop_ids: set[int], stop_window: int, index: int) -> None:
    """Append a sampled token at sequence position ``index`` and settle whether the row finished."""
    row.tokens.append(token)
    row.logprobs.append(logprob)
    row.versions.append(version)
    row.finish = engine._finish_reason(row, token, params, stop_ids, stop_window, position=index)
