"""The metrics of every trainer: ``{folder}/metrics.jsonl`` and TensorBoard events in ``{folder}/tb``.

One JSON line per logged row, ``{"step": N, "kind": "train" | "eval", "time": unix seconds,
...numbers}``, and the same numbers as TensorBoard scalars tagged ``{kind}/{name}``. Every line
is flushed as it is written, so ``tail -f`` and a crash both see everything up to the last row.

Two guarantees for resumable runs (RL):

- ``sync()`` fsyncs the file; a trainer calls it before each checkpoint, so that a resume never
  finds the log shorter than its checkpoint.
- ``MetricsLog(folder, resume_step=N)`` cuts the log back to step N first: the lines after N (the
  steps the resume replays) and a line torn by a kill are dropped, and TensorBoard purges its
  events after N. Without ``resume_step`` the log starts empty.

``read_metrics`` reads the rows back. Where each trainer's folder is: docs/trainer.md.

**Trackers** (``run.trackers``): every row also goes, once, at its step, to each tracker named:
TensorBoard (``{folder}/tb``, the default), Weights & Biases (project ``opencomposer``, the run's
name; ``WANDB_MODE=offline`` writes the run under ``WANDB_DIR``, else ``{folder}``, without a
network) and MLflow (experiment ``opencomposer``; ``MLFLOW_TRACKING_URI``, else a file store in
``{folder}/mlruns``). Their names are ``{kind}/{metric}``, as in TensorBoard. The resolved recipe
goes to each once, when the log opens: W&B's run config, MLflow's ``recipe.toml`` artifact. W&B
and MLflow are the ``trackers`` extra (``pip install 'opencomposer[trackers]'``; ``mlflow-skinny``
is enough) and are imported only when named. A resumed run opens a new W&B or MLflow run, from
the step it resumes at (their logs cannot be cut back the way ``metrics.jsonl`` is).

``merge_ranks`` combines what each rank of a data-parallel group measured into the row one
process would have logged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from opencomposer.io import atomic_write_text

if TYPE_CHECKING:
    from opencomposer.distributed.runtime import World

METRICS_FILE = "metrics.jsonl"

Merge = Literal["sum", "mean", "max", "min", "first", "concat"]
"""How ``merge_ranks`` combines one metric over the ranks (module doc)."""


def merge_ranks(world: World, metrics: Mapping[str, Any], rules: Mapping[str, Merge] | None = None,
                default: Merge = "first") -> dict[str, Any]:
    """Every rank's ``metrics`` (one gather; collective: every rank calls it) combined name by name,
    by ``rules[name]`` or else ``default``: ``sum`` (a rank's part of the batch's loss, counts,
    token-weighted sums; numbers or tensors), ``mean`` (a per-rank value such as the MoE
    load-balancing loss), ``max`` / ``min`` (extremes), ``first`` (rank 0's: a value every rank
    already holds for the whole batch), ``concat`` (lists joined in rank order). Every rank gets
    the merged dict; one process gets ``metrics`` back as a dict. A name only some ranks report (a
    rank with no rows of the step has no metric sums) is merged over the ranks that have it."""
    if not world.distributed:
        return dict(metrics)
    gathered = world.gather(dict(metrics))
    merged: dict[str, Any] = {}
    for name in dict.fromkeys(name for rank in gathered for name in rank):
        values = [rank[name] for rank in gathered if name in rank]
        rule = (rules or {}).get(name, default)
        if rule == "sum":
            merged[name] = sum(values[1:], values[0])
        elif rule == "mean":
            merged[name] = sum(values) / len(values)
        elif rule == "max":
            merged[name] = max(values)
        elif rule == "min":
            merged[name] = min(values)
        elif rule == "first":
            merged[name] = values[0]
        elif rule == "concat":
            merged[name] = [item for value in values for item in value]
        else:
            raise ValueError(f"merge_ranks: unknown rule {rule!r} for {name!r}; expected one of sum, mean, max, "
                             "min, first, concat")
    return merged


def _parsed(line: str) -> dict[str, Any] | None:
    """The row of a ``metrics.jsonl`` line; None for a blank or torn line (a kill mid-write)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def read_metrics(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (or of ``{path}/metrics.jsonl`` for a folder), of ``kind``
    only when given; a torn line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    rows = [row for row in map(_parsed, path.read_text().splitlines()) if row is not None]
    return [row for row in rows if kind is None or row.get("kind") == kind]


class MetricsLog:
    """``{folder}/metrics.jsonl`` plus ``{folder}/tb``; see the module doc."""

    def __init__(self, folder: Path, resume_step: int | None = None, *, tensorboard: bool = True,
                 trackers: Sequence[str] | None = None, recipe: str = "", name: str = "",
                 tracker_folder: Path | None = None):
        """``trackers``: ``run.trackers`` (module doc); None keeps TensorBoard as ``tensorboard``
        says. ``recipe``: the resolved recipe's TOML, for the trackers; ``name``: the run's name;
        ``tracker_folder``: where W&B and MLflow keep their local files (default ``folder``), for a
        log written in a scratch folder that is moved afterwards (SFT), whose stores must not move."""
        folder = Path(folder)
        if trackers is not None:
            tensorboard = "tensorboard" in trackers
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / METRICS_FILE
        kept = []
        if resume_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if (row := _parsed(line)) is not None and row["step"] <= resume_step]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self.writer = SummaryWriter(str(folder / "tb"), purge_step=purge)
        self.trackers = [TRACKERS[tracker](Path(tracker_folder or folder), name or folder.name, recipe)
                         for tracker in trackers or () if tracker != "tensorboard"]
        self.file = self.path.open("a")

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> None:
        row = {"step": step, "kind": kind, "time": time.time(), **metrics}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.writer is not None:
            for name, value in metrics.items():
                self.writer.add_scalar(f"{kind}/{name}", value, step)
            self.writer.flush()
        for tracker in self.trackers:
            tracker.log(step, {f"{kind}/{name}": float(value) for name, value in metrics.items()})

    def sync(self) -> None:
        """Make every line logged so far durable (before a checkpoint; see module doc)."""
        self.file.flush()
        os.fsync(self.file.fileno())
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        for tracker in self.trackers:
            tracker.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class WandbTracker:
    """Rows to a Weights & Biases run (module doc); ``WANDB_MODE`` and ``WANDB_DIR`` as W&B reads them."""

    def __init__(self, folder: Path, name: str, recipe: str):
        import tomllib

        import wandb

        self.run = wandb.init(project="opencomposer", name=name, dir=os.environ.get("WANDB_DIR", str(folder)),
                              config=tomllib.loads(recipe) if recipe else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """Rows to an MLflow run (module doc). Without ``MLFLOW_TRACKING_URI``, a file store in
    ``{folder}/mlruns``: the one store ``mlflow-skinny`` has locally (it lacks the SQL one), which
    MLflow 3 opens only with ``MLFLOW_ALLOW_FILE_STORE=true``, so that is set for this process."""

    def __init__(self, folder: Path, name: str, recipe: str):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(folder) / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name("opencomposer")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("opencomposer")
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        if recipe:
            self.client.log_text(self.run_id, recipe, "recipe.toml")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, value, now, step) for name, value in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}
"""``run.trackers`` names besides ``tensorboard`` → the class that logs to it."""
