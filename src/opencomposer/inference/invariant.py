"""Batch-invariant decoding: a row's logits do not depend on which rows share its batch.

Why a row can depend on its batch at all. Floating-point addition is not associative, so a sum
is only reproducible if it is always added up in the same order, and the order is chosen by the
kernel, from the *shape* of the whole call. Measured with torch's CPU kernels (MKL sgemm,
docs/LOG.md 2026-12-03):

- ``F.linear(x, W)``: row ``i`` of the result takes one of three values depending on how many
  rows ``x`` has (1 row: a matrix-vector kernel; 2-3: a small-matrix kernel; 4 and more: the
  blocked kernel), and with two threads also on the row's position (the last rows of a
  thread's share go through the small kernel). The MoE experts of transformers multiply the
  tokens routed to each expert as one group, so a token's result depends on how many others
  chose its expert.
- ``scaled_dot_product_attention``: a row's output changes with the padded key length (the
  kernel's vector loop and block split follow it), with the amount of left padding, and with two
  threads with the number of rows.
- Elementwise transcendental ops (``silu``, ``sigmoid``) compute the vector tail of a tensor with
  the scalar formula, which rounds differently: the row that lands in the tail is off by an ulp.

What this module does instead, for the decode steps of Llama/Qwen-style models:

1. **Fixed-shape matmuls.** Every matmul runs as a batch of independent ``[TILE, K] @ [K, N]``
   problems (``tiled_linear``): the rows are padded to a multiple of ``TILE`` and each tile is
   its own problem of one ``bmm`` call. The kernel sees one shape whatever the batch, so every
   row is reduced in the same order; only the number of problems changes. That holds for the
   attention projections, the router, the LM head and each expert (the tokens routed to an
   expert are tiled like any other rows, so the group size no longer matters).
2. **Keys reduced in fixed blocks from each row's own start.** A row's keys and values sit at
   positions ``0 .. length-1`` of its cache row (no left padding). Attention splits the keys into
   blocks of ``BLOCK``; scores and the weighted sum of values are fixed-shape products per block,
   and the blocks are added in index order. Blocks past a row's end (present because a longer
   row shares the batch) have weight exactly 0 and add exact zeros.
3. **Prefill per prompt.** A prompt is prefilled on its own, so its cache and first logits are a
   function of the prompt alone; ``n`` samples of it copy that cache.
4. **Activations on whole tiles.** ``silu`` runs on tile-padded tensors whose size is a multiple
   of the vector width, so no row sits in a scalar tail.
5. **Converted models in their format.** A module converted by ``[numerics]`` (``QuantizedLinear``,
   ``QuantizedExperts``) is followed, not bypassed: a tile's rows are quantised as the module's
   forward quantises its input (MXFP8 blocks and per-token NVFP4 scales are row-local), the
   weight is quantised once per weight version, and the dispatch and combine roundings are
   applied as the module applies them. NVFP4 activations with one scale per tensor depend on
   every row by definition; the engine does not use this decoder for them
   (``batch_dependent_format``).

Routing in the MoE layers is computed here too (router logits through ``tiled_linear``, then the
model's softmax / top-k / renormalisation), and the chosen experts go to the ``RouteRecorder``;
the routes of each prompt's prefill (through the model's own router modules) are taken row by row
into ``InvariantDecoder.prompt_routes``.

**Reused prefixes.** ``prefill`` can start a prompt from the keys and values of its first
positions computed by an earlier call (a ``Prefix``, from ``LocalEngine``'s prefix cache) and run
only the rest of the prompt, attending to those keys; the prefix's recorded routes stand in for
the routes of its positions, so ``prompt_routes`` still covers the whole prompt. ``row_prefix``
copies a row's keys and values out of the decode cache for the engine to store. A reused prefix
changes rounding, not results: its keys and values were written by an earlier prefill and by
decode steps (``tiled_linear``), where a fresh prefill of the same tokens would compute them with
one ``F.linear`` over the whole prompt, so the logits agree with a fresh prefill to float32
rounding, not bit for bit (see ``inference.local``).

What it guarantees: with the same weights, torch build and thread count, a (prompt, seed) pair
gives the same tokens, log-probabilities (bit for bit) and routes whatever else is in the call.
What it does not: equality with the fast path (``LeanDecoder``) or with the transformers forward,
which reduce in other orders (both agree with it to float32 rounding); other machines or thread
counts; architectures outside ``decoders.LEAN_MODEL_TYPES``. The premise of rule 1, that a
fixed-shape problem is reduced the same way in every slot of its tile and whatever the number of
problems, is a property of the BLAS; ``tests/inference/test_invariant.py`` checks it on the
machine it runs on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from opencomposer.inference.decoders import LeanDecoder, lean_supported
from opencomposer.model.routing import RouteRecorder
from opencomposer.numerics.convert import QuantizedExperts
from opencomposer.numerics.qlinear import NVFP4Spec, QuantizedLinear, combine_round, fake_quantize

TILE = 16
"""Rows per matmul problem: the fastest of 8, 16 and 32 on the tiny MoE (docs/LOG.md, 2026-12-03);
the LM head runs about as fast as one plain GEMM."""

BLOCK = 64
"""Keys per attention block; cache capacities are multiples of it."""


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [rows, K] with zero rows appended up to a multiple of ``TILE``: [tiles * TILE, K]."""
    rows = x.shape[0]
    padded = -(-rows // TILE) * TILE
    if padded == rows:
        return x.contiguous()
    out = x.new_zeros(padded, x.shape[1])
    out[:rows] = x
    return out


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` with ``x`` [tiles * TILE, K] (see ``pad_rows``), ``weight`` [N, K]:
    one ``[TILE, K] @ [K, N]`` problem per tile, so a row's result does not depend on the others."""
    tiles = x.shape[0] // TILE
    if tiles * TILE != x.shape[0]:
        raise ValueError(f"tiled_linear: {x.shape[0]} rows is not a multiple of TILE = {TILE}")
    out = torch.bmm(x.view(tiles, TILE, -1), weight.T.expand(tiles, *weight.T.shape))  # [tiles, TILE, N]
    out = out.view(tiles * TILE, -1)
    return out if bias is None else out + bias


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``tiled_linear`` for any number of rows: [rows, K] -> [rows, N]."""
    return tiled_linear(pad_rows(x), weight, bias)[: x.shape[0]]


def batch_dependent_format(model: nn.Module) -> str | None:
    """Why ``model``'s [numerics] conversion keeps its decode from being batch-invariant, or None.

    A converted module quantises its input per row (MXFP8 blocks run along a row; NVFP4 with one
    FP32 scale per token) except NVFP4 activations with one scale per tensor, which takes its
    scale from every row of the call."""
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedLinear, QuantizedExperts)):
            spec = module.recipe.forward_input
            if isinstance(spec, NVFP4Spec) and spec.scale_granularity != "token":
                return (f"{name}: NVFP4 activations with one scale per tensor "
                        "(numerics.nvfp4_activation_scale = \"tensor\") take it from every row of the call")
    return None


def forward_weight(module: nn.Module, name: str) -> torch.Tensor:
    """``module.<name>`` as a converted module's forward quantiser leaves it ([N, K], or [E, N, K]
    quantised expert matrix by expert matrix, as ``QuantizedExperts`` does), computed once and kept
    on the module until the parameter changes (an optimizer step or a weight load bumps its
    version; a write through ``.data`` would not, and the project writes weights with ``copy_``)."""
    weight = getattr(module, name)
    key = (weight._version, weight.data_ptr())
    cache = module.__dict__.setdefault("_invariant_weights", {})
    hit = cache.get(name)
    if hit is None or hit[0] != key:
        spec = module.recipe.forward_weight
        with torch.no_grad():
            if weight.ndim == 3:
                quantized = torch.stack([fake_quantize(matrix, spec) for matrix in weight])
            else:
                quantized = fake_quantize(weight, spec)
        hit = cache[name] = (key, quantized)
    return hit[1]


def project(x: torch.Tensor, linear: nn.Module) -> torch.Tensor:
    """``linear(x)`` on tile-padded rows (``pad_rows``), for an ``nn.Linear`` or a converted
    ``QuantizedLinear``: its input quantised row by row, its weight as its forward leaves it, and
    the bias added after, as ``numerics.qlinear.quantized_linear`` does."""
    if isinstance(linear, QuantizedLinear):
        x = fake_quantize(x, linear.recipe.forward_input)
        return tiled_linear(x, forward_weight(linear, "weight"), linear.bias)
    return tiled_linear(x, linear.weight, linear.bias)


def dense_mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama/Qwen gated MLP, ``down(act(gate(x)) * up(x))``, on [rows, H]."""
    padded = pad_rows(x)
    gate = project(padded, mlp.gate_proj)
    up = project(padded, mlp.up_proj)
    return project(mlp.act_fn(gate) * up, mlp.down_proj)[: x.shape[0]]


def sparse_moe(block: nn.Module, x: torch.Tensor, recorder: RouteRecorder | None) -> torch.Tensor:
    """A Qwen3-MoE sparse block on [rows, H]: route, then each expert on its tokens, tiled.

    A token's output is the sum over its top-k slots in slot order, as transformers adds them.
    Converted experts (``QuantizedExperts``) quantise as their forward does: the tokens to MXFP8
    before dispatch when configured, each matmul's input row by row and its weight per expert
    matrix, and the expert outputs rounded to BF16 before the combine."""
    router, experts = block.gate, block.experts
    recipe = experts.recipe if isinstance(experts, QuantizedExperts) else None
    dispatch = recipe is not None and experts.quantize_dispatch
    tokens = fake_quantize(x, experts.dispatch_spec) if dispatch else x
    rows, top_k = x.shape[0], router.top_k
    logits = linear_rows(x, router.weight)  # [rows, E]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, top_k, dim=-1)  # [rows, k]
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(logits.dtype).view(-1, 1)  # [rows * k, 1], pair p = (token p // k, slot p % k)
    if recorder is not None:
        recorder.record(chosen)
    pairs = torch.argsort(chosen.view(-1), stable=True)  # grouped by expert
    counts = torch.bincount(chosen.view(-1), minlength=router.num_experts).tolist()
    out = x.new_zeros(rows * top_k, x.shape[1])  # [pairs, H]
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        mine = pairs[start : start + count]
        start += count
        inputs = pad_rows(tokens[mine // top_k])  # [tiles * TILE, H]
        if recipe is None:
            hidden = tiled_linear(inputs, experts.gate_up_proj[expert])  # [tiles * TILE, 2I]
            gate, up = hidden.chunk(2, dim=-1)
            hidden = tiled_linear(experts.act_fn(gate) * up, experts.down_proj[expert])[:count]  # [count, H]
        else:
            hidden = tiled_linear(fake_quantize(inputs, recipe.forward_input),
                                  forward_weight(experts, "gate_up_proj")[expert])
            gate, up = hidden.chunk(2, dim=-1)
            hidden = tiled_linear(fake_quantize(experts.act_fn(gate) * up, recipe.forward_input),
                                  forward_weight(experts, "down_proj")[expert])[:count]
            if dispatch:
                hidden = combine_round(hidden)
        out[mine] = hidden * weights[mine]
    return out.view(rows, top_k, -1).sum(dim=1)


def block_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per row against that row's first ``lengths[r]`` keys.

    ``q`` [rows, heads, D]; ``keys``, ``values`` [rows, kv_heads, capacity, D], contiguous, with
    capacity a multiple of ``BLOCK``; grouped-query heads ``h`` read kv head ``h // (heads /
    kv_heads)``. Returns [rows, heads, D]. Every block of the capacity is computed (those past all
    rows' ends add zeros): slicing the cache instead would make the products copy it."""
    rows, heads, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    blocks = keys.shape[2] // BLOCK
    k = keys.view(rows, kv_heads, blocks, BLOCK, dim)
    v = values.view(rows, kv_heads, blocks, BLOCK, dim)
    q = (q * scale).view(rows, kv_heads, 1, group, dim)
    scores = torch.matmul(q, k.transpose(-1, -2))  # [rows, kv_heads, blocks, group, BLOCK]
    position = torch.arange(blocks * BLOCK, device=q.device).view(1, 1, blocks, 1, BLOCK)
    scores.masked_fill_(position >= lengths.view(rows, 1, 1, 1, 1), float("-inf"))
    top = scores.amax(dim=(2, 4), keepdim=True)  # [rows, kv_heads, 1, group, 1]
    weights = scores.sub_(top).exp_()
    numerator = torch.matmul(weights, v).sum(dim=2)  # [rows, kv_heads, group, D], blocks in index order
    denominator = weights.sum(dim=4, keepdim=True).sum(dim=2)  # [rows, kv_heads, group, 1]
    return (numerator / denominator).view(rows, heads, dim)


class BlockCache:
    """Keys and values of one layer, ``[rows, kv_heads, capacity, D]``; row r's key t at index t.

    Unwritten slots stay zero, so a zero attention weight times them is an exact zero. The
    capacity grows one block at a time, since attention computes all of it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.k, self.v = keys, values

    def write(self, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> None:
        """Put ``k``, ``v`` [rows, kv_heads, D] at slot ``index[r]`` of each row, growing by doubling."""
        need = int(index.max()) + 1
        if need > self.k.shape[2]:
            capacity = -(-need // BLOCK) * BLOCK
            grown_k = self.k.new_zeros(*self.k.shape[:2], capacity, self.k.shape[3])
            grown_v = self.v.new_zeros(*self.v.shape[:2], capacity, self.v.shape[3])
            grown_k[:, :, : self.k.shape[2]] = self.k
            grown_v[:, :, : self.v.shape[2]] = self.v
            self.k, self.v = grown_k, grown_v
        rows = torch.arange(k.shape[0], device=k.device)
        self.k[rows, :, index] = k
        self.v[rows, :, index] = v


@dataclass(frozen=True)
class Prefix:
    """The first ``length`` positions of a prompt, computed by an earlier call, to start its prefill from.

    ``keys``, ``values``: one tensor per layer, ``[kv_heads, >= length, head_dim]`` (only the first
    ``length`` slots are read, so one stored sequence serves every shorter prefix of itself);
    ``routes``: ``[>= length, moe_layers, top_k]`` expert indices of those positions, None for
    dense models."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: torch.Tensor | None
    length: int


class InvariantDecoder:
    """Prefill and decode whose every row is computed independently of the others (module doc).

    Same four operations as ``decoders.LeanDecoder``; the engine's position ids double as cache
    slots, since no row is padded."""

    def __init__(self, model: nn.Module, recorder: RouteRecorder | None = None):
        if not lean_supported(model):
            raise ValueError(
                f"batch-invariant decoding supports Llama/Qwen-style models, not model_type "
                f"{model.config.model_type!r}"
            )
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.recorder = recorder
        attention = self.layers[0].self_attn
        experts = getattr(self.layers[0].mlp, "experts", None)
        if experts is not None and (getattr(experts, "is_transposed", False) or getattr(experts, "has_bias", False)):
            raise ValueError("batch-invariant decoding expects experts stored [E, out, in] without biases")
        reason = batch_dependent_format(model)
        if reason is not None:
            raise ValueError(f"batch-invariant decoding: {reason}")
        self.apply_rotary = sys.modules[type(attention).__module__].apply_rotary_pos_emb
        self.head_dim = attention.head_dim
        self.scaling = attention.scaling
        self.cache: list[BlockCache] = []
        self.prompt_routes: list[torch.Tensor] = []  # per prefilled row, [length, moe_layers, top_k]
        self.keep_hidden = False  # prefill keeps each row's final-norm hidden states (MTP drafts)
        self.prompt_hidden: list[torch.Tensor] = []  # per prefilled row, [length, H], when keep_hidden
        self.last_hidden: torch.Tensor | None = None  # the last step's, [rows, T, H]

    def prefill(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
        prefixes: list[Prefix | None] | None = None,
    ) -> torch.Tensor:
        """Each row of the left-padded ``input_ids`` [rows, T] on its own; logits [rows, 1, V].
        With a recorder on an MoE model, ``prompt_routes`` then holds each row's routes.

        ``prefixes`` (one per row, None where there is none): row ``r`` starts from the keys and
        values of its first ``prefixes[r].length`` positions, which must be shorter than the row,
        and only the rest of it is run (``_prefill_after``)."""
        lengths = mask.sum(dim=1).tolist()
        width = input_ids.shape[1]
        capacity = -(-(max(lengths) + 1) // BLOCK) * BLOCK
        logits, keys, values = [], [], []
        self.prompt_routes = []
        self.prompt_hidden = []
        for r, length in enumerate(lengths):
            alone = LeanDecoder(self.model)
            alone.keep_hidden = self.keep_hidden and prefixes is None
            ids = input_ids[r : r + 1, width - length :]
            row_positions = positions[r : r + 1, width - length :]
            prefix = prefixes[r] if prefixes is not None else None
            if prefix is None:
                logits.append(alone.prefill(ids, torch.ones_like(ids), row_positions))
                routes = self.recorder.take(1, length) if self.recorder is not None else None
            else:
                if not 0 < prefix.length < length:
                    raise ValueError(f"prefill: a prefix of {prefix.length} positions for a row of {length}")
                logits.append(self._prefill_after(alone, prefix, ids[:, prefix.length :],
                                                  row_positions[:, prefix.length :]))
                routes = self.recorder.take(1, length - prefix.length) if self.recorder is not None else None
                if routes is not None:
                    known = prefix.routes[: prefix.length].to(device=routes.device, dtype=routes.dtype)
                    routes = torch.cat([known, routes[0]])[None]
            if routes is not None:
                self.prompt_routes.append(routes[0])
            if alone.keep_hidden:
                self.prompt_hidden.append(alone.hidden[0])
            keys.append([kv.k[0, :, :length] for kv in alone.cache])
            values.append([kv.v[0, :, :length] for kv in alone.cache])
        self.cache = []
        for layer in range(len(self.layers)):
            k = keys[0][layer].new_zeros(len(lengths), keys[0][layer].shape[0], capacity, self.head_dim)
            v = torch.zeros_like(k)
            for r, length in enumerate(lengths):
                k[r, :, :length] = keys[r][layer]
                v[r, :, :length] = values[r][layer]
            self.cache.append(BlockCache(k, v))
        return torch.cat(logits)

    def _prefill_after(
        self, alone: LeanDecoder, prefix: Prefix, ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run the rest of a row, ``ids`` [1, S] at ``positions`` (``prefix.length`` onwards), on
        ``alone`` with its cache preloaded with the prefix; logits of the last position [1, 1, V].

        The prefix's keys are copied into a buffer sized for the whole row, so the lean decoder
        appends the new ones in place; the mask lets each new position see every prefix position
        and the new ones up to itself. The lean decoder's own ``prefill`` builds a square causal
        mask over its input, which cannot describe keys that precede the input, so this drives its
        forward directly, the glue it shares with ``prefill``."""
        start, width = prefix.length, ids.shape[1]
        for kv, k, v in zip(alone.cache, prefix.keys, prefix.values):
            kv.k = k.new_empty(1, k.shape[0], start + width, k.shape[2])
            kv.v = v.new_empty(1, v.shape[0], start + width, v.shape[2])
            kv.k[0, :, :start] = k[:, :start]
            kv.v[0, :, :start] = v[:, :start]
            kv.length = start
        attend = torch.ones(width, start + width, dtype=torch.bool, device=ids.device).tril(diagonal=start)
        return alone._forward(ids, positions, attend[None, None], last_only=True)

    def row_prefix(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the keys and values of the first ``length`` positions of cache row ``row``,
        one ``[kv_heads, length, head_dim]`` tensor per layer each (copies, so that a stored
        prefix does not keep the whole batch's cache alive)."""
        keys = [kv.k[row, :, :length].clone() for kv in self.cache]
        values = [kv.v[row, :, :length].clone() for kv in self.cache]
        return keys, values

    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed ``T`` tokens per row (``token_ids``, ``positions`` [rows, T]); logits [rows, T, V].

        Token ``t`` of a row attends to the row's keys up to its own position, those of tokens
        ``< t`` of the same call included. Each of the ``rows × T`` tokens is one row of the tiled
        matmuls and one query of ``block_attention``, so a token's logits are bit for bit what
        feeding the tokens one call at a time gives (speculative decoding verifies drafts this
        way). A row's keys past its position are never read, so a later call may overwrite a
        rejected draft's slot. The final-norm hidden states stay in ``last_hidden`` [rows, T, H]."""
        rows, width = token_ids.shape
        hidden = self.inner.embed_tokens(token_ids)  # [rows, T, H]
        cos, sin = self.inner.rotary_emb(hidden, positions)
        hidden = hidden.reshape(rows * width, -1)  # token (r, t) at r * T + t
        for layer, kv in zip(self.layers, self.cache):
            attn = layer.self_attn
            x = pad_rows(layer.input_layernorm(hidden))
            flat = rows * width
            q = project(x, attn.q_proj)[:flat].view(rows, width, -1, self.head_dim)
            k = project(x, attn.k_proj)[:flat].view(rows, width, -1, self.head_dim)
            v = project(x, attn.v_proj)[:flat].view(rows, width, -1, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [rows, heads, T, D]
            for t in range(width):
                kv.write(k[:, :, t], v[:, t], positions[:, t])
            out = torch.stack([block_attention(q[:, :, t], kv.k, kv.v, positions[:, t] + 1, self.scaling)
                               for t in range(width)], dim=1)  # [rows, T, heads, D]
            hidden = hidden + project(pad_rows(out.reshape(flat, -1)), attn.o_proj)[:flat]
            x = layer.post_attention_layernorm(hidden)
            if hasattr(layer.mlp, "experts"):
                hidden = hidden + sparse_moe(layer.mlp, x, self.recorder)
            else:
                hidden = hidden + dense_mlp(layer.mlp, x)
        hidden = self.inner.norm(hidden)
        self.last_hidden = hidden.view(rows, width, -1)
        return linear_rows(hidden, self.model.lm_head.weight, self.model.lm_head.bias).view(rows, width, -1)

    def repeat(self, n: int) -> None:
        for kv in self.cache:
            kv.k = kv.k.repeat_interleave(n, dim=0)
            kv.v = kv.v.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        for kv in self.cache:
            kv.k, kv.v = kv.k[rows], kv.v[rows]
