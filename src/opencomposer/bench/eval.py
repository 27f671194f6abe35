"""Run a policy over a task suite and score it (the library behind ``opencomposer eval``).

Every task runs ``passes`` times, ``workers`` episodes at a time (threads; each episode has its
own sandboxes, so the work happens in subprocesses). Outputs, under the output folder:

- ``results.jsonl``: one row per episode, written as episodes finish: status, why it ended
  (``ended_by``: submitted, a budget, format errors, infra error), every ``reward.json`` number,
  tokens by kind, turns, format errors, tool calls, wall time, cost, the final message and the diff;
- ``episodes/TASK/pass-N/``: ``reward.json`` and ``trajectory.json`` (the chat transcript);
- ``summary.json`` and a printed table (``bench.summary``).

Progress goes through the shared ``ProgressBar``: a bar on a terminal, and otherwise one line per
finished episode (its task, why it ended, the resolved rate so far), since an episode of a model
that never speaks the tool protocol can take minutes and a silent log looks like a hang.

An episode that fails inside the harness is recorded as ``infra_error`` with its traceback and the
run goes on.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opencomposer.agent.policy import Policy
from opencomposer.bench.summary import end_reason, row_grade, summarize
from opencomposer.config import Config
from opencomposer.episode import run_episode
from opencomposer.training.progress import ProgressBar
from opencomposer.types import Episode, EpisodeStatus, Task


@dataclass
class EvalResult:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path


def episode_row(task: Task, episode: Episode, pass_index: int, policy_name: str) -> dict[str, Any]:
    counts = episode.token_counts()
    tokens = {k: v for k, v in counts.items() if k not in ("tool_calls", "turns")}
    row: dict[str, Any] = {
        "task_id": task.id,
        "instance_id": task.metadata.get("instance_id"),
        "pass": pass_index,
        "policy": policy_name,
        "status": episode.status.value,
        "ended_by": episode.end_reason.value if episode.end_reason else None,
        "error": episode.error,
        "reward": episode.reward,
        **episode.metrics,
        **(episode.grade.to_json() if episode.grade is not None else {}),  # the reward.json names
        "tokens": tokens,
        "final_message": episode.final_message,
        "diff": episode.diff,
    }
    return row


def trajectory(episode: Episode) -> dict[str, Any]:
    return {
        "task_id": episode.task_id,
        "status": episode.status.value,
        "ended_by": episode.end_reason.value if episode.end_reason else None,
        "error": episode.error,
        "segments": [
            {
                "messages": [asdict(m) for m in segment.messages],
                "turns": [
                    {"text": t.text, "tokens": len(t.token_ids), "observation_tokens": len(t.observation_ids),
                     "tool_calls": [asdict(c) for c in t.tool_calls], "format_error": t.format_error,
                     "rejected_tool_calls": t.rejected_tool_calls, "finish_reason": t.finish_reason,
                     "summary": t.summary}
                    for t in segment.turns
                ],
            }
            for segment in episode.segments
        ],
        "summaries": episode.summaries,
    }


def run_eval(
    tasks: list[Task],
    policy: Policy,
    config: Config,
    out_dir: Path,
    *,
    passes: int = 1,
    workers: int = 1,
    progress: bool = True,
) -> EvalResult:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    results_path.write_text("")
    jobs = [(task, p) for p in range(passes) for task in tasks]
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(task: Task, pass_index: int) -> dict[str, Any]:
        episode_dir = out_dir / "episodes" / task.id / f"pass-{pass_index}"
        seed = config.run.seed * 1_000_003 + zlib.crc32(task.id.encode()) + pass_index
        started = time.monotonic()
        try:
            episode = run_episode(task, policy, config, seed=seed, sample_index=pass_index, out_dir=episode_dir)
        except Exception:  # a bug in the harness must not end the whole run
            episode = Episode(task_id=task.id, sample_index=pass_index, status=EpisodeStatus.INFRA_ERROR,
                              error=traceback.format_exc(limit=20))
        episode.metrics.setdefault("wall_s", time.monotonic() - started)
        episode_dir.mkdir(parents=True, exist_ok=True)
        (episode_dir / "trajectory.json").write_text(json.dumps(trajectory(episode), indent=1, default=str))
        row = episode_row(task, episode, pass_index, policy.name)
        with lock:
            with results_path.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
            rows.append(row)
        return row

    status = "{task} ({ended_by}, {turns} turns, {format_errors} format errors)  resolved so far {resolved:.2f}"
    finished = 0
    with ProgressBar("eval", len(jobs), status=status, enabled=progress) as bar:
        def on_done(row: dict[str, Any]) -> None:
            nonlocal finished
            finished += 1
            bar.update(finished, task=f"{row['task_id']}#{row['pass']}", ended_by=end_reason(row).replace("_", " "),
                       turns=int(row.get("turns", 0)), format_errors=int(row.get("format_errors", 0)),
                       resolved=_resolved_so_far(rows))

        _run_jobs(jobs, one, workers, on_done)
    rows.sort(key=lambda r: (r["task_id"], r["pass"]))
    summary = summarize(rows)
    summary["policy"] = policy.name
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return EvalResult(rows, summary, out_dir)


def _resolved_so_far(rows: list[dict[str, Any]]) -> float:
    scored = [float(grade.resolved) for grade in map(row_grade, rows) if grade is not None]
    return sum(scored) / len(scored) if scored else 0.0


def _run_jobs(jobs: list, fn: Any, workers: int, on_done: Any) -> None:
    """``fn(task, pass)`` for every job, ``workers`` at a time; ``on_done(row)`` in this thread
    as each finishes."""
    if workers == 1:
        for task, p in jobs:
            on_done(fn(task, p))
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, task, p) for task, p in jobs]
        for future in as_completed(futures):
            on_done(future.result())
