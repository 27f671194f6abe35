"""Generation throughput: verified tasks per minute, per generator, on the machine's cores.

For each generator (bug injection, feature deletion, refactors; and the ``mixed`` stream) a fresh
``TaskFactory`` on the training split makes N tasks with W workers, from an empty cache: every
candidate runs its tests in the sandbox, and every kept task is graded twice (gold and untouched)
before it counts. Beside each rate stands its floor in the same run: the rate if every task cost
exactly the minimum work (one sandboxed run of the broken state plus the two gradings, the gold
state's run shared across tasks), from the median time of one sandboxed pytest run of a source
project measured here. ``efficiency`` = measured rate / floor rate: what rejected candidates,
per-bug checks of multi-file bugs and the analysis itself cost.

    .venv/bin/python benchmarks/tasks.py [--count 8 --workers 2 --seed 100]

Results are printed and written to benchmarks/results/tasks.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from opencomposer.tasks.generators.testrun import run_tests

from opencomposer.tasks.generators.registry import TaskFactory, generate
from opencomposer.tasks.generators.source import project

RESULTS = Path(__file__).parent / "results" / "tasks.json"
RUNS_PER_TASK_FLOOR = 3  # the broken state's run, then grading gold and grading untouched


def pytest_run_seconds(repeats: int = 5) -> float:
    """Median wall time of one sandboxed pytest run of a source project (inventory)."""
    source = project("inventory")
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        run = run_tests(source.tree, source.task_command)
        times.append(time.monotonic() - started)
        assert run.passed, run.tail()
    return statistics.median(times)


def bench(kind: str, count: int, workers: int, seed: int, run_s: float) -> dict:
    factory = TaskFactory(kind, seed=seed, split="train")
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        results = generate(factory, count, Path(out), workers=workers)
        seconds = time.monotonic() - started
    made = [r for r in results if r.task is not None]
    rejected = sum(len(r.attempts) - 1 for r in made) + sum(len(r.attempts) for r in results if r.task is None)
    per_minute = len(made) / (seconds / 60)
    floor = workers * 60 / (RUNS_PER_TASK_FLOOR * run_s)
    return {
        "kind": kind,
        "tasks": len(made),
        "seconds": round(seconds, 1),
        "tasks_per_minute": round(per_minute, 2),
        "floor_tasks_per_minute": round(floor, 2),
        "efficiency": round(per_minute / floor, 2),
        "rejected_candidates": rejected,
        "sandbox_test_runs": factory.lab.runs_done,
        "gradings": 2 * len(made),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=8, help="tasks per generator")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--kinds", default="bugs,deletion,refactor,mixed")
    args = parser.parse_args()
    run_s = pytest_run_seconds()
    print(f"one sandboxed pytest run of a source project: {run_s:.2f} s (median of 5)")
    rows = []
    for kind in args.kinds.split(","):
        row = bench(kind, args.count, args.workers, args.seed, run_s)
        rows.append(row)
        print(f"{kind:9s} {row['tasks']} tasks in {row['seconds']:6.1f} s: {row['tasks_per_minute']:5.2f}/min "
              f"(floor {row['floor_tasks_per_minute']:.2f}/min, efficiency {row['efficiency']:.2f}); "
              f"{row['rejected_candidates']} rejected, {row['sandbox_test_runs']} test runs, "
              f"{row['gradings']} gradings")
    report = {"cpus": os.cpu_count(), "workers": args.workers, "count": args.count, "seed": args.seed,
              "pytest_run_s": round(run_s, 3), "generators": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
