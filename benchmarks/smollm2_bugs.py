"""SmolLM2-135M on real code tasks: SFT teaches the harness, then RL (issue 17).

Runs ``recipes/smollm2-bugs.toml`` end to end on this machine, every stage under ``--out-dir``
(default ``runs/smollm2-bugs``), each skipped when its output is already there, so a rerun
resumes where the last one stopped (RL from its newest checkpoint):

1. **tasks**: the pool, made by ``tasks.generators`` (bug injection, the recipe's ``[tasks]``):
   ``tasks/sft`` (the first ``sft.num_tasks`` of the training stream), ``tasks/rl`` (the next
   ``rl.steps × rl.batch_tasks``, so RL never trains on a task SFT demonstrated) and
   ``tasks/heldout`` (``rl.eval_tasks`` from the held-out projects);
2. **base**: the held-out evaluation (``rl.evaluate``: pass@1, best-of-K, format errors per turn)
   of the untouched model (``model.kind = "smollm2"``), as an RL run of zero steps;
3. **sft**: ``pretrain.sft.run_sft`` on the oracle's episodes of ``tasks/sft``
   (``sft.demonstrations = "explore"``: grep, read, edit, run the tests, finish);
4. **rl**: ``rl.loop.run_rl`` from the SFT checkpoint on ``tasks/rl``, evaluated on the same
   held-out tasks and seeds before the first step (= the SFT model), every ``rl.eval_every``
   steps and after the last;
5. **report**: ``benchmarks/results/smollm2_bugs.json`` and ``.png`` (SFT loss; held-out pass@1
   and best-of-K for base, SFT and RL; format errors per turn; RL's training reward), and a
   table on stdout.

    .venv/bin/python benchmarks/smollm2_bugs.py                  # the recipe as shipped (~2 h here)
    .venv/bin/python benchmarks/smollm2_bugs.py --quick          # every stage, at its smallest (minutes)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-bugs.toml"
RESULTS = Path(__file__).parent / "results"

# --quick: every stage at its smallest, a check by hand that the path runs (13.5 minutes under load 6):
# 2 demonstrations, 2 SFT steps, 1 RL step, 1 held-out task once, turns of at most 32 tokens; the test
# (tests/bench/test_smollm2_bugs.py) runs the same path at SHOWS_SFT's size
QUICK_OVERRIDES = [
    "sft.num_tasks=2", "sft.steps=2", "sft.batch_size=1", "sft.lr=2e-4", "sft.warmup_steps=1",
    "rl.steps=1", "rl.batch_tasks=1", "rl.group_size=2", "rl.lr_warmup_steps=0", "rl.eval_every=1",
    "rl.eval_tasks=1", "rl.eval_samples=1", "tasks.max_turns=6", "sampling.max_new_tokens=32",
]
# the smallest size at which SFT's effect shows (fewer format errors than the base model):
# --quick with these as --set (tests/bench/test_smollm2_bugs.py; about 10 minutes on two cores)
SHOWS_SFT = [
    "sft.num_tasks=8", "sft.steps=8", "sft.batch_size=4", "rl.steps=2", "rl.eval_every=2", "rl.eval_tasks=2",
    "rl.eval_samples=2", "sampling.max_new_tokens=128",
]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe of every stage (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted recipe override, e.g. --set rl.steps=24 (repeatable)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="work folder of the stages, reused by a rerun (default: runs/smollm2-bugs; with "
                             "--quick, a temporary folder)")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"where smollm2_bugs.json / .png go (default: {RESULTS}; with --quick, a temporary "
                             "folder)")
    parser.add_argument("--quick", action="store_true", help="every stage, shrunk: 2 demonstrations, 1 RL step")
    parser.add_argument("--no-base", action="store_true", help="skip the base model's evaluation")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="opencomposer-quick-")) if args.quick else None
    args.results = args.results or scratch or RESULTS
    if args.out_dir is None:
        args.out_dir = scratch / "work" if scratch else Path("runs") / "smollm2-bugs"
    args.out_dir = args.out_dir.resolve()
    return args


def stage_config(args: argparse.Namespace):
    """The recipe with every path under ``--out-dir``."""
    from opencomposer.config import load_recipe

    out = args.out_dir
    paths = [f'sft.tasks="{out / "tasks" / "sft"}"', f'sft.out="{out / "sft"}"',
             f'rl.train_tasks="{out / "tasks" / "rl"}"', f'rl.eval_suite="{out / "tasks" / "heldout"}"',
             f'model.path="{out / "sft"}"', f'run.out_dir="{out}"', 'run.name="rl"']
    return load_recipe(args.recipe, [*paths, *(QUICK_OVERRIDES if args.quick else []), *args.overrides])


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def write_json(path: Path, data: Any) -> None:
    from opencomposer.io import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------
def make_pool(config, out: Path) -> dict[str, Any]:
    """Stage 1: the three task folders (``generate`` reuses every task folder already made)."""
    from opencomposer.tasks.format import load_suite
    from opencomposer.tasks.generators.registry import TaskFactory, generate

    def made(name: str, split: str, count: int, start: int) -> tuple[list, int]:
        folder = out / "tasks" / name
        factory = TaskFactory("bugs", seed=config.run.seed, split=split, config=config.tasks, sandbox=config.sandbox)
        started = time.perf_counter()
        results = generate(factory, count, folder, start=start, workers=config.tasks.workers)
        tasks = [r.task for r in results if r.task is not None]
        if len(tasks) < count:
            raise RuntimeError(f"tasks/{name}: {len(tasks)} of {count} tasks could be made; see {folder}/generation.json")
        log(f"tasks/{name}: {len(tasks)} tasks ({time.perf_counter() - started:.0f} s)")
        return tasks, max(r.index for r in results) + 1

    sft_tasks, end = made("sft", "train", config.sft.num_tasks, 0)
    rl_tasks, _ = made("rl", "train", config.rl.steps * config.rl.batch_tasks, end)
    heldout, _ = made("heldout", "heldout", config.rl.eval_tasks, 0)
    del sft_tasks, rl_tasks, heldout
    return {name: pool_stats(load_suite(out / "tasks" / name)) for name in ("sft", "rl", "heldout")}


def pool_stats(tasks: list) -> dict[str, Any]:
    """What a pool holds: tasks per project and per bug operator, and the size of the fixes."""
    from opencomposer.sandbox.patch import diff_stats

    lines = sorted(diff_stats(t.gold_patch).lines_changed for t in tasks)
    return {
        "tasks": len(tasks),
        "projects": dict(Counter(t.metadata.get("family", "?") for t in tasks).most_common()),
        "operators": dict(Counter(op for t in tasks for op in t.metadata.get("operators", [])).most_common()),
        "gold_lines_changed_median": lines[len(lines) // 2] if lines else 0,
        "fail_to_pass_median": sorted(len(t.fail_to_pass) for t in tasks)[len(tasks) // 2] if tasks else 0,
    }


def evaluate_base(config, out: Path) -> dict[str, float]:
    """Stage 2: the held-out evaluation of the untouched model (an RL run of zero steps)."""
    from opencomposer.rl.loop import run_rl

    done = read_json(out / "base" / "summary.json")
    if done is None:
        log("base: evaluating the untouched model on the held-out tasks ...")
        cfg = replace(config, model=replace(config.model, kind="smollm2", path=""),
                      run=replace(config.run, name="base"), rl=replace(config.rl, steps=0))
        run_rl(cfg, progress=False)
        done = read_json(out / "base" / "summary.json")
    return done["evaluations"][0]


def run_sft_stage(config, out: Path) -> list[dict[str, float]]:
    """Stage 3: SFT of the untouched model on the oracle's episodes; its loss per step."""
    from opencomposer.training.metrics import read_metrics

    folder = Path(config.sft.out)
    if not (folder / "config.json").is_file():
        from opencomposer.pretrain.sft import run_sft

        log(f"sft: {config.sft.num_tasks} demonstrations, {config.sft.steps} steps ...")
        cfg = replace(config, model=replace(config.model, kind="smollm2", path=""))
        _, _, result, _ = run_sft(cfg, progress=False)
        log(f"sft: loss {result.first_loss:.3f} -> {result.last_loss:.3f} in {result.seconds:.0f} s")
    return [{"step": r["step"], "loss": r["loss"], "tokens": r["tokens"]} for r in read_metrics(folder, kind="train")]


