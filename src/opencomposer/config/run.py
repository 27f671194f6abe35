"""``[run]``: what names a run and where it happens (seed, device, threads, determinism, output folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class RunConfig(Section):
    section = "run"

    name: str = "run"
    """Run name; outputs go to ``{out_dir}/{name}``."""
    out_dir: str = "runs"
    """Parent folder of run outputs (checkpoints, metrics, plots)."""
    seed: int = 0
    """Seed for every random choice of the run (data order, init, sampling)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where tensors live; ``auto`` picks CUDA when available."""
    threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""
    deterministic: bool = False
    """Deterministic kernels (``model.device.apply_run_settings``, docs/gpu.md §5): torch's
    deterministic mode, which refuses an op that has no deterministic kernel rather than run it,
    a fixed cuBLAS workspace, no cuDNN autotuning, fixed-point running sums for top-p and the
    sampler. For the GPU, where atomics and split reductions otherwise change the last bits from
    run to run; the CPU already repeats with the same thread count, and there the setting only
    costs time (and moves a draw that falls within rounding of a boundary)."""

    def validate(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"run.threads: must be >= 0 (0 = torch's default), got {self.threads}")

    @property
    def path(self) -> Path:
        return Path(self.out_dir) / self.name
