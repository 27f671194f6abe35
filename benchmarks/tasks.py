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
    .venv/bin/python benchmarks/tasks.py --quick    # one bug task, one pytest run for the floor

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

from _quick import parse_args

from opencomposer.tasks.generators.common import Lab
from opencomposer.tasks.generators.registry import TaskFactory, generate
from opencomposer.tasks.generators.source import project

QUICK = {"count": 1, "kinds": "bugs", "floor_runs": 1}
RUNS_PER_TASK_FLOOR = 3  # the broken state's run, then grading gold and grading untouched


def pytest_run_seconds(repeats: int) -> float:
    """Median wall time of one sandboxed pytest run of a source project (inventory), as generation
    runs it (a fresh ``Lab`` each time: a Lab caches runs by tree)."""
    source = project("inventory")
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        run = Lab().run(source.tree, source.task_command)
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=8, help="tasks per generator")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--kinds", default="bugs,deletion,refactor,mixed", help="comma list of generators")
    parser.add_argument("--floor-runs", type=int, default=5, help="pytest runs timed for the floor (median)")
    args = parse_args(parser, QUICK)
    run_s = pytest_run_seconds(args.floor_runs)
    print(f"one sandboxed pytest run of a source project: {run_s:.2f} s (median of {args.floor_runs})")
    print(f"{'generator':<9}  {'tasks':>5}  {'seconds':>7}  {'per min':>7}  {'floor/min':>9}  {'efficiency':>10}  "
          f"{'rejected':>8}  {'test runs':>9}  {'gradings':>8}")
    rows = []
    for kind in args.kinds.split(","):
        row = bench(kind, args.count, args.workers, args.seed, run_s)
        rows.append(row)
        print(f"{kind:<9}  {row['tasks']:>5}  {row['seconds']:>7.1f}  {row['tasks_per_minute']:>7.2f}  "
              f"{row['floor_tasks_per_minute']:>9.2f}  {row['efficiency']:>10.2f}  {row['rejected_candidates']:>8}  "
              f"{row['sandbox_test_runs']:>9}  {row['gradings']:>8}", flush=True)
    report = {"cpus": os.cpu_count(), "workers": args.workers, "count": args.count, "seed": args.seed,
              "pytest_run_s": round(run_s, 3), "generators": rows}
    out = args.results_dir / "tasks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
