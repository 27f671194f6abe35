"""The reconciler's bookkeeping: admission within the staleness bound, the order steps take
groups in under each ``rl.stale_policy``, and what happens to a stale or orphaned group."""

from __future__ import annotations

import pytest

from opencomposer.services.reconciler import Reconciler
from opencomposer.types import Episode, Group, Task, Turn


def group(index: int, version: int) -> Group:
    episode = Episode(task_id=f"t{index}")
    episode.segments = []
    from opencomposer.types import Segment

    episode.segments.append(Segment(prompt_ids=[1], turns=[Turn(token_ids=[5], logprobs=[0.0], token_kinds=[],
                                                                policy_version=version)]))
    return Group(task=Task(id=f"t{index}", instruction="", repo=None), episodes=[episode])  # type: ignore[arg-type]


def admit_all(r: Reconciler) -> list[int]:
    out = []
    while (slot := r.admit(timeout=0)) is not None:
        out.append(slot.index)
    return out


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_admission_runs_at_most_staleness_steps_ahead(staleness: int):
    r = Reconciler(batch_tasks=2, max_staleness=staleness, stale_policy="wait", total=20)
    assert admit_all(r) == list(range(2 * (staleness + 1)))
    for i in range(2 * (staleness + 1)):
        r.scored(i, group(i, 0))
    assert admit_all(r) == []  # scored but not trained still counts against the bound
    slots = r.next_batch(0, timeout=0)
    assert [s.index for s in slots] == [0, 1]
    r.publish(1, slots, {0: True, 1: True})
    assert admit_all(r) == [2 * (staleness + 1), 2 * (staleness + 1) + 1]


def test_wait_trains_in_admission_order_and_waits_for_a_slow_head():
    r = Reconciler(batch_tasks=2, max_staleness=1, stale_policy="wait", total=8)
    admit_all(r)
    r.scored(1, group(1, 0))
    r.scored(2, group(2, 0))
    r.scored(3, group(3, 0))
    assert r.next_batch(0, timeout=0) is None  # group 0 is still sampling: the step waits
    r.scored(0, group(0, 0))
    assert [s.index for s in r.next_batch(0, timeout=0)] == [0, 1]


def test_drop_takes_ready_groups_and_drops_stale_ones():
    r = Reconciler(batch_tasks=2, max_staleness=1, stale_policy="drop", total=8)
    admit_all(r)  # 0..3 at version 0
    r.scored(1, group(1, 0))
    r.scored(2, group(2, 0))
    slots = r.next_batch(0, timeout=0)
    assert [s.index for s in slots] == [1, 2]  # not held back by group 0
    r.publish(1, slots, {1: True, 2: True})
    r.publish(2)
    r.scored(3, group(3, 1))  # staleness 1 at step 2: within the bound
    r.scored(0, group(0, 0))  # staleness 2 at step 2: beyond it
    slots = r.next_batch(2, timeout=0)
    assert slots is None  # group 0 went, group 3 alone is not a batch yet
    assert r.slots[0].state == "dropped" and r.slots[0].reason.startswith("stale")
    assert r.stats.stale_dropped == 1
    assert [s.index for s in r.dropped_since(set())] == [0]


def test_recompute_samples_a_stale_group_again_first():
    r = Reconciler(batch_tasks=1, max_staleness=0, stale_policy="recompute", total=4)
    assert admit_all(r) == [0]
    r.publish(3)
    r.scored(0, group(0, 0))
    assert r.next_batch(3, timeout=0) is None
    assert r.slots[0].state == "queued" and r.stats.recomputed == 1
    slot = r.admit(timeout=0)
    assert slot.index == 0 and slot.attempts == 2 and slot.admitted_version == 3


def test_a_dead_workers_group_is_sampled_again_and_a_duplicate_result_refused():
    r = Reconciler(batch_tasks=2, max_staleness=0, stale_policy="wait", total=4)
    admit_all(r)
    r.requeue(0, "worker 3 died")
    assert r.admit(timeout=0).index == 0
    r.scored(0, group(0, 0))
    with pytest.raises(RuntimeError, match="duplicate"):
        r.scored(0, group(0, 0))


def test_resume_queues_owed_groups_first_and_restores_scored_ones():
    r = Reconciler(batch_tasks=2, max_staleness=1, stale_policy="wait", total=10, first_index=6, pending=[3, 5, 4])
    r.restore(4, group(4, 2), admitted_version=2)
    assert admit_all(r) == [3, 5, 6]  # 4 came back scored; 3 and 5 are sampled again; then new work
    assert r.stats.restored == 1


def test_end_of_stream_gives_a_short_last_batch_then_done():
    r = Reconciler(batch_tasks=2, max_staleness=0, stale_policy="wait", total=3)
    for step in range(2):
        for i in admit_all(r):
            r.scored(i, group(i, step))
        slots = r.next_batch(step, timeout=0)
        r.publish(step + 1, slots, {s.index: True for s in slots})
    assert [s.state for s in r.slots.values()] == ["trained"] * 3
    assert r.done()


def test_an_exhausted_stream_with_groups_out_makes_admit_wait_not_spin():
    """Once every group is handed out but some are still sampling, an idle dispatcher's ``admit``
    sleeps until something changes (a spinning one held the GIL and starved inference): it looks
    at the reconciler once, then waits on its condition until a change wakes it."""
    import threading

    r = Reconciler(batch_tasks=2, max_staleness=1, stale_policy="wait", total=2)
    assert admit_all(r) == [0, 1]
    looks, waiting = [], threading.Event()
    remaining = r._remaining

    def counted() -> int:
        looks.append(1)
        waiting.set()
        return remaining()

    r._remaining = counted
    admitted: list = []
    dispatcher = threading.Thread(target=lambda: admitted.append(r.admit()), daemon=True)
    dispatcher.start()
    assert waiting.wait(timeout=60)  # it looked, found nothing to do, and waits
    with r._cond:  # free only once admit is inside wait(), which releases it
        assert len(looks) == 1 and dispatcher.is_alive() and not admitted
    r.requeue(1, "worker 0 died")  # a requeued group wakes it
    dispatcher.join(timeout=60)
    assert not dispatcher.is_alive() and admitted[0].index == 1
    r._remaining = remaining
    for i in (0, 1):
        r.scored(i, group(i, 0))
    r.publish(1, r.next_batch(0, timeout=0), {0: True, 1: True})
    assert r.done() and r.admit() is None  # done: returns at once, even with no timeout
