"""Context parallelism (``parallel.cp``, report §7): one sequence split over the ranks of a CP group.

**Layout.** A row of ``T`` positions is cut into ``2 * cp`` equal chunks; CP rank ``r`` holds chunks
``r`` and ``2 * cp - 1 - r`` (``cp_indices``), so under causal attention every rank does the same
work (an early chunk attends to little, its partner at the end to much). Every ``[B, T, ...]``
tensor aligned with the inputs is split with the same indices (``split_sequence``): input ids,
position ids, loss masks, advantages, replayed routes ``[B, T, layers, k]``. **Targets are shifted
on the whole sequence before splitting**, so a chunk's last position is scored against the first
token of the next chunk even where that token lives on another rank. ``T`` must be a multiple of
``2 * cp`` (``pad_for_cp`` pads a batch on the right: padding sits after every real token, so
causal attention never lets a real token see it).

**Attention (all-gather CP, as Llama 3 trains it).** Queries stay local; each layer all-gathers
its keys and values over the CP group (one collective for both, autograd-aware: its backward
sums every rank's key/value gradients back to their owner) and each local query attends to the
gathered keys under a mask built from global token indices: causal in the original order, and
within one document of a packed row (a document starts where the position ids do not continue by
one, transformers' own packed-row rule). RoPE needs nothing: the model is given the global
position ids of its local tokens. The attention is registered with transformers as
``opencomposer_cp`` (``AttentionInterface``) and switched on only inside ``context_parallel`` (the
model's ``config._attn_implementation`` is restored on exit), so the model code is unchanged;
``cp_forward`` wraps split + forward (+ router replay).

**MTP** (``cp_mtp_distillation_loss``): depth ``k`` at row ``i`` reads the token at ``i + k`` and is
pulled onto the main head's row ``i + k``, which may live on another rank. ``shift_left`` brings
them over: every rank all-gathers the first ``k`` rows of each of its chunks (a halo, not the
sequence), so the exchange is ``2 * cp * k`` rows. The MTP block's own attention runs the same
gathered-key attention (its documents start at position id 0, ``model.mtp``'s rule).

**Gradients.** Each rank's backward gives the gradient of its local tokens' loss (including what
flows through other ranks' keys and values); summing parameter gradients over the CP group
(``all_reduce``, or FSDP's reduce-scatter over a mesh that includes the CP dimension) gives the
single-process gradient. Losses must therefore be written as local sums over a global
denominator (``global_count``). docs/context-parallel.md has the picture and the costs;
tests/distributed/test_context_parallel.py checks equality with one process.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

CP_ATTENTION = "opencomposer_cp"
"""The transformers attention implementation name that ``context_parallel`` switches a model to."""


# --------------------------------------------------------------------------------------- layout


def _check_layout(seq_len: int, cp: int) -> int:
    if cp < 1:
        raise ValueError(f"context parallelism: cp must be >= 1, got {cp}")
    if seq_len % (2 * cp):
        raise ValueError(f"context parallelism: sequence length {seq_len} is not a multiple of 2 * cp = {2 * cp} "
                         f"(each row is cut into 2 * cp equal chunks); pad the batch with pad_for_cp")
    return seq_len // (2 * cp)


def cp_indices(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The global positions CP rank ``rank`` holds, in its local order: chunk ``rank`` then chunk
    ``2 * cp - 1 - rank`` of ``2 * cp`` equal chunks (int64, ``seq_len // cp`` of them)."""
    chunk = _check_layout(seq_len, cp)
    if not 0 <= rank < cp:
        raise ValueError(f"context parallelism: rank {rank} outside the group of {cp}")
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([first, second])


def cp_layout(seq_len: int, cp: int) -> torch.Tensor:
    """``[cp, seq_len // cp]``: row ``r`` is ``cp_indices(seq_len, cp, r)``; flattened, the global
    position of every entry of a rank-ordered concatenation (what an all-gather returns)."""
    return torch.stack([cp_indices(seq_len, cp, r) for r in range(cp)])


