"""The shape of a task suite beside CursorBench's and SWE-bench's (``opencomposer tasks stats DIR``).

Report §5 (docs/recipe.md §8) characterises CursorBench by two medians: **181 lines changed** by the
reference solution and **390 characters** of prompt, against **7-10 lines** and **1,185-3,055
characters** for SWE-bench-style public benchmarks. For each task this module measures the same
quantities:

- ``lines_changed``: lines added plus lines removed by ``solution/gold.patch`` (0 without one:
  a task answered in words);
- ``files_touched``: files the gold patch changes (0 without one);
- ``prompt_chars``: characters of ``instruction.md`` without surrounding whitespace.

and, for tasks that carry one (mined suites, ``tasks.mutation``), ``mutation_score``: the share of
mutants of the gold change that the hidden tests reject.

``summarize`` gives the median, mean, quartiles, 10th/90th percentiles and range of each;
``stats_table`` lays them out beside the references; ``compare_table`` puts several suites side by
side (median and interquartile range of each, then the references); ``plot`` draws one histogram
per quantity with each suite's median and the reference medians (a band for SWE-bench's range) as
a PNG, overlaid when there are several suites, with a fourth panel for mutation scores when a suite
has them.

Not here: scores of a policy on the suite (``opencomposer.bench``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from opencomposer.sandbox.patch import diff_stats
from opencomposer.types import Task

METRICS = ("lines_changed", "files_touched", "prompt_chars")
LABELS = {"lines_changed": "lines changed", "files_touched": "files touched", "prompt_chars": "prompt characters"}
SHORT = {"lines_changed": "lines", "files_touched": "files", "prompt_chars": "prompt chars"}
# Report §5: medians of CursorBench, and the range of medians of public benchmarks (SWE-bench family).
REFERENCES: dict[str, dict[str, float | tuple[float, float]]] = {
    "lines_changed": {"CursorBench": 181, "SWE-bench": (7, 10)},
    "prompt_chars": {"CursorBench": 390, "SWE-bench": (1185, 3055)},
    "files_touched": {},
}


@dataclass(frozen=True)
class TaskStats:
    task_id: str
    lines_changed: int
    files_touched: int
    prompt_chars: int
    mutation_score: float | None = None  # metadata.mutation_score of a mined task


@dataclass(frozen=True)
class Summary:
    count: int
    median: float
    mean: float
    p10: float
    p25: float
    p75: float
    p90: float
    minimum: float
    maximum: float


def task_stats(task: Task) -> TaskStats:
    diff = diff_stats(task.gold_patch or "")
    score = task.metadata.get("mutation_score")
    return TaskStats(task.id, diff.lines_changed, diff.files_changed, len(task.instruction.strip()),
                     float(score) if isinstance(score, int | float) else None)


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(rows: list[TaskStats]) -> dict[str, Summary]:
    """One ``Summary`` per quantity of ``METRICS``, and of ``mutation_score`` over the tasks that
    have one (when any does)."""
    if not rows:
        raise ValueError("no tasks to summarise")
    result = {}
    for metric in METRICS + ("mutation_score",):
        values = [float(getattr(r, metric)) for r in rows if getattr(r, metric) is not None]
        if not values:
            continue
        result[metric] = Summary(len(values), statistics.median(values), statistics.fmean(values),
                                 _quantile(values, 0.1), _quantile(values, 0.25), _quantile(values, 0.75),
                                 _quantile(values, 0.9), min(values), max(values))
    return result


def _reference(metric: str, name: str) -> str:
    value = REFERENCES[metric].get(name)
    if value is None:
        return "-"
    return f"{value[0]:,g}-{value[1]:,g}" if isinstance(value, tuple) else f"{value:,g}"


def stats_table(summary: dict[str, Summary], title: str):
    """A rich table: one row per quantity, with the reference medians of report §5."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("quantity", "median", "mean", "p10", "p25", "p75", "p90", "range", "CursorBench", "SWE-bench"):
        table.add_column(column, justify="left" if column == "quantity" else "right")
    for metric in METRICS:
        s = summary[metric]
        table.add_row(SHORT[metric], f"{s.median:g}", f"{s.mean:.1f}", f"{s.p10:g}", f"{s.p25:g}", f"{s.p75:g}",
                      f"{s.p90:g}", f"{s.minimum:g}-{s.maximum:g}", _reference(metric, "CursorBench"),
                      _reference(metric, "SWE-bench"))
    return table


