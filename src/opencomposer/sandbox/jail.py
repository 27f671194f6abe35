"""The jail: how one command is confined (bubblewrap options, rlimits, the pids cgroup, killing).

These are the mechanisms; ``workspace.Sandbox`` decides when to use them. See the module docstring of
``opencomposer.sandbox.workspace`` for what the jail guarantees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from opencomposer.config import SandboxConfig

SANDBOX_UID = 1000
BWRAP = "bwrap"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# the host's /etc entries the jail sees: the small ones are copied into the sandbox's own /etc, bound
# as one folder; /etc/alternatives (hundreds of links, slow to copy) is bound on its own
_ETC_COPIED = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
_ETC_BOUND = ("/etc/alternatives",)
# what a jail with the network (a task environment's build) also needs to resolve names and check
# certificates: the small files are copied, the certificate folders bound
_ETC_NETWORK_COPIED = ("/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf")
_ETC_NETWORK_BOUND = ("/etc/ssl", "/etc/ca-certificates", "/etc/pki")


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


class BwrapCommandLine:
    """The bubblewrap command line of one sandbox: the namespaces, the read-only system, the private
    /tmp, the workspace read-write at ``workdir``.

    Built once when the sandbox opens (bwrap's path, which system folders are links, the
    interpreter's folders, the sandbox's ``mounts``: ``(host, inside, writable)``, a task
    environment read-only); ``network`` keeps the host's network (only while a task environment is
    built, never for agent or test commands); ``options`` adds what is each command's own. bwrap reads the options
    from a pipe (``--args FD``) rather than its argv: it cannot start the jail before it has read
    them, and the caller writes them only once bwrap has its limits and is in the cgroup
    (``Sandbox._start_jail``), so bwrap itself stands in for a waiting wrapper process.

    A setuid-root bwrap, run by anyone else, cannot be given limits (``prlimit`` on a process of
    another user is refused); then ``wrapped`` is True and a shell stands in front of it, is given
    the limits, and execs bwrap (which inherits them) once it reads a line on its stdin.

    There is no ``--new-session``: the caller starts bwrap in a session of its own
    (``start_new_session``), which already leaves the jail without a controlling terminal (no
    TIOCSTI into the user's terminal); a second one cost 3-6 ms per command on a loaded machine
    (each session gets a scheduler autogroup of its own)."""

    def __init__(self, *, workspace: Path, workdir: str, etc: Path, config: SandboxConfig, network: bool = False,
                 mounts: Sequence[tuple[str, str, bool]] = ()):
        self.bwrap = shutil.which(BWRAP) or BWRAP
        setuid = os.path.exists(self.bwrap) and bool(os.stat(self.bwrap).st_mode & stat.S_ISUID)
        self.wrapped = setuid and os.geteuid() != 0
        head = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--cap-drop", "ALL"]
        if network:  # only a task environment's build asks for it (sandbox.venv): never agent or test code
            head.append("--share-net")
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                head += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                head += ["--ro-bind", path, path]
        head += ["--ro-bind", str(etc), "/etc"]
        for path in _ETC_BOUND:
            head += ["--ro-bind-try", path, path]
        # the private /tmp first: an interpreter or extra bind that lives under the host's /tmp
        # (a virtual environment in a temporary clone) is then bound on top of it, not hidden by it
        head += ["--size", str(config.tmp_size_mb << 20), "--tmpfs", "/tmp"]
        for path in python_roots() + list(config.ro_binds):
            head += ["--ro-bind-try", path, path]
        if network:
            for path in _ETC_NETWORK_BOUND:
                head += ["--ro-bind-try", path, path]
        # a task environment (read-only) and, while one is built, its folder and pip's cache (writable)
        for source, target, writable in mounts:
            head += ["--bind" if writable else "--ro-bind", source, target]
        # kept as the bytes bwrap reads: only the per-command parts are encoded per command
        self._head = nul_terminated(head)
        self._workspace = nul_terminated(["--proc", "/proc", "--dev", "/dev", "--bind", str(workspace), workdir])
        self._tail = nul_terminated(["--remount-ro", "/", "--chdir", workdir, "--clearenv"])
        self.workspace, self.workdir = workspace, workdir

    def argv(self, args_fd: int, shell: str, command: str) -> list[str]:
        """bwrap's argv: the options come from ``args_fd``; the command runs with ``shell``. When
        ``wrapped``, the shell in front of it waits for a line on its stdin."""
        argv = [self.bwrap, "--args", str(args_fd), "--", shell, "-c", command]
        if self.wrapped:
            return ["/bin/sh", "-c", 'read -r _ && exec "$@" </dev/null', "opencomposer-sandbox", *argv]
        return argv

    def options(self, *, status_fd: int, env: dict[str, str], readonly: Sequence[str] = (),
                ro_binds: Sequence[str] = ()) -> bytes:
        """The options for ``--args``, each ended by a NUL: the jail, the environment ``env``, and
        bwrap's JSON status lines on ``status_fd`` (``{"exit-code": N}`` only if the command ran).

        ``readonly`` names workspace paths (relative) mounted read-only over the writable workspace,
        so the command can neither change, delete nor rename them; ``ro_binds`` are further host
        paths visible read-only at the same path, for this command only."""
        binds = [option for path in ro_binds for option in ("--ro-bind", path, path)]
        overlays = [option for rel in readonly
                    for option in ("--ro-bind", str(self.workspace / rel), f"{self.workdir}/{rel}")]
        settings = [option for key, value in env.items() for option in ("--setenv", key, value)]
        settings += ["--json-status-fd", str(status_fd)]
        return b"".join((self._head, nul_terminated(binds), self._workspace, nul_terminated(overlays),
                         self._tail, nul_terminated(settings)))


def nul_terminated(options: Sequence[str]) -> bytes:
    """``options`` as ``--args`` reads them: each encoded as a file name is and ended by a NUL."""
    for option in options:
        if "\0" in option:  # would split into two options
            raise ValueError(f"bwrap option {option!r}: embedded null byte")
    return b"".join(os.fsencode(option) + b"\0" for option in options)


def write_etc(root: Path, network: bool = False) -> Path:
    """The /etc the jail sees, as ``root/etc``: passwd, group and hosts of its own (uid 1000 is
    "agent"), copies of the host's dynamic-linker configuration and time zone, and empty mount
    points for what ``BwrapCommandLine`` binds from the host's /etc; with ``network`` (a task
    environment's build), also the name-resolution files and mount points for the certificates.

    One bind of this folder replaces one per file: each bind costs bwrap a mount, a read of the
    mount table and a remount, and the jail is built again for every command."""
    etc = root / "etc"
    etc.mkdir()
    uid = SANDBOX_UID
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nagent:x:{uid}:{uid}:agent:/tmp:/bin/sh\n")
    (etc / "group").write_text(f"root:x:0:\nagent:x:{uid}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    for path in _ETC_COPIED:  # a link is followed, as a bind would follow it
        target = etc / os.path.basename(path)
        if os.path.isdir(path):
            shutil.copytree(path, target, symlinks=True)
        elif os.path.isfile(path):
            shutil.copyfile(path, target)
    for path in _ETC_BOUND:
        if os.path.isdir(path):
            (etc / os.path.basename(path)).mkdir()
    if network:  # name resolution and certificates for a jail that shares the host's network
        for path in _ETC_NETWORK_COPIED:
            if os.path.isfile(path):
                shutil.copyfile(path, etc / os.path.basename(path))
        for path in _ETC_NETWORK_BOUND:
            if os.path.isdir(path):
                (etc / os.path.basename(path)).mkdir()
    return etc


def apply_limits(pid: int, config: SandboxConfig, cgroup: Path | None, *, born_in_cgroup: bool = False) -> None:
    """Set the per-process rlimits on ``pid`` and move it into the pids cgroup (when there is one and
    ``pid`` was not born in it)."""
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
    if cgroup is not None and not born_in_cgroup:
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


class CgroupSpawner:
    """Starts processes inside a pids cgroup instead of moving them in afterwards.

    Moving a process into a cgroup (its pid into ``cgroup.procs``) takes a global lock whose writer
    first waits out an RCU grace period: a median 3-9 ms per command on a loaded 2-CPU machine, the
    largest single cost of a sandboxed command (``benchmarks/sandbox.py``, section 4). On cgroup v1
    a thread may move *itself* (``0`` into ``tasks``) without that lock (0.1-0.3 ms on Linux 6.x),
    and what it then forks is born in its cgroup. So ``entered`` takes the calling thread into the cgroup for the length of a spawn and
    back to where it came from, the cgroup's parent (the process's pids cgroup, in which the
    sandbox's was made).

    It yields False, and moves nothing, on cgroup v2 (no moving a lone thread into a domain
    cgroup), when the thread is not in that parent (something moved it or the process since), or
    when the kernel refuses; the caller then moves the new process in the slow way. While the
    thread is inside, this process is listed in the cgroup: ``kill_cgroup`` spares it."""

    def __init__(self, cgroup: Path):
        self._tasks, self._home_tasks = str(cgroup / "tasks"), str(cgroup.parent / "tasks")
        self._home_line: bytes | None = None  # this process's v1 pids line of /proc/<pid>/cgroup
        if os.path.exists(self._tasks):
            for line in Path("/proc/self/cgroup").read_bytes().splitlines():
                if b"pids" in line.split(b":", 2)[1].split(b","):
                    self._home_line = line

    @contextlib.contextmanager
    def entered(self) -> Iterator[bool]:
        """The calling thread inside the cgroup for the block; whether it got in."""
        with open("/proc/thread-self/cgroup", "rb") as own:
            at_home = self._home_line is not None and self._home_line in own.read().splitlines()
        inside = False
        if at_home:
            try:
                move_thread(self._tasks)
                inside = True
            except OSError:
                pass  # the kernel refused: the caller moves the new process in instead
        if not inside:
            yield False
            return
        try:
            yield True
        finally:
            move_thread(self._home_tasks)


def move_thread(tasks: str) -> None:
    """Move the calling thread into the cgroup v1 whose ``tasks`` file this is."""
    fd = os.open(tasks, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def kill_cgroup(path: Path) -> bool:
    """SIGKILL every process in the cgroup, once, but this one (see ``CgroupSpawner``); False if it
    held none (or is gone)."""
    try:  # os only: this also runs from Sandbox.__del__ at interpreter exit, when builtins may be gone
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_RDONLY)
        try:
            listed = b"".join(iter(lambda: os.read(fd, 1 << 16), b""))
        finally:
            os.close(fd)
    except OSError:
        return False
    pids = [pid for pid in map(int, listed.split()) if pid != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return bool(pids)


def empty_cgroup(path: Path) -> None:
    """SIGKILL every process in the cgroup until it is empty (new forks are caught on the next pass).

    Killed processes stay listed until the kernel has torn them down (a jail's namespaces take a few
    milliseconds), so the passes start a fraction of a millisecond apart and back off to 5 ms."""
    pause = 0.0002
    deadline = time.monotonic() + 1.0
    while kill_cgroup(path) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(2 * pause, 0.005)


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
