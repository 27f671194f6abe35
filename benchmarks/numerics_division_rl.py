"""Exact versus approximate division in NVFP4 over a long RL run on the tiny family (issue 13, §3).

The report (§6.1): NVFP4 quantisation with a fast approximate division diverged after about a
hundred RL steps; IEEE-exact division (``__fdiv_rn``) did not. This script runs the same RL run
in several numerics and measures how far each drifts from the exact one:

- **start**: one SFT stage of ``recipes/rl-tiny.toml`` in the report's numerics (NVFP4 forward with
  per-token scales and exact division, MXFP8 backward, tokens dispatched to the experts in MXFP8),
  shared by every run.
- **runs**: RL from that start, same seed (same task order, same episode seeds), ``--steps`` steps
  of ``--batch-tasks`` tasks × ``--group-size`` rollouts (the family's 96 training prompts, each
  once, at the defaults), differing only in ``numerics.division`` / ``numerics.reciprocal_ulp``:
  ``exact``; ``approx`` (multiply by the correctly rounded reciprocal, two roundings instead of
  one); ``approx+1`` / ``approx-1`` (a reciprocal one ulp high / low, the worst case of a fast
  reciprocal's error bound). ``control`` is the exact run from a start nudged by one ulp in one
  weight: the floor of how far two runs drift apart through sampling alone, since once any bit
  differs, the sampled tokens and everything after them differ.
- **measured** at every checkpoint: weight drift ``|w - w_exact| / |w_exact - w_start|``, the mean
  per-token KL(exact ‖ run) of the next-token distributions over fixed demonstration tokens (each
  model in its own numerics), and per step the reward, the resolved rate and the sampler/trainer
  log-ratio p99; held-out pass@1 every ``--eval-every`` steps.

Why dispatch matters: tokens arrive at the experts as MXFP8 values (3 mantissa bits), so ratios
such as x / amax = 1/8 that put an E2M1 element exactly on a rounding tie are common, and the last
bit of the division decides them. ``dispatch_flip_rates`` measures that on Gaussian tokens (the
``flips`` of the results; ``benchmarks/numerics_division.py`` has the same for larger tensors
without dispatch).

Writes ``benchmarks/results/numerics_division_rl.json`` and ``numerics_division_rl.png``; run
folders under ``--out`` (default ``runs/numerics-division``; an existing SFT start is reused).
``--quick`` runs exact and approx for two steps from a two-step SFT, everything in a temporary folder.

    .venv/bin/python benchmarks/numerics_division_rl.py [--steps 96 --batch-tasks 1 --jobs 2]
    .venv/bin/python benchmarks/numerics_division_rl.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shutil
import time
from pathlib import Path

import torch
from _quick import parse_args

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "rl-tiny.toml"
QUICK = {"steps": 2, "batch_tasks": 1, "group_size": 2, "eval_every": 2, "eval_tasks": 1, "eval_samples": 1,
         "checkpoint_every": 1, "kl_tasks": 1, "sft_steps": 2, "variants": ["exact", "approx"], "jobs": 1}
NVFP4 = ["numerics.recipe=nvfp4_fwd_mxfp8_bwd", "numerics.nvfp4_activation_scale=token",
         "numerics.quantize_dispatch=true"]
VARIANTS = {
    "exact": ["numerics.division=exact"],
    "approx": ["numerics.division=approx"],
    "approx+1": ["numerics.division=approx", "numerics.reciprocal_ulp=1"],
    "approx-1": ["numerics.division=approx", "numerics.reciprocal_ulp=-1"],
    "control": ["numerics.division=exact"],
}


def dispatch_flip_rates(rows: int = 4096, hidden: int = 64) -> dict[str, dict[str, float]]:
    """How often each approximate division changes the NVFP4 codes of Gaussian tokens ``[rows,
    hidden]`` (per-token scales) as float32, as bfloat16, and as the experts receive them after an
    MXFP8 dispatch; bias = mean(|approx| - |exact|) / mean|x| of the dequantised values."""
    from opencomposer.numerics.formats import unpack_fp4
    from opencomposer.numerics.nvfp4 import dequantize_nvfp4, quantize_nvfp4
    from opencomposer.numerics.qlinear import MXSpec, fake_quantize

    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(0))
    inputs = {"float32": x, "bfloat16": x.bfloat16().float(), "mxfp8 dispatch": fake_quantize(x, MXSpec())}
    out = {}
    for name, tokens in inputs.items():
        exact = quantize_nvfp4(tokens, "token")
        for label, ulp in (("approx", 0), ("approx+1", 1), ("approx-1", -1)):
            approx = quantize_nvfp4(tokens, "token", "approx", ulp)
            bias = (dequantize_nvfp4(approx).abs() - dequantize_nvfp4(exact).abs()).mean() / tokens.abs().mean()
            out[f"{name}, {label}"] = {
                "element_flips": float((unpack_fp4(approx.data) != unpack_fp4(exact.data)).double().mean()),
                "block_scale_flips": float((approx.block_scale != exact.block_scale).double().mean()),
                "bias": float(bias),
            }
    return out


def rl_overrides(args: argparse.Namespace, variant: str, start: Path) -> list[str]:
    checkpoints = args.steps // args.checkpoint_every + 1
    return [
        f"run.out_dir={args.out}", f"run.name={variant}", f"model.path={start}", "run.threads=1",
        f"rl.steps={args.steps}", f"rl.batch_tasks={args.batch_tasks}", f"rl.group_size={args.group_size}",
        f"rl.eval_every={args.eval_every}", f"rl.eval_tasks={args.eval_tasks}", f"rl.eval_samples={args.eval_samples}",
        f"rl.checkpoint_every={args.checkpoint_every}", f"rl.keep_checkpoints={checkpoints}",
        *NVFP4, *VARIANTS[variant],
    ]


def make_start(args: argparse.Namespace) -> tuple[Path, Path]:
    """The shared SFT start (exact NVFP4) and its one-ulp-nudged twin for the control run."""
    from safetensors.torch import load_file, save_file

    from opencomposer.config import load_recipe
    from opencomposer.pretrain.sft import run_sft

    start, nudged = args.out / "sft", args.out / "sft-nudged"
    if not (start / "config.json").is_file():
        torch.set_num_threads(1)
        run_sft(load_recipe(RECIPE, [f"run.out_dir={args.out}", f"sft.out={start}", f"sft.steps={args.sft_steps}",
                                     *NVFP4, *VARIANTS["exact"]]), progress=False)
    if not (nudged / "config.json").is_file():
        shutil.copytree(start, nudged, dirs_exist_ok=True)
        weights = load_file(start / "model.safetensors")
        name = sorted(key for key in weights if "experts" in key)[0]
        flat = weights[name].view(-1)
        i = int(flat.abs().argmax())
        flat[i] = torch.nextafter(flat[i], torch.tensor(math.inf))  # one ulp, one element
        save_file(weights, nudged / "model.safetensors", metadata={"format": "pt"})
    return start, nudged


def run_one(job: tuple[argparse.Namespace, str, Path]) -> tuple[str, float]:
    args, variant, start = job
    from opencomposer.config import load_recipe
    from opencomposer.rl.loop import run_rl

    began = time.perf_counter()
    run_rl(load_recipe(RECIPE, rl_overrides(args, variant, start)), progress=False)
    return variant, time.perf_counter() - began


def demonstration_rows(args: argparse.Namespace, tokenizer):
    """Model-token rows of correct one-turn demonstrations (fixed sequences to measure KL on)."""
    import tempfile

    from opencomposer.config import load_recipe
    from opencomposer.pretrain.sft import demonstration_tasks, record_demonstrations
    from opencomposer.training.packing import episode_rows

    config = load_recipe(RECIPE, [f"sft.num_tasks={args.kl_tasks}", "sft.wrong_share=0", "run.seed=7"])
    with tempfile.TemporaryDirectory() as scratch:
        tasks = demonstration_tasks(config, Path(scratch))
        return episode_rows(record_demonstrations(tasks, tokenizer, config))


def load_policy(folder: Path, variant: str):
    """A checkpoint of ``variant``, converted to that run's numerics."""
    from opencomposer.config import ModelConfig, load_recipe
    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import convert_model

    model = load_model(ModelConfig(kind="hf", path=str(folder)))[0]
    convert_model(model, load_recipe(RECIPE, [*NVFP4, *VARIANTS[variant]]).numerics)
    return model.eval()


