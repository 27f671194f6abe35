"""Spawning the ranks of a gloo test: ``spawn_ranks(fn, nprocs, *args)`` runs
``fn(rank, port, *args)`` in ``nprocs`` fresh processes (``torch.multiprocessing.spawn``), with a
free port for the group's rendezvous.

Starting the interpreters of a world costs seconds, often more than what a test checks in it, so a
module spawns one world for all its tests: ``run_world(checks, nprocs, folder)``, from a
module-scoped fixture, joins a gloo group on every rank, runs each check in turn as
``check(rank, folder)`` (inputs in ``folder``, written before) and returns what each returned, by
check name and rank. The tests then read the fixture's results.

Each rank dumps every thread's Python stack if it dies by a signal (``faulthandler``), and a run
in which a rank dies by a signal (not an exception: a wrong result or a failed assertion is never
retried) is run once more on a fresh port, with a warning. Rarely, under the full suite, a gloo
rank has aborted in native code ("terminate called without an active exception", SIGABRT) in the
expert-parallel layouts with FSDP; the rerun keeps that crash from deciding a comparison of
numbers, and the dump says where it happened.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
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


def _world(rank: int, port: int, nprocs: int, checks: Sequence[Callable[[int, str], Any]], folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=nprocs)
    try:
        torch.set_num_threads(1)
        for check in checks:
            result = check(rank, folder)
            (Path(folder) / f"{check.__name__}-{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def run_world(checks: Sequence[Callable[[int, str], Any]], nprocs: int, folder: str | Path) -> dict[str, list[Any]]:
    """Run ``check(rank, folder)`` for each of ``checks`` in turn on every rank of one gloo world of
    ``nprocs`` spawned processes; {check name: [its result on rank 0, rank 1, ...]}. Checks are
    module-level functions (the spawned processes import them by name)."""
    spawn_ranks(_world, nprocs, nprocs, tuple(checks), str(folder))
    return {check.__name__: [pickle.loads((Path(folder) / f"{check.__name__}-{rank}.pkl").read_bytes())
                             for rank in range(nprocs)] for check in checks}
