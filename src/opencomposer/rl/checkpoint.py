"""Resumable RL checkpoints, written atomically, and the exactly-once record of the task stream.

A checkpoint is a folder ``{run}/checkpoints/step-NNNNNN/`` holding everything a resumed run needs
to continue as if it had never stopped:

- ``model/``: the policy's weights and tokenizer (a Hugging Face folder; ``local:PATH`` loads it);
- ``trainer.pt``: Adam's state and the RNG states (torch, NumPy, Python); with
  ``trainer.optimizer_checkpoint = "sharded"`` Adam's state is in ``optimizer/`` instead, one file
  per rank (``torch.distributed.checkpoint``), and ``trainer.pt`` says so;
- ``state.json``: the step, the position in the task stream and the record of every task the
  stream handed out so far (stream index, task id, the step that used it, its status:
  ``trained``, or ``dropped`` with the reason its rollouts taught nothing, and why it was drawn:
  ``drawn_by`` ``order`` or ``harder_later`` with its estimated ``difficulty`` then, ``rl.tasks``),
  plus the policy version and, under ``rl.task_sampling = "harder_later"``, the stream's
  ``sampling`` state (draws, difficulty estimates, generator), so that a resume draws the same tasks.

**Atomicity.** A checkpoint is written into a hidden temporary folder, every file is fsynced, and
the folder is renamed to its final name (an atomic ``rename(2)`` on one file system), then the
parent directory is fsynced. A folder named ``step-NNNNNN`` is therefore always complete; a run
killed while writing leaves only a hidden ``.step-*.tmp*`` folder, removed at the next start.
Old checkpoints are renamed out of the way before they are deleted, for the same reason.

**Exactly once.** The record of trained tasks lives only inside checkpoints, next to the weights
those tasks produced: a step's tasks count as trained when, and only when, a checkpoint holding
the step's weights exists. A run killed at any point resumes from its newest checkpoint; the
steps after it (their rollouts, their updates, any evaluation) are lost with the process and are
replayed from the same stream position, so every task of the stream ends up in the weights
exactly once and in the record exactly once. ``metrics.jsonl`` and the TensorBoard events are cut
back to the checkpoint's step on resume (``rl.loop``), so logs agree with the record.

**Trained or dropped.** Every position is consumed once either way (single epoch: a dropped task
is not retried), but not every consumed task moved the weights: a group left with fewer than two
scored episodes (infrastructure failures) has no baseline and is dropped, and a step without
gradient (every advantage zero) skips its update. Their records say ``dropped`` and why; a task
whose rows entered an applied update says ``trained``.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from opencomposer.io import atomic_directory, discard

CHECKPOINTS = "checkpoints"
PREFIX = "step-"


@dataclass
class TaskRecord:
    """One consumed stream position: its task, the step that used it, and whether it trained."""

    index: int
    task_id: str
    step: int
    status: Literal["trained", "dropped"] = "trained"
    reason: str = ""  # for "dropped": the group was dropped, or the step skipped its update
    drawn_by: Literal["order", "harder_later"] = "order"  # how the stream chose it (rl.tasks)
    difficulty: float | None = None  # its estimated difficulty when drawn (harder_later only)

    def __post_init__(self) -> None:
        if self.status not in ("trained", "dropped"):
            raise ValueError(f"task record status: expected 'trained' or 'dropped', got {self.status!r}")
        if self.drawn_by not in ("order", "harder_later"):
            raise ValueError(f"task record drawn_by: expected 'order' or 'harder_later', got {self.drawn_by!r}")
        if (self.status == "dropped") != bool(self.reason):
            raise ValueError(f"task record {self.task_id!r}: a reason is given for dropped tasks, and only for them")


@dataclass
class RunState:
    """Where a run is: steps done, next stream position, and every task the stream handed out."""

    step: int = 0
    cursor: int = 0
    trained: list[TaskRecord] = field(default_factory=list)  # the exactly-once record, by stream position
    sampling: dict[str, Any] = field(default_factory=dict)  # TaskStream.state_dict(); empty for in_order

    @classmethod
    def from_json(cls, text: str) -> RunState:
        data = json.loads(text)
        return cls(step=int(data["step"]), cursor=int(data["cursor"]),
                   trained=[TaskRecord(**record) for record in data["trained"]],
                   sampling=data.get("sampling", {}))  # absent before harder_later existed

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"


def rng_state() -> dict[str, Any]:
    """The process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(position), int(has_gauss), float(cached)],
        "python": list(random.getstate()[1]) + [random.getstate()[0], random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    *internal, version, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{PREFIX}{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (hidden temporary folders are never listed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def remove_partial(run_dir: Path) -> list[Path]:
    """Delete what a killed run left half-written (hidden temporary and trash folders)."""
    removed = []
    for root in (Path(run_dir), Path(run_dir) / CHECKPOINTS):
        if not root.is_dir():
            continue
        for path in root.iterdir():
            if path.name.startswith(".") and (".tmp" in path.name or path.name.startswith(".trash-")):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def save_training_checkpoint(
    run_dir: Path,
    state: RunState,
    model: torch.nn.Module,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep: int,
    write_optimizer: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically, then keep only the newest ``keep``.
    ``write_optimizer``: writes a sharded optimizer state into the checkpoint's ``optimizer/``
    (``Trainer.save_optimizer``; every rank writes into the same temporary folder)."""
    from opencomposer.model.loading import save_checkpoint

    def write(folder: Path) -> None:
        if write_optimizer is not None:
            write_optimizer(folder / "optimizer")
        save_checkpoint(model, tokenizer, folder / "model")
        torch.save({**trainer_state, "rng": rng_state()}, folder / "trainer.pt")
        (folder / "state.json").write_text(state.to_json())

    final = atomic_directory(checkpoint_dir(run_dir, state.step), write)
    for old in list_checkpoints(run_dir)[:-keep]:
        discard(old)
    return final


def load_training_checkpoint(path: Path) -> tuple[RunState, dict[str, Any]]:
    """``(state, trainer_state)`` of a checkpoint folder; the weights are in ``path / "model"``.
    RNG states are restored as a side effect."""
    state = RunState.from_json((path / "state.json").read_text())
    trainer_state = torch.load(path / "trainer.pt", weights_only=True, map_location="cpu")
    set_rng_state(trainer_state.pop("rng"))
    return state, trainer_state
