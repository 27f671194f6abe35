"""``[trainer]`` and ``[parallel]``: how many processes train, and how the work is split between them.

``[trainer]`` is the process group: ``world_size`` data-parallel ranks (``opencomposer rl`` /
``pretrain`` spawn them, or ``torchrun`` does and the environment says so), the collective backend,
and the rendezvous port of a spawned group. ``[parallel]`` names the axes beyond data parallelism:
context parallelism (``cp``, one sequence's tokens split over ranks) and expert parallelism (``ep``,
a MoE layer's experts split over ranks). Only data parallelism is implemented
(``opencomposer.distributed``); ``cp`` and ``ep`` accept 1 and refuse anything larger with a
ConfigError, so a recipe never believes it runs a parallelism it does not get (docs/distributed.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class TrainerConfig(Section):
    section = "trainer"

    world_size: int = 1
    """Data-parallel trainer processes. 1: a single process, no process group. N > 1: the command
    spawns N processes (or, under ``torchrun``, must equal its ``WORLD_SIZE``); the policy is
    sharded over them with FSDP2 and each rank trains on a share of every step's rows."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: ``auto`` picks ``nccl`` when the run trains on CUDA, else ``gloo`` (CPU)."""
    master_port: int = 29512
    """TCP port of the rendezvous on 127.0.0.1 when the command spawns the group itself; 0 picks a
    free port. Ignored under ``torchrun``, which sets ``MASTER_ADDR`` / ``MASTER_PORT``."""

    def validate(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"trainer.world_size: must be >= 1, got {self.world_size}")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"trainer.master_port: must be a TCP port in 0..65535 (0: any free), got {self.master_port}")


@dataclass
class ParallelConfig(Section):
    section = "parallel"

    cp: int = 1
    """Context-parallel degree: ranks that split one sequence's tokens (ring attention). Not
    implemented yet; only 1 is accepted."""
    ep: int = 1
    """Expert-parallel degree: ranks that split each MoE layer's experts (all-to-all dispatch).
    Not implemented yet; only 1 is accepted."""

    def validate(self) -> None:
        for key, value, what in (("cp", self.cp, "context parallelism (splitting a sequence over ranks)"),
                                 ("ep", self.ep, "expert parallelism (splitting MoE experts over ranks)")):
            if value < 1:
                raise ConfigError(f"parallel.{key}: must be >= 1, got {value}")
            if value > 1:
                raise ConfigError(
                    f"parallel.{key} = {value}: {what} is not implemented yet; only data parallelism is "
                    "(trainer.world_size). Set parallel." + key + " = 1"
                )
