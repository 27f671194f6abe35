"""Held-out evaluation during RL: mean reward, pass@1 and best-of-K on a fixed seed set.

Report §4.2: RL raises both the mean reward and best-of-K on held-out tasks. Every evaluation runs
K samples of each held-out task through the same harness and batched sampler as training, with
the same seeds every time (``episode_seed(run seed, "eval", task, sample)``), so two evaluations
differ only by the weights.

- ``mean_reward``: the RL reward (``rewards.episode_reward``) without the KL term, over scored
  episodes;
- ``pass_at_1``: resolved rate over scored episodes (the unbiased pass@1 estimate from K samples);
- ``best_of_k``: share of tasks with at least one resolved sample among their K;
- ``format_error_rate``: share of the model's turns that could not be parsed into tool calls;
- ``summary_retention``, ``summary_spurious`` and ``summary_plan`` (``tiny-long`` episodes with a
  segment after a read): the share of the facts read before a segment that it opens with, of the
  words the task does not use, and of segments that open with exactly the notes still to read
  (``tasks.generators.long``): the summaries' quality, its floor, and the plan they hand on.

Infrastructure failures are counted and left out, never scored as zeros. With ``record``, every
episode is also written there, one JSON line each (``episode_record``: status, resolved, the text
of every turn and its format error), so that what a policy does on held-out tasks can be read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from opencomposer.agent.context import chain_metrics
from opencomposer.config import Config
from opencomposer.grading.grade import grade
from opencomposer.inference.batching import BatchingEngine
from opencomposer.rl.rewards import episode_reward
from opencomposer.rl.rollouts import episode_seed, run_groups
from opencomposer.sandbox.patch import diff_stats
from opencomposer.tasks.generators.long import NAME as LONG_FAMILY
from opencomposer.tasks.generators.long import summary_plan, summary_retention, summary_spurious
from opencomposer.types import Grade, Task


def evaluate(
    tasks: list[Task],
    batcher: BatchingEngine,
    tokenizer: Any,
    config: Config,
    *,
    out_dir: Path | None = None,
    grader: Callable[..., Grade] = grade,
    record: Path | None = None,
) -> dict[str, float]:
    """Run ``rl.eval_samples`` episodes of each task; returns the metrics named in the module doc.
    ``grader`` as in ``episode.run_episode``; ``record``: a JSON-lines file for the episodes."""
    samples = config.rl.eval_samples
    seeds = [[episode_seed(config.run.seed, "eval", t, j) for j in range(samples)] for t in range(len(tasks))]
    groups = run_groups(tasks, batcher, tokenizer, config, group_size=samples, seeds=seeds, out_dir=out_dir,
                        workers=config.rl.rollout_workers, grader=grader)
    rewards, resolved, best, tokens, turns, retention = [], [], [], [], [], []
    format_errors = 0
    infra = 0
    for group in groups:
        scored = [e for e in group.episodes if e.scored]
        infra += len(group.episodes) - len(scored)
        if not scored:
            continue
        reference = diff_stats(group.task.gold_patch).lines_changed if group.task.gold_patch else None
        for episode in scored:
            reward, _ = episode_reward(episode, config.rl.reward, config.rl.length_penalty,
                                       reference_lines_changed=reference)
            rewards.append(reward)
            resolved.append(float(episode.grade.resolved))
            tokens.append(sum(len(turn.token_ids) for turn in episode.turns))
            turns.append(len(episode.turns))
            format_errors += sum(turn.format_error is not None for turn in episode.turns)
            if group.task.metadata.get("family") == LONG_FAMILY:
                words = tuple(group.task.metadata["words"])
                share = summary_retention(episode, words)
                if not np.isnan(share):
                    retention.append((share, summary_spurious(episode, words), summary_plan(episode, words)))
        best.append(max(float(episode.grade.resolved) for episode in scored))

    if record is not None:
        from opencomposer.io import atomic_write_text

        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, "".join(json.dumps(episode_record(group.task, episode)) + "\n"
                                          for group in groups for episode in group.episodes))

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else float("nan")

    return {
        "mean_reward": mean(rewards),
        "pass_at_1": mean(resolved),
        "best_of_k": mean(best),
        "k": float(samples),
        "tasks": float(len(tasks)),
        "episodes": float(len(rewards)),
        "episodes_infra_error": float(infra),
        "episode_tokens": mean(tokens),
        "episode_turns": mean(turns),
        "format_error_rate": format_errors / sum(turns) if sum(turns) else float("nan"),
        **chain_metrics([e for group in groups for e in group.episodes]),
        **({"summary_retention": mean([r for r, _, _ in retention]),
            "summary_spurious": mean([f for _, f, _ in retention]),
            "summary_plan": mean([p for _, _, p in retention])} if retention else {}),
    }


def episode_record(task: Task, episode: Any) -> dict[str, Any]:
    """One evaluated episode as plain JSON: how it ended, its grade, the measures of the eval's
    axes it has (``bench.summary.AXES``: quality, behaviour, billed tokens, wall time; None where
    the episode was never graded), and every turn's text with its format error (None when the
    turn parsed) and the tool calls it made."""
    graded = episode.grade
    metrics = episode.metrics
    return {
        "task_id": task.id, "sample": episode.sample_index, "status": episode.status.value,
        "end_reason": getattr(episode.end_reason, "value", episode.end_reason),
        "resolved": None if graded is None else float(graded.resolved),
        "fail_to_pass": None if graded is None else graded.fail_to_pass,
        "pass_to_pass": None if graded is None else graded.pass_to_pass,
        "lint_added": None if graded is None else graded.lint_added,
        "todo_added": None if graded is None else graded.todo_added,
        "hack_suspected": None if graded is None else float(graded.hack_suspected),
        "tool_calls": sum(len(turn.tool_calls) for turn in episode.turns),
        "broken_tool_calls": metrics.get("rejected_tool_calls", 0.0) + metrics.get("format_errors", 0.0),
        "prompt_tokens": metrics.get("prompt_tokens", 0.0), "completion_tokens": metrics.get("completion_tokens", 0.0),
        "wall_s": metrics.get("wall_s"),
        "error": episode.error,
        "turns": [{"text": turn.text, "format_error": turn.format_error, "summary": turn.summary,
                   "tool_calls": [call.name for call in turn.tool_calls]} for turn in episode.turns],
    }