@torch.no_grad()
def logprobs_on(model, rows) -> list[torch.Tensor]:
    """Log-softmax at every model-token position of each row: [tokens, V] per row."""
    out = []
    for row in rows:
        ids = torch.from_numpy(row.input_ids)[None]
        logits = model(input_ids=ids).logits[0].float()
        out.append(torch.log_softmax(logits, -1)[torch.from_numpy(row.loss_mask)])
    return out


def kl(reference: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    """Mean over tokens of KL(reference ‖ other) in nats."""
    total, count = 0.0, 0
    for p, q in zip(reference, other, strict=True):
        total += float((p.exp() * (p - q)).sum())
        count += p.shape[0]
    return total / count


def flat_weights(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    weights = load_file(folder / "model.safetensors")
    return torch.cat([weights[name].double().view(-1) for name in sorted(weights)])


def analyse(args: argparse.Namespace, variants: list[str], start: Path) -> dict:
    from opencomposer.model.tokenizer import load_tokenizer

    rows = demonstration_rows(args, load_tokenizer(start))
    steps = list(range(args.checkpoint_every, args.steps + 1, args.checkpoint_every))
    w_start = flat_weights(start)
    exact_dirs = {s: args.out / "exact" / "checkpoints" / f"step-{s:06d}" / "model" for s in steps}
    exact_logprobs = {s: logprobs_on(load_policy(exact_dirs[s], "exact"), rows) for s in steps}
    exact_weights = {s: flat_weights(exact_dirs[s]) for s in steps}
    result: dict = {"steps": steps, "runs": {}}
    for variant in variants:
        run_dir = args.out / variant
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [m for m in metrics if m["kind"] == "train"]
        evals = [m for m in metrics if m["kind"] == "eval"]
        entry = {
            "reward_mean": [m["reward_mean"] for m in train],
            "resolved_rate": [m["resolved_rate"] for m in train],
            "log_ratio_abs_p99": [m.get("log_ratio_abs_p99", float("nan")) for m in train],
            "eval": [{"step": m["step"], "pass_at_1": m["pass_at_1"]} for m in evals],
            "drift": [], "kl_to_exact": [],
        }
        for s in steps:
            folder = run_dir / "checkpoints" / f"step-{s:06d}" / "model"
            moved = float((exact_weights[s] - w_start).norm())
            entry["drift"].append(float((flat_weights(folder) - exact_weights[s]).norm()) / moved)
            entry["kl_to_exact"].append(kl(exact_logprobs[s], logprobs_on(load_policy(folder, variant), rows)))
        result["runs"][variant] = entry
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {variant: f"C{i}" for i, variant in enumerate(result["runs"])}  # one colour per run everywhere
    for variant, entry in result["runs"].items():
        rewards = entry["reward_mean"]
        window = 8
        smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
                  for i in range(len(rewards))]
        axes[0].plot(range(1, len(rewards) + 1), smooth, label=variant, color=colors[variant])
        if variant != "exact":
            axes[1].plot(result["steps"], entry["drift"], "o-", label=variant, color=colors[variant])
            axes[2].plot(result["steps"], entry["kl_to_exact"], "o-", label=variant, color=colors[variant])
    axes[0].set(xlabel="RL step", ylabel="reward (mean of the last 8 steps)", title="reward")
    axes[1].set(xlabel="RL step", ylabel="|w - w_exact| / |w_exact - w_start|", title="weight drift from exact")
    axes[2].set(xlabel="RL step", ylabel="nats/token", yscale="log", title="KL(exact ‖ run), demonstrations")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=96, help="RL steps of every run")
    parser.add_argument("--batch-tasks", type=int, default=1, help="tasks per RL step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    parser.add_argument("--eval-every", type=int, default=48, help="held-out pass@1 every this many steps")
    parser.add_argument("--eval-tasks", type=int, default=32)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=16, help="drift and KL are measured at checkpoints")
    parser.add_argument("--kl-tasks", type=int, default=16, help="demonstrations whose tokens the KL is taken over")
    parser.add_argument("--sft-steps", type=int, default=160, help="the recipe's SFT length")
    parser.add_argument("--variants", nargs="+", default=["exact", "approx", "approx+1", "control"],
                        choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2, help="RL runs at once (one torch thread each)")
    parser.add_argument("--out", type=Path, default=Path("runs/numerics-division"), help="run folders")
    args = parse_args(parser, QUICK)
    if args.quick:
        args.out = args.results_dir / "runs"
    if "exact" not in args.variants:
        parser.error("--variants must include exact (the reference)")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    began = time.perf_counter()
    start, nudged = make_start(args)
    sft_s = time.perf_counter() - began
    jobs = [(args, v, nudged if v == "control" else start) for v in args.variants
            if not (args.out / v / "summary.json").is_file()]
    seconds = {}
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for variant, taken in pool.imap_unordered(run_one, jobs):
            seconds[variant] = taken
            print(f"{variant}: {taken:.0f} s", flush=True)
    torch.set_num_threads(1)
    result = analyse(args, args.variants, start)
    result["flips"] = dispatch_flip_rates()
    result.update({"args": {k: str(v) for k, v in vars(args).items()}, "sft_s": sft_s, "rl_s": seconds})
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "numerics_division_rl.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.results_dir / "numerics_division_rl.png")
    for case, rates in result["flips"].items():
        print(f"{case:26s} element flips {rates['element_flips']:.2e}  block-scale flips "
              f"{rates['block_scale_flips']:.2e}  bias {rates['bias']:+.2e}")
    for variant, entry in result["runs"].items():
        evals = " ".join(f"{e['step']}:{e['pass_at_1']:.2f}" for e in entry["eval"])
        print(f"{variant:9s} drift {' '.join(f'{d:.3f}' for d in entry['drift'])}  "
              f"KL {' '.join(f'{k:.2e}' for k in entry['kl_to_exact'])}  pass@1 {evals}  "
              f"reward(last 16) {sum(entry['reward_mean'][-16:]) / 16:.3f}")


if __name__ == "__main__":
    main()
