"""``opencomposer pretrain``: continued pretraining on the code corpus. A recipe with
``[[pretrain.phases]]`` runs them in order, resuming its run folder's newest checkpoint
(``pretrain.phases``); one without runs the single phase of ``[pretrain]`` (``pretrain.cpt``)."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    from opencomposer.distributed.runtime import launch

    if config.pretrain.phases:
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
              f"run folder: {config.run.path} (checkpoint/, heldout.png, corpus.json, mix.json)")
        return 0
    from opencomposer.pretrain.cpt import pretrain_worker

    outcome = launch(pretrain_worker, config)  # trainer.world_size processes, or torchrun's, or this one
    if outcome is None:  # a following rank of a torchrun group: rank 0 reports
        return 0
    result, checkpoint = outcome
    print(f"{result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {checkpoint}")
    return 0
