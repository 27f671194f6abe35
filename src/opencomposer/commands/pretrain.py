"""``opencomposer pretrain``: continued pretraining on the code corpus (``pretrain.cpt``)."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    from opencomposer.pretrain.cpt import run_pretraining

    _, _, result, checkpoint = run_pretraining(load_recipe(args.recipe, args.overrides))
    print(f"{result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {checkpoint}")
    return 0
