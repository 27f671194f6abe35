"""FSDP2 sharding of a policy, and full state dicts in the single-process layout.

``shard_model`` applies ``torch.distributed.fsdp.fully_shard`` to every decoder layer and then to
the whole model: each rank holds 1/N of every parameter, and therefore 1/N of its gradient and of
Adam's moments (the optimizer is built on the sharded parameters). A layer's parameters are
gathered just before its forward and backward and freed after; gradients are reduce-scattered
(averaged over the ranks) as backward leaves each layer.

**Checkpoints gather full state dicts on rank 0** (``full_model_state``, ``full_optimizer_state``)
rather than writing ``torch.distributed.checkpoint`` shards: the weights go into the same Hugging
Face folder and Adam's state into the same ``trainer.pt``, keyed by parameter index exactly as a
single process's ``optimizer.state_dict()`` is, so a run checkpointed at one world size resumes
at any other and every tool that reads a checkpoint keeps working. The cost is that rank 0 holds
one full copy in CPU memory while writing. ``save_sharded_optimizer`` / ``load_sharded_optimizer``
write and read Adam's state shard by shard with ``torch.distributed.checkpoint`` instead
(``trainer.optimizer_checkpoint = "sharded"``, docs/distributed.md).

**Expert parallelism** (``World.ep > 1``) takes FSDP's place: ``shard_model`` keeps this rank's
block of every MoE layer's experts (``distributed.expert.shard_experts``) and every other weight
whole on every rank; after backward the runners call ``reduce_gradients``, which sums the
replicated weights' gradients over all ranks and the expert shards' over their replicas
(``sync_gradients``) and divides by N, the average that FSDP takes by itself. Full state dicts
gather the expert shards (weights and Adam's moments) back into the single-process layout, and
loading slices them again, so checkpoints move between ``ep`` settings too.

**Both at once** (``World.ep_fsdp``, ``parallel.ep_fsdp``): after the experts are sharded, FSDP2
shards every other weight over all ranks, with the expert shards as its ``ignored_params``. Each
weight then has exactly one owner scheme: an expert row lives on the ``ep`` ranks' blocks (and
their replicas), every other weight is split ``world_size`` ways. FSDP averages the other weights'
gradients in backward; ``reduce_gradients`` then handles only the expert shards. The gradient norm
adds the FSDP shards over all ranks and the expert shards over the expert-parallel group; full
state dicts gather both kinds, and loading slices both.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import torch

from opencomposer.distributed.runtime import World


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (``model.model.layers``), if it has them."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def shard_model(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """Shard ``model`` in place over ``world`` with FSDP2, or its experts over ``world.ep_group``
    under expert parallelism (module doc); a no-op for one process."""
    if not world.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model.to(world.device)
    ignored = None
    if world.ep > 1:
        from opencomposer.distributed.expert import expert_parameters, shard_experts

        shard_experts(model, world.ep_group)
        if not world.ep_fsdp:
            return model
        ignored = {parameter for _, parameter in expert_parameters(model)}  # expert parallelism's own
    mesh = init_device_mesh(world.device.type, (world.size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    return model


def _whole(value: Any) -> Any:
    """A DTensor gathered whole (collective over its mesh); anything else as it is."""
    full = getattr(value, "full_tensor", None)
    return full() if full is not None else value


def _full_options(**extra: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **extra)


def full_model_state(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor]:
    """The unsharded ``state_dict`` of ``model`` on rank 0 (on the CPU), ``{}`` on the other ranks.
    Collective: every rank must call it."""
    if not world.distributed:
        return {k: v.detach() for k, v in model.state_dict().items()}
    if world.ep > 1:
        from opencomposer.distributed.expert import full_state_dict

        state = full_state_dict(model)  # every rank takes part in the gathers (experts, then FSDP's)
        whole = {}
        for key, value in state.items():
            value = _whole(value)  # collective for FSDP's shards; only rank 0 keeps the result
            if world.main:
                whole[key] = value.cpu()
        return whole
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order ``optimizer.state_dict()`` numbers them."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    """The optimizer's unsharded state on rank 0, keyed by parameter index as a single process's
    ``optimizer.state_dict()`` is (``{}`` on the other ranks). Collective."""
    if not world.distributed:
        return optimizer.state_dict()
    if world.ep > 1:
        return _ep_optimizer_state(model, optimizer, world)
    if not optimizer.state:  # no update yet (every rank alike): the helper below would step Adam to make one
        return optimizer.state_dict() if world.main else {}
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if not world.main:
        return {}
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    # hyperparameters as ``optimizer.state_dict()`` writes them (the state-dict helpers turn tuples
    # such as ``betas`` into lists, also in the groups of an optimizer they loaded), parameters by index
    return {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [{**{k: tuple(v) if isinstance(v, list) else v for k, v in own.items() if k != "params"},
                          "params": [index[name] for name in group["params"]]}
                         for own, group in zip(optimizer.param_groups, by_name["param_groups"], strict=True)],
    }


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None,
                         world: World) -> None:
    """Load a state written by ``full_optimizer_state`` (at any world size) into the sharded
    optimizer: rank 0 passes it, the other ranks ``None``, and each keeps its shard. Collective."""
    if not world.distributed:
        optimizer.load_state_dict(state)
        return
    if world.ep > 1:
        if world.main and state is None:
            raise ValueError("load_optimizer_state: rank 0 must pass the saved optimizer state")
        _load_ep_optimizer_state(model, optimizer, world.broadcast(state), world)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if world.broadcast(None if not world.main else state is not None and not state["state"]):
        optimizer.state.clear()  # saved before any update: nothing to load (and no helper to step Adam)
        return
    by_name: dict[str, Any] = {}
    if world.main:
        if state is None:
            raise ValueError("load_optimizer_state: rank 0 must pass the saved optimizer state")
        names = _parameter_names(model, optimizer)
        if len(state["state"]) > len(names):
            raise ValueError(f"optimizer state has {len(state['state'])} parameters, the model {len(names)}")
        by_name = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                             for group in state["param_groups"]],
        }
    set_optimizer_state_dict(model, optimizer, by_name, options=_full_options(broadcast_from_rank0=True))


NO_OPTIMIZER_STATE = "EMPTY"
"""The file a sharded optimizer checkpoint holds instead of shards when Adam had taken no step."""


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path,
                           world: World) -> None:
    """Write the optimizer's state into ``folder`` with ``torch.distributed.checkpoint``: each rank its
    own shard, keyed by parameter name (``trainer.optimizer_checkpoint = "sharded"``). Collective
    over the trainer's group; in one process a plain write of the whole state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if world.ep > 1:
        raise ValueError("sharded optimizer checkpoints: expert-parallel shards are not supported (use the full format)")
    if not optimizer.state:  # no update yet: the state helpers would step Adam once to make one
        if world.main:
            Path(folder).mkdir(parents=True, exist_ok=True)
            Path(folder, NO_OPTIMIZER_STATE).write_text("Adam had taken no step: nothing to restore\n")
        return
    state = get_optimizer_state_dict(model, optimizer)
    with _one_process_is_meant():
        dcp.save({"optimizer": state}, checkpoint_id=str(folder), no_dist=not world.distributed)


