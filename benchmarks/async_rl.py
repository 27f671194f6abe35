"""Synchronous vs asynchronous RL, side by side in one run: groups trained per minute.

The same recipe (``recipes/rl-tiny.toml``, from a fresh tiny MoE so that no SFT run is needed;
throughput does not depend on the policy's quality much) runs as

1. ``rl.mode = "sync"`` (``rl.loop``: sampling waits for training and training for sampling);
2. ``rl.mode = "async"`` with ``rl.max_staleness`` 1 and 2 (embedded services: environment
   workers sample the next steps' groups while the trainer trains), with the sampler as a thread
   of the trainer's process and as a process of its own (``services.inference_process``);
3. the Ray backend with two environment workers at staleness 1 (``--no-ray`` skips it).

Each configuration's rate is B × steps / wall seconds of the steps (set-up excluded: the first
train row's timestamp minus its step time marks the start), and the table gives each rate over the
synchronous one. verl reports 1.72x and AReaL 2.77x for asynchronous over synchronous RL on GPUs.

    .venv/bin/python benchmarks/async_rl.py [--steps 6 --batch-tasks 4 --group-size 8 --no-ray]
                                            [--rounds 3] [--only sync 'async process stal. 1']
    .venv/bin/python benchmarks/async_rl.py --quick   # sync and async staleness 1, two tiny steps each

Results are printed and written to benchmarks/results/async_rl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _quick import parse_args

from opencomposer.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"steps": 2, "batch_tasks": 1, "group_size": 2, "max_new_tokens": 8, "no_ray": True,
         "only": ["sync", "async staleness 1"]}


def measure(label: str, name: str, overrides: list[str], base: list[str], folder: Path) -> dict[str, float]:
    from opencomposer.rl.loop import run_rl
    from opencomposer.services.async_rl import AsyncRollouts

    config = load_recipe(ROOT / "recipes" / "rl-tiny.toml", [*base, f"run.out_dir={folder}", f"run.name={name}", *overrides])
    started = time.perf_counter()
    summary = run_rl(config, progress=False, source=AsyncRollouts() if config.rl.mode == "async" else None)
    total = time.perf_counter() - started
    rows = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["kind"] == "train"]
    first_start = train[0]["time"] - train[0].get("step_s", train[0].get("train_s", 0.0) + train[0].get("trainer_wait_s", 0.0))
    seconds = train[-1]["time"] - first_start
    groups = config.rl.batch_tasks * len(train)
    out = {
        "seconds": seconds,
        "wall_with_setup_s": total,
        "groups_per_minute": 60.0 * groups / seconds,
        "staleness_mean": sum(row.get("staleness_mean", 0.0) for row in train) / len(train),
        "staleness_max": max(row.get("staleness_max", 0.0) for row in train),
        "kl_sampler": sum(row.get("kl_sampler", 0.0) for row in train) / len(train),
        "trainer_wait_s": sum(row.get("trainer_wait_s", 0.0) for row in train),
        # synchronous rows: where a step's time goes (the ceiling of what overlapping can save)
        "rollout_s": sum(row.get("rollout_s", 0.0) for row in train),
        "train_s": sum(row.get("step_s", 0.0) - row.get("rollout_s", 0.0) for row in train)
        if config.rl.mode == "sync" else sum(row.get("train_s", 0.0) for row in train),
    }
    print(f"{label:>24}: {out['groups_per_minute']:6.2f} groups/min over {seconds:6.1f} s "
          f"(staleness mean {out['staleness_mean']:.2f}, max {out['staleness_max']:.0f})", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="RL steps of each configuration")
    parser.add_argument("--batch-tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per turn")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every configuration this many times, interleaved; report the median")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these configurations (with 'sync')")
    args = parse_args(parser, QUICK)
    base = ["model.path=", f"rl.steps={args.steps}", f"rl.batch_tasks={args.batch_tasks}",
            f"rl.group_size={args.group_size}", "rl.eval_every=0", f"sampling.max_new_tokens={args.max_new_tokens}",
            "rl.lr_warmup_steps=0"]
    configs = {
        "sync": ["rl.mode=sync"],
        "async staleness 1": ["rl.mode=async", "rl.max_staleness=1"],
        "async staleness 2": ["rl.mode=async", "rl.max_staleness=2"],
        "async process stal. 1": ["rl.mode=async", "rl.max_staleness=1", "services.inference_process=true"],
        "async process stal. 2": ["rl.mode=async", "rl.max_staleness=2", "services.inference_process=true"],
        # as many environment workers as the Ray configuration: fewer groups in flight, less
        # contention with the trainer for the two cores
        "async 2 workers stal. 1": ["rl.mode=async", "rl.max_staleness=1", "services.env_workers=2"],
        "async process 2 wk stal. 1": ["rl.mode=async", "rl.max_staleness=1", "services.inference_process=true",
                                       "services.env_workers=2"],
        # the trainer alone on CPU 0, everything else on the other CPUs
        "async pinned 2 wk stal. 1": ["rl.mode=async", "rl.max_staleness=1", "services.env_workers=2",
                                      "services.trainer_cpus=[0]"],
        "async pinned process 2 wk stal. 1": ["rl.mode=async", "rl.max_staleness=1", "services.env_workers=2",
                                              "services.inference_process=true", "services.trainer_cpus=[0]"],
    }
    if not args.no_ray:
        configs["ray, 2 workers, stal. 1"] = ["rl.mode=async", "rl.max_staleness=1", "services.backend=ray",
                                              "services.env_workers=2"]
    if args.only:
        unknown = sorted(set(args.only) - set(configs))
        if unknown or "sync" not in args.only:
            parser.error(f"--only takes names from {sorted(configs)} and must include 'sync'; got {unknown or args.only}")
        configs = {name: overrides for name, overrides in configs.items() if name in args.only}
    results: dict[str, object] = {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0],
                                  **{k: v for k, v in vars(args).items() if k != "results_dir"}}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # rounds interleave the configurations: drifting load hits them alike
            for i, (name, overrides) in enumerate(configs.items()):
                rounds[name].append(measure(name, f"run{r}-{i}", overrides, base, Path(tmp)))
    for name, measured in rounds.items():
        # the round with the median rate, and every round's rate
        results[name] = {**sorted(measured, key=lambda m: m["groups_per_minute"])[len(measured) // 2],
                         "rounds_groups_per_minute": [m["groups_per_minute"] for m in measured]}
    print(f"\n{'configuration':<34}  {'groups/min':>10}  {'vs sync':>7}  rounds vs sync")
    for name in configs:
        ratios = [m / s for m, s in zip(results[name]["rounds_groups_per_minute"],
                                        results["sync"]["rounds_groups_per_minute"], strict=True)]
        results[name]["vs_sync"] = results[name]["groups_per_minute"] / results["sync"]["groups_per_minute"]
        results[name]["rounds_vs_sync"] = ratios
        print(f"{name:<34}  {results[name]['groups_per_minute']:>10.2f}  {results[name]['vs_sync']:>6.2f}x  "
              f"{', '.join(f'{x:.2f}' for x in ratios)}")
    out = args.results_dir / "async_rl.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