def split_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s share of ``x`` along its sequence dimension ``dim`` (``cp_indices``)."""
    return x.index_select(dim, cp_indices(x.shape[dim], cp, rank).to(x.device))


def merge_sequence(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The inverse of ``split_sequence``: every rank's share (rank order) back in global order."""
    cp = len(parts)
    stacked = torch.cat(parts, dim=dim)
    order = cp_layout(stacked.shape[dim], cp).flatten().to(stacked.device)
    out = torch.empty_like(stacked)
    return out.index_copy_(dim, order, stacked)


def pad_for_cp(x: torch.Tensor, cp: int, value: float | int = 0, dim: int = 1, positions: bool = False
               ) -> torch.Tensor:
    """``x`` padded on the right of ``dim`` to a multiple of ``2 * cp``. ``positions``: continue the
    last position id by one per padded slot (the padding joins the last document; being after every
    real token it changes no real token's output). Give padded positions no loss (mask 0)."""
    length = x.shape[dim]
    extra = -length % (2 * cp)
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    if positions:
        last = x.narrow(dim, length - 1, 1)
        steps = torch.arange(1, extra + 1, device=x.device, dtype=x.dtype)
        view = [1] * x.dim()
        view[dim] = extra
        pad = last + steps.view(view)
    else:
        pad = torch.full(shape, value, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=dim)


def document_ids(position_ids: torch.Tensor, rule: str = "continue") -> torch.Tensor:
    """``[B, T]`` document number of each position of full rows. ``"continue"``: a document starts
    where the position id is not the previous one plus one (transformers' packed-row detection,
    ``masking_utils.find_packed_sequence_indices``); ``"zero"``: where the position id is 0 (the
    MTP block's rule, ``model.mtp.MTPBlock``)."""
    if rule == "zero":
        return (position_ids == 0).long().cumsum(-1)
    if rule != "continue":
        raise ValueError(f"document_ids: rule {rule!r}, expected 'continue' or 'zero'")
    diff = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    return (diff != 1).long().cumsum(-1)


# ---------------------------------------------------------------------------------- collectives


