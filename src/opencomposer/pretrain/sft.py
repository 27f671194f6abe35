"""Supervised fine-tuning on scripted episodes: the docs/recipe.md §3 SFT phase, and RL's starting point.

Demonstrations are recorded in the real harness: the oracle policy (the task's gold patch replayed
through the tools, ``agent.policies.scripted``) plays each task in a sandbox, all its calls in one
turn followed by ``finish`` (or, for a task with a walkthrough, its turns one by one under the
recipe's context policy), and the agent loop records the episode token in, token out, exactly
as it records an RL rollout. ``opencomposer sft`` then trains on those records as one phase of the
phased trainer whose losses are ``["sft"]`` (``pretrain.plan.sft_plan``, ``pretrain.phases``):
cross-entropy on the model-written tokens only (prompts and tool outputs are context, not
targets), averaged over the batch's model tokens, with the same packing and forward as the RL
trainer (``training.packing``, ``training.forward``). Adam (AdamW with decay groups when
``sft.weight_decay > 0``), linear warm-up, cosine decay to a tenth of the peak learning rate. The
loss of every step goes to ``metrics.jsonl`` (and ``tb/``) in the output folder, beside the
checkpoint. With ``[numerics]`` set, the matmuls of the experts (and linears, with
``quantize_linears``) run in that format (``numerics.convert``), as in RL.

RL needs a starting point that solves its tasks only some of the time (groups whose rollouts
disagree). Two ways to get one: stop SFT early, or give it an imperfect teacher
(``sft.wrong_share``: that share of the demonstrations writes a decoy word instead of the one
asked for, so the model learns to be right with about the complementary probability, whatever the
phrasing). The RL learning test uses the second (docs/rl.md explains why).

Data and context parallelism, ``sft.pack_tokens``, ``sft.micro_batch_tokens`` and ``sft.bf16`` are
the trainer's (``pretrain.phases`` module doc): rank 0 records the demonstrations and sends them to
the other ranks, each takes its cost-balanced share of every batch, and rank 0 writes the
checkpoint, gathered whole, in the same layout.

Not here: chat-transcript SFT data sets (no data set is downloaded).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, SFTConfig, to_toml
from opencomposer.distributed.fsdp import full_model_state
from opencomposer.distributed.runtime import World
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.numerics.convert import convert_model
from opencomposer.pretrain.demonstrations import demonstration_tasks, demonstrations, record_demonstrations
from opencomposer.pretrain.phases import PhasedResult, train_in_memory
from opencomposer.pretrain.plan import sft_plan
from opencomposer.training.cost import CostMeter
from opencomposer.training.cost import finish as finish_cost
from opencomposer.training.metrics import MetricsLog
from opencomposer.types import Episode

__all__ = ["demonstration_tasks", "record_demonstrations", "run_sft", "sft", "sft_output", "sft_worker"]


def sft(
    model: torch.nn.Module,
    tokenizer: Any,
    episodes: list[Episode],
    config: SFTConfig,
    *,
    seed: int = 0,
    progress: bool = True,
    log: MetricsLog | None = None,
    world: World | None = None,
    cost: CostMeter | None = None,
) -> PhasedResult:
    """Train ``model`` in place on the model tokens of ``episodes`` (the ``sft`` phase of
    ``config``); returns the loss history, and writes it to ``log`` when given. ``world``: this
    rank's place in a data- (and context-) parallel group, whose ranks all train on rank 0's
    ``episodes``; ``model`` is then sharded in place."""
    settings, plan = sft_plan(config)
    return train_in_memory(model, tokenizer, settings, plan, seed=seed, demonstrations=lambda: episodes, sft=config,
                           log=log, progress=progress, world=world, cost=cost)


def sft_output(config: Config) -> Path:
    return Path(config.sft.out) if config.sft.out else Path(config.run.out_dir) / f"{config.run.name}-sft"


def run_sft(config: Config, progress: bool = True, world: World | None = None
            ) -> tuple[torch.nn.Module, Any, PhasedResult, Path | None]:
    """Demonstrations → SFT → checkpoint at ``sft_output(config)`` (loadable as ``model.path``).
    ``world``: a rank of a data-parallel group (module doc); ranks other than 0 return no folder."""
    import dataclasses

    from opencomposer.model.loading import load_model, save_checkpoint

    world = world or World()
    device = world.device if world.distributed else resolve_device(config.run.device)
    apply_run_settings(config.run)
    init = config.sft.init
    spec = dataclasses.replace(config.model, kind="hf", path=init) if init else dataclasses.replace(config.model, path="")
    model, tokenizer = load_model(spec, seed=config.run.seed, device=device)
    convert_model(model, config.numerics)
    cost = CostMeter("sft", config.run, model, devices=world.size)  # its wall time includes recording the demonstrations
    with tempfile.TemporaryDirectory(prefix="opencomposer-sft-") as scratch:
        # the sandboxed demonstrations run once, on rank 0 (the trainer sends them on)
        episodes = demonstrations(config, tokenizer) if world.main else None
        if not world.main:
            result = sft(model, tokenizer, episodes, config.sft, seed=config.run.seed, progress=False, world=world)
            full_model_state(model, world)  # rank 0 gathers the checkpoint
            return model, tokenizer, result, None
        # logged in scratch, then moved in with the weights: the output folder is whole or absent
        metrics = Path(scratch) / "metrics"
        with MetricsLog(metrics, trackers=config.run.trackers, recipe=to_toml(config),
                        name=f"{config.run.name}-sft", tracker_folder=Path(config.run.out_dir)) as log:
            result = sft(model, tokenizer, episodes, config.sft, seed=config.run.seed, progress=progress, log=log,
                         world=world, cost=cost)
        if world.distributed:  # the whole weights, into the single-process model's layout
            whole, _ = load_model(spec, seed=config.run.seed, device=torch.device("cpu"))
            convert_model(whole, config.numerics)
            whole.load_state_dict(full_model_state(model, world))
            model = whole
        from opencomposer.io import atomic_directory

        def write(folder: Path) -> None:
            save_checkpoint(model, tokenizer, folder)
            (folder / "recipe.toml").write_text(to_toml(config))
            for item in metrics.iterdir():  # metrics.jsonl and tb/
                shutil.move(item, folder / item.name)
            finish_cost(cost, folder, f"opencomposer sft: {sft_output(config)}")

        # built aside and renamed into place: RL never starts from half a checkpoint after a crash
        out = atomic_directory(sft_output(config), write)
    return model, tokenizer, result, out


def sft_worker(world: World, config: Config) -> tuple[PhasedResult, Path] | None:
    """``distributed.launch``'s function for ``opencomposer sft``: rank 0's result and checkpoint
    folder, None on the other ranks."""
    _, _, result, out = run_sft(config, progress=world.main, world=world)
    return (result, out) if world.main else None
