"""The reconciler: every group's slot, its lifecycle, and the staleness bound (docs/services.md).

A *group* is the G rollouts of one task of the stream, named by its stream index. Its slot moves
through

    queued → sampling → grading → scored → trained
                                        ↘ dropped

(``dropped`` is reachable from every state before ``trained``: too few scored episodes, a stale
group under ``rl.stale_policy = "drop"``, or a step that applied no update). The reconciler is
pure bookkeeping under one lock; the episode workers, the trainer and the checkpoint code
call it, and it never runs a model or a sandbox itself.

**Admission.** A new group may start sampling only while fewer than ``(max_staleness + 1) × B``
groups are admitted and not yet consumed (trained or dropped). With ``stale_policy = "wait"`` the
trainer takes groups in admission order, B per step, so the g-th admitted group is trained at step
⌊g/B⌋ and was admitted when version ⌊g/B⌋ - max_staleness was already published: no token it
trains on is older than the bound. ``max_staleness = 0`` is therefore the synchronous loop: the B
groups of step t are sampled by version t only, and trained together.

**Completion order.** With ``drop`` or ``recompute`` a step takes the first B groups that are
scored, whatever their admission order (a slow group does not hold the step back); one whose
oldest token is more than ``max_staleness`` versions older than the step is dropped (recorded
with the reason) or queued again to be sampled afresh (same task, same seeds, newer weights).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

from opencomposer.types import Group

State = Literal["queued", "sampling", "grading", "scored", "trained", "dropped"]


@dataclass
class Slot:
    """One group of the stream: where it is, and the versions that sampled it."""

    index: int
    state: State = "queued"
    admitted_version: int = -1  # the published version when it started sampling
    attempts: int = 0  # times it was (re)started: recompute, a dead worker
    group: Group | None = None
    reason: str = ""  # for dropped

    @property
    def oldest_version(self) -> int:
        """The oldest version that sampled a token of the group (its admission version when none
        recorded one, e.g. every episode failed)."""
        if self.group is None:
            return self.admitted_version
        versions = [v for e in self.group.episodes for v in e.policy_versions]
        return min(versions) if versions else self.admitted_version


@dataclass
class ReconcilerStats:
    """Counts since the run (or its resume) started."""

    admitted: int = 0
    stale_dropped: int = 0
    recomputed: int = 0
    reassigned: int = 0  # groups restarted because their worker died
    restored: int = 0  # scored groups read back from their checkpoints on resume


class Reconciler:
    """Slots of the task stream from ``first_index`` to ``total`` (see module doc).

    ``pending``: indices below ``first_index`` that a resumed run still owes (admitted before the
    crash, never trained nor dropped); they are queued first, in stream order."""

    def __init__(self, batch_tasks: int, max_staleness: int, stale_policy: str, total: int,
                 first_index: int = 0, pending: list[int] | None = None):
        if stale_policy not in ("wait", "drop", "recompute"):
            raise ValueError(f"stale_policy: expected wait, drop or recompute, got {stale_policy!r}")
        self.batch = batch_tasks
        self.max_staleness = max_staleness
        self.policy = stale_policy
        self.total = total
        self.version = 0  # the newest published policy version
        self.slots: dict[int, Slot] = {}
        self.order: list[int] = []  # admission order (``wait`` trains in this order)
        self._queue: deque[int] = deque(sorted(pending or []))  # re-samples and owed groups go first
        self._next = first_index
        self._cond = threading.Condition()
        self._closed = False
        self.stats = ReconcilerStats()

    # -- episode side ----------------------------------------------------------------------------
    def outstanding(self) -> int:
        """Groups admitted and not yet consumed (trained or dropped)."""
        return sum(s.state in ("sampling", "grading", "scored") for s in self.slots.values())

    def _can_admit(self) -> bool:
        has_work = bool(self._queue) or self._next < self.total
        return has_work and self.outstanding() < (self.max_staleness + 1) * self.batch

    def admit(self, timeout: float | None = None) -> Slot | None:
        """The next group to sample (blocks until the bound allows one); None once every group is
        done or the reconciler closed, or after ``timeout`` seconds (an idle dispatcher sleeps here,
        never spins)."""
        with self._cond:
            # an exhausted stream with groups still out waits too (a dead worker's group may come back)
            if not self._cond.wait_for(lambda: self._closed or self._can_admit() or self._remaining() == 0, timeout):
                return None
            if self._closed or not self._can_admit():
                return None
            index = self._queue.popleft() if self._queue else self._take_next()
            slot = self.slots.get(index) or Slot(index)
            slot.state, slot.admitted_version, slot.group = "sampling", self.version, None
            slot.attempts += 1
            self.slots[index] = slot
            if index not in self.order:
                self.order.append(index)
            self.stats.admitted += 1
            return slot

    @property
    def high_water(self) -> int:
        """One past the highest stream index ever handed out."""
        return self._next

    def _take_next(self) -> int:
        index = self._next
        self._next += 1
        return index

    def grading(self, index: int) -> None:
        with self._cond:
            if self.slots[index].state == "sampling":
                self.slots[index].state = "grading"

    def scored(self, index: int, group: Group) -> None:
        """A worker finished the group (every episode ended, scored or an infrastructure failure)."""
        with self._cond:
            slot = self.slots[index]
            if slot.state not in ("sampling", "grading"):
                raise RuntimeError(f"group {index} reported scored while {slot.state}: a duplicate result")
            slot.state, slot.group = "scored", group
            self._cond.notify_all()

    def restore(self, index: int, group: Group, admitted_version: int) -> None:
        """A scored group read back from its checkpoint on resume (it was admitted before)."""
        with self._cond:
            if index in self._queue:
                self._queue.remove(index)
            self.slots[index] = Slot(index, "scored", admitted_version, 1, group)
            self.order.append(index)
            self.stats.restored += 1
            self._cond.notify_all()

    def requeue(self, index: int, reason: str) -> None:
        """Sample the group again from scratch (its worker died): it goes to the front."""
        with self._cond:
            slot = self.slots[index]
            slot.state, slot.group, slot.reason = "queued", None, reason
            self._queue.appendleft(index)
            self.stats.reassigned += 1
            self._cond.notify_all()

    # -- trainer side ----------------------------------------------------------------------------
    def next_batch(self, step: int, timeout: float | None = None) -> list[Slot] | None:
        """The B groups step ``step`` trains on (fewer at the end of the stream), per the policy;
        None after ``timeout``. Stale groups met on the way are dropped or queued again."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or self._batch_ready(step), timeout):
                return None
            if self._closed:
                return None
            return self._take_batch()

    def _remaining(self) -> int:
        """Groups that can still reach ``scored`` (admitted, queued, or never handed out)."""
        live = sum(s.state in ("queued", "sampling", "grading", "scored") for s in self.slots.values())
        return live + (self.total - self._next) + sum(1 for i in self._queue if i not in self.slots)

    def _batch_ready(self, step: int) -> bool:
        self._drop_or_requeue_stale(step)
        want = min(self.batch, self._remaining())
        if want == 0:
            return True
        if self.policy == "wait":
            head = [i for i in self.order if self.slots[i].state not in ("trained", "dropped")][:want]
            return len(head) == want and all(self.slots[i].state == "scored" for i in head)
        return sum(s.state == "scored" for s in self.slots.values()) >= want

    def _drop_or_requeue_stale(self, step: int) -> None:
        if self.policy == "wait":
            return  # admission keeps the bound by construction
        for slot in self.slots.values():
            if slot.state != "scored" or step - slot.oldest_version <= self.max_staleness:
                continue
            reason = (f"stale: sampled from version {slot.oldest_version}, step {step} trains version {step}, "
                      f"rl.max_staleness = {self.max_staleness}")
            if self.policy == "drop":
                slot.state, slot.reason = "dropped", reason
                self.stats.stale_dropped += 1
            else:
                slot.state, slot.group, slot.reason = "queued", None, reason
                self._queue.appendleft(slot.index)
                self.stats.recomputed += 1
            self._cond.notify_all()

    def _take_batch(self) -> list[Slot]:
        # "wait": the head of the admission order (all scored, see _batch_ready); otherwise the
        # ready groups, oldest admission first
        want = min(self.batch, self._remaining())
        return [self.slots[i] for i in self.order if self.slots[i].state == "scored"][:want]

    def publish(self, version: int, slots: list[Slot] = (), trained: dict[int, bool] | None = None) -> None:
        """Version ``version`` is out; the step that made it consumed ``slots``, each ``trained`` or
        ``dropped`` (``trained[index]`` False). Both change at once, so the slots a step frees are
        refilled by groups the new version samples, never the old one."""
        with self._cond:
            for slot in slots:
                slot.state = "trained" if (trained or {}).get(slot.index, True) else "dropped"
            self.version = version
            self._cond.notify_all()

    def dropped_since(self, seen: set[int]) -> list[Slot]:
        """Slots dropped as stale that ``seen`` does not hold yet (for the record)."""
        with self._cond:
            return [s for s in self.slots.values() if s.state == "dropped" and s.reason.startswith("stale")
                    and s.index not in seen]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def done(self) -> bool:
        with self._cond:
            return self._remaining() == 0
