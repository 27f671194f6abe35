"""``opencomposer sft``: supervised fine-tuning on oracle episodes, RL's starting point (``pretrain.sft``)."""

from __future__ import annotations

import argparse

from opencomposer.config import ConfigError, load_recipe


def main(args: argparse.Namespace) -> int:
    from opencomposer.distributed.runtime import under_launcher
    from opencomposer.pretrain.sft import run_sft

    config = load_recipe(args.recipe, args.overrides)
    if config.trainer.world_size > 1 or config.parallel.cp > 1 or under_launcher():
        raise ConfigError("opencomposer sft trains in one process so far; set trainer.world_size = 1 and "
                          "parallel.cp = 1 (data and context parallelism run in opencomposer rl)")
    _, _, result, out = run_sft(config)
    print(f"{result.steps} SFT steps on {result.demonstrations} demonstrations in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {out}")
    return 0