def compare_table(summaries: dict[str, dict[str, Summary]]):
    """A rich table of several suites: per quantity, each suite's median with its interquartile
    range, then the reference medians of report §5."""
    from rich.table import Table

    table = Table(title="suites beside CursorBench and SWE-bench (median \\[p25-p75])")
    table.add_column("quantity")
    for name, summary in summaries.items():
        count = next(iter(summary.values())).count
        table.add_column(f"{name} ({count})", justify="right")
    table.add_column("CursorBench", justify="right")
    table.add_column("SWE-bench", justify="right")
    for metric in METRICS + ("mutation_score",):
        if not any(metric in s for s in summaries.values()):
            continue
        cells = []
        for summary in summaries.values():
            s = summary.get(metric)
            cells.append("-" if s is None else f"{s.median:g} [{s.p25:g}-{s.p75:g}]")
        references = REFERENCES.get(metric, {})
        table.add_row(SHORT.get(metric, "mutation score"), *cells,
                      _reference(metric, "CursorBench") if references else "-",
                      _reference(metric, "SWE-bench") if references else "-")
    return table


COLOURS = ("#4c72b0", "#55a868", "#8172b2", "#937860", "#64b5cd")


def plot(rows: list[TaskStats] | dict[str, list[TaskStats]], path: Path, title: str) -> Path:
    """Histograms of the three quantities with each suite's median and the reference medians
    (``rows`` one suite's, or suite name -> rows, overlaid), and of mutation scores when any task
    has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = rows if isinstance(rows, dict) else {"": rows}
    summaries = {name: summarize(r) for name, r in suites.items()}
    metrics = METRICS + (("mutation_score",) if any("mutation_score" in s for s in summaries.values()) else ())
    figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2))
    for axis, metric in zip(axes, metrics):
        references = REFERENCES.get(metric, {})
        every = [getattr(r, metric) for r in sum(suites.values(), []) if getattr(r, metric) is not None]
        upper = max([max(every)] + [v[1] if isinstance(v, tuple) else v for v in references.values()])
        if metric == "files_touched":  # one bar per whole number of files
            bins = [b - 0.5 for b in range(0, int(max(every)) + 2)]
        elif metric == "mutation_score":
            bins, upper = [i / 20 for i in range(21)], 1 / 1.05
        else:
            bins = [upper * 1.05 * i / 40 for i in range(41)]
        for (name, suite_rows), colour in zip(suites.items(), COLOURS):
            values = [getattr(r, metric) for r in suite_rows if getattr(r, metric) is not None]
            if not values:
                continue
            label = f"{name}: " if name else ""
            axis.hist(values, bins=bins, color=colour, alpha=0.85 if len(suites) == 1 else 0.55,
                      label=f"{label}{len(values)} tasks")
            axis.axvline(summaries[name][metric].median, color="black" if len(suites) == 1 else colour,
                         linewidth=2, label=f"{label}median {summaries[name][metric].median:g}")
        for name, value in references.items():
            if isinstance(value, tuple):
                axis.axvspan(value[0], value[1], color="#dd8452", alpha=0.35, label=f"{name} {value[0]:,g}-{value[1]:,g}")
            else:
                axis.axvline(value, color="#c44e52", linestyle="--", linewidth=2, label=f"{name} {value:,g}")
        if metric == "files_touched":
            axis.set_xlim(-0.5, upper + 0.5)
        else:
            axis.set_xlim(0, upper * 1.05)
        axis.set_xlabel(LABELS.get(metric, "mutation score (share of mutants rejected)"))
        axis.set_ylabel("tasks")
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
