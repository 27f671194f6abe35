"""Where model-written code runs: a private workspace and a bubblewrap jail per command.

A ``Sandbox`` copies a task's repository snapshot into a private workspace folder and runs each
command in a fresh bubblewrap (``bwrap``) jail over it:

- **filesystem**: a tmpfs root holding read-only binds of the system (``/usr``, ``/bin``, ``/lib*``,
  a few ``/etc`` files), of the Python installation that runs opencomposer and of
  ``sandbox.ro_binds``; the workspace read-write at the task's ``workdir`` (``/workspace`` by
  default); a private, size-limited ``/tmp``. Nothing else of the host is visible.
- **namespaces**: new user, PID, network (loopback only), IPC, UTS and cgroup namespaces, uid and
  gid 1000 inside, no capabilities, no further user namespaces.
- **limits**: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE and RLIMIT_CORE per process; a cap on live
  processes (a pids cgroup when running as root, whose processes RLIMIT_NPROC does not bind, else
  RLIMIT_NPROC); a wall-clock limit after which the whole process tree is killed; an output cap.
- **lifetime**: each command gets its own PID namespace, so nothing it starts outlives it; the
  per-sandbox cgroup is emptied and removed by ``close()``.
- **concurrency**: at most ``sandbox.max_concurrent`` commands run at once in the process (the
  CPU count by default), whatever the number of sandboxes open: RL opens one per rollout.

Tools read and write workspace files from the host through ``resolve()``, which confines paths to
the workspace (no ``..``, no symlink pointing out, regular files only).

``sandbox.isolation = "none"`` runs commands directly on the host with the same rlimits and timeout
but none of the isolation; it is for machines without bubblewrap and warns loudly each time.

Not here: snapshots/forking of running environments, network egress through a proxy (RECIPE.md
§6 mentions both), containers with their own system packages.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from opencomposer.config import SandboxConfig
from opencomposer.sandbox.patch import IGNORED_NAMES, IGNORED_SUFFIXES, diff_trees

DEFAULT_WORKDIR = "/workspace"
SANDBOX_UID = 1000
BWRAP = "bwrap"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, could not be set up): an infrastructure error,
    never the policy's fault."""


class SandboxUnavailable(SandboxError):
    """Isolation was asked for but cannot be provided on this machine."""


class PathOutsideWorkspace(ValueError):
    """A path that would leave the workspace (``..``, an absolute path elsewhere, a symlink out)."""


