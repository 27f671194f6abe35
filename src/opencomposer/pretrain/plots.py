"""The run folder's plots: ``loss.png`` (training and held-out loss against step) and
``heldout.png`` (held-out codebase loss against tokens, log axis, phase starts marked, with the
least-squares fit ``a + b·log10(tokens)``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_loss(history: list[dict], path: Path, title: str = "pretraining loss") -> Path:
    """Training and held-out loss against step, to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    train = [(r["step"], r["loss"]) for r in history if "loss" in r and "lr" in r]
    held = [(r["step"], r["heldout_loss"]) for r in history if "heldout_loss" in r]
    if train:
        ax.plot(*zip(*train), label="train")
    if held:
        ax.plot(*zip(*held), "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def loglinear_fit(tokens: list[float], losses: list[float]) -> tuple[float, float]:
    """Least-squares ``loss ≈ a + b · log10(tokens)``: (a, b); b < 0 when the loss falls."""
    b, a = np.polyfit(np.log10(tokens), losses, 1)
    return float(a), float(b)


def plot_heldout(rows: list[dict], path: Path, boundaries: list[int]) -> Path | None:
    """Held-out codebase loss against tokens trained on a log axis, phase starts marked, with the
    log-linear fit over the evaluations after the first (docs/recipe.md §3: it falls log-linearly)."""
    points = [(r["tokens"], r["heldout_loss"], r["step"]) for r in rows
              if r.get("kind") == "eval" and "heldout_loss" in r and r.get("tokens", 0) > 0]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    tokens, losses, steps = zip(*points, strict=True)
    ax.plot(tokens, losses, "o-", label="held-out codebase loss")
    if len(points) >= 3:
        a, b = loglinear_fit(list(tokens), list(losses))
        grid = np.geomspace(min(tokens), max(tokens), 50)
        ax.plot(grid, a + b * np.log10(grid), "--", color="gray", label=f"fit: {a:.2f} {b:+.2f}·log10(tokens)")
    for boundary in boundaries:
        before = [t for t, _, s in points if s <= boundary]
        if before:
            ax.axvline(max(before), color="red", alpha=0.3, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("tokens trained (log)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("held-out codebase loss (dotted: phase starts)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
