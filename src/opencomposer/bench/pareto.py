"""The comparison of policies as one page: the per-axis table and accuracy against cost and latency.

The Composer 2 report judges models on more than correctness and shows accuracy against cost on a
Pareto front (issue 37 §2). ``write_report`` writes ``{out}/report.html`` (a ``training.html.HtmlReport``:
one self-contained page, the figures embedded as PNG) from the summaries ``bench.eval.run_eval``
returns:

- the per-axis table (``bench.summary.axes_rows``): every measure of every policy, mean over tasks
  with its 95% interval;
- "Pareto front: accuracy versus cost": each policy a point at (cost per episode, pass@1) with both
  intervals as error bars; the policies no other beats on both (``pareto_front``: none costs as
  little or less and resolves as much or more, better in one) joined by the front line. Cost is
  dollars per episode; when no policy has a dollar cost (no ``--price`` and none billed) it is the
  billed tokens per episode (prompt plus completion), and the axis says so;
- accuracy versus latency (mean wall seconds per episode), drawn the same way.

Not here: running the episodes (``bench.eval``), the statistics (``bench.summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opencomposer.bench.summary import axes_rows
from opencomposer.training.cost import cost_section
from opencomposer.training.html import HtmlReport


@dataclass
class Point:
    """One policy on a plot: x (cost or latency) and y (pass@1), each with its 95% interval."""

    name: str
    x: float
    y: float
    x_interval: tuple[float | None, float | None]
    y_interval: tuple[float | None, float | None]


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point dominates (an x as low or lower and a y as high or higher, strictly
    better in one), by increasing x."""
    def dominated(p: Point) -> bool:
        return any(q.x <= p.x and q.y >= p.y and (q.x < p.x or q.y > p.y) for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: (p.x, -p.y))


def cost_measure(summaries: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The cost measure to plot and its axis label: dollars where any policy has some, else tokens."""
    if any((summary["axes"]["dollars"]["mean"] or 0.0) > 0 for summary in summaries.values()):
        return "dollars", "dollars per episode"
    return "tokens", "billed tokens per episode (prompt + completion; no policy cost dollars)"


def points(summaries: dict[str, dict[str, Any]], measure: str) -> list[Point]:
    """Each policy at (``measure``'s mean, pass@1); ``tokens`` adds prompt and completion tokens."""
    out = []
    for name, summary in summaries.items():
        axes = summary["axes"]
        if measure == "tokens":
            parts = [axes["prompt_tokens"], axes["completion_tokens"]]
            x = sum(part["mean"] or 0.0 for part in parts)
            bounded = all(part["low"] is not None for part in parts)
            x_interval = ((sum(part["low"] for part in parts), sum(part["high"] for part in parts)) if bounded
                          else (None, None))  # the sum of the bounds: a conservative interval
        else:
            x = axes[measure]["mean"] or 0.0
            x_interval = (axes[measure]["low"], axes[measure]["high"])
        resolved = axes["resolved"]
        out.append(Point(name, x, resolved["mean"] or 0.0, x_interval, (resolved["low"], resolved["high"])))
    return out


def draw_front(chart_points: list[Point], path: Path, title: str, xlabel: str, front: bool = True) -> Path:
    """One figure: each point with its error bars and its name; with ``front``, the Pareto front
    line through the non-dominated points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bar(value: float, bounds: tuple[float | None, float | None]) -> list[list[float]] | None:
        low, high = bounds
        return None if low is None or high is None else [[max(value - low, 0.0)], [max(high - value, 0.0)]]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, point in enumerate(chart_points):
        ax.errorbar([point.x], [point.y], xerr=bar(point.x, point.x_interval), yerr=bar(point.y, point.y_interval),
                    fmt="o", color=f"C{index % 10}", capsize=4, label=point.name)
        ax.annotate(point.name, (point.x, point.y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if front:
        line = pareto_front(chart_points)
        ax.plot([p.x for p in line], [p.y for p in line], "--", color="0.3", linewidth=1.2, label="Pareto front",
                drawstyle="steps-post" if len(line) > 1 else "default")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("pass@1 (resolved, 95% interval)")
    ax.set_ylim(-0.05, 1.05)
    widest = max((max(p.x, p.x_interval[1] or 0.0) for p in chart_points), default=0.0) or 1.0
    ax.set_xlim(-0.03 * widest, 1.15 * widest)  # costs and latencies start at 0
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: Path, summaries: dict[str, dict[str, Any]], title: str, note: str = "",
                 cost: dict[str, Any] | None = None) -> Path:
    """``{out}/report.html`` (module doc), its figures also under ``{out}/report/``; with ``cost``
    (``training.cost``), the run's compute table last."""
    out = Path(out)
    report = HtmlReport(title)
    report.section("axes", "Every axis")
    if note:
        report.text(note)
    report.text("Each cell: the mean over tasks of each task's mean over its samples, with its 95% interval over "
                "tasks (Wilson's for pass@1 and best-of-K, a t-interval otherwise; none with one task).", note=True)
    report.table(*axes_rows(summaries))
    measure, label = cost_measure(summaries)
    cost_points = points(summaries, measure)
    front = pareto_front(cost_points)
    report.section("pareto", "Pareto front: accuracy versus cost")
    report.text("On the Pareto front (no other policy is as cheap and as accurate, and better in one): "
                + ", ".join(point.name for point in front) + ".")
    report.image(draw_front(cost_points, out / "report" / "pareto-cost.png", "Pareto front: accuracy versus cost",
                            label), "Pareto front: accuracy versus cost")
    report.section("latency", "Accuracy versus latency")
    report.image(draw_front(points(summaries, "wall_s"), out / "report" / "accuracy-latency.png",
                            "Pareto front: accuracy versus latency", "wall seconds per episode"),
                 "accuracy versus latency")
    if cost is not None:
        cost_section(report, cost)
    return report.write(out / "report.html")
