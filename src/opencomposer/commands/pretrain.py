"""``opencomposer pretrain``: continued pretraining on the code corpus by the phased trainer
(``pretrain.phases``): the recipe's ``[[pretrain.phases]]`` in order, resuming its run folder's
newest checkpoint, or without them the one phase of ``[pretrain]`` (``pretrain.cpt``)."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    from opencomposer.distributed.runtime import launch
    from opencomposer.pretrain.phases import phases_worker

    result = launch(phases_worker, config)  # trainer.world_size processes, or torchrun's, or this one
    if result is None:  # a following rank of a torchrun group: rank 0 reports
        return 0
    for phase in result.phases:
        evals = [e for e in phase.evals if "heldout_loss" in e]
        held = f"; held-out {evals[0]['heldout_loss']:.3f} → {evals[-1]['heldout_loss']:.3f}" if evals else ""
        print(f"{phase.name}: seq_len {phase.seq_len}, {phase.steps} steps, {phase.tokens:,} tokens; "
              f"loss {phase.first_loss:.3f} → {phase.last_loss:.3f}{held}")
    print(f"{result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s; "
          f"run folder: {config.run.path} (checkpoint/, loss.png, heldout.png, corpus.json, mix.json)")
    return 0
