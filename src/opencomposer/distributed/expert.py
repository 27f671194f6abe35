"""Expert parallelism: each rank of a group keeps a block of every MoE layer's experts, and tokens
travel to the experts they were routed to and back by two all-to-alls (docs/distributed.md).

What ``shard_experts(model, group)`` does
-----------------------------------------
On each of the ``ep`` ranks of ``group`` it replaces every routed-experts module of ``model``
(transformers 5's fused layout, ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, as in
Qwen3-MoE and DeepSeek-V3, or the ``QuantizedExperts`` that ``numerics.convert_model`` made of
it) by ``ExpertParallelExperts``, which keeps the rank's contiguous block of ``E / ep`` experts
(rank ``r`` owns experts ``r·E/ep … (r+1)·E/ep - 1``) as its own, smaller parameters under the same
state-dict names. Nothing else changes: attention, embeddings, norms, shared experts and **the
routers** stay whole and run on every rank for that rank's tokens, so ``RouteRecorder`` and
``RouterReplay`` (``model.routing``) hook the same router calls as in one process; routing
happens before dispatch, and what gets dispatched is whatever the (possibly replayed) router chose.

One MoE layer's forward, for the ``T`` tokens of this rank and its top-``k`` choices:

1. **counts**: every (token, choice) pair is a row bound for the rank owning its expert; rows are
   ordered by global expert (hence by owner rank). The per-expert counts are exchanged with a
   plain ``all_to_all_single`` (integers, no gradient), so each rank learns how many rows each
   source rank sends to each of its local experts;
2. **dispatch**: the token rows (``[T·k, H]``; quantised to MXFP8 and dequantised first when the
   experts were converted with ``numerics.quantize_dispatch``, straight-through, with the gradient
   returning in BF16 exactly as ``numerics.qlinear.dispatch_quantize`` does in one process) go out
   by ``torch.distributed.nn.functional.all_to_all_single``, which is autograd-aware: its backward
   is the reverse all-to-all of the row gradients;
3. **experts**: each rank runs its local experts on the rows it received (plain ``F.linear``, or
   the converted module's quantised matmuls);
4. **return**: the expert outputs go back by a second autograd all-to-all (rounded to BF16 first
   with ``quantize_dispatch``, as ``QuantizedExperts`` rounds them);
5. **combine**: on the token's own rank, the ``k`` outputs are weighted by the router's gate
   weights and summed in float32 (or the model dtype when wider), then cast to the model dtype once.
   One process sums ``y · w`` into a model-dtype buffer, expert by expert; in float32 the two agree
   to rounding, and in BF16 this is the more precise one ("combine in higher precision").

Gradients and the optimizer
---------------------------
Expert parameters (``expert_parameters``) are **per rank**, not replicated: the rows of every rank
of the group reach an expert's owner, so after backward the owner's gradient already sums the
contributions of all ``ep`` ranks' losses. The other parameters are replicated and each rank holds
the gradient of its own loss only. ``sync_gradients`` puts both right: it all-reduces the
replicated gradients over the whole data-parallel group, and the expert gradients only over
``expert_replicas``, the ranks that hold the *same* shard (none when ``ep`` equals the world size);
an all-reduce over every rank would add different experts' gradients together. An elementwise
optimizer (Adam) built on the local parameters then updates each shard as one process would update
those rows; its moments of an expert parameter are sharded the same way (gather them with
``gather_experts`` as the weights are).

Checkpoints: ``full_state_dict`` gathers every expert parameter back (``all_gather`` along the
expert dimension) into the single-process layout, so ``save_pretrained`` of an unsharded copy, or
the existing checkpoint code given that dict, writes the same files at any ``ep``. To load, build
the whole model, load the full checkpoint, then call ``shard_experts``.

Not done here
-------------
- FSDP of the expert shards over their replicas: with ``parallel.ep_fsdp`` FSDP2 shards every
  other weight (``distributed.fsdp.shard_model``), and each expert shard stays whole on its
  ``world_size / ep`` replicas (docs/distributed.md).
- No capacity factor or token dropping: every routed row is computed (exact, uneven load).
- No overlap of communication and compute, no grouped GEMM: one matmul per local expert.
- Code that reads expert weights directly instead of calling the module (``inference.invariant``,
  the batch-invariant decoder) sees only the local shard: samplers need an unsharded copy.
- ``numerics.convert_model`` must run *before* ``shard_experts`` (the sharded module is refused
  by nothing there, but converting it would wrap the local shard as if it were every expert).
- NVFP4 forwards with a per-tensor activation scale (``numerics.nvfp4_activation_scale =
  "tensor"``) take their scale from the rows an expert receives, so they depend on how rows are
  grouped; the MXFP8 and per-token scales do not.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from opencomposer.config.section import ConfigError

EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def check_expert_parallel(world_size: int, ep: int, num_experts: int | None = None) -> None:
    """Raise ConfigError unless ``ep`` ranks per expert group fit ``world_size`` ranks and ``E``
    experts per layer: ``world_size % ep == 0`` and ``num_experts % ep == 0`` (when given)."""
    if ep < 1:
        raise ConfigError(f"parallel.ep: must be a positive integer, got {ep}")
    if world_size % ep:
        raise ConfigError(f"parallel.ep = {ep} does not divide trainer.world_size = {world_size}: the ranks form "
                          f"world_size / ep data-parallel replicas of ep expert shards; pick ep among the divisors")
    if num_experts is not None and num_experts % ep:
        raise ConfigError(f"parallel.ep = {ep} does not divide the model's {num_experts} experts per MoE layer: "
                          f"each rank keeps E / ep of them; pick ep among the divisors of {num_experts}")


def expert_block(num_experts: int, ep: int, rank: int) -> range:
    """The experts rank ``rank`` of ``ep`` owns: a contiguous block of ``num_experts / ep``."""
    check_expert_parallel(ep, ep, num_experts)
    if not 0 <= rank < ep:
        raise ValueError(f"expert-parallel rank {rank} outside [0, {ep})")
    per_rank = num_experts // ep
    return range(rank * per_rank, (rank + 1) * per_rank)


def _a2a(output: torch.Tensor, rows: torch.Tensor, output_splits: list[int], input_splits: list[int],
         group) -> torch.Tensor:
    """The autograd-aware all-to-all of ``rows`` (its backward sends the gradients back)."""
    from torch.distributed.nn.functional import all_to_all_single

    with warnings.catch_warnings():  # torch 2.13 points to a private replacement; this one is public
        warnings.simplefilter("ignore", FutureWarning)
        return all_to_all_single(output, rows.contiguous(), output_splits, input_splits,
                                 group=group or torch.distributed.group.WORLD)


class ExpertParallelExperts(nn.Module):
    """A fused-experts module holding this rank's block of experts; called like the original,
    ``(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``, with global
    expert indices (module doc: the two all-to-alls and the combine)."""

    def __init__(self, experts: nn.Module, group=None):
        super().__init__()
        import torch.distributed as dist

        self.group = group
        self.ep_size = dist.get_world_size(group)
        self.ep_rank = dist.get_rank(group)
        self.num_experts = int(experts.num_experts)  # global, as the router numbers them
        block = expert_block(self.num_experts, self.ep_size, self.ep_rank)
        self.first_expert, self.local_experts = block.start, len(block)
        for name in EXPERT_PARAMS:
            full = getattr(experts, name)
            local = nn.Parameter(full.detach()[block.start:block.stop].clone(), requires_grad=full.requires_grad)
            local.expert_parallel_group = group  # a shard: its gradient norm counts over the group
            setattr(self, name, local)
        self.act_fn = experts.act_fn
        self.recipe = getattr(experts, "recipe", None)  # QuantizedExperts: the quantised matmuls
        self.quantize_dispatch = bool(getattr(experts, "quantize_dispatch", False))
        self.dispatch_spec = getattr(experts, "dispatch_spec", None)

    def _expert(self, j: int, x: torch.Tensor) -> torch.Tensor:
        if self.recipe is None:
            gate, up = F.linear(x, self.gate_up_proj[j]).chunk(2, dim=-1)
            return F.linear(self.act_fn(gate) * up, self.down_proj[j])
        from opencomposer.numerics.qlinear import quantized_linear

        gate, up = quantized_linear(x, self.gate_up_proj[j], self.recipe).chunk(2, dim=-1)
        return quantized_linear(self.act_fn(gate) * up, self.down_proj[j], self.recipe)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        tokens, hidden = hidden_states.shape
        k = top_k_index.shape[1]
        ep, local = self.ep_size, self.local_experts
        experts = top_k_index.reshape(-1).long()  # [T·k] global expert of each row
        if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= self.num_experts):
            raise ValueError(f"expert parallelism: expert indices in [{int(experts.min())}, {int(experts.max())}], "
                             f"expected [0, {self.num_experts})")
        order = torch.argsort(experts, stable=True)  # rows grouped by expert, hence by owner rank
        # 1. counts: [E] rows per global expert out; back, [ep, local] rows per (source rank, local expert)
        sent = torch.bincount(experts, minlength=self.num_experts)
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=self.group)
        received = received.view(ep, local)
        send_splits = sent.view(ep, local).sum(1).tolist()
        recv_splits = received.sum(1).tolist()
        # 2. dispatch (the MXFP8 rounding is per token row, blocks along H, so it commutes with the gather)
        x = hidden_states
        if self.quantize_dispatch:
            from opencomposer.numerics.qlinear import dispatch_quantize

            x = dispatch_quantize(x, self.dispatch_spec)
        rows = _a2a(x.new_empty(sum(recv_splits), hidden), x[order // k], recv_splits, send_splits, self.group)
        # 3. local experts; rows arrive by source rank, then by local expert
        local_ids = torch.repeat_interleave(torch.arange(local, device=rows.device).repeat(ep), received.reshape(-1))
        by_expert = torch.argsort(local_ids, stable=True)
        counts = torch.bincount(local_ids, minlength=local).tolist()
        outputs = []
        for j, chunk in enumerate(rows[by_expert].split(counts)):
            outputs.append(self._expert(j, chunk) if counts[j] else chunk)  # an empty chunk keeps the graph
        # in the dispatched rows' dtype: under bf16 autocast an expert returns bf16 and an empty
        # chunk stays float32, and every rank must send the return all-to-all the same element size
        done = torch.cat(outputs).to(rows.dtype)[torch.argsort(by_expert)]
        if self.quantize_dispatch:
            from opencomposer.numerics.qlinear import combine_round

            done = combine_round(done)
        # 4. return, 5. combine on the token's own rank, in float32 at least
        back = _a2a(done.new_empty(tokens * k, hidden), done, send_splits, recv_splits, self.group)
        per_choice = back[torch.argsort(order)].view(tokens, k, hidden)
        wide = torch.promote_types(hidden_states.dtype, torch.float32)
        out = (per_choice.to(wide) * top_k_weights.to(wide).unsqueeze(-1)).sum(dim=1)
        return out.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return (f"experts {self.first_expert}..{self.first_expert + self.local_experts - 1} of {self.num_experts}, "
                f"ep rank {self.ep_rank} of {self.ep_size}, quantize_dispatch={self.quantize_dispatch}")


def _fused_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from opencomposer.numerics.convert import QuantizedExperts, is_fused_experts

    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, QuantizedExperts) or (is_fused_experts(module) and hasattr(module, "num_experts"))]
    return [(name, module) for name, module in found
            if not any(name.startswith(other + ".") for other, _ in found if other != name)]


def shard_experts(model: nn.Module, group=None) -> list[str]:
    """Keep, on this rank of ``group`` (default: the whole world), its block of every MoE layer's
    experts and make those layers dispatch by all-to-all (module doc). Returns the replaced module
    names. Refuses a model without fused experts, experts stored otherwise (transposed, with bias,
    without gate), an expert count not divisible by the group size, and a model already sharded.
    Every rank must call it (it reads the group; the first forward's all-to-alls are collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("shard_experts needs an initialised process group (torch.distributed.init_process_group)")
    if any(isinstance(m, ExpertParallelExperts) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} is already expert-parallel; shard the unsharded model once")
    experts = _fused_experts(model)
    if not experts:
        raise ValueError(f"{type(model).__name__} has no fused MoE experts (gate_up_proj [E, 2I, H], down_proj "
                         "[E, H, I]); expert parallelism supports transformers Qwen3-MoE and DeepSeek-V3 models")
    ep = dist.get_world_size(group)
    for name, module in experts:
        if getattr(module, "is_transposed", False) or getattr(module, "has_bias", False) \
                or not getattr(module, "has_gate", True):
            raise ValueError(f"{name}: experts stored transposed, with biases or without a gate are not supported "
                             "by expert parallelism; expected gate_up_proj [E, 2I, H] and down_proj [E, H, I]")
        if module.num_experts % ep:
            raise ValueError(f"{name}: {module.num_experts} experts cannot be split over an expert-parallel group of "
                             f"{ep} ranks (parallel.ep = {ep}); E must be a multiple of ep")
    for name, module in experts:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, ExpertParallelExperts(module, group))
    return [name for name, _ in experts]


def expert_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every expert shard of ``model`` (per rank, not replicated)."""
    for prefix, module in model.named_modules():
        if isinstance(module, ExpertParallelExperts):
            for name in EXPERT_PARAMS:
                yield f"{prefix}.{name}" if prefix else name, getattr(module, name)


def gather_experts(local: torch.Tensor, group=None) -> torch.Tensor:
    """The full ``[E, ...]`` tensor from every rank's ``[E / ep, ...]`` block (a weight, its
    gradient, or an optimizer moment of it), on every rank. Collective, no gradient."""
    import torch.distributed as dist

    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.detach().contiguous(), group=group)
    return torch.cat(parts)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every expert parameter gathered back to ``[E, ...]``: the keys
    and shapes of the unsharded model, on every rank. Collective over each layer's group."""
    state = {name: value.detach() for name, value in model.state_dict().items()}
    for prefix, module in model.named_modules():
        if isinstance(module, ExpertParallelExperts):
            for name in EXPERT_PARAMS:
                key = f"{prefix}.{name}" if prefix else name
                state[key] = gather_experts(getattr(module, name), module.group)
    return state


