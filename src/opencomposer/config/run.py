"""``[run]``: what names a run and where it happens (seed, device, threads, determinism, output folder),
what its compute is priced at (``training.cost``) and where its metrics go (``training.metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from opencomposer.config.section import ConfigError, Section

DEVICE_PRICES: dict[str, float] = {
    "cpu": 0.10,
    "L4": 0.80,
    "A100": 1.50,
    "H100": 2.50,
    "H200": 3.50,
    "B200": 5.00,
}
"""Dollars per device-hour when ``run.cost_per_hour`` is 0: round on-demand prices of late 2026 for
one device (for ``cpu``, one small cloud machine of a few cores), so that a cost table says
something out of the box; override with the price you pay. Names match ``run.cost_device``."""
TRACKERS = ("tensorboard", "wandb", "mlflow")


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

    cost_device: str = "auto"
    """The device the cost table prices (``training.cost``; ``cost.json`` and ``report.html``): a
    name of ``DEVICE_PRICES`` (``cpu``, ``L4``, ``A100``, ``H100``, ``H200``, ``B200``), another name
    with ``cost_per_hour`` set, or ``auto``: the run's own, ``cpu`` or the GPU's model name when it
    is one of the table's."""
    cost_per_hour: float = 0.0
    """Dollars per device-hour; 0 takes ``DEVICE_PRICES[cost_device]``."""
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where metrics go besides ``metrics.jsonl`` (``training.metrics``): ``tensorboard``
    (``{run}/tb``), ``wandb`` (Weights & Biases; ``WANDB_MODE=offline`` keeps it local) and
    ``mlflow`` (``MLFLOW_TRACKING_URI``, else ``{run}/mlruns``); the last two need the
    ``trackers`` extra (``pip install 'opencomposer[trackers]'``). Each gets every row once, at its
    step, and the resolved recipe once."""

    def validate(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"run.threads: must be >= 0 (0 = torch's default), got {self.threads}")
        if self.cost_per_hour < 0:
            raise ConfigError(f"run.cost_per_hour: must be >= 0 (0 = the price of run.cost_device), got {self.cost_per_hour}")
        if self.cost_per_hour == 0 and self.cost_device != "auto" and self.cost_device not in DEVICE_PRICES:
            raise ConfigError(
                f"run.cost_device = {self.cost_device!r} has no known price: set run.cost_per_hour, or name one of "
                f"{', '.join(DEVICE_PRICES)} (or \"auto\")"
            )
        for tracker in self.trackers:
            if tracker not in TRACKERS:
                raise ConfigError(f"run.trackers: {tracker!r} is not one of {', '.join(TRACKERS)}")
        if len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(f"run.trackers: {self.trackers} names a tracker twice")

    @property
    def path(self) -> Path:
        return Path(self.out_dir) / self.name
