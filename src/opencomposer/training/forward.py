"""The trainer's forward pass: log π(target) and the entropy at every position of a ``TrainBatch``.

Agent rollouts repeat a long common prefix: every episode opens with the same system prompt and
tool list (about 1,300 tokens in our harness, more than all the model tokens of a tiny-family
episode), and the G rollouts of a task share the instruction too. Recomputing that prefix for
every row is most of the work, so ``token_logprobs`` runs it **once**:

1. the longest prefix that every row of the micro-batch shares, and that holds no loss target,
   goes through the model as a single row, keeping its keys and values (``use_cache``);
2. the cache is repeated to the batch's rows (differentiably: the gradient of every row flows
   back into the one prefix computation, so this is the same function, not an approximation);
3. the rows' remaining tokens run on top of it, and logits are kept only from the first position
   that has a loss target onward (``logits_to_keep``), so the vocabulary projection skips the
   prompt. A step of several micro-batches runs the prefix they all share once for the step
   (``StepPrefix``, used by ``rl.step.train_step``) instead of once per micro-batch. Without a
   shared prefix the logits are kept at exactly the positions each row scores (a boolean
   ``logits_to_keep``), skipping tool outputs and padding too.

Outputs are ``[rows, seq]`` like the batch; positions outside the computed window hold 0 (their
targets carry no loss). ``tests/training/test_forward.py`` checks values and gradients against the
plain full-sequence forward. Works with any transformers causal LM that accepts ``cache=`` and
``logits_to_keep=`` (Qwen3-MoE, DeepSeek-V3, Llama-family models).

A batch of packed rows (``training.packing.pack_rows``: ``segment_ids`` not all zero) runs in one
call without a cache, with attention inside each segment at the cost of its own length
(``training.attention.packed_attention``), and the vocabulary projection runs on the positions
each row scores only (a packed row's later segments hold prompts and tool outputs).

**Router replay** (report §6.2): given a ``model.routing.RouterReplay``, both calls select the
experts the sampler recorded (``TrainBatch.routes``, aligned with the inputs): the prefix call
those of the first row's prefix, the rows' call those of their remaining positions. The prefix is
then shared only as far as the rows' routes agree too, so every row is computed with its own
routes (``tests/training/test_router_replay_forward.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import torch

from opencomposer.inference.sampling import kept_tokens, truncated_logprobs, truncates, widened
from opencomposer.model.loading import cache_argument
from opencomposer.model.routing import RouterReplay
from opencomposer.training.attention import packed_attention
from opencomposer.types import TrainBatch

MIN_SHARED_PREFIX = 16  # below this, one extra forward call costs more than it saves


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """−log softmax(logits)[target] at every position, shaped like ``targets``: cross-entropy
    without reduction (no ignored index), in float32 at least. A log-softmax and a gather rather
    than ``F.cross_entropy``, whose NLL kernel torch lists among those it has no deterministic
    version of on CUDA (``run.deterministic`` would refuse it); the gather's backward has one."""
    return -torch.log_softmax(widened(logits), dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor,  # [rows, seq, vocab], already divided by the sampling temperature
    target_ids: torch.Tensor,  # [rows, seq]
    top_p: float = 1.0,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:  # [rows, seq] differentiable, [rows, seq] detached
    """log π(target) at each position, and the entropy of π there (for metrics; no gradient).

    π is the distribution the sampler draws from: the softmax of ``logits`` cut by ``top_p`` /
    ``top_k`` and renormalised (``inference.sampling``, the sampler's own rule). The target always
    counts as kept: it was sampled, so the sampler kept it, and a target that the trainer's logits
    put just past the top-p boundary (rounding differences between the two forwards) is scored
    instead of getting log 0. Half-precision logits are upcast to float32 first; float64 stays
    float64."""
    logits = widened(logits)
    targets = target_ids.long().unsqueeze(-1)
    keep = None
    if truncates(top_p, top_k):
        keep = kept_tokens(logits, top_p, top_k).scatter_(-1, targets, True)
    logp_all = truncated_logprobs(logits, keep)
    logprobs = logp_all.gather(-1, targets).squeeze(-1)
    with torch.no_grad():
        finite = logp_all if keep is None else torch.where(keep, logp_all, 0.0)  # 0·log 0 = 0
        entropy = -(logp_all.exp() * finite).sum(-1)
    return logprobs, entropy


def _first_true(values: torch.Tensor) -> int:
    """Index of the first True of a 1-D bool tensor, or its length."""
    hits = values.nonzero()
    return int(hits[0, 0]) if hits.numel() else values.numel()


def first_loss_position(batch: TrainBatch) -> int:
    """The first position (over all rows) whose target carries loss; ``seq`` when none does."""
    return _first_true(batch.loss_mask.bool().any(0))


def shared_prefix_length(batch: TrainBatch, min_prefix: int = MIN_SHARED_PREFIX, by_routes: bool = False) -> int:
    """How many leading input positions every row shares and no loss target depends on; 0 when
    sharing is not worth it (one row, or a shorter prefix than ``min_prefix``). ``by_routes``:
    the rows' routes must agree too (router replay)."""
    rows, seq = batch.input_ids.shape
    if rows < 2:
        return 0
    differs = (batch.input_ids != batch.input_ids[:1]).any(0) | (batch.position_ids != batch.position_ids[:1]).any(0)
    if by_routes and batch.routes is not None:
        differs |= (batch.routes != batch.routes[:1]).flatten(2).any(-1).any(0)
    length = min(_first_true(differs), first_loss_position(batch), seq - 1)
    return length if length >= min_prefix else 0


def step_prefix_length(batches: list[TrainBatch], min_prefix: int = MIN_SHARED_PREFIX, by_routes: bool = False) -> int:
    """How many leading input positions every row of every micro-batch in ``batches`` shares and no
    loss target depends on (``shared_prefix_length`` across the step); 0 when there is one batch,
    a packed one, or a shorter prefix than ``min_prefix``. Each row keeps at least one position."""
    if len(batches) < 2 or any(bool(b.segment_ids.any()) for b in batches):
        return 0
    first = batches[0]
    length = min(b.input_ids.shape[1] for b in batches) - 1
    for batch in batches:
        window = slice(0, length)
        differs = ((batch.input_ids[:, window] != first.input_ids[:1, window]).any(0)
                   | (batch.position_ids[:, window] != first.position_ids[:1, window]).any(0))
        if by_routes and batch.routes is not None:
            differs |= (batch.routes[:, window] != first.routes[:1, window]).flatten(2).any(-1).any(0)
        length = min(length, _first_true(differs), first_loss_position(batch))
    return length if length >= min_prefix else 0


class StepPrefix:
    """The prefix every micro-batch of a step shares, run through the model once for the step.

    ``token_logprobs`` computes a micro-batch's shared prefix once per micro-batch, so a step of
    several micro-batches behind one system prompt would run that prefix, forward and backward, in
    each. Here it runs once: each micro-batch attends to copies of its keys and values made from
    detached leaves (``cache``), the gradient that the micro-batches' backward passes send into
    those leaves adds up across them, and ``backward`` then sends the sum through the prefix's own
    graph once. By the chain rule this is the gradient of recomputing the prefix per micro-batch
    (the test compares the two); only the order of some additions changes. ``replay``: the prefix
    is routed by the first row's recorded routes, as ``token_logprobs`` routes its own."""

    def __init__(self, model: torch.nn.Module, batch: TrainBatch, length: int, bf16: bool = False,
                 replay: RouterReplay | None = None):
        device = next(model.parameters()).device
        window = (slice(0, 1), slice(0, length))
        routed = contextlib.nullcontext() if replay is None else replay.routes(batch.routes[window].to(device))
        with autocast(device, bf16), routed:
            out = model(input_ids=batch.input_ids[window].to(device), position_ids=batch.position_ids[window].to(device),
                        use_cache=True, logits_to_keep=1)
        self.length = length
        self.input_ids = batch.input_ids[0, :length].clone()
        self.config = model.config
        self.outputs = [(layer.keys, layer.values) for layer in getattr(out, cache_argument(model)).layers]
        # float32 leaves: under bf16 autocast the micro-batches' gradients add up in float32
        self.leaves = [(k.detach().float().requires_grad_(True), v.detach().float().requires_grad_(True))
                       for k, v in self.outputs]

    def cache(self, rows: int) -> Any:
        """A fresh key/value cache of the prefix for ``rows`` rows, differentiable into the leaves."""
        from transformers import DynamicCache

        data = [(k.to(out_k.dtype).repeat(rows, 1, 1, 1), v.to(out_v.dtype).repeat(rows, 1, 1, 1))
                for (k, v), (out_k, out_v) in zip(self.leaves, self.outputs, strict=True)]
        return DynamicCache(ddp_cache_data=data, config=self.config)

    def backward(self) -> None:
        """Send the gradient the micro-batches left in the leaves through the prefix's forward."""
        pairs = [(out, leaf.grad) for outs, leaves in zip(self.outputs, self.leaves, strict=True)
                 for out, leaf in zip(outs, leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad.to(out.dtype) for out, grad in pairs])
        self.outputs = self.leaves = []


@functools.cache
def per_row_logits() -> bool:
    """Whether the installed transformers takes a ``[rows, seq]`` boolean ``logits_to_keep``
    (logits at exactly the positions each row scores): its ``slice_logits_to_keep`` is asked to
    keep two marked positions of a small tensor and must return those two."""
    import transformers.modeling_utils

    slicer = getattr(transformers.modeling_utils, "slice_logits_to_keep", None)
    if slicer is None:
        return False
    hidden = torch.arange(12.0).view(2, 3, 2)
    keep = torch.tensor([[False, True, False], [False, False, True]])
    try:
        return torch.equal(slicer(hidden, keep), hidden[keep])
    except Exception:  # an older slicer that reads a 2-D tensor another way
        return False


def scored_positions(batch: TrainBatch) -> torch.Tensor:
    """The positions (1-D, ascending) whose target carries loss in some row; the last position
    when none does (a forward must keep at least one)."""
    positions = batch.loss_mask.bool().any(0).nonzero().flatten()
    return positions if positions.numel() else torch.tensor([batch.loss_mask.shape[1] - 1])


def _scored_mask(batch: TrainBatch, device: torch.device) -> torch.Tensor:
    """``[rows, seq]`` bool: the positions whose target carries loss, or the last position of
    every row when none does (a forward must keep at least one)."""
    keep = batch.loss_mask.to(device, torch.bool, copy=True)
    if not keep.any():
        keep[:, -1] = True
    return keep


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on ``device`` when asked, else nothing (parameters stay in their dtype)."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def token_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    with_entropy: bool = True,
    bf16: bool = False,
    share_prefix: bool = True,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    replay: RouterReplay | None = None,
    step_prefix: StepPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [rows, seq] (differentiable), [rows, seq] or None
    """log π(target_t) at every position, and the entropy of π there (detached, when asked).

    π is the distribution the sampler draws from: the model's logits divided by ``temperature``,
    cut by ``top_p`` / ``top_k`` and renormalised (``token_logprobs_and_entropy``; the sampler
    records its logprobs by the same rule), so at step 0 the trainer's log π equals the sampler's
    logprobs whatever the sampling settings. ``replay``: route the MoE layers by ``batch.routes``
    (module doc); its ``stats`` count what it replayed and replaced. ``step_prefix``: the step's
    shared prefix, already run (``StepPrefix``); the batch's rows begin with it."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    if replay is not None and batch.routes is None:
        raise ValueError("router replay: the batch carries no routes (the sampler did not report them)")
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    position_ids = batch.position_ids.to(device)
    target_ids = batch.target_ids.to(device)
    rows, seq = input_ids.shape
    start = min(first_loss_position(batch), seq - 1)  # logits are needed from here on
    # packed rows (training.packing) share no prefix beyond their first segment, and their
    # block-diagonal mask comes from the position ids only in a forward without a cache
    packed = bool(batch.segment_ids.any())
    prefix = shared_prefix_length(batch, by_routes=replay is not None) if share_prefix and not packed else 0
    if step_prefix is not None:
        length = step_prefix.length
        if (packed or length > min(seq - 1, first_loss_position(batch))
                or not bool((batch.input_ids[:, :length] == step_prefix.input_ids).all())):
            raise ValueError(f"step_prefix: this batch's rows do not all begin with its {length} unscored positions")
        prefix = step_prefix.length
    keep = None

    def routed(window: tuple[slice, slice]):
        return contextlib.nullcontext() if replay is None else replay.routes(batch.routes[window].to(device))

    with autocast(device, bf16):
        if prefix:
            name = cache_argument(model)  # "cache", or "past_key_values" in older transformers
            if step_prefix is not None:
                cache = step_prefix.cache(rows)
            else:
                with routed((slice(0, 1), slice(0, prefix))):
                    shared = model(input_ids=input_ids[:1, :prefix], position_ids=position_ids[:1, :prefix],
                                   use_cache=True, logits_to_keep=1)
                cache = getattr(shared, name)
                cache.batch_repeat_interleave(rows)
            suffix_keep = seq - start
            if per_row_logits():  # the vocabulary projection at the scored positions only (below)
                keep = _scored_mask(batch, device)
                suffix_keep = keep[:, prefix:]  # the prefix holds no scored position (shared_prefix_length)
            with routed((slice(None), slice(prefix, None))):
                out = model(input_ids=input_ids[:, prefix:], position_ids=position_ids[:, prefix:],
                            **{name: cache}, use_cache=True, logits_to_keep=suffix_keep)
        else:
            # the vocabulary projection runs on the positions each row scores, not on a window
            # from the first of them (a packed row holds prompts and tool outputs after it)
            keep = scored_positions(batch).to(device) if packed else None
            if per_row_logits():
                keep = _scored_mask(batch, device)
            documents = packed_attention(model, position_ids) if packed else contextlib.nullcontext()
            with routed((slice(None), slice(None))), documents:
                out = model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                            logits_to_keep=seq - start if keep is None else keep)
    logits = out.logits if temperature == 1.0 else widened(out.logits) / temperature  # not in bf16
    if keep is not None and keep.dtype == torch.bool:  # [kept, vocab]: the kept positions of every row
        logprobs, entropy = token_logprobs_and_entropy(logits[None], target_ids[keep][None], top_p, top_k)
        full_logprobs = logprobs.new_zeros(rows, seq).masked_scatter(keep, logprobs[0])
        full_entropy = entropy.new_zeros(rows, seq).masked_scatter(keep, entropy[0]) if with_entropy else None
        return full_logprobs, full_entropy
    if keep is not None:  # [rows, kept]
        logprobs, entropy = token_logprobs_and_entropy(logits, target_ids[:, keep], top_p, top_k)
        full_logprobs = logprobs.new_zeros(rows, seq).index_copy(1, keep, logprobs)
        full_entropy = entropy.new_zeros(rows, seq).index_copy(1, keep, entropy) if with_entropy else None
        return full_logprobs, full_entropy
    logprobs, entropy = token_logprobs_and_entropy(logits, target_ids[:, start:], top_p, top_k)  # [rows, seq - start]
    full_logprobs = torch.nn.functional.pad(logprobs, (start, 0))
    full_entropy = torch.nn.functional.pad(entropy, (start, 0)) if with_entropy else None
    return full_logprobs, full_entropy


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, batch: TrainBatch, bf16: bool = False,
                       temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """log π_ref(target) on ``batch`` (no graph), ``[rows, seq]`` float32 on the CPU, scored by the
    same rule as the policy (``token_logprobs``), so k1 is 0 where the two policies agree."""
    logprobs, _ = token_logprobs(model, batch, with_entropy=False, bf16=bf16, temperature=temperature,
                                 top_p=top_p, top_k=top_k)
    return logprobs.float().cpu()


def batch_to(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch with every tensor on ``device``."""
    moved = {
        f.name: getattr(batch, f.name).to(device) if isinstance(getattr(batch, f.name), torch.Tensor)
        else getattr(batch, f.name)
        for f in dataclasses.fields(batch)
    }
    return TrainBatch(**moved)


def cp_token_logprobs(model: torch.nn.Module, batch: Any, group: Any = None, *, replay: Any = None,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, with_entropy: bool = True,
                      bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``training.forward.token_logprobs`` under context parallelism (``distributed.context``):
    log π(target) (and the entropy) at this rank's
    positions of the FULL ``batch`` (``[rows, seq / cp]``, ``cp_indices`` order; pair them with
    ``split_batch(batch, cp, rank)``). Every position is scored (no shared prefix, no
    ``logits_to_keep`` window); positions without loss are the caller's to mask."""
    from opencomposer.distributed.context import cp_forward, group_size_rank, split_sequence

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    cp, rank = group_size_rank(group)
    device = next(model.parameters()).device
    with autocast(device, bf16):
        out = cp_forward(model, batch.input_ids.to(device), batch.position_ids.to(device), group,
                         routes=None if batch.routes is None else batch.routes.to(device), replay=replay)
    logits = out.logits if temperature == 1.0 else widened(out.logits) / temperature  # not in bf16
    targets = split_sequence(batch.target_ids.to(device), cp, rank)
    logprobs, entropy = token_logprobs_and_entropy(logits, targets, top_p, top_k)
    return logprobs, entropy if with_entropy else None


def padding_forward(model: torch.nn.Module, device: torch.device) -> None:
    """A forward and backward that adds nothing to any gradient: a rank with fewer micro-batches
    than another runs these, because FSDP gathers every layer's weights collectively."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    logits = model(input_ids=ids, logits_to_keep=1).logits
    (logits.float().sum() * 0.0).backward()
