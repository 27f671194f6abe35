"""Statistics of an evaluation run: resolved rate with a confidence interval, quality, tokens,
latency and cost, from the rows of ``results.jsonl`` (one row per episode; the grade's fields are
read back as a ``types.Grade`` by ``row_grade``).

Scores follow CursorBench practice (docs/recipe.md §8): each task's score is the mean over its passes,
the suite's score the mean over tasks. The 95% interval is Wilson's score interval on that mean
with n = number of tasks (exact for one pass; conservative for several, since passes of one task
are correlated). Infrastructure errors are counted and left out of every score.

The hack monitor's rate (``hack_suspected_rate``: episodes whose diff ``grading.hack_monitor``
flagged, resolved or not) stands beside ``tampered_rate``; it is a signal. ``hack_flagged`` lists the
flagged episodes (task, pass, reasons); their diffs are in ``results.jsonl`` (``diff``).

Why episodes ended is reported beside the scores: the count per end reason (``types.EndReason``:
submitted, format errors, each budget, infra error) and the format errors per turn over all scored
turns. A model that does not speak the tool protocol shows there at once (every episode "format
errors", a rate near 1), where the resolved rate alone would read as an ordinary zero.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from opencomposer.types import EndReason, Grade

TOKEN_KINDS = ("prompt", "thinking", "tool_call", "tool_output", "final_message", "summary")
MODEL_KINDS = ("thinking", "tool_call", "final_message", "summary")  # what the model wrote in its turns


def wilson_interval(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a proportion ``p`` observed over ``n`` trials."""
    if n == 0:
        return (0.0, 1.0)
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, center - half), min(1.0, center + half))


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def end_reason(row: dict[str, Any]) -> str:
    """The row's ``ended_by``; rows written before it was recorded fall back on their status."""
    if row.get("ended_by"):
        return row["ended_by"]
    return {"ok": EndReason.SUBMITTED.value, "infra_error": EndReason.INFRA_ERROR.value}.get(row["status"], "unrecorded")


def row_grade(row: dict[str, Any]) -> Grade | None:
    """The grade of a ``results.jsonl`` row; None for an infrastructure error (never graded)."""
    return None if row["status"] == "infra_error" else Grade.from_json(row)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if r["status"] != "infra_error"]
    grades = [Grade.from_json(r) for r in scored]
    by_task: dict[str, list[Grade]] = defaultdict(list)
    for row, grade in zip(scored, grades, strict=True):
        by_task[row["task_id"]].append(grade)
    task_resolved = [_mean([float(g.resolved) for g in gs]) for gs in by_task.values()]
    resolved = _mean(task_resolved)
    low, high = wilson_interval(resolved, len(task_resolved))
    summary: dict[str, Any] = {
        "episodes": len(rows),
        "tasks": len({r["task_id"] for r in rows}),
        "infra_errors": len(rows) - len(scored),
        "timeouts": sum(r["status"] == "timeout" for r in scored),
        "ended_by": _ended_by(rows),
        "resolved": resolved,
        "resolved_ci95": [low, high],
        "tampered_rate": _mean([float(g.tampered) for g in grades]),  # graded 0 for tampering with the tests
        "hack_suspected_rate": _mean([float(g.hack_suspected) for g in grades]),  # grading.hack_monitor: a signal
        "hack_flagged": [{"task_id": row["task_id"], "pass": row.get("pass"), "reasons": list(g.hack_reasons)}
                         for row, g in zip(scored, grades, strict=True) if g.hack_suspected],
        "diff_round_trip_failures": sum(g.diff_round_trip_failed for g in grades),  # harness bugs
        "fail_to_pass": _mean([g.fail_to_pass for g in grades]),
        "pass_to_pass": _mean([g.pass_to_pass for g in grades]),
        "lines_changed": _mean([g.lines_changed for g in grades]),
        "files_changed": _mean([g.files_changed for g in grades]),
        "todo_added": _mean([g.todo_added for g in grades]),
        "comment_lines_added": _mean([g.comment_lines_added for g in grades]),
        "lint_added": _mean([g.lint_added for g in grades]),
    }
    for kind in TOKEN_KINDS:
        summary[f"tokens_{kind}"] = _mean([r.get("tokens", {}).get(kind, 0) for r in scored])
    summary["completion_tokens"] = _mean([r.get("completion_tokens", 0.0) for r in scored])
    summary["turns"] = _mean([r.get("turns", 0.0) for r in scored])
    turns = sum(r.get("turns", 0.0) for r in scored)
    summary["format_errors_per_turn"] = sum(r.get("format_errors", 0.0) for r in scored) / turns if turns else 0.0
    summary["tool_calls"] = _mean([r.get("tool_calls", 0.0) for r in scored])
    walls = [r.get("wall_s", 0.0) for r in scored]
    summary["wall_s_p50"] = _quantile(walls, 0.5)
    summary["wall_s_p90"] = _quantile(walls, 0.9)
    summary["grading_s"] = _mean([g.grading_s for g in grades])
    summary["cost_total"] = sum(r.get("cost", 0.0) for r in rows)
    summary["cost_per_episode"] = _mean([r.get("cost", 0.0) for r in scored])
    # context policies (agent.context): chains of segments, and what their summaries cost
    for name in ("segments", "summaries", "summary_tokens", "compaction_tokens", "compaction_prompt_tokens",
                 "context_tokens_saved"):
        summary[name] = _mean([r.get(name, 0.0) for r in scored])
    # every model token the episode cost: its turns (summaries included) and any compaction call's output
    summary["model_tokens"] = _mean([sum(r.get("tokens", {}).get(k, 0) for k in MODEL_KINDS)
                                     + r.get("compaction_tokens", 0.0) for r in scored])
    return summary


