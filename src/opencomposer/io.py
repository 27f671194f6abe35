"""Files that are whole or absent: atomic writes and directories, fsync, the cache folder, locks.

A reader (a resumed run, another process) sees the old file or the new one, never a part: every
write goes to a hidden temporary name in the same folder, is fsynced, and is renamed into place
(``rename(2)`` is atomic on one file system), then the parent folder is fsynced.

Not here: what is written (checkpoints in ``rl.checkpoint``, task folders in ``tasks.format``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where downloaded wheels, converted checkpoints and trained tokenizers are cached
    (``$OPENCOMPOSER_HOME``, else ``~/.cache/opencomposer``)."""
    root = os.environ.get("OPENCOMPOSER_HOME") or Path.home() / ".cache" / "opencomposer"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block: processes
    that fill the same cache entry take turns, and the second finds the first's result. Released
    when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory entry list, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers see the old file or
    the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(data)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def atomic_directory(final: Path, write: Callable[[Path], Any]) -> Path:
    """Build a folder with ``write(tmp_folder)``, fsync it, then rename it to ``final`` atomically."""
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    for dirpath, _, filenames in os.walk(tmp):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))
    if final.exists():  # only when a step is saved twice; the new copy wins
        discard(final)
    os.rename(tmp, final)
    fsync_path(final.parent)
    return final


def discard(path: Path) -> None:
    """Rename a folder out of the way, then delete it: its name never points at a half-deleted tree."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
