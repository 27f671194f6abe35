"""What an ablation study's runs say: each metric's mean over seeds with a 95 % interval, per grid
cell, as a table, ``ablation.json`` and one ``report.html`` (``opencomposer ablate``, docs/ablations.md).

A cell's runs are ordinary run folders; their ``metrics.jsonl`` rows are read here, nothing else.
A metric is ``"eval/NAME"`` (the held-out evaluation rows) or ``"train/NAME"`` (the training
steps'); its final value is the one of the last row of that kind that holds it.

**Intervals.** Over the n seeds of a cell, the mean ± t·s/√n, where s is the sample standard
deviation and t the 0.975 quantile of Student's t with n − 1 degrees of freedom (``t_975``): a 95 %
two-sided interval for the cell's expected value, if the seeds' results are independent and
roughly normal. With one seed there is no interval, and the table says so. Two cells whose
intervals overlap are not shown to differ; the report claims nothing about them.

Not here: running the cells (``commands.ablate``), the grid itself (``config.ablation``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencomposer.training.html import HtmlReport
from opencomposer.training.metrics import read_metrics

T_975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
"""The 0.975 quantile of Student's t for 1 to 30 degrees of freedom, to six decimals."""
Z_975 = 1.959963984540054


def t_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the table up to 30, then the
    Cornish-Fisher expansion around the normal quantile (within 1e-7 of the exact value there)."""
    if df < 1:
        raise ValueError(f"degrees of freedom: expected >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z, v = Z_975, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


@dataclass
class Interval:
    """The mean of ``n`` values and the half-width of its 95 % t-interval (None for one value)."""

    mean: float
    half: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    def text(self) -> str:
        return f"{self.mean:.3f}" if self.half is None else f"{self.mean:.3f} ± {self.half:.3f}"


def interval(values: list[float]) -> Interval:
    """The mean of ``values`` with its 95 % t-interval (see the module doc)."""
    if not values:
        raise ValueError("interval: no values")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, None, 1)
    return Interval(mean, t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)), len(values))


def metric_series(rows: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of ``metric`` (``"eval/pass_at_1"``) over a run's rows, finite values only."""
    kind, _, name = metric.partition("/")
    return [(int(row["step"]), float(row[name])) for row in rows
            if row.get("kind") == kind and isinstance(row.get(name), int | float) and math.isfinite(row[name])]


def run_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run folder's ``metrics.jsonl`` (none when it has none yet)."""
    path = Path(run_dir) / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


def final_metrics(run_dir: Path, metrics: list[str]) -> dict[str, float]:
    """The last value of each of ``metrics`` the run logged."""
    rows = run_rows(run_dir)
    return {metric: series[-1][1] for metric in metrics if (series := metric_series(rows, metric))}


@dataclass
class CellRun:
    """One run of the study: grid cell ``cell`` (its name) with ``seed``; ``overrides``: the varied
    keys' values; ``status``: "finished", "failed" or "pending"; ``metrics``: the final values."""

    cell: str
    overrides: dict[str, str]
    seed: int
    run_dir: str
    status: str = "pending"
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


def cells_in_order(runs: list[CellRun]) -> list[str]:
    return list(dict.fromkeys(run.cell for run in runs))


