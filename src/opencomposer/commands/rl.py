"""``opencomposer rl``: RL in the agent harness, synchronous (``rl.loop``) or with the asynchronous
services (``rl.mode = "async"``, ``services.async_rl``); a rerun resumes the run folder's newest
checkpoint."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    from opencomposer.distributed.runtime import launch

    if config.rl.mode == "async":
        from opencomposer.services.async_rl import async_worker as worker
    else:
        from opencomposer.rl.distributed import rl_worker as worker
    summary = launch(worker, config)  # trainer.world_size processes, or torchrun's, or this one
    if summary is None:  # a following rank of a torchrun group: rank 0 reports
        return 0
    first, last = summary.first_eval, summary.last_eval
    line = f"{summary.steps} steps in {summary.seconds:.0f} s; run folder {summary.run_dir}"
    if first and last:
        line += (f"; held-out pass@1 {first['pass_at_1']:.3f} → {last['pass_at_1']:.3f}, "
                 f"best-of-{int(last['k'])} {first['best_of_k']:.3f} → {last['best_of_k']:.3f}")
    print(line)
    return 0
