"""Where model-written code runs: a private workspace and a bubblewrap jail per command.

A ``Sandbox`` copies a task's repository snapshot into a private workspace folder and runs each
command in a fresh bubblewrap (``bwrap``) jail over it:

- **filesystem**: a tmpfs root holding read-only binds of the system (``/usr``, ``/bin``, ``/lib*``),
  of the sandbox's own ``/etc`` (passwd, group, hosts; copies of the host's dynamic-linker
  configuration and time zone; the host's ``/etc/alternatives``), of the Python installation that
  runs opencomposer and of ``sandbox.ro_binds``; the workspace read-write at the task's ``workdir``
  (``/workspace`` by default); a private, size-limited ``/tmp``. Nothing else of the host is visible.
- **namespaces**: new user, PID, network (loopback only), IPC, UTS and cgroup namespaces, uid and
  gid 1000 inside, no capabilities, no further user namespaces.
- **limits**: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE and RLIMIT_CORE per process; a cap on live
  processes (a pids cgroup when running as root, whose processes RLIMIT_NPROC does not bind, else
  RLIMIT_NPROC); a wall-clock limit after which the whole process tree is killed; an output cap.
- **lifetime**: each command gets its own PID namespace, so nothing it starts outlives it; the
  per-sandbox cgroup is emptied and removed by ``close()``.
- **concurrency**: at most ``sandbox.max_concurrent`` commands run at once in the process (the
  CPU count by default), whatever the number of sandboxes open: RL opens one per rollout.
- **per command**: workspace paths mounted read-only over the writable workspace (grading's
  tests and test configuration), extra read-only host folders, inherited file descriptors.
- **cost**: RL's environment service runs thousands of commands per step, so a command in an open
  sandbox pays for little beyond bwrap itself: the command line is built when the sandbox opens,
  bwrap waits for its options (not a wrapper process) while it gets its limits, and it is born in
  the pids cgroup rather than moved in (``jail.CgroupSpawner``). ``benchmarks/sandbox.py --only
  command`` measures it beside a minimal bwrap jail.

Tools read and write workspace files from the host through ``resolve()``, which confines paths to
the workspace (no ``..``, no symlink pointing out, regular files only).

``sandbox.isolation = "none"`` runs commands directly on the host with the same rlimits and timeout
but none of the isolation; it is for machines without bubblewrap and warns loudly each time.

A task may bring its own Python environment (``sandbox.venv``: a virtual environment built
once per definition and cached). ``Sandbox(..., environment=TaskEnvironment(...))`` binds it
read-only at its host path, puts its ``bin`` first on PATH in place of opencomposer's interpreter
(so ``python``, ``python3`` and ``pytest`` are the task's), sets ``VIRTUAL_ENV`` and puts the
environment's workspace folders (a src layout's ``src``) on ``PYTHONPATH`` after whatever the caller
passes there (the test runner's plugin folder). The code in the workspace therefore imports from
the workspace copy, never from the cache, and cannot write into the environment. ``mounts`` binds
further host folders (read-only or writable, at any path: grading's ``/tests`` and
``/logs/verifier`` for a Harbor verifier); ``network=True`` keeps the host's network and is used
only while an environment is built.

Not here: snapshots/forking of running environments, network egress through a proxy (docs/recipe.md
§6 mentions both), containers with their own system packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opencomposer.config import SandboxConfig
from opencomposer.sandbox.jail import (
    BwrapCommandLine,
    CgroupSpawner,
    apply_limits,
    bwrap_available,
    command_slots,
    empty_cgroup,
    kill_cgroup,
    kill_group,
    make_pids_cgroup,
    python_roots,
    read_all,
    remove_cgroup,
    write_etc,
)
from opencomposer.sandbox.patch import diff_trees, ignore_names
from opencomposer.types import RunResult

DEFAULT_WORKDIR = "/workspace"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, could not be set up): an infrastructure error,
    never the policy's fault."""


class SandboxUnavailable(SandboxError):
    """Isolation was asked for but cannot be provided on this machine."""


class PathOutsideWorkspace(ValueError):
    """A path that would leave the workspace (``..``, an absolute path elsewhere, a symlink out)."""


