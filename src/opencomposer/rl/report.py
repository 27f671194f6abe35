"""The curves of an RL run, drawn to PNG from its ``metrics.jsonl`` (``opencomposer report RUN``).

Panels (one PNG each under ``{run}/report/``, and all of them in ``{run}/report.png``):
reward (training mean, held-out mean), pass rate (training resolved rate, held-out pass@1 and
best-of-K), loss, KL (to the reference, and sampler-vs-trainer mismatch), entropy, lengths
(model tokens and turns per episode), the named reward terms and, for async runs, staleness (mean,
max, and the share of trained tokens at each staleness: the histogram per step). A metric the run never logged is
left out of its panel; a panel with nothing to draw is skipped.

The hack monitor (``grading.hack_monitor``) is on the pass-rate panel (``hack_suspected_rate``), and
``hack_monitor_section`` puts it on an HTML report (``training.html``; the quickstart's
``report.html``): the rate per step and every flagged episode with its reasons and its diff, one
click away. The rollout records keep the diff of a flagged episode for it (``hack_record``).

An RL run ends by writing ``{run}/report.html`` (``write_run_page``): the hack monitor's findings
and the run's cost table (``training.cost``; ``run_cost_section`` adds it to any report).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

PANELS: dict[str, list[tuple[str, str, str]]] = {  # panel -> [(kind, metric, label)]
    "reward": [("train", "reward_mean", "train mean reward"), ("eval", "mean_reward", "held-out mean reward")],
    "pass_rate": [("train", "resolved_rate", "train resolved rate"), ("eval", "pass_at_1", "held-out pass@1"),
                  ("eval", "best_of_k", "held-out best-of-K"),
                  ("train", "hack_suspected_rate", "train hack suspected rate (monitor)")],
    "loss": [("train", "loss", "loss")],
    "kl": [("train", "kl_ref", "KL(policy ‖ reference), k1"), ("train", "kl_sampler", "KL(sampler ‖ trainer), k3"),
           ("train", "kl_penalty_mean", "KL penalty per episode")],
    "entropy": [("train", "entropy", "entropy (nats/token)")],
    "lengths": [("train", "episode_tokens", "train model tokens/episode"), ("train", "episode_turns", "train turns/episode"),
                ("eval", "episode_tokens", "held-out model tokens/episode")],
}


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; is {run_dir} an `opencomposer rl` run folder?")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # blank, or torn by a kill mid-write (a resume drops it)
            continue
    return rows


def series(rows: list[dict], kind: str, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping rows without it and non-finite values."""
    points = [(row["step"], float(row[metric])) for row in rows
              if row.get("kind") == kind and isinstance(row.get(metric), int | float) and math.isfinite(row[metric])]
    return [p[0] for p in points], [p[1] for p in points]


def panel_lines(rows: list[dict]) -> dict[str, list[tuple[str, list[int], list[float]]]]:
    """Every panel's lines, including one line per named reward term."""
    panels = {name: [(label, *series(rows, kind, metric)) for kind, metric, label in lines]
              for name, lines in PANELS.items()}
    terms = sorted({key for row in rows if row.get("kind") == "train" for key in row if key.startswith("reward/")})
    panels["reward_terms"] = [(term.removeprefix("reward/"), *series(rows, "train", term)) for term in terms]
    panels["staleness"] = [(label, *series(rows, "train", metric)) for metric, label in
                           (("staleness_mean", "mean (versions)"), ("staleness_max", "max"))]
    panels["staleness"] += staleness_shares(rows)
    return {name: [line for line in lines if line[1]] for name, lines in panels.items()}


def staleness_shares(rows: list[dict]) -> list[tuple[str, list[int], list[float]]]:
    """One line per staleness value k: the share of a step's trained tokens sampled k versions
    behind (from the ``staleness_hist/k`` counts of the train rows)."""
    train = [row for row in rows if row.get("kind") == "train" and any(k.startswith("staleness_hist/") for k in row)]
    values = sorted({int(k.split("/")[1]) for row in train for k in row if k.startswith("staleness_hist/")})
    lines = []
    for value in values:
        steps, shares = [], []
        for row in train:
            total = sum(v for k, v in row.items() if k.startswith("staleness_hist/"))
            if total:
                steps.append(row["step"])
                shares.append(row.get(f"staleness_hist/{value}", 0.0) / total)
        lines.append((f"share of tokens {value} behind", steps, shares))
    return lines


