"""Where a trainer puts its model: ``run.device`` resolved to a ``torch.device``.

``"auto"`` takes the GPU when torch sees one and the CPU otherwise; ``"cuda"`` insists on the GPU
and stops with an error when there is none, rather than quietly training on the CPU for hours;
``"cpu"`` is always the CPU. Pretraining, SFT, RL and the local policy (evaluation, serving) all resolve it here.
"""

from __future__ import annotations

import torch

from opencomposer.config import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """The ``torch.device`` for ``run.device = name`` (see module doc)."""
    if name not in DEVICES:
        raise ConfigError(f"run.device: expected one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"run.device = 'cuda', but torch sees no CUDA device (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none'}); set run.device = 'cpu' or 'auto'"
        )
    return torch.device(name)
