"""``benchmarks/speculative.py``'s sweep over distillation steps: what ``--steps`` accepts, and the
plot of acceptance and speed-up against the counts (the whole path runs in its ``--quick`` test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.bench import BENCHMARKS, load_benchmark

sys.path.insert(0, str(BENCHMARKS))  # the script imports its helper (_quick) by name
speculative = load_benchmark("speculative")


def test_steps_is_one_count_or_an_ascending_list():
    assert speculative.step_counts("300") == [300]
    assert speculative.step_counts("50,100,400") == [50, 100, 400]
    for bad in ("100,50", "50,50", "0,10", "ten", "10,"):
        with pytest.raises(SystemExit, match="--steps"):
            speculative.step_counts(bad)


def test_the_sweep_plot_has_a_point_per_count(tmp_path: Path):
    def rows(acceptance):
        return [{"temperature": t, "batch": b, "acceptance": acceptance, "speedup": 0.5 + acceptance}
                for t in (0.0, 1.0) for b in (1, 8)]

    sweep = [{"distil_steps": n, "rows": rows(a)} for n, a in ((50, 0.2), (100, 0.4), (200, 0.6))]
    path = tmp_path / "sweep.png"
    speculative.plot_sweep(sweep, path)
    assert path.stat().st_size > 10_000
