"""The jail that model-written code runs in, and the workspace around it.

- ``workspace``: ``Sandbox``, a task repository copied into a private folder whose commands run
  in the jail, with a wall-clock limit, capped output and host-side file access confined to it;
- ``jail``: how one command is confined (bubblewrap options: no network, private /tmp, read-only
  system; rlimits; a pids cgroup; killing the process group);
- ``patch``: git diffs of workspace trees that round-trip byte for byte, and applying them;
- ``gitformat``: the byte-level parts of git's patch format (quoted names, blob ids, binary hunks).

Not here: what runs inside (the agent's tools in ``agent``, grading in ``grading``).
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