def load_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path,
                           world: World) -> None:
    """Load a state written by ``save_sharded_optimizer`` at any world size into this rank's shard
    of the optimizer (collective, like the save). Parameters the saved optimizer held no state for
    (never updated: MTP layers during RL) get none here either."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if world.ep > 1:
        raise ValueError("sharded optimizer checkpoints: expert-parallel shards are not supported (use the full format)")
    if Path(folder, NO_OPTIMIZER_STATE).is_file():
        optimizer.state.clear()
        return
    if not Path(folder, ".metadata").is_file():
        raise FileNotFoundError(f"{folder}: no sharded optimizer checkpoint here (its .metadata file is missing)")
    prefix = "optimizer.state."
    saved = {key[len(prefix):].rsplit(".", 1)[0]
             for key in FileSystemReader(str(folder)).read_metadata().state_dict_metadata if key.startswith(prefix)}
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to fill: every parameter's
    with _one_process_is_meant():
        dcp.load(state, checkpoint_id=str(folder), planner=DefaultLoadPlanner(allow_partial_load=True),
                 no_dist=not world.distributed)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    for name, parameter in model.named_parameters():
        if name not in saved:
            optimizer.state.pop(parameter, None)


@contextlib.contextmanager
def _one_process_is_meant():
    """Silence the checkpoint library's notice that it runs without a process group (one process
    writing or reading the shards is intended here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float, world: World | None = None) -> float:
    """Clip the global gradient norm (over every rank's shards) to ``max_norm``; return the norm
    before clipping, a Python float equal on every rank. Under expert parallelism (``world``) the
    norm counts the replicated gradients once and every expert shard of the expert-parallel group."""
    if world is not None and world.ep > 1:
        return _clip_ep_gradients(parameters, max_norm, world)
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def reduce_gradients(model: torch.nn.Module, world: World) -> None:
    """After backward: under expert parallelism, average the gradients over the ranks as FSDP does
    (module doc), the expert shards' only under ``ep_fsdp``; nothing otherwise (FSDP reduced them
    during backward)."""
    if world.ep > 1:
        from opencomposer.distributed.expert import sync_gradients

        sync_gradients(model, None, world.expert_replicas, average=True, experts_only=world.ep_fsdp)