def run_rl_stage(config) -> tuple[list[dict], list[dict]]:
    """Stage 4: RL from the SFT checkpoint (resumed when it has checkpoints); its step and eval rows."""
    from opencomposer.rl.loop import run_rl
    from opencomposer.training.metrics import read_metrics

    summary = read_json(config.run.path / "summary.json")
    if summary is None or summary["steps"] < config.rl.steps:
        log(f"rl: {config.rl.steps} steps x {config.rl.batch_tasks} tasks x {config.rl.group_size} rollouts ...")
        run_rl(config, progress=False)
    keep_train = ("reward_mean", "resolved_rate", "step_s", "rollout_s", "loss", "mismatch_kl")
    train = [{"step": r["step"], **{k: r[k] for k in keep_train if k in r}}
             for r in read_metrics(config.run.path, kind="train")]
    evals = read_metrics(config.run.path, kind="eval")
    for row in train:  # what the rollouts did, from their records: ended by finish, terms of the reward
        row.update(rollout_summary(config.run.path / "rollouts" / f"step-{row['step']:06d}.jsonl"))
    return train, evals


def rollout_summary(path: Path) -> dict[str, float]:
    """Shares and means over one step's rollouts (``rollouts/step-NNNNNN.jsonl``): ended with a
    status of ok, resolved, and the mean of the reward terms that say how far an episode got
    (``fail_to_pass``: hidden tests fixed; ``broken_tool_calls``: calls that failed, e.g. an edit
    whose old text is not in the file)."""
    if not path.is_file():
        return {}
    episodes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not episodes:
        return {}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    return {
        "episodes_ok": mean([float(e["status"] == "ok") for e in episodes]),
        "episode_turns_train": mean([float(e["turns"]) for e in episodes]),
        **{f"term_{name}": mean([float(e["terms"].get(name, 0.0)) for e in episodes])
           for name in ("fail_to_pass", "pass_to_pass", "broken_tool_calls")},
    }


