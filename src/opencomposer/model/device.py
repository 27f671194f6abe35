"""Where a trainer puts its model (``run.device``), and the process-wide torch settings of ``[run]``.

``"auto"`` takes the GPU when torch sees one and the CPU otherwise; ``"cuda"`` insists on the GPU
and stops with an error when there is none, rather than quietly training on the CPU for hours;
``"cpu"`` is always the CPU. Pretraining, SFT, RL and the local policy (evaluation, serving) all
resolve it here.

``apply_run_settings`` is what every process of a run (the trainer, each distributed rank, each
service process or Ray actor, the local policy of ``opencomposer eval``) calls first:
``run.threads`` and ``run.deterministic``.

**Determinism.** On the CPU a run repeats bit for bit with the same thread count. On the GPU it
does not by default: ``index_add_``, ``scatter_add_``, the backward of indexing and of attention
sum with atomics or split reductions, so the last bits of a gradient change from run to run and
grow through Adam. ``run.deterministic = true`` turns on torch's deterministic mode, which runs
those ops with deterministic kernels and refuses (``RuntimeError``) any op that has none; with
``CUBLAS_WORKSPACE_CONFIG`` set, cuBLAS repeats too. On the CPU's dispatch path the project's
training and sampling code calls none of the refused ops (``tests/training/test_determinism.py``
records every op of a pretraining step, an RL step and a sampling call and checks them against
torch's list): cross-entropy is a log-softmax and a gather (``training.forward.target_nll``;
torch has no deterministic NLL loss on CUDA), and the running sums of top-p and of the sampler's
inverse CDF are fixed-point sums in int64 (``inference.sampling.prefix_sums``; nor has it a
deterministic floating-point ``cumsum`` there). CUDA picks other kernels (attention, grouped
expert matmuls, autocast) that the CPU cannot record; ``tests/gpu/test_cuda.py`` runs the check
that covers them, two deterministic RL runs compared bit for bit, and it has not yet run on a GPU.
The setting reaches this project's processes only: a vLLM or HTTP sampler samples with its own
kernels. What stays out of reach: other machines, other torch or CUDA versions, and a different
number of ranks (a reduction over ranks sums in another order).
"""

from __future__ import annotations

import os

import torch

from opencomposer.config import ConfigError, RunConfig

CUBLAS_WORKSPACES = (":4096:8", ":16:8")
"""The values of ``CUBLAS_WORKSPACE_CONFIG`` under which cuBLAS repeats its results (CUDA 10.2 and
later; torch refuses a cuBLAS call in deterministic mode without one)."""

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


def apply_run_settings(run: RunConfig) -> None:
    """This process's torch settings from ``[run]``: ``run.threads`` intra-op threads (0 keeps
    torch's default) and, with ``run.deterministic``, deterministic kernels (module doc). Call it
    before the first CUDA operation of the process: cuBLAS reads its workspace setting when torch
    first creates a handle. Deterministic mode is process-wide and stays on."""
    if run.threads:
        torch.set_num_threads(run.threads)
    if not run.deterministic:
        return
    workspace = os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACES[0])
    if workspace not in CUBLAS_WORKSPACES:
        raise ConfigError(
            f"run.deterministic: CUBLAS_WORKSPACE_CONFIG={workspace!r} in the environment; cuBLAS repeats "
            f"its results only with {' or '.join(CUBLAS_WORKSPACES)} (unset it to get {CUBLAS_WORKSPACES[0]})"
        )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
