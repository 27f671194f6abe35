"""Checkpoints of a phased run: ``{run}/checkpoints/step-NNNNNNN/`` (global step) holds ``model/``
(a checkpoint ``transformers`` loads), ``trainer.pt`` (AdamW's state in the single-process
layout, torch's RNG) and ``state.json`` (phase, step in it, global step, tokens, tokens per
source, whether it ends its phase, the phase plan, the phases a condition ended early and after
how many steps: ``ended``). One is written at the end of every phase
(kept) and every ``pretrain.checkpoint_every`` steps inside one (only the newest kept), each
atomically; a resume reads the newest (docs/pretraining.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import ConfigError
from opencomposer.distributed.fsdp import full_model_state, full_optimizer_state
from opencomposer.distributed.runtime import World
from opencomposer.io import atomic_directory, discard
from opencomposer.pretrain.plan import Phase

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
FRESH = {"phase": 0, "step": 0, "global_step": 0, "tokens": 0, "mix": {}}
"""The ``state.json`` of a run that has not trained yet."""


def _checkpoints(run_dir: Path) -> list[Path]:
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(PREFIX) and (p / "state.json").is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    found = _checkpoints(run_dir)
    return found[-1] if found else None


def save_phase_checkpoint(run_dir: Path, model: torch.nn.Module, tokenizer: Any, optimizer: dict[str, Any],
                          state: dict[str, Any]) -> Path:
    """Write ``checkpoints/step-NNNNNNN`` atomically, then drop older mid-phase checkpoints (those
    that end a phase stay). ``model``: whole (not sharded); ``optimizer``: its state dict in the
    single-process layout (``distributed.fsdp.full_optimizer_state``)."""
    from opencomposer.model.loading import save_checkpoint

    def write(folder: Path) -> None:
        save_checkpoint(model, tokenizer, folder / "model")
        torch.save({"optimizer": optimizer, "torch_rng": torch.get_rng_state()}, folder / "trainer.pt")
        (folder / "state.json").write_text(json.dumps(state, indent=1))

    (run_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    for stale in (run_dir / CHECKPOINTS).glob(f".{PREFIX}*.tmp*"):  # left by a kill mid-write
        discard(stale)
    path = atomic_directory(run_dir / CHECKPOINTS / f"{PREFIX}{state['global_step']:07d}", write)
    for old in _checkpoints(run_dir):
        if old != path and not json.loads((old / "state.json").read_text()).get("phase_end"):
            discard(old)
    return path



def plan_state(plan: list[Phase]) -> list[dict[str, Any]]:
    """The plan as ``state.json`` keeps it: a resume with other phases is refused. An empty
    ``until`` is left out, as checkpoints written before the key existed have it."""
    return [{"name": p.name, "steps": p.steps,
             **{k: v for k, v in dataclasses.asdict(p.config).items() if k != "until" or v}} for p in plan]


def resume_state(checkpoint: Path | None, plan: list[Phase]) -> dict[str, Any]:
    """The ``state.json`` of ``checkpoint`` (``FRESH`` without one), refused when its phases differ
    from ``plan``."""
    if checkpoint is None:
        return dict(FRESH)
    state = json.loads((checkpoint / "state.json").read_text())
    if state["plan"] != plan_state(plan):
        raise ConfigError(f"cannot resume {checkpoint}: its [[pretrain.phases]] differ from the recipe's; restore "
                          f"the recipe or start a fresh run folder (run.name)")
    return state


def whole_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, host: torch.nn.Module | None,
                world: World) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model whole and the optimizer's state in the single-process layout (collective under
    data parallelism: rank 0 gets them in ``host``, the other ranks nothing useful)."""
    if not world.distributed:
        return model, optimizer.state_dict()
    weights = full_model_state(model, world)
    optimizer_state = full_optimizer_state(model, optimizer, world)
    if world.main:
        host.load_state_dict(weights)
    return host, optimizer_state