def draw_report(run_dir: Path) -> list[Path]:
    """Write the panels; returns the PNG paths (the combined figure last)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    panels = {name: lines for name, lines in panel_lines(read_metrics(run_dir)).items() if lines}
    if not panels:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no step or evaluation yet")
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    written = []
    columns = 3
    rows_count = math.ceil(len(panels) / columns)
    combined, axes = plt.subplots(rows_count, columns, figsize=(5 * columns, 3.6 * rows_count), squeeze=False)
    for index, (name, lines) in enumerate(panels.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for target in (ax, axes[index // columns][index % columns]):
            for label, steps, values in lines:
                target.plot(steps, values, "o-" if len(steps) < 30 else "-", label=label, markersize=3)
            target.set_title(name.replace("_", " "))
            target.set_xlabel("step")
            target.grid(alpha=0.3)
            target.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for index in range(len(panels), rows_count * columns):
        axes[index // columns][index % columns].axis("off")
    combined.suptitle(f"RL run {run_dir.resolve().parent.name}/{run_dir.name}")
    combined.tight_layout()
    path = run_dir / "report.png"
    combined.savefig(path, dpi=100)
    plt.close(combined)
    written.append(path)
    return written


def hack_record(grade, diff: str | None) -> dict:
    """The hack monitor's fields of one rollout record: its verdict and reasons, and the diff when
    it was flagged (only then, to keep the records small)."""
    flagged = grade is not None and grade.hack_suspected
    return {"hack_suspected": flagged, "hack_reasons": list(grade.hack_reasons) if flagged else [],
            **({"diff": diff} if flagged else {})}


def flagged_episodes(run_dir: Path) -> list[dict]:
    """Every rollout record of the run (``rollouts/step-*.jsonl``) the hack monitor flagged, in
    step order."""
    rows = []
    for path in sorted((Path(run_dir) / "rollouts").glob("step-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("hack_suspected"):
                rows.append(row)
    return rows


def hack_monitor_section(report, run_dir: Path, limit: int = 50) -> None:
    """Add the hack monitor's findings to ``report`` (a ``training.html.HtmlReport`` with a section
    open): the share of training episodes it flagged, then each flagged episode (the first
    ``limit``) with its reasons and its diff folded under it."""
    rows = [row for row in read_metrics(run_dir) if row.get("kind") == "train" and "hack_suspected_rate" in row]
    flagged = flagged_episodes(run_dir)
    rate = sum(row["hack_suspected_rate"] for row in rows) / len(rows) if rows else 0.0
    report.text(f"Hack monitor (a static scan of each diff for reward-hacking patterns; a signal, not a "
                f"verdict): {rate:.3f} of training episodes flagged on average over {len(rows)} steps, "
                f"{len(flagged)} flagged episodes in all.")
    if not flagged:
        return
    report.table(["step", "task", "sample", "resolved", "reward", "reasons"],
                 [[row["step"], row["task_id"], row["sample"], row.get("resolved"),
                   f"{row['reward']:.3f}" if isinstance(row.get("reward"), int | float) else row.get("reward"),
                   "; ".join(row["hack_reasons"])] for row in flagged[:limit]])
    for row in flagged[:limit]:
        report.details(f"diff of step {row['step']}, {row['task_id']}, sample {row['sample']}: "
                       f"{'; '.join(row['hack_reasons'])}", row.get("diff") or "(no diff recorded)")
    if len(flagged) > limit:
        report.text(f"... and {len(flagged) - limit} more flagged episodes in rollouts/.", note=True)


def run_cost_section(report, run_dir: Path) -> None:
    """Add the cost table of the run in ``run_dir`` (its ``cost.json``) to ``report``, a
    ``training.html.HtmlReport``; a run without one (written before costs were kept) adds nothing."""
    from opencomposer.training.cost import COST_FILE, cost_section

    path = Path(run_dir) / COST_FILE
    if path.is_file():
        cost_section(report, json.loads(path.read_text()))


def write_run_page(run_dir: Path) -> Path:
    """``{run}/report.html`` of an RL run: the hack monitor's findings, then the cost table."""
    from opencomposer.training.html import HtmlReport

    report = HtmlReport(f"opencomposer rl: {run_dir}")
    report.section("hack-monitor", "Hack monitor")
    hack_monitor_section(report, run_dir)
    run_cost_section(report, run_dir)
    return report.write(Path(run_dir) / "report.html")