def _ended_by(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Episodes per end reason, in ``EndReason`` order, reasons no episode had left out."""
    counts = Counter(end_reason(row) for row in rows)
    known = [reason.value for reason in EndReason]
    return {reason: counts[reason] for reason in [*known, *sorted(set(counts) - set(known))] if counts[reason]}


def summary_table(summary: dict[str, Any], title: str = "evaluation") -> Any:
    """A rich Table of the summary (rows: measure, value)."""
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    low, high = summary["resolved_ci95"]
    lines = [
        ("tasks / episodes", f"{summary['tasks']} / {summary['episodes']}"),
        ("infra errors (excluded)", str(summary["infra_errors"])),
        ("budget stops", str(summary["timeouts"])),
        ("resolved", f"{summary['resolved']:.3f}  [{low:.3f}, {high:.3f}] 95% CI"),
        ("tampered with the tests (scored 0)", f"{summary.get('tampered_rate', 0.0):.3f}"),
        ("hack suspected (monitor; not a verdict)", f"{summary.get('hack_suspected_rate', 0.0):.3f}"),
        ("diffs that failed to round-trip (harness bug)", str(summary.get("diff_round_trip_failures", 0))),
        ("fail→pass / pass→pass", f"{summary['fail_to_pass']:.3f} / {summary['pass_to_pass']:.3f}"),
        ("lines / files changed", f"{summary['lines_changed']:.1f} / {summary['files_changed']:.2f}"),
        ("todo / comment lines / lint added",
         f"{summary['todo_added']:.2f} / {summary['comment_lines_added']:.2f} / {summary['lint_added']:.2f}"),
        ("tokens: thinking / tool call / tool output / final",
         f"{summary['tokens_thinking']:.0f} / {summary['tokens_tool_call']:.0f} / "
         f"{summary['tokens_tool_output']:.0f} / {summary['tokens_final_message']:.0f}"),
        ("ended by", ", ".join(f"{reason.replace('_', ' ')} {count}"
                               for reason, count in summary.get("ended_by", {}).items()) or "-"),
        ("turns / tool calls", f"{summary['turns']:.1f} / {summary['tool_calls']:.1f}"),
        ("format errors / turn", f"{summary.get('format_errors_per_turn', 0.0):.2f}"),
        ("wall s p50 / p90 (grading)",
         f"{summary['wall_s_p50']:.2f} / {summary['wall_s_p90']:.2f} ({summary['grading_s']:.2f})"),
        ("cost total / per episode", f"{summary['cost_total']:.4f} / {summary['cost_per_episode']:.4f}"),
    ]
    if summary.get("summaries"):
        lines.append(("segments / summaries / summary tokens",
                      f"{summary['segments']:.2f} / {summary['summaries']:.2f} / {summary['summary_tokens']:.0f}"))
        lines.append(("model tokens (compaction output included)", f"{summary['model_tokens']:.0f}"))
    for name, value in lines:
        table.add_row(name, value)
    for item in summary.get("hack_flagged", [])[:10]:
        table.add_row(f"  flagged: {item['task_id']} pass {item['pass']}", "; ".join(item["reasons"])[:120])
    if summary.get("format_errors_per_turn", 0.0) >= 0.5:
        table.caption = ("most turns did not parse as tool calls: the model does not speak the tool protocol "
                         "(docs/harness.md); see episodes/*/trajectory.json")
    return table