def table(runs: list[CellRun], metrics: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: per grid cell, its finished seeds and each metric's mean ± half-width."""
    header = ["cell", "seeds", *metrics]
    rows = []
    for cell in cells_in_order(runs):
        done = [run for run in runs if run.cell == cell and run.status == "finished"]
        row = [cell, str(len(done))]
        for metric in metrics:
            values = [run.metrics[metric] for run in done if metric in run.metrics]
            row.append(interval(values).text() if values else "-")
        rows.append(row)
    return header, rows


def table_note(runs: list[CellRun]) -> str:
    seeds = {run.seed for run in runs}
    if len(seeds) == 1:
        return "One seed: each value is that seed's, with no interval (run more seeds for one)."
    return (f"Mean ± half-width of the 95 % t-interval over {len(seeds)} seeds. Overlapping intervals: "
            "no claim that the cells differ.")


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """The table as aligned plain text, for the terminal and logs."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
                     for line in [header, *rows])


def mean_curve(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """The steps every one of ``curves`` (one per seed) has, with the mean and interval there
    (low = high = mean where there is one curve)."""
    steps = sorted(set.intersection(*(({step for step, _ in curve}) for curve in curves))) if curves else []
    means, lows, highs = [], [], []
    for step in steps:
        found = interval([dict(curve)[step] for curve in curves])
        means.append(found.mean)
        lows.append(found.mean if found.low is None else found.low)
        highs.append(found.mean if found.high is None else found.high)
    return steps, means, lows, highs


SHARE_PREFIXES = ("pass_at_", "best_of_")
SHARE_SUFFIXES = ("_rate", "_share", "_fraction")


def is_share(metric: str) -> bool:
    """Whether ``metric`` is a share of episodes or tokens, so lies in [0, 1] (pass@1, best-of-K,
    a resolved or replace rate)."""
    name = metric.rsplit("/", 1)[-1]
    return name.startswith(SHARE_PREFIXES) or name.endswith(SHARE_SUFFIXES)


def clipped_band(metric: str, lows: list[float], highs: list[float]) -> tuple[list[float], list[float]]:
    """The interval as drawn: a t-interval over three seeds can reach past what a share can be,
    so a share's band stops at 0 and 1 (the table keeps the interval as computed)."""
    if not is_share(metric):
        return lows, highs
    return [max(0.0, low) for low in lows], [min(1.0, high) for high in highs]


def draw_metric(runs: list[CellRun], metric: str, path: Path) -> Path:
    """One figure for ``metric``: the mean over seeds against steps per cell (band: the interval,
    cut at 0 and 1 for a share), and beside it each cell's final values (the seeds as dots, the
    mean with its interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve_ax, final_ax) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    cells = cells_in_order(runs)
    for index, cell in enumerate(cells):
        done = [run for run in runs if run.cell == cell and run.status == "finished"]
        color = f"C{index % 10}"
        curves = [metric_series(run_rows(Path(run.run_dir)), metric) for run in done]
        steps, means, lows, highs = mean_curve([curve for curve in curves if curve])
        if steps:
            curve_ax.plot(steps, means, "o-" if len(steps) < 30 else "-", color=color, label=cell, markersize=3)
            curve_ax.fill_between(steps, *clipped_band(metric, lows, highs), color=color, alpha=0.2)
        values = [run.metrics[metric] for run in done if metric in run.metrics]
        if values:
            found = interval(values)
            final_ax.plot([index] * len(values), values, ".", color=color, alpha=0.6)
            yerr = None
            if found.half is not None:
                [low], [high] = clipped_band(metric, [found.mean - found.half], [found.mean + found.half])
                yerr = [[found.mean - low], [high - found.mean]]
            final_ax.errorbar([index], [found.mean], yerr=yerr, fmt="s", color=color, capsize=6)
    band = "95 % interval" + (", cut at 0 and 1" if is_share(metric) else "")
    curve_ax.set_title(f"{metric}: mean over seeds, band = {band}")
    curve_ax.set_xlabel("step")
    curve_ax.grid(alpha=0.3)
    if cells:
        curve_ax.legend(fontsize=7)
    final_ax.set_title(f"{metric}: final value per cell")
    final_ax.set_xticks(range(len(cells)), [cell.replace(",", ",\n") for cell in cells], fontsize=7,
                        rotation=20 if len(cells) > 2 else 0, ha="right" if len(cells) > 2 else "center")
    final_ax.set_xlim(-0.5, len(cells) - 0.5)
    final_ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: Path, runs: list[CellRun], metrics: list[str], title: str, recipe_text: str) -> Path:
    """``{out}/report.html``: the table, then one figure per metric (also ``{out}/report/*.png``)."""
    out = Path(out)
    report = HtmlReport(title)
    report.section("table", "Final values")
    report.text(table_note(runs))
    report.table(*table(runs, metrics))
    failed = [run for run in runs if run.status != "finished"]
    if failed:
        report.text("Not finished: " + "; ".join(f"{run.cell} seed {run.seed} ({run.status}"
                                                 + (f": {run.error}" if run.error else "") + ")" for run in failed),
                    note=True)
    for metric in metrics:
        report.section(metric.replace("/", "-"), metric)
        report.image(draw_metric(runs, metric, out / "report" / f"{metric.replace('/', '-')}.png"), metric)
    report.section("runs", "Runs")
    report.table(["cell", "seed", "status", "run folder"], [[run.cell, run.seed, run.status, run.run_dir] for run in runs])
    report.section("recipe", "Study")
    report.code(recipe_text)
    return report.write(out / "report.html")
