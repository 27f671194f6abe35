"""The hand-written suite through the real harness: the oracle resolves every task, doing nothing
resolves none.

Each episode is ``episode.run_episode`` with ``make_policy("oracle" | "noop", config)``: a
sandbox made from the task's ``repo/``, the agent loop and its tools, then the grader. The oracle
replays ``solution/gold.patch`` through the tools, or, for the three tasks that must not edit code,
answers with ``solution/answer.md``. A sample of four tasks (one of them a no-edit question) runs
by default; the full sweep of all 29 tasks is ``slow``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from opencomposer.agent.policy import make_policy
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.tasks.format import load_suite
from opencomposer.types import EpisodeStatus

from .conftest import CURSORBENCH

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]

SAMPLE = ["confkit-toml-files", "ledger-filter-bugs", "inventory-shipping", "textkit-wide-chars-question"]
NO_EDIT = ["inventory-stacked-coupons-question", "ledger-concurrency-review", "textkit-wide-chars-question"]


def sweep(task_ids: list[str] | None, policy_name: str) -> dict[str, tuple[str, float, float, str | None]]:
    """task id -> (status, resolved, rubric_ok, final message) for one policy over the suite."""
    config = Config()
    policy = make_policy(policy_name, config)
    tasks = [t for t in load_suite(CURSORBENCH) if task_ids is None or t.id in task_ids]

    def one(task):
        episode = run_episode(task, policy, config)
        assert episode.status != EpisodeStatus.INFRA_ERROR, f"{task.id}: {episode.error}"
        return task.id, (episode.status.value, float(episode.grade.resolved), float(episode.grade.rubric_ok),
                         episode.final_message)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, tasks))


def check_oracle(results: dict, expected_ids: list[str]) -> None:
    assert sorted(results) == sorted(expected_ids)
    unresolved = {tid: r for tid, r in results.items() if r[:3] != ("ok", 1.0, 1.0)}
    assert unresolved == {}
    for task_id in set(NO_EDIT) & set(results):
        answer = (CURSORBENCH / task_id / "solution" / "answer.md").read_text()
        assert results[task_id][3] == answer


def check_noop(results: dict, expected_ids: list[str]) -> None:
    assert sorted(results) == sorted(expected_ids)
    assert {tid: r[1] for tid, r in results.items() if r[1] != 0.0} == {}


def test_oracle_resolves_and_noop_does_not_on_a_sample():
    check_oracle(sweep(SAMPLE, "oracle"), SAMPLE)
    check_noop(sweep(SAMPLE, "noop"), SAMPLE)


@pytest.mark.slow
def test_oracle_resolves_every_handwritten_task_and_noop_none():
    every = [t.id for t in load_suite(CURSORBENCH)]
    assert len(every) == 29
    check_oracle(sweep(None, "oracle"), every)
    check_noop(sweep(None, "noop"), every)
