"""``opencomposer sft``: supervised fine-tuning on oracle episodes, RL's starting point (``pretrain.sft``)."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    from opencomposer.pretrain.sft import run_sft

    _, _, result, out = run_sft(load_recipe(args.recipe, args.overrides))
    print(f"{result.steps} SFT steps on {result.demonstrations} demonstrations in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {out}")
    return 0
