"""What the three base-model checks share: the models they measure (named, checked, loaded), the
token every scored text starts with, the held-out projects they read, and the results: the
comparison table and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HEADLINE = (("codebase_nll_per_byte", "NLL/byte ↓"), ("state_tracking_distance", "state dist ↓"),
            ("freshbench_accuracy", "Fresh acc ↑"))
"""The three headline numbers of a model's results (JSON key, table column), in report order."""


class BasecheckError(ValueError):
    """Bad input to the base-model checks: a model that is neither a kind nor a checkpoint folder,
    a repository that is not a folder or not a git work tree, an unknown package, too little data."""


def check_model_spec(spec: str) -> str:
    """Refuse, before anything is loaded, a model that is neither a kind nor a checkpoint folder."""
    from opencomposer.model.loading import MODEL_KINDS

    kinds = [kind for kind in MODEL_KINDS if kind != "hf"]
    if spec in kinds:
        return spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise BasecheckError(f"--model {spec}: no such folder, and not a model kind ({', '.join(kinds)})")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise BasecheckError(f"--model {spec}: not a checkpoint folder (no config.json); expected a folder "
                             "that save_checkpoint or save_pretrained wrote, or a kind: " + ", ".join(kinds))
    return str(path)


def load_checked_model(spec: str, seed: int, device: str) -> tuple[Any, Any]:
    """The model and tokenizer ``spec`` names (a kind, built with ``seed``, or a checkpoint folder)."""
    from opencomposer.model.device import resolve_device
    from opencomposer.model.loading import load_model

    return load_model(check_model_spec(spec), seed=seed, device=resolve_device(device))


def start_id(tokenizer: Any) -> int:
    """The token every scored sequence starts with: the document separator of pretraining."""
    from opencomposer.model.tokenizer import document_separator_id

    return document_separator_id(tokenizer)


def model_context(model: Any) -> int:
    """The positions the model was built for (2048 when its config does not say)."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 2048)


def model_device(model: Any) -> Any:
    return next(model.parameters()).device


def heldout_project_roots() -> list[Path]:
    """The held-out source projects (``tasks.heldout_projects``): repositories that the default
    pretraining corpus (stdlib and site-packages) does not hold, and task generation keeps out of
    the training stream."""
    from opencomposer.config import TasksConfig
    from opencomposer.tasks.format import PROJECTS_DIR

    return [PROJECTS_DIR / name for name in TasksConfig().heldout_projects]


def results_table(results: dict[str, dict]) -> Any:
    """A rich table: one row per model, the three headline numbers and the run time."""
    from rich.table import Table

    table = Table(title="base-model checks", caption="NLL/byte: codebase NLL, nats per UTF-8 byte; state dist: "
                  "normalised edit distance of the final file; Fresh acc: FreshBench-like accuracy")
    table.add_column("model", overflow="fold")  # a checkpoint path is shown whole, over lines
    for _, title in HEADLINE:
        table.add_column(title, justify="right")
    table.add_column("seconds", justify="right")
    for spec, row in results.items():
        seconds = row.get("detail", {}).get("seconds", {}).get("total")
        table.add_row(spec, *(f"{row[key]:.4f}" for key, _ in HEADLINE), f"{seconds:.0f}" if seconds else "")
    return table


def write_results(results: dict[str, dict], out: Path) -> None:
    """``out`` as JSON: ``{MODEL: {"codebase_nll_per_byte", "state_tracking_distance",
    "freshbench_accuracy", "detail"}}``, its folder made when missing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
