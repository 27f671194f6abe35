"""Injected faults: how the tests kill a service at a chosen moment (docs/services.md, "Faults").

A ``FaultPlan`` lists faults, each firing once at a named point; the services call ``fire`` at
those points, which is a no-op when no plan is set (the production path). Each fault raises what
the real failure would look like to the code above it:

| point              | fault                 | what the code above sees                            |
|--------------------|-----------------------|-----------------------------------------------------|
| ``env.turn``       | ``kill_worker``       | the worker stops (no heartbeat, its episodes fail) |
| ``env.grade``      | ``crash_grader``      | the grader raises (an infrastructure failure)      |
| ``env.grade``      | ``hang_sandbox``      | the episode never returns (until the plan closes)  |
| ``engine.generate``| ``kill_inference``    | the engine dies mid-request (``EngineDied``)       |
| ``trainer.step``   | ``kill_trainer``      | the process dies after a step, before its checkpoint (``TrainerKilled``) |

A fault matches a group by its stream index (and an episode by its sample index) and fires on the
first attempt only, so the retry it causes succeeds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from opencomposer.agent.policy import PolicyError


class EngineDied(RuntimeError):
    """The inference engine's process is gone; requests in flight are lost."""


class WorkerDied(PolicyError):
    """An episode worker died under an episode; the episode is an infrastructure failure."""


class TrainerKilled(BaseException):  # noqa: N818 (a BaseException like KeyboardInterrupt: nothing catches it)
    """The trainer's process was killed (injected): the run stops where it is, without cleanup."""


@dataclass
class Fault:
    kind: str  # kill_worker, crash_grader, hang_sandbox, kill_inference, kill_trainer
    index: int = -1  # stream index of the group (-1: any)
    sample: int = -1  # sample index inside the group (-1: any)
    after: int = 0  # kill_inference: generate calls to let through first; kill_trainer: the step
    fired: bool = False


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)  # ends every hang
    log: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _calls: int = 0

    def take(self, kind: str, index: int = -1, sample: int = -1, attempt: int = 1) -> Fault | None:
        """The fault of ``kind`` that fires now for (index, sample), marked fired; else None."""
        with self._lock:
            if kind == "kill_inference":
                self._calls += 1
            for fault in self.faults:
                if fault.fired or fault.kind != kind or attempt > 1:
                    continue
                if fault.index not in (-1, index) or fault.sample not in (-1, sample):
                    continue
                if kind == "kill_inference" and self._calls <= fault.after:
                    continue
                if kind == "kill_trainer" and index != fault.after:
                    continue
                fault.fired = True
                self.log.append(f"{kind} index={index} sample={sample}")
                return fault
            return None

    def release(self) -> None:
        self.released.set()


def fire(plan: FaultPlan | None, kind: str, index: int = -1, sample: int = -1, attempt: int = 1) -> bool:
    """Whether fault ``kind`` fires here (and for hangs, block until the plan is released)."""
    if plan is None or plan.take(kind, index, sample, attempt) is None:
        return False
    if kind == "hang_sandbox":
        plan.released.wait()
    return True
