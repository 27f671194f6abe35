"""Group checkpoints: every scored group is written to disk the moment it is ready, so a trainer
crash loses no finished rollout (docs/services.md).

``{run}/groups/NNNNNN.pkl`` holds one group of stream index N: its task, every episode (token ids,
sampler logprobs, per-token policy versions, routes, grades and the grade-level reward), the
version that admitted it and the attempt. Shaped rewards and advantages are not stored: the
trainer computes them when it trains the group (they need the reference policy's forward, which is
fixed for the run, so they come out the same whenever that happens).

Files are written atomically (``io.atomic_write_bytes``). A group file is deleted only once a
training checkpoint records its index as trained or dropped; on resume, the groups whose files
remain and whose indices the checkpoint does not record are trained without sampling them again.
They are our own files (pickle), never read from anywhere else.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from opencomposer.io import atomic_write_bytes
from opencomposer.types import Group

FOLDER = "groups"


@dataclass
class StoredGroup:
    index: int
    task_id: str
    admitted_version: int
    attempt: int
    group: Group


class GroupStore:
    def __init__(self, run_dir: Path):
        self.folder = Path(run_dir) / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, index: int) -> Path:
        return self.folder / f"{index:06d}.pkl"

    def save(self, stored: StoredGroup) -> None:
        atomic_write_bytes(self.path(stored.index), pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL))

    def load(self, index: int) -> StoredGroup:
        return pickle.loads(self.path(index).read_bytes())

    def indices(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob("*.pkl") if p.stem.isdigit())

    def remove(self, indices: list[int]) -> None:
        for index in indices:
            self.path(index).unlink(missing_ok=True)