@dataclass
class RunResult:
    """What one command did. ``exit_code`` is the command's status (128 + N when killed by signal
    N, as a shell reports it); ``output`` interleaves stdout and stderr, capped."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float
    truncated: bool


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


_BWRAP_OK: bool | None = None


class Sandbox:
    """A private workspace made from ``repo`` plus a jail to run commands in it.

    Use as a context manager, or call ``close()``; both leave no process and no file behind.
    ``repo`` may be None for an empty workspace. The source folder must stay unchanged while the
    sandbox lives: ``diff()`` compares the workspace against it.
    """

    def __init__(self, repo: Path | str | None, config: SandboxConfig | None = None, workdir: str = DEFAULT_WORKDIR):
        self.config = config or SandboxConfig()
        self.config.validate()
        if not workdir.startswith("/") or workdir == "/" or ".." in workdir.split("/"):
            raise ValueError(f"workdir: {workdir!r} must be an absolute path below / without '..'")
        self.workdir = workdir
        self.source = Path(repo) if repo is not None else None
        if self.source is not None and not self.source.is_dir():
            raise SandboxError(f"repository snapshot {self.source} is not a folder")
        if self.config.isolation == "bwrap" and not bwrap_available():
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is missing or cannot create namespaces on this machine, so model-"
                "written code cannot be isolated. Install it (Debian: apt-get install bubblewrap) or, "
                'only for trusted code, set sandbox.isolation = "none".'
            )
        if self.config.isolation == "none":
            warnings.warn(
                'sandbox.isolation = "none": commands run on this host WITHOUT isolation (only rlimits '
                "and a timeout). Never run an untrusted model like this.",
                RuntimeWarning,
                stacklevel=2,
            )
        self.id = uuid.uuid4().hex[:12]
        parent = Path(self.config.root_dir or tempfile.gettempdir()) / f"opencomposer-sandboxes-{os.getuid()}"
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.id}-", dir=parent))
        self.workspace = self.root / "workspace"
        self._lock = threading.Lock()
        self._closed = False
        self._cgroup: Path | None = None
        try:
            if self.source is not None:
                shutil.copytree(self.source, self.workspace, symlinks=True, ignore=_ignore_caches)
            else:
                self.workspace.mkdir()
            self._etc = self._write_etc()
            (self.root / "home").mkdir()
            if os.geteuid() == 0:
                self._cgroup = _make_pids_cgroup(f"opencomposer-{os.getpid()}-{self.id}", self.config.max_processes)
                if self._cgroup is None and self.config.isolation == "bwrap":
                    raise SandboxUnavailable(
                        "running as root, so RLIMIT_NPROC cannot cap the sandbox's processes, and no "
                        "writable pids cgroup was found under /sys/fs/cgroup; run opencomposer as a "
                        "normal user or give it a writable pids cgroup"
                    )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------------
    # Commands

    def run(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> RunResult:
        """Run ``command`` with the configured shell inside the jail, from the workspace root.

        Raises ``SandboxError`` only when the jail itself could not start; everything the command
        does (failing, timing out, being killed by a limit) is reported in the ``RunResult``.
        """
        if self._closed:
            raise SandboxError("run() on a closed sandbox")
        timeout = min(float(timeout_s or self.config.timeout_s), self.config.max_timeout_s)
        with self._lock, command_slots(self.config.max_concurrent):
            return self._run(command, timeout, env or {})

    def _run(self, command: str, timeout: float, extra_env: dict[str, str]) -> RunResult:
        shell = self.config.shell if Path(self.config.shell).exists() else "/bin/sh"
        go_read, go_write = os.pipe()
        status_read = status_write = -1
        if self.config.isolation == "bwrap":
            status_read, status_write = os.pipe()
            argv = self._bwrap_argv(shell, command, status_write, extra_env)
            cwd, env = "/", {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        else:
            argv = [shell, "-c", command]
            cwd, env = str(self.workspace), self._environment(extra_env, host=True)
        # The shell wrapper waits for a line on its stdin until limits and the cgroup are in place,
        # then execs the real command, so no child can be forked before it is accounted for.
        wrapper = ["/bin/sh", "-c", 'read _ && exec "$@" </dev/null', "opencomposer-sandbox", *argv]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                wrapper,
                stdin=go_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                pass_fds=(status_write,) if status_write >= 0 else (),
                start_new_session=True,
            )
        except OSError as e:
            for fd in (go_read, go_write, status_read, status_write):
                if fd >= 0:
                    os.close(fd)
            raise SandboxError(f"could not start the sandbox: {e}") from e
        os.close(go_read)
        if status_write >= 0:
            os.close(status_write)
        try:
            self._apply_limits(proc.pid)
            os.write(go_write, b"go\n")
        except OSError as e:
            _kill_group(proc.pid)
            proc.wait()
            raise SandboxError(f"could not apply limits to the sandbox: {e}") from e
        finally:
            os.close(go_write)
        output, truncated, timed_out, killed = self._collect(proc, start + timeout)
        returncode = proc.wait()
        duration = time.monotonic() - start
        self._stop(proc)
        exit_code = returncode if returncode >= 0 else 128 - returncode
        if status_read >= 0:
            status = _read_all(status_read)
            exit_code = self._bwrap_exit_code(status, output, exit_code, killed)
        return RunResult(exit_code, output, timed_out, duration, truncated)

    def _bwrap_exit_code(self, status: str, output: str, exit_code: int, killed: bool) -> int:
        """bwrap reports ``{"exit-code": N}`` on its status fd only if the command really ran."""
        for line in status.splitlines():
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "exit-code" in doc:
                return int(doc["exit-code"])
        if killed:
            return exit_code
        raise SandboxError(f"bubblewrap failed to set up the jail: {output.strip()[-500:]}")

    def _collect(self, proc: subprocess.Popen, deadline: float) -> tuple[str, bool, bool, bool]:
        """Read merged output until EOF; keep its head and tail; kill on timeout or flood.

        Returns (text, truncated, timed_out, killed_by_harness)."""
        half = self.config.output_limit_bytes // 2
        flood = self.config.max_output_mb << 20
        head, tail = bytearray(), bytearray()
        total = 0
        timed_out = flooded = False
        fd = proc.stdout.fileno()
        stop_at: float | None = None  # after the command ended or was killed: drain briefly, then stop
        while True:
            now = time.monotonic()
            if stop_at is None and now >= deadline:
                timed_out = True
                self._stop(proc)
                stop_at = now + 5.0
            elif stop_at is None and proc.poll() is not None:
                self._stop(proc)  # the command is done; whatever it left behind goes now
                stop_at = now + 5.0
            if stop_at is not None and now > stop_at:
                break  # a writer we cannot reach keeps the pipe open; give up on the rest
            wait = 0.2 if stop_at is not None else max(0.0, min(deadline - now, 0.2))
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if len(head) < half:
                take = half - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail += chunk
                if len(tail) > half:
                    del tail[: len(tail) - half]
            if total > flood and not flooded and stop_at is None:
                flooded = True
                self._stop(proc)
                stop_at = time.monotonic() + 5.0
        proc.stdout.close()
        truncated = total > len(head) + len(tail)
        text = head.decode("utf-8", errors="replace")
        if truncated:
            dropped = total - len(head) - len(tail)
            text += f"\n[... {dropped} bytes of output omitted ...]\n"
        text += tail.decode("utf-8", errors="replace")
        if flooded:
            text += f"\n[stopped: the command printed more than {self.config.max_output_mb} MiB]\n"
        return text, truncated or flooded, timed_out, timed_out or flooded

    def _stop(self, proc: subprocess.Popen) -> None:
        _kill_group(proc.pid)
        self._kill_leftovers()

    def _apply_limits(self, pid: int) -> None:
        c = self.config
        limits = {
            resource.RLIMIT_CPU: c.cpu_s,
            resource.RLIMIT_AS: c.memory_mb << 20,
            resource.RLIMIT_FSIZE: c.file_size_mb << 20,
            resource.RLIMIT_CORE: 0,
        }
        if self._cgroup is None and os.geteuid() != 0:
            limits[resource.RLIMIT_NPROC] = _count_own_processes() + c.max_processes
        for which, value in limits.items():
            resource.prlimit(pid, which, (value, value))
        if self._cgroup is not None:
            (self._cgroup / "cgroup.procs").write_text(str(pid))

    def _environment(self, extra: dict[str, str], host: bool = False) -> dict[str, str]:
        python_bin = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.root / "home") if host else "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PIP_NO_INPUT": "1",
        }
        env.update(extra)
        return env

    def _bwrap_argv(self, shell: str, command: str, status_fd: int, extra_env: dict[str, str]) -> list[str]:
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
            argv += ["--ro-bind", str(self._etc / name), f"/etc/{name}"]
        # the private /tmp first: an interpreter or extra bind that lives under the host's /tmp
        # (a virtual environment in a temporary clone) is then bound on top of it, not hidden by it
        argv += ["--size", str(self.config.tmp_size_mb << 20), "--tmpfs", "/tmp"]
        for path in _python_roots() + list(self.config.ro_binds):
            argv += ["--ro-bind-try", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--bind", str(self.workspace), self.workdir, "--remount-ro", "/",
                 "--chdir", self.workdir, "--clearenv"]
        for key, value in self._environment(extra_env).items():
            argv += ["--setenv", key, value]
        return argv + ["--", shell, "-c", command]

    def _write_etc(self) -> Path:
        etc = self.root / "etc"
        etc.mkdir()
        uid = SANDBOX_UID
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nagent:x:{uid}:{uid}:agent:/tmp:/bin/sh\n")
        (etc / "group").write_text(f"root:x:0:\nagent:x:{uid}:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        return etc

    def _kill_leftovers(self) -> None:
        if self._cgroup is not None:
            _empty_cgroup(self._cgroup)

    # ------------------------------------------------------------------------------------------
    # Files (host side, confined to the workspace)

    def resolve(self, path: str, must_exist: bool = False) -> Path:
        """The host path of a workspace path (relative, or absolute under the workdir).

        Refuses ``..`` components, absolute paths outside the workdir and anything whose real path
        (symlinks followed) leaves the workspace.
        """
        if not isinstance(path, str) or not path or "\0" in path:
            raise PathOutsideWorkspace(f"path {path!r}: expected a non-empty path inside the workspace")
        rel = path
        if path.startswith("/"):
            if path == self.workdir or path == self.workdir + "/":
                rel = "."
            elif path.startswith(self.workdir + "/"):
                rel = path[len(self.workdir) + 1 :]
            else:
                raise PathOutsideWorkspace(
                    f"path {path!r} is outside the workspace; use a path relative to {self.workdir}"
                )
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise PathOutsideWorkspace(f"path {path!r}: '..' is not allowed; paths stay inside the workspace")
        target = self.workspace.joinpath(*parts)
        real_root = os.path.realpath(self.workspace)
        real = os.path.realpath(target)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise PathOutsideWorkspace(f"path {path!r} resolves outside the workspace (through a symlink)")
        if must_exist and not os.path.exists(real):
            raise FileNotFoundError(f"{path}: no such file or directory")
        return Path(real)

    def command_path(self, rel: str) -> str:
        """Where commands see the workspace path ``rel`` (the workdir inside the jail; the host
        folder with ``isolation = "none"``)."""
        base = self.workdir if self.config.isolation == "bwrap" else str(self.workspace)
        return f"{base}/{rel}"

    def relpath(self, host_path: Path) -> str:
        """The workspace-relative POSIX path of a host path inside the workspace."""
        rel = Path(os.path.realpath(host_path)).relative_to(os.path.realpath(self.workspace)).as_posix()
        return "." if rel in ("", ".") else rel

    def diff(self) -> str:
        """Unified diff from the initial snapshot to the workspace now (added and deleted files too)."""
        if self.source is None:
            empty = self.root / "empty"
            empty.mkdir(exist_ok=True)
            return diff_trees(empty, self.workspace)
        return diff_trees(self.source, self.workspace)

    # ------------------------------------------------------------------------------------------
    # Lifetime

    def close(self) -> None:
        """Kill anything still running and delete the workspace. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._cgroup is not None:
            _empty_cgroup(self._cgroup)
            _remove_cgroup(self._cgroup)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


