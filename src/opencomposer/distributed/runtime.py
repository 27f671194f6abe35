"""Who this process is in the trainer's process group, and how the group starts.

Two ways to run N data-parallel ranks (``trainer.world_size = N``):

- **spawned by the command**: ``opencomposer rl`` / ``pretrain`` with ``--set trainer.world_size=N``
  calls ``launch``, which starts N processes (``torch.multiprocessing.spawn``) on this machine,
  with a rendezvous on ``127.0.0.1:trainer.master_port``; rank 0's return value comes back to the
  caller;
- **under torchrun** (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT``): ``launch`` joins the group the environment describes and runs the function
  once in this process; ``trainer.world_size`` must be 1 (take the launcher's) or equal it.

The backend is ``gloo`` on CPU and ``nccl`` on CUDA (``trainer.backend = "auto"``); each CUDA rank
uses the GPU of its ``LOCAL_RANK``. ``World`` wraps the few collectives the trainers use, so the
single-process case (``World.size == 1``, no process group) runs the same code without any.

**Context parallelism** (``parallel.cp = c``, ``trainer.world_size`` a multiple of ``c``): the ranks
form a ``(size / c) × c`` grid, rank ``r`` at data-parallel position ``r // c`` and context-parallel
position ``r % c``. The ``c`` consecutive ranks of one data-parallel position are a context-parallel
group (``World.cp_group``): they get the same rows and each holds ``1 / c`` of every row's positions
(``distributed.context``). ``join_group`` creates every group on every rank, in the same order, as
``torch.distributed.new_group`` requires.

**Expert parallelism** (``parallel.ep = e``, ``trainer.world_size`` a multiple of ``e``): the ``e``
consecutive ranks ``d·e … d·e + e - 1`` form an expert-parallel group (``World.ep_group``), each
keeping ``E / e`` of every MoE layer's experts; the ranks at the same place in their groups hold the
same experts (``World.expert_replicas``, ``world_size / e`` of them). Expert parallelism is a way
to split the model, not the data: every rank still trains its own share of the rows.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ConfigError

ENV_KEYS = ("RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class World:
    """This process's place in the trainer's group; ``size == 1`` means no group at all. ``cp`` and
    ``cp_group``: the context-parallel degree and this rank's group of ``cp`` ranks (module doc)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    cp: int = 1
    cp_group: Any = None
    ep: int = 1
    ep_group: Any = None
    expert_replicas: Any = None  # the ranks holding this rank's experts (None: only this rank)
    ep_fsdp: bool = False  # with ep > 1: FSDP2 shards every weight but the experts (parallel.ep_fsdp)

    def __post_init__(self) -> None:
        for axis in ("cp", "ep"):
            degree = getattr(self, axis)
            if degree < 1 or self.size % degree:
                raise ValueError(f"World: {self.size} ranks cannot form {axis} groups of {degree}")
            if degree > 1 and getattr(self, f"{axis}_group") is None:
                raise ValueError(f"World: {axis} = {degree} needs this rank's {axis} group")

    @property
    def main(self) -> bool:
        """Rank 0: the rank that samples, evaluates and writes (records, metrics, checkpoints)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def dp_size(self) -> int:
        """Data-parallel positions: how many ways a step's rows are split."""
        return self.size // self.cp

    @property
    def dp_rank(self) -> int:
        """This rank's share of the rows (the same for every rank of a context-parallel group)."""
        return self.rank // self.cp

    @property
    def cp_rank(self) -> int:
        """This rank's place in its context-parallel group (which chunks of each row it holds)."""
        return self.rank % self.cp

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; for commands and rows, not for weights)."""
        if not self.distributed:
            return obj
        box = [obj if self.main else None]
        torch.distributed.broadcast_object_list(box, src=0, device=self._object_device)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over the ranks (a copy; ``tensor`` itself one process)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone().to(self._object_device)
        torch.distributed.all_reduce(total)
        return total.to(tensor.device)

    def max(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self._object_device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return int(tensor.item())

    @property
    def _object_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def single_process(device: torch.device | str = "cpu") -> World:
    return World(device=torch.device(device))


_JOINED: World | None = None  # what join_group made of the default group (it knows the CP groups)


def current_world() -> World:
    """The ``World`` of an initialised default process group, or the single process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return single_process()
    if _JOINED is not None:
        return _JOINED
    local = int(os.environ.get("LOCAL_RANK", torch.distributed.get_rank()))
    device = torch.device("cuda", local) if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    return World(torch.distributed.get_rank(), torch.distributed.get_world_size(), local, device)


def under_launcher() -> bool:
    """True when a launcher (torchrun) set this process's rank and world size."""
    return all(key in os.environ for key in ENV_KEYS)


def _device_and_backend(config: Config, local_rank: int) -> tuple[torch.device, str]:
    from opencomposer.model.device import resolve_device

    device = torch.device(resolve_device(config.run.device))
    backend = config.trainer.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError('trainer.backend = "nccl" needs CUDA; this run trains on the CPU (run.device), use "gloo"')
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device, backend