def sync_gradients(model: nn.Module, group=None, expert_replicas=None, average: bool = False,
                   experts_only: bool = False) -> None:
    """All-reduce the gradients of an expert-parallel model after backward (module doc).

    Replicated parameters: summed over ``group`` (every data-parallel rank; default the world).
    Expert shards: summed over ``expert_replicas`` only (the ranks holding the same experts; pass
    ``None`` when the expert-parallel group is the whole ``group``: each owner already has the sum
    over all ranks' tokens). ``average``: divide both by ``group``'s size, for per-rank losses that
    are means (the step's loss their mean) rather than parts of one sum. ``experts_only``: leave
    the other parameters alone (FSDP reduced them: ``parallel.ep_fsdp``). Every rank must have the
    same replicated parameters with and without a gradient (the all-reduces are matched in order)."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    shards = [p for _, p in expert_parameters(model)]
    experts = {id(p) for p in shards}
    # A shard without a gradient: when its layer ran backward on some rank, no row reached these
    # experts, and one process would hold zeros in their rows of the layer's gradient (Adam still
    # steps them), so hold zeros too; when no rank ran the layer's backward (a loss that reads the
    # trunk without gradient), one process has no gradient for the layer at all: leave it None.
    if shards:
        some = torch.tensor([float(p.grad is not None) for p in shards], device=shards[0].device)
        dist.all_reduce(some, op=dist.ReduceOp.MAX, group=group)
        for parameter, anywhere in zip(shards, some.tolist(), strict=True):
            if parameter.grad is None and anywhere and parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
    for parameter in model.parameters():
        grad = parameter.grad
        if grad is None:
            continue
        if id(parameter) in experts:
            if expert_replicas is not None and dist.get_world_size(expert_replicas) > 1:
                dist.all_reduce(grad, group=expert_replicas)
        elif experts_only:
            continue
        else:
            dist.all_reduce(grad, group=group)
        if average:
            grad.div_(size)
