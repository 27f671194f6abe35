"""One episode end to end: sandbox, agent loop, diff, grading.

``run_episode`` is what the evaluator and the RL environment service call for every rollout. The
agent works with the task's own environment (``[environment]`` in ``task.toml``,
``sandbox.venv``: built on first use, bound read-only), the one its tests run in. It
never raises for failures of the harness: an environment that will not build, a sandbox that cannot start, a policy backend that
fails or a grader that crashes all come back as an ``Episode`` with status ``INFRA_ERROR`` and
the error text, so they are excluded from scores instead of counted as zeros. A workspace diff
that would not rebuild the workspace (``sandbox.patch.DiffRoundTripError``) is a harness bug too,
but one that must not drop the rollout nor let a policy escape its score by making such a file:
it is logged as an error and the workspace itself is graded (``Grade.diff_round_trip_failed``).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policy import Policy
from opencomposer.config import Config
from opencomposer.grading.grade import GradingInfraError, grade, task_environment
from opencomposer.sandbox.patch import DiffRoundTripError
from opencomposer.sandbox.workspace import Sandbox, SandboxError
from opencomposer.types import Episode, EpisodeStatus, Grade, Task

log = logging.getLogger(__name__)


def run_episode(
    task: Task,
    policy: Policy,
    config: Config,
    *,
    seed: int = 0,
    sample_index: int = 0,
    out_dir: Path | None = None,
    grader: Callable[..., Grade] = grade,
) -> Episode:
    """Roll out ``policy`` on ``task`` and grade the result (``reward.json`` goes to ``out_dir``);
    ``grader`` has ``grade``'s signature (``GradeCache.grade`` reuses grades of identical changes)."""
    try:  # the task's own environment ([environment] in task.toml), built on first use
        environment = task_environment(task, config.sandbox)
    except GradingInfraError as e:  # a failed build is the infrastructure's, never a zero reward
        return Episode(task_id=task.id, sample_index=sample_index, status=EpisodeStatus.INFRA_ERROR, error=str(e))
    try:
        sandbox = Sandbox(task.repo, config.sandbox, workdir=task.workdir, environment=environment)
    except SandboxError as e:
        return Episode(task_id=task.id, sample_index=sample_index, status=EpisodeStatus.INFRA_ERROR,
                       error=f"sandbox could not start: {e}")
    with sandbox:
        episode = AgentLoop(policy, task, sandbox, config.agent, seed=seed, sample_index=sample_index).run()
        if episode.status == EpisodeStatus.INFRA_ERROR:
            return episode
        try:
            episode.diff = sandbox.diff()
        except DiffRoundTripError as e:  # our bug, not the policy's: grade what it left, and say so loudly
            log.error("task %s, sample %d: %s; grading the workspace itself (reward.json: diff_round_trip_failed)",
                      task.id, sample_index, e)
            episode.diff = e.diff
            return _graded(episode, task, config, out_dir, grader, workspace=sandbox.workspace)
    return _graded(episode, task, config, out_dir, grader)


def _graded(episode: Episode, task: Task, config: Config, out_dir: Path | None, grader: Callable[..., Grade],
            workspace: Path | None = None) -> Episode:
    extra = {} if workspace is None else {"workspace": workspace}
    try:
        episode.grade = grader(task, episode.diff, episode.final_message, config.sandbox, config.grading, out_dir,
                               **extra)
    except GradingInfraError as e:
        episode.status = EpisodeStatus.INFRA_ERROR
        episode.error = f"grading failed: {e}"
        return episode
    except Exception:  # a crashing grader must not turn into a zero reward; keep the traceback
        episode.status = EpisodeStatus.INFRA_ERROR
        episode.error = "the grader crashed:\n" + traceback.format_exc(limit=20)
        return episode
    episode.reward = float(episode.grade.resolved)
    return episode
