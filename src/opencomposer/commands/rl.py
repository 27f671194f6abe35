"""``opencomposer rl``: the RL run (``rl.loop.RLRun``) from the rollout source ``rl.mode`` names,
synchronous (``rl.sync.SyncRollouts``) or the asynchronous services
(``services.async_rl.AsyncRollouts``), on every rank of ``trainer.world_size``; a rerun resumes the
run folder's newest checkpoint. An asynchronous run checks its weight store before any process
starts (``services.async_rl.check_weight_store``): a fresh run refuses a store that holds another
run's versions with exit 2, as any recipe error."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from opencomposer.config import Config, load_recipe
from opencomposer.protocols import RolloutSource

if TYPE_CHECKING:  # both import torch, which the command line loads only when a command runs
    from opencomposer.distributed.runtime import World
    from opencomposer.rl.loop import RLSummary
    from opencomposer.services.faults import FaultPlan


def rollout_source(config: Config, faults: FaultPlan | None = None) -> RolloutSource:
    """The ``protocols.RolloutSource`` of ``rl.mode``; ``faults``: an injected ``services.faults.FaultPlan``
    (async only)."""
    if config.rl.mode == "async":
        from opencomposer.services.async_rl import AsyncRollouts

        return AsyncRollouts(faults=faults)
    if faults is not None:
        raise ValueError("injected faults (a FaultPlan) need rl.mode = \"async\"")
    from opencomposer.rl.sync import SyncRollouts

    return SyncRollouts()


def rl_worker(world: World, config: Config) -> RLSummary | None:
    """``distributed.launch``'s function: rank 0 runs the RL run and returns its summary; the
    other ranks train their shares (``rl.loop.follow_rl``) and return None."""
    from opencomposer.rl.loop import follow_rl, run_rl

    if not world.main:
        follow_rl(config, world)
        return None
    return run_rl(config, source=rollout_source(config), world=world)


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    if config.rl.mode == "async":  # here, so that a refusal is exit 2 whatever the number of ranks
        from opencomposer.rl.checkpoint import latest_checkpoint
        from opencomposer.services.async_rl import check_weight_store, open_weight_store

        check_weight_store(config, open_weight_store(config), fresh=latest_checkpoint(config.run.path) is None)
    from opencomposer.distributed.runtime import launch

    summary = launch(rl_worker, config)  # trainer.world_size processes, or torchrun's, or this one
    if summary is None:  # a following rank of a torchrun group: rank 0 reports
        return 0
    first, last = summary.first_eval, summary.last_eval
    line = f"{summary.steps} steps in {summary.seconds:.0f} s; run folder {summary.run_dir}"
    if first and last:
        line += (f"; held-out pass@1 {first['pass_at_1']:.3f} → {last['pass_at_1']:.3f}, "
                 f"best-of-{int(last['k'])} {first['best_of_k']:.3f} → {last['best_of_k']:.3f}")
    print(line)
    return 0
