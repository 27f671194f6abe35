"""``[sandbox]``: where model-written commands run (``opencomposer.sandbox``; docs/architecture.md, "Sandbox")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class SandboxConfig(Section):
    """Where model-written commands run (``opencomposer.sandbox.workspace``; docs/architecture.md, "Sandbox")."""

    section = "sandbox"

    isolation: Literal["bwrap", "none"] = "bwrap"
    """``bwrap``: each command runs in a bubblewrap jail (no network, tmpfs root with read-only
    system binds, the workspace read-write, new PID namespace, unprivileged uid, rlimits).
    ``none``: commands run on the host with rlimits only. Never use it for untrusted models; it
    exists for machines without bubblewrap and prints a warning every time a sandbox starts."""
    timeout_s: float = 60.0
    """Wall-clock limit of one command when the caller gives none; the whole process tree is killed."""
    max_timeout_s: float = 600.0
    """Largest wall-clock limit a tool call may ask for (larger requests are clamped)."""
    cpu_s: int = 300
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 4096
    """Address space per process (RLIMIT_AS), in MiB."""
    file_size_mb: int = 256
    """Largest file a command may write (RLIMIT_FSIZE), in MiB."""
    max_processes: int = 256
    """Processes and threads alive at once inside one sandbox (pids cgroup as root, else RLIMIT_NPROC
    on top of the user's current count)."""
    tmp_size_mb: int = 512
    """Size of the private ``/tmp`` tmpfs, in MiB."""
    output_limit_bytes: int = 1_000_000
    """Output kept per command: the first and the last half of this many bytes; the middle is dropped."""
    max_output_mb: int = 64
    """A command that prints more than this many MiB is stopped."""
    ro_binds: list[str] = field(default_factory=list)
    """Extra absolute host paths bound read-only at the same place (for example a project's virtualenv)."""
    root_dir: str = ""
    """Folder where workspaces are created; empty uses the system temporary folder."""
    shell: str = "/bin/bash"
    """Shell that runs each command (``shell -c COMMAND``); /bin/sh when this one is missing."""
    max_concurrent: int = 0
    """Commands running at once in this process, over all its sandboxes (tool calls and grading);
    0: the CPUs this process may use. An RL step runs B × G episodes in threads, and without a cap
    their test runs would all start together. Waiting for a slot does not count toward a
    command's wall-clock limit."""

    env_cache_dir: str = ""
    """Folder of the built task environments (``[environment]`` in a task's ``task.toml``;
    ``sandbox.venv``), one virtual environment per definition; empty:
    ``$OPENCOMPOSER_HOME/task-envs``. It can be deleted between runs (environments are rebuilt on
    first use)."""
    env_build_timeout_s: float = 1800.0
    """Wall-clock limit of building one task environment (pip installs included)."""
    env_build_network: bool = True
    """Let an environment's build reach the network (the package index); agent and test commands
    never have it. False: builds install only from the definition's ``find_links`` folders
    (``pip --no-index``)."""

    def validate(self) -> None:
        for name in ("timeout_s", "max_timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_processes",
                     "tmp_size_mb", "output_limit_bytes", "max_output_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sandbox.{name}: must be positive, got {getattr(self, name)}")
        if self.env_build_timeout_s <= 0:
            raise ConfigError(f"sandbox.env_build_timeout_s: must be positive, got {self.env_build_timeout_s}")
        if self.env_cache_dir and not self.env_cache_dir.startswith(("/", "~")):
            raise ConfigError(f"sandbox.env_cache_dir: {self.env_cache_dir!r} must be an absolute path (or start with ~)")
        if self.max_concurrent < 0:
            raise ConfigError(f"sandbox.max_concurrent: must be >= 0 (0 = the CPU count), got {self.max_concurrent}")
        if self.timeout_s > self.max_timeout_s:
            raise ConfigError(
                f"sandbox.timeout_s: {self.timeout_s} exceeds sandbox.max_timeout_s = {self.max_timeout_s}"
            )
        for path in self.ro_binds:
            if not path.startswith("/"):
                raise ConfigError(f"sandbox.ro_binds: {path!r} is not an absolute path")
