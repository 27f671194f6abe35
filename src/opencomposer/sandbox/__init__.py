"""The jail that model-written code runs in, and the workspace around it.

- ``workspace``: ``Sandbox``, a task repository copied into a private folder whose commands run
  in the jail, with a wall-clock limit, capped output and host-side file access confined to it;
- ``jail``: how one command is confined (bubblewrap argv: no network, private /tmp, read-only
  system; rlimits; a pids cgroup; killing the process group);
- ``patch``: unified diffs of workspace trees, and applying them.

Not here: what runs inside (the agent's tools in ``agent``, grading in ``envs``).
"""

from opencomposer.sandbox.jail import bwrap_available
from opencomposer.sandbox.workspace import (
    PathOutsideWorkspace,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
)

__all__ = ["PathOutsideWorkspace", "RunResult", "Sandbox", "SandboxError", "SandboxUnavailable", "bwrap_available"]