def join_group(config: Config) -> World:
    """Initialise the default process group from the environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``) and return this process's ``World``."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if config.trainer.world_size not in (1, size):
        raise ConfigError(f"trainer.world_size = {config.trainer.world_size}, but the launcher started "
                          f"WORLD_SIZE = {size} processes; set trainer.world_size = {size} (or leave it at 1)")
    cp = config.parallel.cp
    if size % cp:
        raise ConfigError(f"parallel.cp = {cp} does not divide the {size} ranks of the group; "
                          f"use a world size that is a multiple of {cp}")
    local = int(os.environ.get("LOCAL_RANK", rank))
    device, backend = _device_and_backend(config, local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, rank=rank, world_size=size,
                                             device_id=device if device.type == "cuda" else None,
                                             timeout=datetime.timedelta(seconds=config.trainer.timeout_s))
    ep = config.parallel.ep
    from opencomposer.distributed.expert import check_expert_parallel

    check_expert_parallel(size, ep)
    global _JOINED
    cp_group = context_parallel_groups(size, cp, rank)
    ep_group, replicas = expert_parallel_groups(size, ep, rank)
    _JOINED = World(rank, size, local, device, cp=cp, cp_group=cp_group, ep=ep, ep_group=ep_group,
                    expert_replicas=replicas, ep_fsdp=config.parallel.ep_fsdp and ep > 1)
    return _JOINED


def _own_groups(size: int, rank: int, members: list[list[int]]) -> Any:
    """Create every group of ``members`` (on every rank, in the same order); return this rank's."""
    own = None
    for ranks in members:
        group = torch.distributed.new_group(ranks)
        if rank in ranks:
            own = group
    return own


def context_parallel_groups(size: int, cp: int, rank: int) -> Any:
    """This rank's context-parallel group (None when ``cp == 1``). Collective: every rank creates
    every group, ranks ``d·cp … d·cp + cp - 1`` for each data-parallel position ``d``."""
    if cp == 1:
        return None
    return _own_groups(size, rank, [list(range(first, first + cp)) for first in range(0, size, cp)])


def expert_parallel_groups(size: int, ep: int, rank: int) -> tuple[Any, Any]:
    """This rank's expert-parallel group (``ep`` consecutive ranks) and its expert replicas (the
    ranks at the same place in every group; None when there is one group). ``(None, None)``
    when ``ep == 1``. Collective, like ``context_parallel_groups``."""
    if ep == 1:
        return None, None
    group = _own_groups(size, rank, [list(range(first, first + ep)) for first in range(0, size, ep)])
    if size == ep:
        return group, None
    return group, _own_groups(size, rank, [list(range(place, size, ep)) for place in range(ep)])


def leave_group() -> None:
    """Destroy the default process group (and with it the context-parallel groups)."""
    global _JOINED
    _JOINED = None
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, fn: Callable[..., Any], config: Config, args: tuple, port: int, result: str) -> None:
    faulthandler.enable(all_threads=True)  # a rank killed by a signal (a native abort) prints where it was
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(config.trainer.world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    world = join_group(config)
    try:
        value = fn(world, config, *args)
        if world.main:
            Path(result).write_bytes(pickle.dumps(value))
    finally:
        leave_group()


def launch(fn: Callable[..., Any], config: Config, *args: Any) -> Any:
    """Run ``fn(world, config, *args)`` on every rank of the trainer's group and return rank 0's
    value (``None`` on other ranks of a torchrun group). See the module doc for the three cases:
    under a launcher, spawned (``trainer.world_size > 1``), or in this process alone."""
    if under_launcher():
        world = join_group(config)
        try:
            value = fn(world, config, *args)
        finally:
            leave_group()
        return value if world.main else None
    size = config.trainer.world_size
    if size == 1:
        for axis, what in (("cp", "splits each sequence"), ("ep", "splits each MoE layer's experts")):
            if getattr(config.parallel, axis) != 1:
                raise ConfigError(f"parallel.{axis} = {getattr(config.parallel, axis)} {what} over that many ranks: "
                                  f"set trainer.world_size to a multiple of it (or run under torchrun)")
        device, _ = _device_and_backend(config, 0)
        return fn(World(device=device), config, *args)
    if config.trainer.backend != "gloo" and torch.cuda.is_available() and torch.cuda.device_count() < size \
            and config.run.device != "cpu":
        raise ConfigError(f"trainer.world_size = {size} on CUDA needs {size} GPUs; "
                          f"{torch.cuda.device_count()} are visible")
    port = config.trainer.master_port or free_port()
    with tempfile.TemporaryDirectory(prefix="opencomposer-launch-") as folder:
        result = Path(folder) / "rank0.pkl"
        torch.multiprocessing.spawn(_spawned, args=(fn, config, args, port, str(result)), nprocs=size, join=True)
        return pickle.loads(result.read_bytes()) if result.exists() else None
