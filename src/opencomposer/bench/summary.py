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

**Axes** (``summary["axes"]``, issue 37 §2): each measure of ``AXES`` (correctness, quality,
behaviour, cost, latency) as its mean over tasks of each task's mean over samples, with a 95%
interval over tasks: Wilson's for the two rates of resolution (pass@1, the unbiased estimate from K
samples, and best-of-K, the share of tasks with at least one resolved sample), a t-interval of the
task means for the rest (``bench.ablation.interval``; none with one task). An episode without a
value (no rubric, no edit) is left out of that measure, and a task without any of them too.

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

from opencomposer.bench.ablation import interval
from opencomposer.types import EndReason, Grade

TOKEN_KINDS = ("prompt", "thinking", "tool_call", "tool_output", "final_message", "summary")
MODEL_KINDS = ("thinking", "tool_call", "final_message", "summary")  # what the model wrote in its turns


AXES: dict[str, tuple[tuple[str, str], ...]] = {  # axis -> ((measure, label), ...), in the report's order
    "correctness": (("resolved", "pass@1"), ("best_of_k", "best-of-K"), ("fail_to_pass", "FAIL_TO_PASS passed"),
                    ("pass_to_pass", "PASS_TO_PASS passed")),
    "quality": (("lint_added", "lint findings added"), ("rubric_ok", "rubric holds (tasks with one)"),
                ("hack_suspected", "hack suspected (monitor)")),
    "behaviour": (("turns", "turns"), ("tool_calls", "tool calls"), ("broken_tool_calls", "broken tool calls"),
                  ("todo_added", "TODOs left")),
    "cost": (("prompt_tokens", "prompt tokens"), ("completion_tokens", "completion tokens"),
             ("cached_tokens", "cached prompt tokens"), ("dollars", "dollars / episode")),
    "latency": (("wall_s", "wall s"), ("first_edit_s", "s to the first edit")),
}
RATES = ("resolved", "best_of_k")  # proportions of tasks: Wilson's interval
FRACTIONS = ("fail_to_pass", "pass_to_pass", "rubric_ok", "hack_suspected")  # their t-intervals are cut to [0, 1]
SIGNED = ("lint_added",)  # may be below 0; every other measure's interval is cut at 0


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
    summary["samples"] = max(Counter(r["task_id"] for r in rows).values(), default=0)
    summary["axes"] = axes(rows)
    summary["pass_at_1"] = summary["resolved"]
    best = summary["axes"]["best_of_k"]
    summary["best_of_k"] = best["mean"] or 0.0
    summary["best_of_k_ci95"] = [best["low"] if best["low"] is not None else 0.0,
                                 best["high"] if best["high"] is not None else 1.0]
    summary["dollars_total"] = sum(value for r in rows if (value := episode_value(r, "dollars")) is not None)
    return summary


def episode_value(row: dict[str, Any], measure: str) -> float | None:
    """One episode's value of an ``AXES`` measure (None: the episode has none, e.g. no rubric).
    Rows written before a measure was recorded fall back on what they hold."""
    if measure == "rubric_ok":
        return None if row.get("rubric") is None else float(row["rubric"])
    if measure == "broken_tool_calls" and measure not in row:
        return float(row.get("rejected_tool_calls", 0.0) + row.get("format_errors", 0.0))
    if measure == "dollars" and measure not in row:
        return float(row.get("cost", 0.0))
    value = row.get(measure, None if measure == "first_edit_s" else 0.0)
    return None if value is None else float(value)


def axes(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every ``AXES`` measure over the scored ``rows`` of one policy: ``{"mean", "low", "high",
    "tasks"}`` (``low``/``high`` None where there is no interval), as the module doc says."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["status"] != "infra_error":
            by_task[row["task_id"]].append(row)
    out: dict[str, dict[str, Any]] = {}
    for measure, _ in (item for items in AXES.values() for item in items):
        if measure == "best_of_k":
            task_values = [max(float(r["resolved"]) for r in task_rows) for task_rows in by_task.values()]
        else:
            per_task = [[v for r in task_rows if (v := episode_value(r, measure)) is not None]
                        for task_rows in by_task.values()]
            task_values = [_mean(values) for values in per_task if values]
        if not task_values:
            out[measure] = {"mean": None, "low": None, "high": None, "tasks": 0}
            continue
        if measure in RATES:
            mean = _mean(task_values)
            low, high = wilson_interval(mean, len(task_values))
        else:
            found = interval(task_values)
            mean, low, high = found.mean, found.low, found.high
            if low is not None and measure not in SIGNED:
                low, high = max(low, 0.0), min(high, 1.0) if measure in FRACTIONS else high
        out[measure] = {"mean": mean, "low": low, "high": high, "tasks": len(task_values)}
    return out


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
    if "axes" in summary:  # summaries written before the axes lack them
        first_edit = summary["axes"]["first_edit_s"]["mean"]
        lines[3:3] = [("pass@1 / best-of-K", f"{summary['pass_at_1']:.3f} / {summary['best_of_k']:.3f} "
                                             f"(K = {summary['samples']})")]
        lines += [("dollars total / per episode",
                   f"{summary['dollars_total']:.4f} / {summary['axes']['dollars']['mean'] or 0.0:.4f}"),
                  ("broken tool calls / s to the first edit",
                   f"{summary['axes']['broken_tool_calls']['mean'] or 0.0:.2f} / "
                   + ("-" if first_edit is None else f"{first_edit:.2f}"))]
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


def axis_cell(stat: dict[str, Any]) -> str:
    """One measure of ``axes`` as text: the mean and its 95% interval, ``-`` without a value."""
    if stat["mean"] is None:
        return "-"
    digits = 4 if abs(stat["mean"]) < 0.1 and stat["mean"] else 3 if abs(stat["mean"]) < 10 else 1
    text = f"{stat['mean']:.{digits}f}"
    return text if stat["low"] is None else f"{text} [{stat['low']:.{digits}f}, {stat['high']:.{digits}f}]"


def axes_rows(summaries: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The per-axis comparison of several policies: header (axis, measure, one column per policy)
    and one row per measure of ``AXES``, each cell the mean with its 95% interval."""
    header = ["axis", "measure", *summaries]
    rows = [[axis, label, *(axis_cell(summary["axes"][measure]) for summary in summaries.values())]
            for axis, measures in AXES.items() for measure, label in measures]
    return header, rows


def comparison_table(summaries: dict[str, dict[str, Any]], title: str = "policies compared") -> Any:
    """A rich Table of ``axes_rows``."""
    from rich.table import Table

    header, rows = axes_rows(summaries)
    table = Table(title=title, show_header=True)
    for index, name in enumerate(header):
        table.add_column(name, justify="left" if index < 2 else "right")
    for row in rows:
        table.add_row(*row)
    table.caption = "mean over tasks of each task's mean over samples [95% interval over tasks]"
    return table