@dataclass(frozen=True)
class TaskEnvironment:
    """A task's built Python environment as the sandbox uses it (``sandbox.venv`` makes it).

    ``root``: the environment folder, bound read-only at the same path (a virtual environment's
    scripts name it by absolute path). ``bin_dir`` replaces opencomposer's interpreter folder at the
    front of PATH. ``pythonpath``: workspace-relative folders put on ``PYTHONPATH`` (where the
    repository's own package is imported from). ``binds``: further host folders bound read-only at
    the same path (the interpreter the environment was made from, when it lives outside ``/usr``).
    ``variables``: further environment variables of every command."""

    root: str
    bin_dir: str
    pythonpath: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    variables: tuple[tuple[str, str], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Mount:
    """A host folder or file bound into the jail at ``target`` (read-only unless ``writable``)."""

    source: str
    target: str
    writable: bool = False


class Sandbox:
    """A private workspace made from ``repo`` plus a jail to run commands in it.

    Use as a context manager, or call ``close()``; both leave no process and no file behind.
    ``repo`` may be None for an empty workspace. The source folder must stay unchanged while the
    sandbox lives: ``diff()`` compares the workspace against it.
    """

    def __init__(self, repo: Path | str | None, config: SandboxConfig | None = None, workdir: str = DEFAULT_WORKDIR,
                 *, environment: TaskEnvironment | None = None, mounts: Sequence[Mount] = (),
                 network: bool = False):
        self.config = config or SandboxConfig()
        self.environment = environment
        self.network = network
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
        # seconds commands waited for a command slot (sandbox.max_concurrent) or this sandbox's
        # previous command: load, not the policy's doing (the agent loop's wall-time budget skips it)
        self.slot_wait_s = 0.0
        self._closed = False
        self._cgroup: Path | None = None
        self._spawner: CgroupSpawner | None = None
        self._command_line: BwrapCommandLine | None = None  # None: isolation = "none"
        self._shell = self.config.shell if Path(self.config.shell).exists() else "/bin/sh"
        try:
            if self.source is not None:
                shutil.copytree(self.source, self.workspace, symlinks=True, ignore=ignore_names)
            else:
                self.workspace.mkdir()
            etc = write_etc(self.root, network=network)
            shown = set(python_roots())  # opencomposer's interpreter is bound already
            binds = [] if environment is None else [Mount(p, p) for p in (environment.root, *environment.binds)
                                                    if p not in shown]
            binds += list(mounts)
            if self.config.isolation == "bwrap":
                self._command_line = BwrapCommandLine(
                    workspace=self.workspace, workdir=self.workdir, etc=etc, config=self.config, network=network,
                    mounts=[(m.source, m.target, m.writable) for m in binds])
            else:
                moved = [m.target for m in binds if m.source != m.target]
                if moved:
                    raise SandboxUnavailable(f'sandbox.isolation = "none" cannot show host folders at other paths '
                                             f"({', '.join(moved)}); this needs bubblewrap")
            (self.root / "home").mkdir()
            if os.geteuid() == 0:
                self._cgroup = make_pids_cgroup(f"opencomposer-{os.getpid()}-{self.id}", self.config.max_processes)
                if self._cgroup is not None:
                    self._spawner = CgroupSpawner(self._cgroup)
                elif self.config.isolation == "bwrap":
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

    def run(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None, *,
            pass_fds: Sequence[int] = (), readonly: Sequence[str] = (), ro_binds: Sequence[str] = ()) -> RunResult:
        """Run ``command`` with the configured shell inside the jail, from the workspace root.

        ``pass_fds`` are inherited by the command (same numbers); ``readonly`` names workspace paths
        (relative, existing, reached without symlinks) that this command may not change, delete or
        rename; ``ro_binds`` are host folders it sees read-only at the same path. With
        ``isolation = "none"`` nothing can be made read-only and ``readonly`` has no effect.

        Raises ``SandboxError`` only when the jail itself could not start; everything the command
        does (failing, timing out, being killed by a limit) is reported in the ``RunResult``.
        """
        if self._closed:
            raise SandboxError("run() on a closed sandbox")
        for rel in readonly:
            if Path(self.resolve(rel, must_exist=True)) != self.workspace.resolve().joinpath(rel):
                raise PathOutsideWorkspace(f"readonly path {rel!r} goes through a symlink")
        timeout = min(float(timeout_s or self.config.timeout_s), self.config.max_timeout_s)
        asked = time.monotonic()
        with self._lock, command_slots(self.config.max_concurrent):
            self.slot_wait_s += time.monotonic() - asked
            return self._run(command, timeout, env or {}, tuple(pass_fds), tuple(readonly), tuple(ro_binds))

    def _run(self, command: str, timeout: float, extra_env: dict[str, str], pass_fds: tuple[int, ...],
             readonly: tuple[str, ...], ro_binds: tuple[str, ...]) -> RunResult:
        if self._command_line is None:
            return self._run_unisolated(command, timeout, extra_env, pass_fds)
        self._kill_leftovers()  # of the previous command, before this one's processes join them
        status_read, status_write = os.pipe()
        start = time.monotonic()
        try:
            options = self._command_line.options(status_fd=status_write, env=self._environment(extra_env),
                                                 readonly=readonly, ro_binds=ro_binds)
            proc = self._start_jail(command, options, (status_write,) + pass_fds)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        output, truncated, timed_out, killed = self._collect(proc, start + timeout)
        returncode = proc.wait()
        duration = time.monotonic() - start
        self._stop(proc)
        exit_code = returncode if returncode >= 0 else 128 - returncode
        exit_code = self._bwrap_exit_code(read_all(status_read), output, exit_code, killed)
        return RunResult(exit_code, output, timed_out, duration, truncated)

    def _start_jail(self, command: str, options: bytes, pass_fds: tuple[int, ...]) -> subprocess.Popen:
        """Start bwrap for ``command``; it gets its ``options`` (the jail) once it has the limits and
        is in the cgroup, so every process of the jail is accounted for.

        bwrap reads the options from a pipe before it does anything else. If they never come, it
        reads end-of-file, no options, and cannot start the command in an empty root; any failure
        here kills it before the pipe closes all the same."""
        args_read, args_write = os.pipe()
        go_read, go_write = os.pipe() if self._command_line.wrapped else (-1, -1)
        proc: subprocess.Popen | None = None
        try:
            spawning = self._spawner.entered() if self._spawner else contextlib.nullcontext(False)
            with spawning as born_in_cgroup:
                proc = subprocess.Popen(
                    self._command_line.argv(args_read, self._shell, command),
                    stdin=go_read if go_read >= 0 else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    pass_fds=(args_read,) + pass_fds,
                    start_new_session=True,
                )
            apply_limits(proc.pid, self.config, self._cgroup, born_in_cgroup=born_in_cgroup)
            if go_write >= 0:
                os.write(go_write, b"go\n")
            while options:
                options = options[os.write(args_write, options):]
            return proc
        except BaseException as e:
            if proc is not None:
                self._stop(proc)
                proc.wait()
            if isinstance(e, OSError):
                stage = "start" if proc is None else "apply limits to"
                raise SandboxError(f"could not {stage} the sandbox: {e}") from e
            raise
        finally:
            for fd in (args_read, args_write, go_read, go_write):
                if fd >= 0:
                    os.close(fd)

    def _run_unisolated(self, command: str, timeout: float, extra_env: dict[str, str],
                        pass_fds: tuple[int, ...]) -> RunResult:
        go_read, go_write = os.pipe()
        # The shell wrapper waits for a line on its stdin until the limits are in place, then execs
        # the command, so no child can be forked before it is accounted for.
        wrapper = ["/bin/sh", "-c", 'read _ && exec "$@" </dev/null', "opencomposer-sandbox", self._shell, "-c", command]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                wrapper,
                stdin=go_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=str(self.workspace),
                env=self._environment(extra_env, host=True),
                pass_fds=pass_fds,
                start_new_session=True,
            )
        except OSError as e:
            os.close(go_read)
            os.close(go_write)
            raise SandboxError(f"could not start the sandbox: {e}") from e
        os.close(go_read)
        try:
            apply_limits(proc.pid, self.config, self._cgroup)
            os.write(go_write, b"go\n")
        except OSError as e:
            self._stop(proc)
            proc.wait()
            raise SandboxError(f"could not apply limits to the sandbox: {e}") from e
        finally:
            os.close(go_write)
        output, truncated, timed_out, _ = self._collect(proc, start + timeout)
        returncode = proc.wait()
        duration = time.monotonic() - start
        self._stop(proc)
        self._kill_leftovers()  # no PID namespace to take them down: what forked since goes too
        exit_code = returncode if returncode >= 0 else 128 - returncode
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
        """Kill the command's process group and everything in the sandbox's cgroup, in one pass: the
        jail's first process is among them, and the kernel kills the rest of its PID namespace with
        it. What is still being torn down is waited for before the next command (``_kill_leftovers``),
        so that one finds the cgroup empty and its whole process budget free."""
        kill_group(proc.pid)
        if self._cgroup is not None:
            kill_cgroup(self._cgroup)

    def _environment(self, extra: dict[str, str], host: bool = False) -> dict[str, str]:
        python_bin = str(Path(sys.executable).parent) if self.environment is None else self.environment.bin_dir
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
        if self.environment is not None:
            env["VIRTUAL_ENV"] = self.environment.root
            env.update(self.environment.variables)
        env.update(extra)
        if self.environment is not None and self.environment.pythonpath:
            # the caller's entries (the test runner's plugin folder) first, then the repository's own
            ours = [self.command_path(rel) if rel not in ("", ".") else self.command_path("").rstrip("/")
                    for rel in self.environment.pythonpath]
            env["PYTHONPATH"] = ":".join([p for p in env.get("PYTHONPATH", "").split(":") if p] + ours)
        return env

    def _kill_leftovers(self) -> None:
        """Kill what is left in the sandbox's cgroup and wait until it is gone."""
        if self._cgroup is not None:
            empty_cgroup(self._cgroup)

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
        """The git-style diff from the initial snapshot to the workspace now (``sandbox.patch.diff_trees``:
        byte for byte, binary files, symbolic links as links, the executable bit; caches and other
        ignored names left out on both sides, as the copy left them out). Raises
        ``sandbox.patch.DiffRoundTripError``, a harness bug, if the diff would not rebuild the workspace."""
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
            empty_cgroup(self._cgroup)
            remove_cgroup(self._cgroup)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
