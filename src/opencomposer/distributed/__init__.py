"""Data-parallel training under ``torch.distributed``: process groups, FSDP2 sharding, and the
collective pieces the trainers share (docs/distributed.md).

- ``runtime``: who this process is (``World``), starting the group (spawned by the command with
  ``trainer.world_size = N``, or by ``torchrun``), and running a function on every rank;
- ``fsdp``: sharding a policy with ``fully_shard`` (parameters, gradients and Adam's state split over
  the ranks), and gathering full model and optimizer state dicts in the single-process layout, so a
  checkpoint written at any world size loads at any other;
- ``balance``: splitting a step's rows over the ranks by their cost (tokens plus attention).

Imports torch lazily where it can, like the rest of the package's entry points.
"""

from opencomposer.distributed.balance import row_cost, split_rows
from opencomposer.distributed.runtime import World, current_world, launch, single_process

__all__ = ["World", "current_world", "launch", "row_cost", "single_process", "split_rows"]
