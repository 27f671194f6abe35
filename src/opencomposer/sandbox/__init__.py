"""The jail that model-written code runs in, and the workspace around it.

- ``workspace``: ``Sandbox``, a task repository copied into a private folder whose commands run
  under bubblewrap (no network, private /tmp, read-only system, rlimits, a pids cgroup, a
  wall-clock limit that kills the process group, capped output);
- ``patch``: unified diffs of workspace trees, and applying them.

Not here: what runs inside (the agent's tools in ``agent``, grading in ``envs``).
"""

from opencomposer.sandbox.workspace import (
    PathOutsideWorkspace,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
)

__all__ = ["PathOutsideWorkspace", "RunResult", "Sandbox", "SandboxError", "SandboxUnavailable"]