# ------------------------------------------------------------------------------- expert parallelism


def _expert_names(model: torch.nn.Module) -> dict[str, Any]:
    """Name of every expert shard -> the expert-parallel group it is split over."""
    from opencomposer.distributed.expert import EXPERT_PARAMS, ExpertParallelExperts

    return {f"{prefix}.{name}" if prefix else name: module.group
            for prefix, module in model.named_modules() if isinstance(module, ExpertParallelExperts)
            for name in EXPERT_PARAMS}


def _clip_ep_gradients(parameters: list[torch.nn.Parameter], max_norm: float, world: World) -> float:
    import torch.distributed as dist

    with_grad = [p for p in parameters if p.grad is not None]
    shards = [p for p in with_grad if getattr(p, "expert_parallel_group", None) is not None]
    squared = torch.zeros((), dtype=torch.float64, device=world.device)
    for p in shards:
        squared += p.grad.detach().double().pow(2).sum()
    dist.all_reduce(squared, group=world.ep_group)  # every expert of every layer, once
    sharded = torch.zeros((), dtype=torch.float64, device=world.device)
    for p in with_grad:
        if getattr(p, "expert_parallel_group", None) is not None:
            continue
        local = getattr(p.grad, "to_local", None)
        if local is not None:  # an FSDP shard (ep_fsdp): each rank holds its own part
            sharded += local().detach().double().pow(2).sum()
        else:  # replicated: equal on every rank
            squared += p.grad.detach().double().pow(2).sum()
    if world.ep_fsdp:
        dist.all_reduce(sharded)
        squared += sharded
    norm = float(squared.sqrt())
    if norm > max_norm:
        factor = max_norm / (norm + 1e-6)  # as torch.nn.utils.clip_grad_norm_
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(factor)
    return norm


def _ep_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    """Adam's state with every expert moment gathered back to ``[E, ...]`` (collective; rank 0 keeps it)."""
    from opencomposer.distributed.expert import gather_experts

    state = optimizer.state_dict()
    groups = _expert_names(model)
    names = _parameter_names(model, optimizer)
    out = {"state": {}, "param_groups": state["param_groups"]}
    for index, slots in sorted(state["state"].items()):
        group = groups.get(names[index])
        gathered = {slot: gather_experts(value, group) if group is not None and value.dim() else _whole(value)
                    for slot, value in slots.items()}  # _whole: FSDP's shards under ep_fsdp
        if world.main:
            out["state"][index] = {slot: value.cpu() for slot, value in gathered.items()}
    return out if world.main else {}


def _load_ep_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                             world: World) -> None:
    """Load a single-process-layout Adam state, each rank keeping the rows of its experts."""
    import torch.distributed as dist

    groups = _expert_names(model)
    names = _parameter_names(model, optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    local: dict[str, Any] = {"state": {}, "param_groups": state["param_groups"]}
    for index, slots in state["state"].items():
        group = groups.get(names[int(index)])
        if group is None:
            parameter = parameters[int(index)]
            local["state"][index] = {slot: _like(value, parameter) for slot, value in slots.items()}
            continue
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        local["state"][index] = {slot: value.chunk(size)[rank].clone() if value.dim() else value
                                 for slot, value in slots.items()}
    optimizer.load_state_dict(local)


def _like(value: Any, parameter: torch.nn.Parameter) -> Any:
    """An optimizer moment of the whole ``parameter`` as the parameter is held here: its FSDP shard
    (a DTensor with this rank's rows, no collective) when it is one (``ep_fsdp``), else as it is."""
    from torch.distributed.tensor import DTensor

    if not isinstance(parameter, DTensor) or not isinstance(value, torch.Tensor) or value.shape != parameter.shape:
        return value
    mesh, placements = parameter.device_mesh, parameter.placements
    (dim,) = [p.dim for p in placements]  # FSDP2: Shard(0) over one mesh dimension
    chunks = value.chunk(mesh.size(), dim=dim)
    rank = mesh.get_local_rank()
    piece = chunks[rank] if rank < len(chunks) else value.narrow(dim, 0, 0)
    return DTensor.from_local(piece.clone().to(parameter.device), mesh, placements, shape=value.shape,
                              stride=value.stride(), run_check=False)