def edit_diagnostics(record: Path, tasks_folder: Path) -> dict[str, float]:
    """How the held-out episodes of one evaluation (``rl/eval/step-N.jsonl``) used ``edit``: the
    edits made, the share naming a file that exists, and the share whose ``old`` text occurs
    exactly once in it (an edit that applies). Read against the task's workspace as it starts,
    which is what a first edit of each file sees."""
    from opencomposer.agent.protocol import parse_turn
    from opencomposer.tasks.format import load_task

    if not record.is_file():
        return {}
    tasks: dict[str, Any] = {}
    edits = exists = applies = 0
    for line in record.read_text().splitlines():
        episode = json.loads(line)
        task = tasks.get(episode["task_id"]) or tasks.setdefault(
            episode["task_id"], load_task(tasks_folder / episode["task_id"]))
        for turn in episode["turns"]:
            for call in parse_turn(turn["text"]).calls if "edit" in turn["tool_calls"] else []:
                if call.name != "edit":
                    continue
                edits += 1
                target = task.repo / str(call.arguments.get("path", ""))
                if not target.is_file():
                    continue
                exists += 1
                old = str(call.arguments.get("old", ""))
                applies += bool(old) and target.read_text(encoding="utf-8", errors="replace").count(old) == 1
    return {"edits": float(edits), "edit_path_exists": exists / edits if edits else float("nan"),
            "edit_applies": applies / edits if edits else float("nan")}


