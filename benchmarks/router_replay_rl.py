"""Short RL runs with router replay off, on and filtered, the same seeds each way (issue 13, report §6.2).

``benchmarks/router_replay.py`` measures the sampler/trainer mismatch of one batch; this runs the
learning loop itself each way. From one SFT checkpoint of the tiny MoE (by default the 1,800-step
budget of ``benchmarks/loss_predicts_rl.py``, which learns reliably under RL), the quickstart's RL
stage runs once per ``rl.router_replay`` mode with identical seeds, task order and settings, under
a sampler/trainer gap (``--gap``):

- ``bf16`` (default): the trainer's forward under bfloat16 autocast (``rl.bf16``), the sampler in
  float32, so routing can flip between the two on near-tied experts;
- ``none``: both in float32 (the control: the trainer and the batch-invariant sampler differ by
  summation order only).

Reported per mode: mean train reward, held-out pass@1 at the evaluation steps, and the mean of the
train rows' ``mismatch_kl``, ``router_replay_replace_rate`` and ``router_replay_agreement`` where
the loop reports them; results and a plot go to ``benchmarks/results/router_replay_rl.{json,png}``.

    .venv/bin/python benchmarks/router_replay_rl.py [--sft PATH] [--gap bf16|none] [--seed 0]
                                                    [--modes off replay filtered] [--set KEY=VALUE ...]

Runs are cached under ``~/.cache/opencomposer/router-replay-rl`` and resume after a crash.
``--quick`` runs ``off`` and ``replay`` for two tiny steps each from a randomly initialised tiny MoE
(no SFT checkpoint needed), runs and results in a temporary folder.

    .venv/bin/python benchmarks/router_replay_rl.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _quick import parse_args  # noqa: E402
from loss_predicts_rl import log, mean, run_rl_stage  # noqa: E402  (a sibling benchmark script)

from opencomposer.io import cache_dir  # noqa: E402

DEFAULT_SFT = cache_dir() / "loss-predicts-rl" / "pretrain-01800" / "sft"
QUICK = {"modes": ["off", "replay"], "overrides": [
    "rl.steps=2", "rl.batch_tasks=1", "rl.group_size=2", "rl.lr_warmup_steps=1", "rl.eval_every=2",
    "rl.eval_tasks=1", "rl.eval_samples=1", "rl.checkpoint_every=2", "sampling.max_new_tokens=16"]}


def random_start(folder: Path) -> Path:
    """A randomly initialised tiny MoE saved as a checkpoint: the quick run's start."""
    from opencomposer.model.loading import load_model, save_checkpoint

    model, tokenizer = load_model("tiny_moe", seed=0)
    return save_checkpoint(model, tokenizer, folder)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", type=Path, default=DEFAULT_SFT, help="the SFT checkpoint RL starts from")
    parser.add_argument("--recipe", type=Path, default=Path(__file__).parents[1] / "recipes" / "quickstart.toml")
    parser.add_argument("--gap", choices=["bf16", "none"], default="bf16", help="the sampler/trainer gap (module doc)")
    parser.add_argument("--modes", nargs="+", default=["off", "replay", "filtered"], help="rl.router_replay values")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted recipe override of every run (repeatable)")
    parser.add_argument("--out", type=Path, help="results JSON; the plot goes beside it "
                                                 "(default: benchmarks/results/router_replay_rl.json)")
    args = parse_args(parser, QUICK, argv)
    if args.out is None:
        args.out = args.results_dir / "router_replay_rl.json"
    if args.quick:
        args.sft = random_start(args.results_dir / "start")
    if not (args.sft / "config.json").is_file():
        raise SystemExit(f"{args.sft} is not a checkpoint folder; run benchmarks/loss_predicts_rl.py first "
                         "(its 1800-step budget) or pass --sft")
    import torch

    from opencomposer.commands.quickstart import stage_configs
    from opencomposer.config import load_recipe

    torch.set_num_threads(1)
    base = load_recipe(args.recipe, [f"run.seed={args.seed}", "run.threads=1", *args.overrides])
    _, rl_config = stage_configs(base, args.sft)
    out_root = args.results_dir / "runs" if args.quick else cache_dir() / "router-replay-rl"
    runs = {}
    for mode in args.modes:
        name = f"{args.gap}-seed{args.seed}-{mode}"
        config = replace(rl_config, model=replace(rl_config.model, kind="hf", path=str(args.sft)),
                         run=replace(rl_config.run, out_dir=str(out_root), name=name, seed=args.seed),
                         rl=replace(rl_config.rl, router_replay=mode, bf16=args.gap == "bf16"))
        config.validate()
        runs[mode] = run_rl_stage(config, f"router_replay={mode}, gap {args.gap}")
        from opencomposer.training.metrics import read_metrics

        train = read_metrics(config.run.path, kind="train")
        for key in ("mismatch_kl", "router_replay_replace_rate", "router_replay_agreement"):
            values = [row[key] for row in train if key in row]
            runs[mode][key] = mean(values) if values else None
    result = {"sft": str(args.sft), "gap": args.gap, "seed": args.seed, "overrides": args.overrides, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"{'mode':9s} {'reward':>7s} {'pass@1 (eval steps)':>30s} {'mismatch_kl':>12s} {'replaced':>9s}")
    for mode, run in runs.items():
        passes = " ".join(f"{e['pass_at_1']:.3f}" for e in run["eval"])
        kl = run["mismatch_kl"]
        replaced = run["router_replay_replace_rate"]
        print(f"{mode:9s} {mean(run['reward']):7.3f} {passes:>30s} {kl if kl is None else f'{kl:.2e}':>12} "
              f"{'-' if replaced is None else f'{replaced:.3f}':>9s}")
    log(f"wrote {args.out}")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, run in result["runs"].items():
        left.plot(range(1, len(run["reward"]) + 1), run["reward"], label=mode)
        right.plot([e["step"] for e in run["eval"]], [e["pass_at_1"] for e in run["eval"]], marker="o", label=mode)
    left.set(xlabel="RL step", ylabel="train reward (mean)", title="train reward")
    right.set(xlabel="RL step", ylabel="held-out pass@1", title="held-out pass@1", ylim=(0, 1.05))
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(title="rl.router_replay")
    fig.suptitle(f"router replay in RL, sampler/trainer gap: {result['gap']}, seed {result['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
