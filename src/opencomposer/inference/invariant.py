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
2. **Keys reduced in fixed blocks from each row's own start.** A row's keys and values sit in
   blocks of ``BLOCK`` positions from its position 0, no left padding (``PagedCache``: the full
   blocks of each prompt once, in a pool that the prompt's ``n`` samples share; the rest of each
   row, its prompt's partial last block and the decoded positions, in a dense cache of its own).
   For each (query, block) pair the scores and the weighted sum of values are fixed-shape
   products; a query's maximum over its keys is exact in any order; and its blocks are added as a
   balanced tree over a power-of-two number of slots, zeros past its last block
   (``combine_blocks``), which is the same sum however many blocks the longest row has. All
   rows' pairs of a layer go through one batched product per kind of block
   (``planned_attention``): a shared block is one ``[SHARED_ROWS * group, D] @ [D, BLOCK]``
   problem for up to ``SHARED_ROWS`` rows at once (one slot each, so a row's result does not
   depend on who fills the others), an own block one ``[group, D] @ [D, BLOCK]`` problem. Which
   kind a block is depends on the row alone (its prompt's length), so a row's result does not
   depend on its batch; the products on a prompt's blocks are 8 rows wide instead of one.
3. **Prefill per prompt.** A prompt is prefilled on its own, so its cache and first logits are a
   function of the prompt alone; its ``n`` samples share its full blocks (``PagedCache.repeat``).
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
    one ``[TILE, K] @ [K, N]`` problem per tile, so a row's result does not depend on the others.

    A weight larger than ``CHUNK_BYTES`` (the LM head) is taken ``chunk_columns`` output columns at a
    time, each chunk by every tile before the next: ``[TILE, K] @ [K, chunk]`` problems, of shapes
    fixed by the weight, that read the weight once from memory instead of once per tile."""
    tiles = x.shape[0] // TILE
    if tiles * TILE != x.shape[0]:
        raise ValueError(f"tiled_linear: {x.shape[0]} rows is not a multiple of TILE = {TILE}")
    tiled = x.view(tiles, TILE, -1)
    columns = chunk_columns(weight)
    if columns >= weight.shape[0]:
        out = torch.bmm(tiled, weight.T.expand(tiles, *weight.T.shape))  # [tiles, TILE, N]
    else:
        out = x.new_empty(tiles, TILE, weight.shape[0])
        for start in range(0, weight.shape[0], columns):
            part = weight[start : start + columns].T
            out[:, :, start : start + columns] = torch.bmm(tiled, part.expand(tiles, *part.shape))
    out = out.view(tiles * TILE, -1)
    return out if bias is None else out + bias


CHUNK_BYTES = 4 << 20
"""Weights larger than this are multiplied a chunk of output columns at a time (``tiled_linear``)."""


def chunk_columns(weight: torch.Tensor) -> int:
    """Output columns per chunk of ``weight`` [N, K] in ``tiled_linear``: all of them up to
    ``CHUNK_BYTES``, else a multiple of 64 near 1 MiB of weight (the fastest size measured for
    SmolLM2's LM head, 576 x 49152: 1.7x faster than one product per tile)."""
    if weight.numel() * weight.element_size() <= CHUNK_BYTES:
        return weight.shape[0]
    return max(64, (1 << 20) // (weight.shape[1] * weight.element_size()) // 64 * 64)


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
    counts = torch.bincount(chosen.view(-1), minlength=router.num_experts)
    gate_up = forward_weight(experts, "gate_up_proj") if recipe is not None else experts.gate_up_proj
    down = forward_weight(experts, "down_proj") if recipe is not None else experts.down_proj
    tiles = -(-counts // TILE)  # per expert
    if int(tiles.sum()) * (gate_up[0].numel() + down[0].numel()) * gate_up.element_size() <= GATHER_BYTES:
        hidden = _experts_at_once(experts, tokens[pairs // top_k], gate_up, down, counts, tiles, recipe)
    else:
        hidden = _experts_one_by_one(experts, tokens[pairs // top_k], gate_up, down, counts.tolist(), recipe)
    if dispatch:
        hidden = combine_round(hidden)
    out = x.new_zeros(rows * top_k, x.shape[1])  # [pairs, H]
    out[pairs] = hidden * weights[pairs]
    return out.view(rows, top_k, -1).sum(dim=1)


GATHER_BYTES = 16 << 20
"""``sparse_moe`` multiplies every expert's tiles in one ``bmm`` when the expert matrices it gathers
for them (one copy per tile) stay within this; beyond it (a large MoE), one expert at a time."""


def _experts_at_once(experts, routed: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                     counts: torch.Tensor, tiles: torch.Tensor, recipe) -> torch.Tensor:
    """``routed`` [pairs, H], grouped by expert (``counts`` each), through its expert's MLP: every
    expert's rows padded to whole tiles in one buffer, each tile with its expert's matrices, one
    ``bmm`` per matrix for all. Each tile is the ``[TILE, H] @ [H, 2I]`` and ``[TILE, I] @ [I, H]``
    problem ``tiled_linear`` runs, so a row's result is the same either way.

    Where no expert has more than one tile and at least half of them have one (a decode step of a
    few dozen rows), every expert gets one tile, an empty one zeros, and the matrices are used in
    place; otherwise each tile gets a copy of its expert's."""
    experts_n = counts.shape[0]
    in_place = int(tiles.max()) <= 1 and 2 * int(tiles.sum()) >= experts_n
    if in_place:
        tiles = torch.ones_like(tiles)
    first_tile = torch.cumsum(tiles, 0) - tiles
    first_pair = torch.cumsum(counts, 0) - counts
    expert_of = torch.repeat_interleave(torch.arange(experts_n), counts)  # [pairs]
    slot = first_tile[expert_of] * TILE + torch.arange(routed.shape[0]) - first_pair[expert_of]
    total = int(tiles.sum())
    inputs = routed.new_zeros(total * TILE, routed.shape[1])
    inputs[slot] = routed
    if recipe is not None:
        inputs = fake_quantize(inputs, recipe.forward_input)
    if not in_place:  # index_select, not gate_up[tile_expert]: the same copy, several times faster on CPU
        tile_expert = torch.repeat_interleave(torch.arange(experts_n), tiles)  # [T]
        gate_up, down = gate_up.index_select(0, tile_expert), down.index_select(0, tile_expert)
    hidden = torch.bmm(inputs.view(total, TILE, -1), gate_up.transpose(1, 2))
    gate, up = hidden.view(total * TILE, -1).chunk(2, dim=-1)
    hidden = experts.act_fn(gate) * up
    if recipe is not None:
        hidden = fake_quantize(hidden, recipe.forward_input)
    out = torch.bmm(hidden.view(total, TILE, -1), down.transpose(1, 2))
    return out.view(total * TILE, -1)[slot]


def _experts_one_by_one(experts, routed: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                        counts: list[int], recipe) -> torch.Tensor:
    """As ``_experts_at_once``, one expert at a time through ``tiled_linear`` (its matrices read
    in place, a large one a chunk of columns at a time)."""
    out = routed.new_empty(routed.shape)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        inputs = pad_rows(routed[start : start + count])
        if recipe is not None:
            inputs = fake_quantize(inputs, recipe.forward_input)
        gate, up = tiled_linear(inputs, gate_up[expert]).chunk(2, dim=-1)
        hidden = experts.act_fn(gate) * up
        if recipe is not None:
            hidden = fake_quantize(hidden, recipe.forward_input)
        out[start : start + count] = tiled_linear(hidden, down[expert])[:count]
        start += count
    return out


SHARED_ROWS = 8
"""Rows per attention problem on a shared block: the queries of up to this many rows that read the
same read-only block are stacked into one ``[SHARED_ROWS * group, D] @ [D, BLOCK]`` problem (a
group's ``n`` samples read their prompt's full blocks; 8 is the usual ``n``)."""


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class AttentionPlan:
    """Which keys each query reads, and in which problem; built once per step, used by every layer.

    Query ``i`` reads the keys ``0 .. lengths[i] - 1`` of its row, block ``j`` holding keys
    ``j * BLOCK ..``. The row's first ``shared[r]`` blocks are *shared*: full blocks of its prompt
    in a pool, read by the prompt's ``n`` samples. The pairs (query, shared block) on one block
    fill tiles of ``SHARED_ROWS`` slots, one problem per tile and kv head: ``s_query``, ``s_index``
    (block index ``j``), ``s_tile``, ``s_slot`` per pair, ``s_blocks`` (pool block) per tile. Where
    no block has more pairs than a tile holds, the tiles are the pool blocks ``s_range[0] ..
    s_range[1] - 1`` in order (empty tiles for blocks nobody reads), so the keys of the tiles are
    a slice of the pool, not a copy. The rest of a row's keys are its *own*, in a dense per-row
    cache from key ``shared[r] * BLOCK`` on: ``own_blocks`` blocks a query, block ``o`` at index
    ``own_slot[i, o] = shared + o`` of the row, of which the query sees ``own_limit[i, o]`` keys.
    ``own_rows``: each query's own-cache row, None when query ``i`` is row ``i``.
    ``width``: blocks per query padded to a power of two (``combine_blocks``)."""

    queries: int
    width: int
    s_query: torch.Tensor
    s_index: torch.Tensor
    s_tile: torch.Tensor
    s_slot: torch.Tensor
    s_blocks: torch.Tensor
    s_range: tuple[int, int] | None
    own_blocks: int
    own_slot: torch.Tensor
    own_limit: torch.Tensor
    own_masked: bool
    own_rows: torch.Tensor | None

    @staticmethod
    def build(table: torch.Tensor, shared: torch.Tensor, query_rows: torch.Tensor, lengths: torch.Tensor,
              own_capacity: int) -> "AttentionPlan":
        """``table`` [rows, J] pool blocks of the shared blocks; ``shared`` [rows]; ``query_rows``,
        ``lengths`` [queries]: each query's row and the number of keys it sees (past its row's
        shared blocks); ``own_capacity``: positions of the own cache, a multiple of ``BLOCK``."""
        device = query_rows.device
        queries = lengths.shape[0]
        counts = shared[query_rows]  # shared blocks each query reads
        if bool((lengths <= counts * BLOCK).any()):
            raise ValueError("AttentionPlan: a query inside its row's shared blocks")
        query = torch.repeat_interleave(torch.arange(queries, device=device), counts)
        starts = torch.cumsum(counts, 0) - counts
        s_index = torch.arange(query.shape[0], device=device) - starts[query]
        s_block = table[query_rows[query], s_index]
        order = torch.argsort(s_block, stable=True)  # pairs on one block together
        s_query, s_index, s_block = query[order], s_index[order], s_block[order]
        distinct, per_block = torch.unique_consecutive(s_block, return_counts=True)
        tiles = (per_block + SHARED_ROWS - 1) // SHARED_ROWS
        first_pair = torch.cumsum(per_block, 0) - per_block
        first_tile = torch.cumsum(tiles, 0) - tiles
        group = torch.repeat_interleave(torch.arange(distinct.shape[0], device=device), per_block)
        rank = torch.arange(s_block.shape[0], device=device) - first_pair[group]
        s_tile = first_tile[group] + rank // SHARED_ROWS
        s_blocks = torch.repeat_interleave(distinct, tiles)
        s_range = None
        if distinct.numel() and int(per_block.max()) <= SHARED_ROWS:  # one tile a block: tiles = a range
            s_range = (int(distinct[0]), int(distinct[-1]) + 1)
            s_tile = s_block - s_range[0]
            s_blocks = torch.arange(*s_range, device=device)
        own_blocks = own_capacity // BLOCK
        own = torch.arange(own_blocks, device=device)
        own_limit = (lengths[:, None] - (counts[:, None] + own) * BLOCK).clamp(0, BLOCK)  # [queries, own_blocks]
        identity = queries == shared.shape[0] and bool((query_rows == torch.arange(queries, device=device)).all())
        return AttentionPlan(
            queries=queries, width=_pow2(int(counts.max()) + own_blocks if queries else 1),
            s_query=s_query, s_index=s_index, s_tile=s_tile, s_slot=rank % SHARED_ROWS, s_blocks=s_blocks,
            s_range=s_range, own_blocks=own_blocks, own_slot=counts[:, None] + own, own_limit=own_limit,
            own_masked=bool((own_limit < BLOCK).any()), own_rows=None if identity else query_rows,
        )


def combine_blocks(plan: AttentionPlan, own: torch.Tensor, query: torch.Tensor, index: torch.Tensor,
                   shared: torch.Tensor | None) -> torch.Tensor:
    """Sum each query's per-block parts over its blocks: [queries, ...].

    ``own`` [queries, own_blocks, ...]; ``shared`` [pairs, ...] at block ``index`` of ``query``.
    The parts go to their block's slot of a zeroed ``[queries, width, ...]`` buffer, which is
    summed as a balanced tree (pairs of neighbours, then pairs of those, ...). A query's blocks
    fill the first slots and zeros the rest (blocks past its end are exact zeros), and a tree over
    twice as many slots is the same tree plus a subtree of zeros, so the sum does not depend on
    ``width`` (how long the other rows are)."""
    buffer = own.new_zeros(plan.queries, plan.width, *own.shape[2:])
    if shared is None:
        buffer[:, : plan.own_blocks] = own
    else:
        buffer[torch.arange(plan.queries, device=own.device)[:, None], plan.own_slot] = own
        buffer[query, index] = shared
    while buffer.shape[1] > 1:
        buffer = buffer[:, 0::2] + buffer[:, 1::2]
    return buffer[:, 0]


def _amax_into(out: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> None:
    """``out[index[i]] = max(out[index[i]], source[i])`` for every ``i`` (a maximum is exact in any order)."""
    out.scatter_reduce_(0, index.view(-1, *[1] * (source.dim() - 1)).expand_as(source), source, "amax")


def planned_attention(
    q: torch.Tensor, plan: AttentionPlan, shared_kv: tuple[torch.Tensor, torch.Tensor],
    own_kv: tuple[torch.Tensor, torch.Tensor], scale: float,
) -> torch.Tensor:
    """Attention of queries ``q`` [queries, heads, D] over their keys (``AttentionPlan``).

    ``shared_kv``: keys and values of each shared tile's block, ``[tiles, kv_heads, BLOCK, D]``;
    ``own_kv``: each query's own cache, ``[queries, kv_heads, own_blocks * BLOCK, D]``. Every
    product is a fixed-shape problem (``[SHARED_ROWS * group, D] @ [D, BLOCK]`` per shared tile,
    ``[group, D] @ [D, BLOCK]`` per own block, and the same shapes for the weighted values), a
    query's maximum is exact, and its blocks are added by ``combine_blocks``: its result depends on
    its own keys only, not on which rows share its tiles, the call or the batch. Returns
    [queries, heads, D]."""
    queries, heads, dim = q.shape
    kv_heads = own_kv[0].shape[1]
    group = heads // kv_heads
    blocks = plan.own_blocks
    q = (q * scale).view(queries, kv_heads, group, dim)
    own_k = own_kv[0].view(queries, kv_heads, blocks, BLOCK, dim)
    own_v = own_kv[1].view(queries, kv_heads, blocks, BLOCK, dim)
    o_scores = torch.matmul(q[:, :, None], own_k.transpose(-1, -2))  # [queries, kv, blocks, group, BLOCK]
    if plan.own_masked:
        hidden = torch.arange(BLOCK, device=q.device) >= plan.own_limit[..., None]  # [queries, blocks, BLOCK]
        o_scores.masked_fill_(hidden[:, None, :, None], float("-inf"))
    top = o_scores.amax(dim=(2, 4))  # [queries, kv, group]; exact in any order
    tiles = plan.s_blocks.shape[0]
    s_parts = None
    if tiles:
        stacked = q.new_zeros(tiles, kv_heads, SHARED_ROWS, group, dim)
        stacked[plan.s_tile, :, plan.s_slot] = q.index_select(0, plan.s_query)
        s_scores = torch.matmul(stacked.view(tiles, kv_heads, SHARED_ROWS * group, dim),
                                shared_kv[0].transpose(-1, -2)).view(tiles, kv_heads, SHARED_ROWS, group, BLOCK)
        _amax_into(top, plan.s_query, s_scores.amax(dim=-1)[plan.s_tile, :, plan.s_slot])
        tops = q.new_zeros(tiles, kv_heads, SHARED_ROWS, group)
        tops[plan.s_tile, :, plan.s_slot] = top.index_select(0, plan.s_query)
        s_weights = s_scores.sub_(tops[..., None]).exp_()
        s_values = torch.matmul(s_weights.view(tiles, kv_heads, SHARED_ROWS * group, BLOCK), shared_kv[1])
        s_parts = torch.cat([s_values.view(tiles, kv_heads, SHARED_ROWS, group, dim),
                             s_weights.sum(dim=-1, keepdim=True)], dim=-1)[plan.s_tile, :, plan.s_slot]
    o_weights = o_scores.sub_(top[:, :, None, :, None]).exp_()
    o_parts = torch.cat([torch.matmul(o_weights, own_v), o_weights.sum(dim=-1, keepdim=True)], dim=-1)
    total = combine_blocks(plan, o_parts.transpose(1, 2), plan.s_query, plan.s_index, s_parts)
    return (total[..., :dim] / total[..., dim:]).view(queries, heads, dim)


def block_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per row against that row's first ``lengths[r]`` keys, in a dense per-row cache.

    ``q`` [rows, heads, D]; ``keys``, ``values`` [rows, kv_heads, capacity, D], contiguous, with
    capacity a multiple of ``BLOCK``; grouped-query heads ``h`` read kv head ``h // (heads /
    kv_heads)``. Returns [rows, heads, D]: ``planned_attention`` with every key the row's own."""
    rows, kv_heads, capacity, dim = keys.shape
    device = q.device
    plan = AttentionPlan.build(torch.zeros(rows, 0, dtype=torch.long, device=device),
                               torch.zeros(rows, dtype=torch.long, device=device),
                               torch.arange(rows, device=device), lengths.to(device), capacity)
    none = keys.new_zeros(0, kv_heads, BLOCK, dim)
    return planned_attention(q, plan, (none, none), (keys, values), scale)


class BlockCache:
    """Keys and values of one layer, ``[rows, kv_heads, capacity, D]``; row r's key t at index t.

    Unwritten slots stay zero, so a zero attention weight times them is an exact zero. The
    capacity grows one block at a time. (The MTP drafter's cache; the decoder's is ``PagedCache``.)"""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.k, self.v = keys, values

    def write(self, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> None:
        """Put ``k``, ``v`` [rows, kv_heads, D] at slot ``index[r]`` of each row, growing by whole blocks."""
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


class PagedCache:
    """Keys and values of every layer: prompts' full blocks in a shared pool, the rest per row.

    ``k[layer]``, ``v[layer]``: the pool, ``[blocks, kv_heads, BLOCK, D]``, holding each prompt's
    full blocks side by side (``load``); ``table`` [rows, J]: the pool blocks of row ``r``'s first
    ``shared[r]`` blocks, read-only and shared by the rows ``repeat`` made of it. ``own_k[layer]``,
    ``own_v[layer]``: ``[rows, kv_heads, capacity, D]``, row ``r``'s keys from position
    ``shared[r] * BLOCK`` on (the prompt's partial last block, copied for each row, then the
    decoded positions); unwritten slots stay zero, and the capacity grows one block at a time."""

    def __init__(self, keys: list[list[torch.Tensor]], values: list[list[torch.Tensor]]):
        """One row per prompt from its prefill: ``keys[r][layer]`` [kv_heads, length_r, D]."""
        first = keys[0][0]
        kv_heads, dim, device = first.shape[0], first.shape[2], first.device
        lengths = [k[0].shape[1] for k in keys]
        full = [length // BLOCK for length in lengths]
        starts = [sum(full[:r]) for r in range(len(lengths))]
        capacity = -(-(max(length - f * BLOCK for length, f in zip(lengths, full)) + 1) // BLOCK) * BLOCK
        self.table = torch.full((len(lengths), max(full)), -1, dtype=torch.long, device=device)
        for r, (start, count) in enumerate(zip(starts, full)):
            self.table[r, :count] = torch.arange(start, start + count, device=device)
        self.shared = torch.tensor(full, dtype=torch.long, device=device)
        self.k, self.v, self.own_k, self.own_v = [], [], [], []
        for rows, pools, owns in ((keys, self.k, self.own_k), (values, self.v, self.own_v)):
            for layer in range(len(rows[0])):
                pool = first.new_empty(sum(full), kv_heads, BLOCK, dim)
                own = first.new_zeros(len(lengths), kv_heads, capacity, dim)
                for r, (start, count) in enumerate(zip(starts, full)):
                    source = rows[r][layer]
                    pool[start : start + count] = source[:, : count * BLOCK].reshape(
                        kv_heads, count, BLOCK, dim).transpose(0, 1)
                    own[r, :, : lengths[r] - count * BLOCK] = source[:, count * BLOCK :]
                pools.append(pool)
                owns.append(own)

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Own-cache index of position ``positions[i]`` of row ``rows[i]``, growing the own caches
        to hold it. Refuses a write into a row's shared blocks."""
        index = positions - self.shared[rows] * BLOCK
        if bool((index < 0).any()):
            raise ValueError("PagedCache: a write into a shared prompt block")
        need = -(-(int(index.max()) + 1) // BLOCK) * BLOCK
        if need > self.own_k[0].shape[2]:
            for owns in (self.own_k, self.own_v):
                for layer, own in enumerate(owns):
                    grown = own.new_zeros(*own.shape[:2], need, own.shape[3])
                    grown[:, :, : own.shape[2]] = own
                    owns[layer] = grown
        return index

    def write(self, layer: int, rows: torch.Tensor, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put ``k``, ``v`` [writes, kv_heads, D] of ``layer`` at own-cache ``index`` of ``rows``."""
        self.own_k[layer][rows, :, index] = k
        self.own_v[layer][rows, :, index] = v

    def shared_kv(self, layer: int, plan: AttentionPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``plan``'s shared tiles: a slice of the pool where the tiles are a
        range of blocks, else a copy."""
        if plan.s_range is None:
            return self.k[layer].index_select(0, plan.s_blocks), self.v[layer].index_select(0, plan.s_blocks)
        start, end = plan.s_range
        return self.k[layer][start:end], self.v[layer][start:end]

    def own_kv(self, layer: int, plan: AttentionPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's own cache (the rows' own, or a copy when a row has several queries)."""
        if plan.own_rows is None:
            return self.own_k[layer], self.own_v[layer]
        return self.own_k[layer].index_select(0, plan.own_rows), self.own_v[layer].index_select(0, plan.own_rows)

    def plan(self, query_rows: torch.Tensor, lengths: torch.Tensor) -> AttentionPlan:
        return AttentionPlan.build(self.table, self.shared, query_rows, lengths, self.own_k[0].shape[2])

    def repeat(self, n: int) -> None:
        """Each row ``n`` times in a row: the copies share its shared blocks and copy its own cache."""
        self.table = self.table.repeat_interleave(n, dim=0)
        self.shared = self.shared.repeat_interleave(n)
        self.own_k = [own.repeat_interleave(n, dim=0) for own in self.own_k]
        self.own_v = [own.repeat_interleave(n, dim=0) for own in self.own_v]

    def select(self, rows: torch.Tensor) -> None:
        """Keep ``rows`` (in that order). The pool stays as it is until the cache goes."""
        self.table, self.shared = self.table[rows], self.shared[rows]
        self.own_k = [own.index_select(0, rows) for own in self.own_k]
        self.own_v = [own.index_select(0, rows) for own in self.own_v]

    def row_prefix(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of row ``row``'s first ``length`` keys and values, ``[kv_heads, length, D]`` a layer."""
        blocks = self.table[row, : int(self.shared[row])]

        def flat(pool: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
            part = pool[blocks]  # [blocks, kv_heads, BLOCK, D]
            joined = torch.cat([part.transpose(0, 1).reshape(part.shape[1], -1, part.shape[3]), own[row]], dim=1)
            return joined[:, :length].clone()

        return ([flat(p, o) for p, o in zip(self.k, self.own_k)],
                [flat(p, o) for p, o in zip(self.v, self.own_v)])


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
        self.cache: PagedCache | None = None
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
        self.cache = PagedCache(keys, values)
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
        prefix does not keep the decode cache alive)."""
        return self.cache.row_prefix(row, length)

    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed ``T`` tokens per row (``token_ids``, ``positions`` [rows, T]); logits [rows, T, V].

        Token ``t`` of a row attends to the row's keys up to its own position, those of tokens
        ``< t`` of the same call included. Each of the ``rows × T`` tokens is one row of the tiled
        matmuls and one query of ``planned_attention``, so a token's logits are bit for bit what
        feeding the tokens one call at a time gives (speculative decoding verifies drafts this
        way). A row's keys past its position are never read, so a later call may overwrite a
        rejected draft's slot. The final-norm hidden states stay in ``last_hidden`` [rows, T, H]."""
        rows, width = token_ids.shape
        hidden = self.inner.embed_tokens(token_ids)  # [rows, T, H]
        cos, sin = self.inner.rotary_emb(hidden, positions)
        hidden = hidden.reshape(rows * width, -1)  # token (r, t) at r * T + t
        cache = self.cache
        query_rows = torch.arange(rows, device=token_ids.device).repeat_interleave(width)
        flat_positions = positions.reshape(-1)
        slots = cache.slots(query_rows, flat_positions)
        plan = cache.plan(query_rows, flat_positions + 1)
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = pad_rows(layer.input_layernorm(hidden))
            flat = rows * width
            q = project(x, attn.q_proj)[:flat].view(rows, width, -1, self.head_dim)
            k = project(x, attn.k_proj)[:flat].view(rows, width, -1, self.head_dim)
            v = project(x, attn.v_proj)[:flat].view(rows, width, -1, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [rows, heads, T, D]
            k = k.transpose(1, 2).reshape(flat, -1, self.head_dim)  # token (r, t) at r * T + t
            cache.write(index, query_rows, slots, k, v.reshape(flat, -1, self.head_dim))
            q = q.transpose(1, 2).reshape(flat, -1, self.head_dim)
            shared_kv = cache.shared_kv(index, plan)
            own_kv = cache.own_kv(index, plan)
            out = planned_attention(q, plan, shared_kv, own_kv, self.scaling)  # [rows * T, heads, D]
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
        self.cache.repeat(n)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.select(rows)