EVAL_KEYS = ("pass_at_1", "best_of_k", "format_error_rate", "mean_reward", "episode_turns", "episode_tokens",
             "episodes", "episodes_infra_error")


def eval_row(row: dict) -> dict[str, float]:
    return {k: row[k] for k in EVAL_KEYS if k in row}


# ----------------------------------------------------------------------------------------------
def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    sft = results["sft_loss"]
    axes[0].plot([r["step"] for r in sft], [r["loss"] for r in sft], marker=".")
    axes[0].set(title="SFT loss on the oracle's episodes", xlabel="SFT step", ylabel="nats / model token")
    rl_evals, base = results["rl_evals"], results.get("base")
    steps = [r["step"] for r in rl_evals]
    for key, label, marker in (("pass_at_1", "pass@1", "o"), ("best_of_k", f"best-of-{results['k']}", "s")):
        line = axes[1].plot(steps, [r[key] for r in rl_evals], marker=marker, label=f"{label} (SFT at step 0, then RL)")
        if base:
            axes[1].axhline(base[key], ls=":", color=line[0].get_color(), label=f"{label}, base model")
    axes[1].set(title="held-out resolve rate", xlabel="RL step", ylim=(-0.02, 1.02))
    axes[1].legend(fontsize=7)
    labels = (["base"] if base else []) + ["SFT" if r["step"] == 0 else f"RL {r['step']}" for r in rl_evals]
    values = ([base["format_error_rate"]] if base else []) + [r["format_error_rate"] for r in rl_evals]
    axes[2].bar(labels, values, color="tab:red")
    axes[2].set(title="format errors per turn (held-out)", ylim=(0, 1.02))
    train = results["rl_train"]
    axes[3].plot([r["step"] for r in train], [r.get("resolved_rate", float("nan")) for r in train], marker=".",
                 label="resolved")
    axes[3].plot([r["step"] for r in train], [r.get("reward_mean", float("nan")) for r in train], marker=".",
                 label="reward")
    axes[3].set(title="RL training batches", xlabel="RL step")
    axes[3].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct on injected bugs (recipes/smollm2-bugs.toml)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(results: dict[str, Any]) -> None:
    rows = ([("base", results["base"])] if results.get("base") else []) + [
        ("SFT" if r["step"] == 0 else f"RL step {r['step']}", r) for r in results["rl_evals"]]
    print(f"\n{'model':<12} {'pass@1':>7} {'best-of-' + str(results['k']):>9} {'fmt err/turn':>12} "
          f"{'turns':>6} {'tokens':>7}")
    for name, r in rows:
        print(f"{name:<12} {r['pass_at_1']:>7.3f} {r['best_of_k']:>9.3f} {r['format_error_rate']:>12.3f} "
              f"{r.get('episode_turns', float('nan')):>6.1f} {r.get('episode_tokens', float('nan')):>7.0f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    config = stage_config(args)
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    out = args.out_dir
    started = time.perf_counter()
    pools = make_pool(config, out)
    base = None if args.no_base else eval_row(evaluate_base(config, out))
    sft_loss = run_sft_stage(config, out)
    train, evals = run_rl_stage(config)
    results = {
        "recipe": str(args.recipe), "overrides": args.overrides, "quick": args.quick,
        "k": config.rl.eval_samples, "pools": pools, "base": base, "sft_loss": sft_loss,
        "rl_evals": [{"step": int(r["step"]), **eval_row(r),
                      **edit_diagnostics(config.run.path / "eval" / f"step-{int(r['step']):06d}.jsonl",
                                         Path(config.rl.eval_suite))} for r in evals],
        "rl_train": train,
        "seconds_this_run": round(time.perf_counter() - started, 1),
    }
    name = "smollm2_bugs_quick" if args.quick else "smollm2_bugs"
    write_json(args.results / f"{name}.json", results)
    plot(results, args.results / f"{name}.png")
    print_table(results)
    log(f"results: {args.results / (name + '.json')}, plot: {args.results / (name + '.png')}")
    return results


if __name__ == "__main__":
    main()
