"""Run policies over a task suite and score them on every axis (the library behind ``opencomposer eval``).

Every policy runs every task ``passes`` times (its K samples), ``workers`` episodes at a time
(threads; each episode has its own sandboxes, so the work happens in subprocesses). Sample j of a
task has the same seed under every policy, so policies are compared on the same tasks and seeds.
Outputs, under the output folder:

- ``results.jsonl``: one row per episode, written as episodes finish: policy, task, sample
  (``pass``), status, why it ended (``ended_by``: submitted, a budget, format errors, infra error),
  every ``reward.json`` number, tokens by kind, turns, format errors, tool calls, wall time, cost, the
  final message and the diff; and the axes' own measures (``episode_row``): ``rubric``,
  ``broken_tool_calls``, ``cached_tokens``, ``dollars``, ``first_edit_s``;
- ``episodes/POLICY/TASK/pass-N/``: ``reward.json`` and ``trajectory.json`` (the chat transcript);
- ``summary.json`` (``{"policies": {NAME: summary}}``, ``bench.summary``), a printed table per
  policy and, for several, the per-axis comparison; ``report.html`` (``bench.pareto``);
  ``cost.json``, the run's compute (``training.cost``: tokens sampled, prefilled and cached, FLOPs
  of a local model, wall and device time), added to by a resumed run.

**Resuming.** An output folder that already holds a ``results.jsonl`` is resumed: an episode whose
(policy, task, sample) has a row there is not run again (infrastructure errors included: delete
their rows to retry them), and a row torn by a kill mid-write is dropped. The summaries count the
rows of the tasks, policies and samples asked for this time only.

**Dollars** (``dollars``) are the policy's billed tokens (``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, as the policy reports them) at its ``config.bench.Price``; without one, the cost
the policy reports itself (``agent.http``'s prices). A scripted policy bills nothing.

**Time to the first edit** (``first_edit_s``): seconds from the episode's first policy call until
the first turn calling ``edit`` or ``write_file`` had run, measured when the policy is next called
(the episode's end when it is not); None for an episode that edits nothing. A change made through
``run`` (a shell command) is not seen as an edit.

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
from opencomposer.config.bench import Price
from opencomposer.episode import run_episode
from opencomposer.io import atomic_write_text
from opencomposer.training.cost import CostMeter
from opencomposer.training.progress import ProgressBar
from opencomposer.types import Episode, EpisodeStatus, Task

EDIT_TOOLS = ("edit", "write_file")  # the tools that change a file (time to the first edit)


@dataclass
class EvalResult:
    rows: list[dict[str, Any]]
    summaries: dict[str, dict[str, Any]]  # policy name -> bench.summary.summarize of its rows
    out_dir: Path
    cost: dict[str, Any] | None = None  # the run's compute (training.cost), also in cost.json

    @property
    def summary(self) -> dict[str, Any]:
        """The summary of a run of one policy."""
        if len(self.summaries) != 1:
            raise ValueError(f"EvalResult.summary: {len(self.summaries)} policies ran; read summaries[NAME]")
        return next(iter(self.summaries.values()))


class TimedPolicy:
    """One episode's view of a shared policy that notes when each call starts (``calls``: the
    turn index the call is for, and ``time.monotonic()``); everything else is the policy's."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.calls: list[tuple[int, float]] = []

    def act(self, context: Any) -> Any:
        self.calls.append((context.turn_index, time.monotonic()))
        return self.policy.act(context)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def first_edit_s(episode: Episode, calls: list[tuple[int, float]]) -> float | None:
    """Time to the first edit (module doc) from the episode's turns and its policy calls."""
    edit_turn = next((index for index, turn in enumerate(episode.turns)
                      if any(call.name in EDIT_TOOLS for call in turn.tool_calls)), None)
    if edit_turn is None or not calls:
        return None
    started = calls[0][1]
    after = next((at for turn_index, at in calls if turn_index > edit_turn), None)
    return (after - started) if after is not None else episode.metrics.get("wall_s", 0.0)


