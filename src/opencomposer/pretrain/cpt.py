"""Continued pretraining of ``[pretrain]`` without ``[[pretrain.phases]]``: the quickstart's stage 1.

Such a recipe is one phase of the phased trainer (``pretrain.phases``; ``pretrain.plan.pretraining_plan``):
``pretrain.seq_len``, ``batch_size``, ``max_steps``, ``lr``, ``warmup_steps`` and ``min_lr_ratio``
make the phase, trained on the corpus a recipe without phases always had (no deduplication,
held-out files drawn one by one), for ``max_steps`` or ``max_minutes`` of wall-clock time,
whichever runs out first (the cosine follows whichever budget is running out faster). It keeps no
step checkpoints: a rerun starts afresh. The run folder gets what a phased run's gets, the final
``checkpoint/`` (plain ``transformers`` loads it), ``metrics.jsonl`` and ``loss.png`` among them.

The entry points here are the ones scripts and tests call: ``run_pretraining`` (a run folder),
``pretrain`` (a model trained in place on given files), and the held-out measure ``evaluate`` on
``packed_batches``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, PretrainConfig
from opencomposer.distributed.runtime import World
from opencomposer.model.corpus import CodeFile, Corpus
from opencomposer.pretrain.data import packed_batches
from opencomposer.pretrain.evaluation import heldout_loss
from opencomposer.pretrain.phases import PhasedResult, run_phases, train_in_memory
from opencomposer.pretrain.plan import pretraining_plan
from opencomposer.training.metrics import MetricsLog

__all__ = ["evaluate", "packed_batches", "pretrain", "run_pretraining"]


def pretrain(
    model: torch.nn.Module,
    tokenizer: Any,
    train_files: list[CodeFile],
    heldout_files: list[CodeFile],
    config: PretrainConfig,
    *,
    log: MetricsLog | None = None,
    progress: bool = True,
    seed: int = 0,
    world: World | None = None,
) -> PhasedResult:
    """Train ``model`` in place (on the device it is on) as ``config`` says (module doc), on
    ``train_files``, evaluating on ``heldout_files``; the rows also go to ``log`` when given.
    ``world``: this rank of a data-parallel group; ``model`` is then sharded in place."""
    settings, plan = pretraining_plan(config)
    return train_in_memory(model, tokenizer, settings, plan, seed=seed, corpus=Corpus(train_files, heldout_files),
                           log=log, progress=progress, world=world)


def run_pretraining(config: Config, corpus: Corpus | None = None, tokenizer: Any = None, progress: bool = True,
                    world: World | None = None) -> tuple[Any, Any, PhasedResult, Path | None]:
    """Corpus → tokenizer → model → the recipe's phases → checkpoint, all under ``config.run.path``
    (``phases.run_phases``, which this returns with the final checkpoint folder; None on ranks
    other than 0)."""
    model, tokenizer, result = run_phases(config, corpus, tokenizer, progress=progress, world=world)
    return model, tokenizer, result, result.checkpoint


def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` on batches of ``packed_batches``."""
    return heldout_loss(model, batches)["loss"]
