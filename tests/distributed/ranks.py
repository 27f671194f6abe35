"""Spawning the ranks of a gloo test: ``spawn_ranks(fn, nprocs, *args)`` runs
``fn(rank, port, *args)`` in ``nprocs`` fresh processes (``torch.multiprocessing.spawn``), with a
free port for the group's rendezvous.

Each rank dumps every thread's Python stack if it dies by a signal (``faulthandler``), and a run
in which a rank dies by a signal (not an exception: a wrong result or a failed assertion is never
retried) is run once more on a fresh port, with a warning. Rarely, under the full suite, a gloo
rank has aborted in native code ("terminate called without an active exception", SIGABRT) in the
expert-parallel layouts with FSDP; the rerun keeps that crash from deciding a comparison of
numbers, and the dump says where it happened.
"""

from __future__ import annotations

import faulthandler
import warnings
from collections.abc import Callable
from typing import Any

import torch

from opencomposer.distributed.runtime import free_port


def _rank(rank: int, fn: Callable[..., None], port: int, args: tuple) -> None:
    faulthandler.enable(all_threads=True)
    fn(rank, port, *args)


def spawn_ranks(fn: Callable[..., None], nprocs: int, *args: Any, attempts: int = 2) -> None:
    for attempt in range(1, attempts + 1):
        try:
            torch.multiprocessing.spawn(_rank, args=(fn, free_port(), args), nprocs=nprocs, join=True)
            return
        except torch.multiprocessing.ProcessExitedException as crash:
            if crash.signal_name is None or attempt == attempts:
                raise
            warnings.warn(f"rank {crash.error_index} of {nprocs} died by {crash.signal_name} (attempt {attempt} "
                          f"of {attempts}); running the ranks again", RuntimeWarning, stacklevel=2)
