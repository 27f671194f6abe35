"""``[trainer]`` and ``[parallel]``: how many processes train, and how the work is split between them.

``[trainer]`` is the process group: ``world_size`` ranks (``opencomposer rl`` / ``sft`` /
``pretrain`` spawn them, or ``torchrun`` does and the environment says so), the collective backend,
and the rendezvous port of a spawned group. ``[parallel]`` names the axes beyond data parallelism:
context parallelism (``cp``, one sequence's tokens split over ranks) and expert parallelism (``ep``,
a MoE layer's experts split over ranks). ``cp > 1`` runs in ``opencomposer rl`` (synchronous and
async), ``sft`` and ``pretrain`` (single phase and phases). ``ep > 1`` runs in the same commands,
in place of FSDP: each MoE layer's experts split over the group, every other weight replicated,
or sharded by FSDP2 as well with ``ep_fsdp`` (docs/distributed.md, "Expert parallelism in the
commands").
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
    timeout_s: float = 3600.0
    """How long a rank waits in one collective before the group fails. The other ranks wait in one
    while rank 0 samples an RL step or records SFT demonstrations in the sandbox, so this bounds
    those; torch's own defaults (10 minutes for NCCL) are shorter than a long rollout."""
    optimizer_checkpoint: Literal["full", "sharded"] = "full"
    """How RL checkpoints hold Adam's state. ``full``: rank 0 gathers it whole into ``trainer.pt``
    (the single-process layout, by parameter index; rank 0 then holds two fp32 copies of every
    weight's moments while writing). ``sharded``: every rank writes its own shard into the
    checkpoint's ``optimizer/`` folder with ``torch.distributed.checkpoint``, keyed by parameter
    name, and a resume at any world size reads the parts it needs; nothing is gathered. The ranks
    must share the run folder's file system. Data and context parallelism only (expert shards
    are per-rank tensors that the checkpoint planner would take for replicas)."""
    master_port: int = 29512
    """TCP port of the rendezvous on 127.0.0.1 when the command spawns the group itself; 0 picks a
    free port. Ignored under ``torchrun``, which sets ``MASTER_ADDR`` / ``MASTER_PORT``."""

    def validate(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"trainer.world_size: must be >= 1, got {self.world_size}")
        if self.timeout_s <= 0:
            raise ConfigError(f"trainer.timeout_s: must be > 0 seconds, got {self.timeout_s}")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"trainer.master_port: must be a TCP port in 0..65535 (0: any free), got {self.master_port}")


@dataclass
class ParallelConfig(Section):
    section = "parallel"

    cp: int = 1
    """Context-parallel degree: ranks that split one sequence's tokens, each holding chunks ``r``
    and ``2·cp−1−r`` of ``2·cp``, keys and values all-gathered for attention
    (``opencomposer.distributed.context``, docs/context-parallel.md). ``trainer.world_size`` must be
    a multiple of ``cp``: ``world_size / cp`` data-parallel shares of each step's rows, each computed
    by ``cp`` ranks. Runs in ``opencomposer rl`` (synchronous and async), ``sft`` and ``pretrain``
    (single phase and ``[[pretrain.phases]]``)."""
    ep: int = 1
    """Expert-parallel degree: ranks that split each MoE layer's routed experts
    (``opencomposer.distributed.expert``). Every rank of an expert-parallel group of ``ep`` ranks
    keeps a contiguous block of ``E / ep`` experts of every MoE layer; the routers, attention,
    embeddings and shared experts stay whole on every rank. Tokens travel to the ranks owning their
    chosen experts and back by two all-to-alls (MXFP8 on the way out with
    ``numerics.quantize_dispatch``); the weighted combine runs on the token's own rank in float32.
    Constraints, checked by ``distributed.expert.check_expert_parallel`` (``trainer.world_size`` and
    the model's expert count live outside this section): ``trainer.world_size`` a multiple of
    ``ep`` (``world_size / ep`` data-parallel replicas of each expert shard), and every MoE layer's
    expert count ``E`` divisible by ``ep``. Every command runs it (``distributed.fsdp.shard_model``
    shards the experts; the other weights stay whole on every rank unless ``ep_fsdp``)."""
    ep_fsdp: bool = False
    """With ``ep > 1``, also shard every weight that expert parallelism keeps whole (attention,
    embeddings, norms, routers, shared experts, MTP layers) with FSDP2 over all ranks, with their
    gradients and Adam's moments: the expert shards are left to expert parallelism
    (``ignored_params``), the rest costs 1/``world_size`` of its memory per rank instead of all of
    it (docs/distributed.md, "Expert and data parallelism at once"). Off by default: EP alone
    needs no FSDP collectives, and a ``[[pretrain.phases]]`` phase of ``mtp`` alone is refused under
    FSDP (its trunk runs without gradient)."""

    def validate(self) -> None:
        if self.cp < 1:
            raise ConfigError(f"parallel.cp: must be >= 1, got {self.cp}")
        if self.ep < 1:
            raise ConfigError(f"parallel.ep: must be a positive integer (ranks per expert-parallel group), got {self.ep}")
        if self.ep_fsdp and self.ep == 1:
            raise ConfigError("parallel.ep_fsdp = true shards the weights expert parallelism keeps whole; with "
                              "parallel.ep = 1 FSDP already shards every weight: set parallel.ep > 1 or drop ep_fsdp")