# ----------------------------------------------------------------------------------------------
# Helpers


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def command_slots(limit: int = 0) -> threading.BoundedSemaphore:
    """The process-wide semaphore that lets ``limit`` sandboxed commands run at once (0: the CPUs
    this process may use); sandboxes configured with the same limit share it."""
    limit = limit or len(os.sched_getaffinity(0))
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(limit, threading.BoundedSemaphore(limit))


def _ignore_caches(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in IGNORED_NAMES - {".git"} or n.endswith(IGNORED_SUFFIXES)}


def _python_roots() -> list[str]:
    """The folders the running interpreter and its packages live in (bound read-only)."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots |= {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)}
    return sorted(r for r in roots if not r.startswith(("/usr/", "/bin", "/lib")) and r != "/usr")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_all(fd: int) -> str:
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


def _count_own_processes() -> int:
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


def _pids_cgroup_parent() -> Path | None:
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


def _make_pids_cgroup(name: str, max_pids: int) -> Path | None:
    parent = _pids_cgroup_parent()
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
        _remove_cgroup(path)
        return None
    return path


def _empty_cgroup(path: Path) -> None:
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


def _remove_cgroup(path: Path) -> None:
    for _ in range(200):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return
            _empty_cgroup(path)
            time.sleep(0.01)
