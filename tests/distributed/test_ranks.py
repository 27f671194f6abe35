"""The gloo tests' spawner reruns a run only when a rank died by a signal, never on an exception;
one world runs several checks in the same group and hands back each one's results by rank."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from tests.distributed.ranks import run_world, spawn_ranks


def _abort_once(rank: int, port: int, folder: str) -> None:
    first = not any(Path(folder).glob(f"attempt-{rank}-*"))
    (Path(folder) / f"attempt-{rank}-{port}").write_text("")
    if rank == 1 and first:
        os.kill(os.getpid(), signal.SIGABRT)  # as a gloo rank aborting in native code
    (Path(folder) / f"done-{rank}-{port}").write_text("")


def _raise(rank: int, port: int, folder: str) -> None:
    (Path(folder) / f"attempt-{rank}-{port}").write_text("")
    raise ValueError("a wrong result")


def test_a_rank_killed_by_a_signal_is_run_again_on_a_fresh_port(tmp_path):
    with pytest.warns(RuntimeWarning, match="rank 1 of 2 died by SIGABRT"):
        spawn_ranks(_abort_once, 2, str(tmp_path))
    attempts = {p.name.split("-")[2] for p in tmp_path.glob("attempt-1-*")}
    assert len(attempts) == 2  # rank 1 ran twice, on two ports
    finished = [p.name for p in tmp_path.glob("done-1-*")]
    assert len(finished) == 1 and (tmp_path / finished[0].replace("done-1", "done-0")).exists()  # both, on the rerun


def test_an_exception_in_a_rank_is_not_retried(tmp_path):
    with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="a wrong result"):
        spawn_ranks(_raise, 2, str(tmp_path))
    assert len({p.name.split("-")[2] for p in tmp_path.glob("attempt-*")}) == 1  # one attempt, one port


def summed_ranks(rank: int, folder: str) -> int:
    total = torch.tensor(rank + 1)
    torch.distributed.all_reduce(total)
    return int(total)


def read_input(rank: int, folder: str) -> tuple[int, int, str]:
    return rank, torch.distributed.get_world_size(), (Path(folder) / "input.txt").read_text()


def test_one_world_runs_each_check_on_every_rank_in_one_group(tmp_path):
    (tmp_path / "input.txt").write_text("written before the spawn")
    results = run_world([summed_ranks, read_input], 2, tmp_path)
    assert results == {"summed_ranks": [3, 3],
                       "read_input": [(0, 2, "written before the spawn"), (1, 2, "written before the spawn")]}
