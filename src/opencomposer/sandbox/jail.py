"""The jail: how one command is confined (bubblewrap argv, rlimits, the pids cgroup, killing).

These are the mechanisms; ``workspace.Sandbox`` decides when to use them. See the module docstring of
``opencomposer.sandbox.workspace`` for what the jail guarantees.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from opencomposer.config import SandboxConfig

SANDBOX_UID = 1000
BWRAP = "bwrap"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")


_BWRAP_OK: bool | None = None


def bwrap_available() -> bool:
    """True when bubblewrap is installed and can create its namespaces here."""
    global _BWRAP_OK
    if _BWRAP_OK is None:
        path = shutil.which(BWRAP)
        if path is None:
            _BWRAP_OK = False
        else:
            probe = subprocess.run(
                [path, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--", "/bin/true"],
                capture_output=True,
            )
            _BWRAP_OK = probe.returncode == 0
    return _BWRAP_OK


def bwrap_argv(shell: str, command: str, *, status_fd: int, workspace: Path, workdir: str, etc: Path,
               config: SandboxConfig, env: dict[str, str], readonly: Sequence[str] = (),
               ro_binds: Sequence[str] = ()) -> list[str]:
    """The bubblewrap command line that runs ``command`` with ``shell`` over ``workspace`` (mounted at
    ``workdir``): the namespaces, the read-only system, the private /tmp, the environment ``env``.

    ``readonly`` names workspace paths (relative) mounted read-only over the writable workspace, so
    the command can neither change, delete nor rename them; ``ro_binds`` are further host paths
    visible read-only at the same path, for this command only."""
    argv = [shutil.which(BWRAP) or BWRAP, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--hostname", "sandbox", "--cap-drop", "ALL", "--json-status-fd", str(status_fd)]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    for name in ("passwd", "group", "hosts"):
        argv += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    # the private /tmp first: an interpreter or extra bind that lives under the host's /tmp
    # (a virtual environment in a temporary clone) is then bound on top of it, not hidden by it
    argv += ["--size", str(config.tmp_size_mb << 20), "--tmpfs", "/tmp"]
    for path in python_roots() + list(config.ro_binds):
        argv += ["--ro-bind-try", path, path]
    for path in ro_binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workspace), workdir]
    for rel in readonly:
        argv += ["--ro-bind", str(workspace / rel), f"{workdir}/{rel}"]
    argv += ["--remount-ro", "/",
             "--chdir", workdir, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--", shell, "-c", command]


def write_etc(root: Path) -> Path:
    """The passwd, group and hosts files the jail sees (uid 1000 is "agent"), under ``root/etc``."""
    etc = root / "etc"
    etc.mkdir()
    uid = SANDBOX_UID
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nagent:x:{uid}:{uid}:agent:/tmp:/bin/sh\n")
    (etc / "group").write_text(f"root:x:0:\nagent:x:{uid}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    return etc


def apply_limits(pid: int, config: SandboxConfig, cgroup: Path | None) -> None:
    """Set the per-process rlimits on ``pid`` and move it into the pids cgroup (when there is one)."""
    c = config
    limits = {
        resource.RLIMIT_CPU: c.cpu_s,
        resource.RLIMIT_AS: c.memory_mb << 20,
        resource.RLIMIT_FSIZE: c.file_size_mb << 20,
        resource.RLIMIT_CORE: 0,
    }
    if cgroup is None and os.geteuid() != 0:
        limits[resource.RLIMIT_NPROC] = count_own_processes() + c.max_processes
    for which, value in limits.items():
        resource.prlimit(pid, which, (value, value))
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(pid))


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def command_slots(limit: int = 0) -> threading.BoundedSemaphore:
    """The process-wide semaphore that lets ``limit`` sandboxed commands run at once (0: the CPUs
    this process may use); sandboxes configured with the same limit share it."""
    limit = limit or len(os.sched_getaffinity(0))
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(limit, threading.BoundedSemaphore(limit))


def python_roots() -> list[str]:
    """The folders the running interpreter and its packages live in (bound read-only)."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots |= {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)}
    return sorted(r for r in roots if not r.startswith(("/usr/", "/bin", "/lib")) and r != "/usr")


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read_all(fd: int) -> str:
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def count_own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def pids_cgroup_parent() -> Path | None:
    """The folder of this process's pids cgroup (v1 ``pids`` hierarchy or the v2 unified one)."""
    mounts: dict[str, Path] = {}
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if not tail:
                continue
            if tail[0] == "cgroup" and "pids" in tail[-1].split(","):
                mounts["pids"] = Path(fields[4])
            elif tail[0] == "cgroup2":
                mounts.setdefault("", Path(fields[4]))
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "pids" in controllers.split(",") and "pids" in mounts:
                return mounts["pids"] / path.lstrip("/")
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::") and "" in mounts:
                return mounts[""] / line[3:].lstrip("/")
    except OSError:
        return None
    return None


def make_pids_cgroup(name: str, max_pids: int) -> Path | None:
    parent = pids_cgroup_parent()
    if parent is None:
        return None
    path = parent / name
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        (path / "pids.max").write_text(str(max_pids))
    except OSError:
        remove_cgroup(path)
        return None
    return path


def empty_cgroup(path: Path) -> None:
    """SIGKILL every process in the cgroup until it is empty (new forks are caught on the next pass)."""
    for _ in range(200):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def remove_cgroup(path: Path) -> None:
    for _ in range(200):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return
            empty_cgroup(path)
            time.sleep(0.01)
