"""``opencomposer sft``: supervised fine-tuning on oracle episodes, RL's starting point (``pretrain.sft``)."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    from opencomposer.distributed.runtime import launch
    from opencomposer.pretrain.sft import sft_worker

    outcome = launch(sft_worker, load_recipe(args.recipe, args.overrides))  # trainer.world_size processes, or one
    if outcome is None:  # a following rank of a torchrun group: rank 0 reports
        return 0
    result, out = outcome
    print(f"{result.steps} SFT steps on {result.demonstrations} demonstrations in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {out}")
    return 0