def group_size_rank(group: Any = None) -> tuple[int, int]:
    """``(cp, rank)`` of this process in ``group`` (the default group when None)."""
    return dist.get_world_size(group), dist.get_rank(group)


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` (rank order), differentiable: the backward sums every rank's
    gradient of the gathered tensor and returns this rank's slice (a reduce-scatter; gloo has one
    since torch 2.x, and ``torch.distributed.nn.functional.all_gather``, deprecated, would emulate it
    with an all-to-all)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:  # type: ignore[override]
        cp, rank = group_size_rank(group)
        ctx.dim, ctx.group, ctx.cp, ctx.rank = dim, group, cp, rank
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(cp)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        chunks = [g.contiguous() for g in grad.chunk(ctx.cp, dim=ctx.dim)]
        out = torch.empty_like(chunks[ctx.rank])
        dist.reduce_scatter(out, chunks, group=ctx.group)
        return out, None, None


def gather_concat(x: torch.Tensor, dim: int, group: Any = None) -> torch.Tensor:
    """Every CP rank's ``x`` concatenated along ``dim`` in rank order, with gradient."""
    return _GatherSequence.apply(x, dim, group)


@torch.no_grad()
def gather_sequence(local: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """A split tensor back in global order on every rank (no gradient; for metrics and tests)."""
    cp, _ = group_size_rank(group)
    parts = [torch.empty_like(local) for _ in range(cp)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return merge_sequence(parts, dim=dim)


@torch.no_grad()
def shift_left(local: torch.Tensor, k: int, group: Any = None, fill: float | int = 0) -> torch.Tensor:
    """This rank's share of ``full[:, i + k]`` (``fill`` past the end), from its share of ``full``
    ``[B, T_local, ...]``: each local chunk continues into the first ``k`` rows of the next chunk,
    which another rank may hold, so every rank all-gathers the first ``k`` rows of its two chunks
    (no gradient: for targets, tokens and masks). ``k`` must not exceed the chunk length."""
    cp, rank = group_size_rank(group)
    chunk = local.shape[1] // 2
    if k == 0:
        return local
    if not 0 < k <= chunk:
        raise ValueError(f"shift_left: shift {k} outside 1..{chunk} (the chunk length)")
    own = [local[:, :chunk], local[:, chunk:]]
    heads = torch.stack([own[0][:, :k], own[1][:, :k]]).contiguous()  # [2, B, k, ...]
    every = [torch.empty_like(heads) for _ in range(cp)]
    dist.all_gather(every, heads, group=group)

    def head(c: int) -> torch.Tensor:  # the first k rows of global chunk c
        if c == 2 * cp:
            return torch.full_like(heads[0], fill)
        return every[c][0] if c < cp else every[2 * cp - 1 - c][1]

    chunks = (rank, 2 * cp - 1 - rank)
    return torch.cat([torch.cat([own[j][:, k:], head(c + 1)], dim=1) for j, c in enumerate(chunks)], dim=1)


def global_count(count: int | torch.Tensor, group: Any = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """A count (tokens with loss, valid rows) summed over the CP group: the denominator that makes
    local sums add up to the single-process mean. ``device``: where the collective runs (the
    model's device: NCCL reduces CUDA tensors only)."""
    total = torch.as_tensor(count, dtype=torch.float64).clone().reshape(1).to(device)
    dist.all_reduce(total, group=group)
    return total[0].cpu()


# ------------------------------------------------------------------------------------ attention


@dataclass
class _CPState:
    group: Any
    position_ids: torch.Tensor  # the full rows [B, T]
    masks: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # per document rule, built once

    def mask(self, rule: str) -> torch.Tensor:
        """``attention_mask`` for this rank, built on first use and shared by every layer."""
        if rule not in self.masks:
            cp, rank = group_size_rank(self.group)
            self.masks[rule] = attention_mask(self.position_ids, cp, rank, rule)
        return self.masks[rule]


_STATE: contextvars.ContextVar[_CPState | None] = contextvars.ContextVar("opencomposer_cp", default=None)


def attention_mask(position_ids: torch.Tensor, cp: int, rank: int, rule: str = "continue") -> torch.Tensor:
    """``[B, 1, T / cp, T]`` bool: may local query ``q`` of rank ``rank`` see gathered key ``j`` (keys
    in all-gather order)? Yes when key ``j`` is at or before ``q`` in the global order and in the
    same document. ``position_ids``: the full rows ``[B, T]``."""
    seq = position_ids.shape[1]
    queries = cp_indices(seq, cp, rank).to(position_ids.device)
    keys = cp_layout(seq, cp).flatten().to(position_ids.device)
    docs = document_ids(position_ids, rule)
    causal = keys[None, :] <= queries[:, None]  # [T_local, T]
    same = docs[:, queries, None] == docs[:, None, keys]  # [B, T_local, T]
    return (causal[None] & same)[:, None]


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rule: str, scaling: float | None,
            dropout: float = 0.0) -> torch.Tensor:
    """Local queries ``[B, H, T_local, D]`` over the CP group's keys/values ``[B, H_kv, T_local, D]``:
    ``[B, H, T_local, D]``."""
    state = _STATE.get()
    if state is None:
        raise RuntimeError(f"attention implementation {CP_ATTENTION!r} runs only inside context_parallel(...)")
    if key.shape == value.shape:  # one collective for both
        key, value = gather_concat(torch.stack([key, value]), dim=3, group=state.group).unbind(0)
    else:  # value heads of another width (DeepSeek's MLA)
        key, value = gather_concat(key, 2, state.group), gather_concat(value, 2, state.group)
    mask = state.mask(rule).to(query.device)
    if mask.shape[-2] != query.shape[-2] or mask.shape[-1] != key.shape[-2]:
        raise RuntimeError(f"context parallel attention: {query.shape[-2]} local queries and {key.shape[-2]} "
                           f"gathered keys, but the mask was built for {tuple(mask.shape[-2:])}")
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                          enable_gqa=query.shape[1] != key.shape[1])


def cp_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The transformers attention function ``opencomposer_cp`` (same contract as ``sdpa``: returns
    ``[B, T_local, H, D]``). The model's own ``attention_mask`` is ignored (it builds none for this
    implementation); the CP mask comes from ``context_parallel``."""
    if kwargs.get("sliding_window"):
        raise NotImplementedError("context parallel attention: sliding-window layers are not supported")
    out = _attend(query, key, value, "continue", scaling, dropout)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    if CP_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(CP_ATTENTION, cp_attention_forward)


@contextlib.contextmanager
def context_parallel(model: torch.nn.Module | None, position_ids: torch.Tensor, group: Any = None
                     ) -> Iterator[None]:
    """Run ``model``'s forwards inside with context-parallel attention over ``group``:
    ``position_ids`` are the FULL rows ``[B, T]`` (identical on every CP rank); the model is then
    called on this rank's share (``split_sequence``) with the matching share of the position ids.
    ``model`` None: only the state (for ``cp_mtp_distillation_loss``'s block)."""
    if _STATE.get() is not None:
        raise RuntimeError("context_parallel: already inside a context-parallel forward")
    token = _STATE.set(_CPState(group, position_ids))
    switch = contextlib.nullcontext()
    if getattr(model, "config", None) is not None:
        from opencomposer.model.attention import attention_implementation

        _register()
        switch = attention_implementation(model, CP_ATTENTION)
    try:
        with switch:
            yield
    finally:
        _STATE.reset(token)


def cp_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, group: Any = None, *,
               routes: torch.Tensor | None = None, replay: Any = None, hidden: bool = False, **kwargs: Any):
    """The model's forward on this CP rank's share of the FULL rows ``input_ids`` / ``position_ids``
    ``[B, T]`` (the same on every rank of ``group``), with attention over the whole rows. Returns the
    model's output for the local positions (``logits`` ``[B, T / cp, V]`` in ``cp_indices`` order;
    ``hidden_states`` when ``hidden``). ``replay`` (a ``model.routing.RouterReplay``) replays
    ``routes`` ``[B, T, layers, k]`` (full rows, aligned with the inputs), split like them. No cache:
    the shared-prefix path of ``training.forward`` does not apply under CP."""
    cp, rank = group_size_rank(group)
    local_ids = split_sequence(input_ids, cp, rank)
    local_positions = split_sequence(position_ids, cp, rank)
    if replay is not None and routes is None:
        raise ValueError("cp_forward: router replay needs the batch's routes")
    routed = contextlib.nullcontext() if replay is None else replay.routes(split_sequence(routes, cp, rank))
    with context_parallel(model, position_ids, group), routed:
        return model(input_ids=local_ids, position_ids=local_positions, use_cache=False,
                     output_hidden_states=hidden, **kwargs)


# ----------------------------------------------------------------------------------- RL batches

# what padding holds in each [rows, seq] field of a TrainBatch (input/target ids: the pad id)
_BATCH_PAD = {"loss_mask": False, "advantages": 0.0, "sampler_logprobs": 0.0, "segment_ids": 0,
              "ref_logprobs": 0.0, "routes": -1, "versions": -1, "episode_ids": -1, "episode_tokens": 0.0}


def _sequence_fields(batch: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor)]


def pad_batch_for_cp(batch: Any, cp: int, pad_id: int) -> Any:
    """A ``types.TrainBatch`` right-padded to a multiple of ``2 * cp`` positions: ids with
    ``pad_id``, position ids continuing, no loss, routes and versions -1 (``collate``'s padding)."""
    out = {}
    for name in _sequence_fields(batch):
        value = getattr(batch, name)
        if name == "position_ids":
            out[name] = pad_for_cp(value, cp, positions=True)
        else:
            out[name] = pad_for_cp(value, cp, pad_id if name in ("input_ids", "target_ids") else _BATCH_PAD[name])
    return dataclasses.replace(batch, **out)


def split_batch(batch: Any, cp: int, rank: int) -> Any:
    """CP rank ``rank``'s share of every ``[rows, seq, ...]`` tensor of a ``types.TrainBatch`` (targets,
    sampler and reference log-probs are aligned with the inputs' positions already, so they split
    the same way); ``num_episodes`` is kept (it counts the whole rows)."""
    return dataclasses.replace(batch, **{name: split_sequence(getattr(batch, name), cp, rank)
                                         for name in _sequence_fields(batch)})


# ------------------------------------------------------------------------------------------ MTP


def cp_mtp_distillation_loss(model: torch.nn.Module, logits: torch.Tensor, hidden: torch.Tensor,
                             input_ids: torch.Tensor, position_ids: torch.Tensor, group: Any = None,
                             targets: torch.Tensor | None = None, count_group: Any = "group"
                             ) -> tuple[torch.Tensor, dict[str, float]]:
    """``model.mtp.mtp_distillation_loss`` under CP. ``logits`` / ``hidden``: this rank's main forward
    (``cp_forward``); ``input_ids`` / ``position_ids`` / ``targets``: the FULL rows ``[B, T]``. Returns
    this rank's share of the loss (the shares sum over the group to the single-process loss, so
    summed gradients are its gradient) and the metrics of the whole rows (equal on every rank).
    ``count_group``: the ranks whose valid rows the loss is normalised by and the metrics summed
    over: the CP group by default; under data and context parallelism the whole trainer group
    (``None``), so that every rank's share adds up to the whole batch's loss. Collective."""
    from opencomposer.model.mtp import mtp_layers, rope_base

    if not mtp_layers(model):
        raise ValueError(f"{type(model).__name__} has no MTP layers (model.num_mtp_layers)")
    cp, rank = group_size_rank(group)
    counted = group if count_group == "group" else count_group
    ids = split_sequence(input_ids, cp, rank)
    positions = split_sequence(position_ids, cp, rank)
    wanted = None if targets is None else split_sequence(targets.bool(), cp, rank)
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings()
    theta = rope_base(model)
    target = torch.log_softmax(logits.detach().float(), dim=-1)
    depths = [k for k in range(1, len(model.mtp.layers) + 1) if k < input_ids.shape[1]]
    total = logits.new_zeros((), dtype=torch.float)
    metrics: dict[str, float] = {}
    sums = []  # per depth: [kl sum, top-1 agreements, valid rows] of this rank, detached
    h = hidden.detach()
    with context_parallel(None, position_ids, group):
        for k in depths:
            layer = model.mtp.layers[k - 1]
            tokens = shift_left(ids, k, group)
            # the block's own forward, its attention over the CP group (documents start at position id 0)
            h = layer.block(layer.combine(h, F.embedding(tokens, embed)), positions, theta,
                            attend=lambda q, k, v: _attend(q, k, v, "zero", None))
            draft = F.linear(layer.norm(h), head.weight.detach(), head.bias.detach() if head.bias is not None else None)
            valid = torch.ones_like(positions, dtype=torch.bool)
            for j in range(1, k + 1):  # tokens i+1 .. i+k stay in i's document and exist (fill 0 past the end)
                valid &= shift_left(positions, j, group, fill=0) != 0
            if wanted is not None:
                valid &= shift_left(wanted, k, group, fill=False)
            p_log = shift_left(target, k, group)[valid]
            q_log = torch.log_softmax(draft.float(), dim=-1)[valid]
            kl = (p_log.exp() * (p_log - q_log)).sum(-1)
            count = global_count(int(valid.sum()), counted, logits.device)
            if count > 0:
                total = total + kl.sum() / count.to(kl.dtype) / len(depths)
            sums.append(torch.tensor([float(kl.detach().sum()), float((p_log.argmax(-1) == q_log.argmax(-1)).sum()),
                                      float(valid.sum())], dtype=torch.float64))
    if sums:
        every = torch.stack(sums).to(logits.device)
        dist.all_reduce(every, group=counted)
        every = every.cpu()
        overall = 0.0
        for k, (kl_sum, agreed, rows) in zip(depths, every.tolist(), strict=True):
            if rows:
                metrics[f"mtp_kl_{k}"] = kl_sum / rows
                metrics[f"mtp_top1_{k}"] = agreed / rows
                overall += kl_sum / rows / len(depths)
        metrics["mtp_kl"] = overall
    else:
        metrics["mtp_kl"] = 0.0
    return total, metrics