def episode_row(task: Task, episode: Episode, pass_index: int, policy_name: str,
                price: Price | None = None, first_edit: float | None = None) -> dict[str, Any]:
    counts = episode.token_counts()
    tokens = {k: v for k, v in counts.items() if k not in ("tool_calls", "turns")}
    metrics = episode.metrics
    billed = (metrics.get("prompt_tokens", 0.0), metrics.get("completion_tokens", 0.0),
              metrics.get("cached_tokens", 0.0))
    row: dict[str, Any] = {
        "task_id": task.id,
        "instance_id": task.metadata.get("instance_id"),
        "pass": pass_index,
        "policy": policy_name,
        "status": episode.status.value,
        "ended_by": episode.end_reason.value if episode.end_reason else None,
        "error": episode.error,
        "reward": episode.reward,
        **metrics,
        **(episode.grade.to_json() if episode.grade is not None else {}),  # the reward.json names
        "rubric": None if episode.grade is None or not task.rubric else float(episode.grade.rubric_ok),
        "broken_tool_calls": metrics.get("rejected_tool_calls", 0.0) + metrics.get("format_errors", 0.0),
        "cached_tokens": billed[2],
        "dollars": price.dollars(*billed) if price is not None else metrics.get("cost", 0.0),
        "first_edit_s": first_edit,
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
    policies: Policy | list[Policy],
    config: Config,
    out_dir: Path,
    *,
    passes: int = 1,
    workers: int = 1,
    progress: bool = True,
    prices: list[Price | None] | None = None,
) -> EvalResult:
    """Run each of ``policies`` (one, or a list; ``prices`` one per policy) ``passes`` times on
    every task, resuming ``out_dir`` (module doc); returns every row asked for and a summary per policy."""
    policies = list(policies) if isinstance(policies, list | tuple) else [policies]
    prices = list(prices) if prices is not None else [None] * len(policies)
    names = [policy.name for policy in policies]
    if len(set(names)) != len(names) or len(prices) != len(policies):
        raise ValueError(f"run_eval: policies {names} must have distinct names and one price each (got {len(prices)})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    wanted = {(name, task.id, p) for name in names for task in tasks for p in range(passes)}
    rows = [row for row in read_rows(results_path) if row_key(row) in wanted]
    done = {row_key(row) for row in rows}
    results_path.write_text("".join(json.dumps(row, default=str) + "\n" for row in read_rows(results_path)))
    jobs = [(policy, price, task, p) for policy, price in zip(policies, prices, strict=True)
            for p in range(passes) for task in tasks if (policy.name, task.id, p) not in done]
    lock = threading.Lock()
    meter = CostMeter("eval", config.run, _local_model(policies))
    meter.resume(out_dir)

    def one(policy: Policy, price: Price | None, task: Task, pass_index: int) -> dict[str, Any]:
        episode_dir = out_dir / "episodes" / _folder_name(policy.name) / task.id / f"pass-{pass_index}"
        seed = config.run.seed * 1_000_003 + zlib.crc32(task.id.encode()) + pass_index
        timed = TimedPolicy(policy)
        started = time.monotonic()
        try:
            episode = run_episode(task, timed, config, seed=seed, sample_index=pass_index, out_dir=episode_dir)
        except Exception:  # a bug in the harness must not end the whole run
            episode = Episode(task_id=task.id, sample_index=pass_index, status=EpisodeStatus.INFRA_ERROR,
                              error=traceback.format_exc(limit=20))
        episode.metrics.setdefault("wall_s", time.monotonic() - started)
        episode_dir.mkdir(parents=True, exist_ok=True)
        (episode_dir / "trajectory.json").write_text(json.dumps(trajectory(episode), indent=1, default=str))
        row = episode_row(task, episode, pass_index, policy.name, price, first_edit_s(episode, timed.calls))
        with lock:
            with results_path.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
            rows.append(row)
            meter.episode(episode)
        return row

    status = "{task} ({ended_by}, {turns} turns, {format_errors} format errors)  resolved so far {resolved:.2f}"
    finished = 0
    with ProgressBar("eval", len(jobs), status=status, enabled=progress) as bar:
        def on_done(row: dict[str, Any]) -> None:
            nonlocal finished
            finished += 1
            who = f"{row['policy']} " if len(policies) > 1 else ""
            bar.update(finished, task=f"{who}{row['task_id']}#{row['pass']}", ended_by=end_reason(row).replace("_", " "),
                       turns=int(row.get("turns", 0)), format_errors=int(row.get("format_errors", 0)),
                       resolved=_resolved_so_far(rows))

        _run_jobs(jobs, one, workers, on_done)
    order = {name: index for index, name in enumerate(names)}
    rows.sort(key=lambda r: (order[r["policy"]], r["task_id"], r["pass"]))
    summaries = {}
    for name in names:
        summaries[name] = summarize([row for row in rows if row["policy"] == name])
        summaries[name]["policy"] = name
    atomic_write_text(out_dir / "summary.json", json.dumps({"policies": summaries}, indent=2) + "\n")
    return EvalResult(rows, summaries, out_dir, meter.write(out_dir))


def _local_model(policies: list[Policy]) -> Any:
    """The model of the first policy that samples from a local one (its FLOPs are counted), else None."""
    for policy in policies:
        engine = getattr(policy, "engine", None)
        engine = getattr(engine, "engine", engine)  # behind a batching front-end (eval --workers N)
        model = getattr(engine, "model", None)
        if model is not None:
            return model
    return None


def row_key(row: dict[str, Any]) -> tuple[str, str, int]:
    """What identifies an episode of a run: (policy, task, sample)."""
    return row.get("policy", ""), row["task_id"], int(row.get("pass", 0))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``results.jsonl`` (none if it is not there); a line torn by a kill is dropped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _folder_name(policy_name: str) -> str:
    """A policy name as one folder name (``openai:org/model`` -> ``openai_org_model``)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in policy_name)


def _resolved_so_far(rows: list[dict[str, Any]]) -> float:
    scored = [float(grade.resolved) for grade in map(row_grade, rows) if grade is not None]
    return sum(scored) / len(scored) if scored else 0.0


def _run_jobs(jobs: list, fn: Any, workers: int, on_done: Any) -> None:
    """``fn(*job)`` for every job, ``workers`` at a time; ``on_done(row)`` in this thread as each finishes."""
    if workers == 1:
        for job in jobs:
            on_done(fn(*job))
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for future in as_completed(futures):
            on_done(future.result())
