"""Does lower pretraining loss predict higher RL reward? (issue 15 part 4; the Composer 2 report §3)

The report: across pretraining budgets of one recipe, the base model with the lower loss reaches
the higher reward in RL. This script measures that on the tiny MoE of ``recipes/quickstart.toml``:

1. **pretrain** (``pretrain.cpt.run_pretraining``): three (or more) log-spaced step budgets of the
   same recipe, the same init seed and data order; each budget runs its own warm-up and cosine
   schedule to its end (``pretrain.max_minutes`` is lifted so the step budget alone decides);
2. **sft** (``pretrain.sft.run_sft``, from ``commands.quickstart.stage_configs``): the quickstart's
   SFT on the same demonstrations (the imperfect teacher of ``tiny-composed``) in the same order;
3. **held-out loss** (``pretrain.cpt.evaluate``): the project's held-out codebase loss, on the
   same ``--heldout-batches`` rows of the held-out files, after pretraining and after SFT;
4. **rl** (``rl.loop.run_rl``): the quickstart's RL (24 steps × 4 tasks × 8 rollouts, lr 3e-4,
   6-step warm-up, cosine) with the same seeds, so the same tasks and sampling seeds; the train
   reward of every step (``reward_mean``) and held-out pass@1 on the fixed evaluation steps (0,
   every ``rl.eval_every`` and the last; the same held-out tasks and seeds at each).

Writes ``benchmarks/results/loss_predicts_rl.json`` and ``loss_predicts_rl.png`` (held-out loss
after SFT on x; RL reward and held-out pass@1 on y, one labelled point per budget; a third panel
puts the loss after pretraining on x), prints a table and the ordering check: Spearman's rho
between the loss (after SFT, the issue's x; and after pretraining) and each outcome, and whether
every lower-loss budget scores higher (rho = -1: the report's ordering). With several
``--rl-seeds`` the outcomes are means over the seeds; each seed's run is in the JSON too.

Every stage caches its output under ``--out-dir`` (``{out}/pretrain-NNNNN/``: ``checkpoint/``,
``pretrain.json``, ``sft/``, ``heldout.json``, ``rl-seedS/``); a rerun skips finished stages and
RL resumes from its newest checkpoint, so a crash costs at most the stage it interrupted. One torch
thread (``run.threads = 1``).

    .venv/bin/python benchmarks/loss_predicts_rl.py --steps 200 600 1800
    .venv/bin/python benchmarks/loss_predicts_rl.py --quick            # a smoke test, ~1 minute
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.toml"
RESULTS = Path(__file__).parent / "results"

# --quick: tiny budgets and stages, for the test (tests/bench/test_loss_predicts_rl.py)
QUICK_STEPS = [3, 9, 27]
QUICK_OVERRIDES = [
    "corpus.max_files=200", "pretrain.batch_size=4", "pretrain.seq_len=64", "pretrain.warmup_steps=2",
    "pretrain.eval_every=1000", "pretrain.log_every=1",
    "sft.num_tasks=4", "sft.steps=3", "sft.batch_size=4",
    "rl.steps=2", "rl.batch_tasks=1", "rl.group_size=2", "rl.lr_warmup_steps=1", "rl.eval_every=2",
    "rl.eval_tasks=2", "rl.eval_samples=1", "rl.checkpoint_every=2", "rl.loss.token_budget=128",
    "sampling.max_new_tokens=64",
]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 600, 1800],
                        help="pretraining budgets in optimizer steps, log-spaced (default: 200 600 1800; "
                             "600 is the quickstart's)")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe of every stage (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted recipe override for every budget, e.g. --set rl.steps=16 (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="run.seed: init, data order, SFT, RL (default: 0)")
    parser.add_argument("--rl-seeds", type=int, nargs="+", default=None,
                        help="RL runs from each SFT checkpoint, one per seed (its task order and sampling "
                             "seeds; default: --seed only)")
    parser.add_argument("--heldout-batches", type=int, default=16,
                        help="held-out loss rows: this many batches of pretrain.batch_size x pretrain.seq_len "
                             "(default: 16)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="work folder of the stages, reused by a rerun (default: "
                             "$OPENCOMPOSER_HOME/loss-predicts-rl; with --quick, a temporary folder)")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"where loss_predicts_rl.json / .png go (default: {RESULTS}; with --quick, a "
                             "temporary folder)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: budgets {QUICK_STEPS}, a 200-file corpus, 3 SFT steps, 2 RL steps")
    args = parser.parse_args(argv)
    if args.quick and "--steps" not in (argv if argv is not None else sys.argv[1:]):
        args.steps = QUICK_STEPS
    if len(args.steps) < 2 or sorted(set(args.steps)) != args.steps:
        parser.error("--steps: at least two budgets, increasing")
    scratch = Path(tempfile.mkdtemp(prefix="opencomposer-quick-")) if args.quick else None
    args.results = args.results or scratch or RESULTS
    if args.out_dir is None:
        from opencomposer.io import cache_dir

        args.out_dir = scratch / "work" if scratch else cache_dir() / "loss-predicts-rl"
    args.out_dir = args.out_dir.resolve()
    args.rl_seeds = args.rl_seeds or [args.seed]
    return args


def base_config(args: argparse.Namespace):
    from opencomposer.config import load_recipe

    overrides = [f"run.seed={args.seed}", "run.threads=1", "pretrain.max_minutes=100000",
                 *(QUICK_OVERRIDES if args.quick else []), *args.overrides]
    return load_recipe(args.recipe, overrides)


def budget_config(config, args: argparse.Namespace, steps: int):
    """The recipe of one budget: its run folder and its step budget, everything else shared."""
    return replace(config, run=replace(config.run, out_dir=str(args.out_dir), name=f"pretrain-{steps:05d}"),
                   pretrain=replace(config.pretrain, max_steps=steps))


class Shared:
    """The corpus, the tokenizer and the held-out rows, built once and only when a stage needs them."""

    def __init__(self, config, args: argparse.Namespace):
        self.config, self.args = config, args
        self._corpus = self._tokenizer = self._rows = None

    @property
    def corpus(self):
        if self._corpus is None:
            from opencomposer.model.corpus import build_corpus

            started = time.perf_counter()
            self._corpus = build_corpus(self.config.corpus, seed=self.config.run.seed)
            log(f"corpus: {len(self._corpus.train):,} training files, {len(self._corpus.heldout):,} held out "
                f"({time.perf_counter() - started:.0f} s)")
        return self._corpus

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from opencomposer.model.loading import default_tokenizer

            self._tokenizer = default_tokenizer(self.config.corpus, self.config.tokenizer, self.config.run.seed)
        return self._tokenizer

    @property
    def heldout_rows(self) -> list:
        """The same held-out batches (ids and position ids) for every model: the held-out files, packed
        as pretraining packs them."""
        if self._rows is None:
            from opencomposer.model.tokenizer import document_separator_id
            from opencomposer.pretrain.cpt import packed_batches

            pretrain = self.config.pretrain
            batches = packed_batches(self.corpus.heldout, self.tokenizer, document_separator_id(self.tokenizer),
                                     pretrain.batch_size, pretrain.seq_len, repeat=False)
            self._rows = []
            for batch in batches:
                self._rows.append(batch)
                if len(self._rows) == self.args.heldout_batches:
                    break
            if not self._rows:
                raise RuntimeError("the held-out files hold fewer tokens than one batch")
        return self._rows


def heldout_loss(folder: Path, rows: list) -> float:
    """``pretrain.cpt.evaluate`` (mean next-token cross-entropy, nats/token) of the checkpoint in ``folder``."""
    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.cpt import evaluate

    model, _ = load_model(ModelConfig(kind="hf", path=str(folder)), device="cpu")
    return evaluate(model, rows)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def write_json(path: Path, data: Any) -> None:
    from opencomposer.io import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def prepare_budget(config, args: argparse.Namespace, shared: Shared, steps: int) -> dict:
    """Stages 1-3 of one budget (pretraining, SFT, held-out loss), each skipped when its output is there."""
    import torch

    from opencomposer.commands.quickstart import stage_configs

    torch.set_num_threads(1)
    cfg = budget_config(config, args, steps)
    run_dir = cfg.run.path
    tag = f"budget {steps} steps"

    # 1. pretraining
    pre = read_json(run_dir / "pretrain.json")
    if pre is None or not (run_dir / "checkpoint" / "config.json").is_file():
        from opencomposer.pretrain.cpt import run_pretraining

        log(f"{tag}: pretraining ...")
        _, _, result, _ = run_pretraining(cfg, shared.corpus, shared.tokenizer, progress=False)
        pre = {"steps": result.steps, "tokens": result.tokens, "seconds": result.seconds,
               "train_loss_first": result.first_loss, "train_loss_last": result.last_loss,
               "heldout_curve": [[s, loss] for s, loss in result.heldout]}
        write_json(run_dir / "pretrain.json", pre)
        log(f"{tag}: pretrained {pre['steps']} steps, {pre['tokens']:,} tokens, train loss "
            f"{pre['train_loss_first']:.3f} -> {pre['train_loss_last']:.3f}, {pre['seconds']:.0f} s")
    else:
        log(f"{tag}: pretraining cached ({pre['steps']} steps)")
    sft_config, rl_config = stage_configs(cfg, run_dir / "checkpoint")

    # 2. SFT
    sft_dir = run_dir / "sft"
    sft = read_json(run_dir / "sft.json")
    if sft is None or not (sft_dir / "config.json").is_file():
        from opencomposer.pretrain.sft import run_sft

        log(f"{tag}: SFT ...")
        _, _, result, _ = run_sft(sft_config, progress=False)
        sft = {"steps": result.steps, "demonstrations": result.demonstrations, "seconds": result.seconds,
               "loss_first": result.first_loss, "loss_last": result.last_loss}
        write_json(run_dir / "sft.json", sft)
        log(f"{tag}: SFT {sft['steps']} steps, loss {sft['loss_first']:.3f} -> {sft['loss_last']:.4f}, "
            f"{sft['seconds']:.0f} s")
    else:
        log(f"{tag}: SFT cached")

    # 3. held-out codebase loss after pretraining and after SFT, on the same rows
    held = read_json(run_dir / "heldout.json")
    if held is None or held.get("batches") != args.heldout_batches:
        started = time.perf_counter()
        rows = shared.heldout_rows
        held = {"batches": args.heldout_batches, "tokens": sum(int(ids[:, 1:].numel()) for ids, _ in rows),
                "after_pretrain": heldout_loss(run_dir / "checkpoint", rows),
                "after_sft": heldout_loss(sft_dir, rows)}
        write_json(run_dir / "heldout.json", held)
        log(f"{tag}: held-out loss {held['after_pretrain']:.4f} after pretraining, {held['after_sft']:.4f} after "
            f"SFT ({held['tokens']:,} tokens, {time.perf_counter() - started:.0f} s)")
    else:
        log(f"{tag}: held-out loss cached ({held['after_sft']:.4f} after SFT)")
    return {"pretrain_steps": pre["steps"], "pretrain_tokens": pre["tokens"], "pretrain": pre, "sft": sft,
            "heldout_loss_after_pretrain": held["after_pretrain"], "heldout_loss_after_sft": held["after_sft"],
            "heldout_tokens": held["tokens"], "rl": {}, "_rl_config": rl_config}


def run_rl_seed(budget: dict, seed: int) -> None:
    """Stage 4 of one budget for one RL seed (its task order and sampling seeds); resumes after a crash."""
    rl_config = budget["_rl_config"]
    cfg_rl = replace(rl_config, run=replace(rl_config.run, name=f"rl-seed{seed}", seed=seed))
    budget["rl"][str(seed)] = run_rl_stage(cfg_rl, f"budget {budget['pretrain_steps']} steps, RL seed {seed}")


def run_rl_stage(config, tag: str) -> dict:
    from opencomposer.rl.loop import run_rl
    from opencomposer.training.metrics import read_metrics

    run_dir = config.run.path
    summary = read_json(run_dir / "summary.json")
    if summary is None or summary.get("steps") != config.rl.steps:
        log(f"{tag}: RL, {config.rl.steps} steps x {config.rl.batch_tasks} tasks x {config.rl.group_size} rollouts"
            + (" (resuming)" if (run_dir / "checkpoints").is_dir() else "") + " ...")
        result = run_rl(config, progress=False)
        seconds = result.seconds
    else:
        seconds = None
    train = read_metrics(run_dir, kind="train")
    evals = read_metrics(run_dir, kind="eval")
    out = {
        "seconds": seconds if seconds is not None else read_json(run_dir / "bench.json")["seconds"],
        "reward": [row["reward_mean"] for row in train],
        "resolved_rate": [row["resolved_rate"] for row in train],
        # episodes cut at the turn budget: in this family, a turn whose tool-call format broke
        "episodes_timeout": int(sum(row.get("episodes_timeout", 0) for row in train)),
        "episodes": len(train) * config.rl.batch_tasks * config.rl.group_size,
        "eval": [{"step": row["step"], "pass_at_1": row["pass_at_1"], "best_of_k": row["best_of_k"],
                  "mean_reward": row["mean_reward"]} for row in evals],
    }
    if seconds is not None:
        write_json(run_dir / "bench.json", {"seconds": seconds})
    passes = " -> ".join(f"{e['pass_at_1']:.3f}" for e in out["eval"])
    log(f"{tag}: RL done: mean train reward {mean(out['reward']):.3f}, held-out pass@1 at steps "
        f"{[e['step'] for e in out['eval']]}: {passes} ({out['seconds']:.0f} s)")
    return out


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def aggregate(runs: dict[str, dict]) -> dict:
    """Means over the RL seeds: reward per step, the run's mean reward, pass@1 per evaluation step."""
    first = next(iter(runs.values()))
    steps = len(first["reward"])
    reward_per_step = [mean([r["reward"][i] for r in runs.values()]) for i in range(steps)]
    eval_steps = [e["step"] for e in first["eval"]]
    pass_at = {str(s): mean([e["pass_at_1"] for r in runs.values() for e in r["eval"] if e["step"] == s])
               for s in eval_steps}
    after = [p for s, p in pass_at.items() if int(s) > 0]
    return {
        "reward_mean_per_seed": {seed: mean(r["reward"]) for seed, r in runs.items()},
        "timeout_share": sum(r["episodes_timeout"] for r in runs.values()) / sum(r["episodes"] for r in runs.values()),
        "reward_per_step": reward_per_step,
        "reward_mean": mean(reward_per_step),
        "reward_last_quarter": mean(reward_per_step[-max(1, steps // 4):]),
        "pass_at_1": pass_at,
        "pass_at_1_before_rl": pass_at.get("0", float("nan")),
        "pass_at_1_final": pass_at[str(eval_steps[-1])] if eval_steps else float("nan"),
        "pass_at_1_mean_after_0": mean(after),
    }


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (average ranks for ties); nan when either side is constant."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    x, y = [round(v, 9) for v in x], [round(v, 9) for v in y]  # float noise is not an order
    rx, ry = ranks(x), ranks(y)
    mx, my = mean(rx), mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else float("nan")


OUTCOMES = {  # name in the JSON -> label in the table and the plot
    "pass_at_1_before_rl": "held-out pass@1 before RL",
    "reward_mean": "RL train reward, mean of all steps",
    "reward_last_quarter": "RL train reward, last quarter of steps",
    "pass_at_1_final": "held-out pass@1 after RL",
    "pass_at_1_mean_after_0": "held-out pass@1, mean of RL evaluations after step 0",
}


def ordering(budgets: list[dict], loss_key: str = "heldout_loss_after_sft") -> dict:
    """For each outcome: rho(loss, outcome), and whether every lower-loss budget scores higher
    (``loss_key``: the held-out loss after SFT, the issue's x; or after pretraining)."""
    losses = [b[loss_key] for b in budgets]
    out = {"loss": loss_key}
    outcomes = {key: [b[key] for b in budgets] for key in OUTCOMES}
    for step in budgets[0]["pass_at_1"]:  # held-out pass@1 at each fixed RL step
        outcomes[f"pass_at_1_step_{step}"] = [b["pass_at_1"][step] for b in budgets]
    for key, values in outcomes.items():
        pairs = [(i, j) for i in range(len(budgets)) for j in range(len(budgets)) if losses[i] < losses[j]]
        out[key] = {"spearman_rho": spearman(losses, values),
                    "report_ordering_holds": all(values[i] > values[j] for i, j in pairs),
                    "pairs_in_order": sum(values[i] > values[j] for i, j in pairs), "pairs": len(pairs)}
    pretrain_losses = [b["heldout_loss_after_pretrain"] for b in budgets]
    sft_losses = [b["heldout_loss_after_sft"] for b in budgets]
    out["loss_after_sft_vs_after_pretrain_rho"] = spearman(pretrain_losses, sft_losses)
    out["loss_after_sft_falls_with_budget"] = all(a > b for a, b in zip(sft_losses, sft_losses[1:]))
    out["loss_after_pretrain_falls_with_budget"] = all(a > b for a, b in zip(pretrain_losses, pretrain_losses[1:]))
    return out


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = result["budgets"]
    x = [b["heldout_loss_after_sft"] for b in budgets]
    labels = [f"{b['pretrain_steps']} steps" for b in budgets]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    ax = axes[0]
    for key, style in (("reward_mean", "o-"), ("reward_last_quarter", "s--")):
        ax.plot(x, [b[key] for b in budgets], style, label=OUTCOMES[key])
    for xi, b in zip(x, budgets):  # each RL seed's mean reward
        seeds = list(b["reward_mean_per_seed"].values())
        ax.plot([xi] * len(seeds), seeds, ".", color="C0", alpha=0.4, label="one RL seed" if xi == x[0] else None)
    for xi, yi, label in zip(x, [b["reward_mean"] for b in budgets], labels):
        ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set(xlabel="held-out codebase loss after SFT (nats/token)", ylabel="RL train reward",
           title="RL reward against loss (lines: mean over RL seeds)")
    ax = axes[1]
    steps = list(budgets[0]["pass_at_1"])
    for i, step in enumerate(steps):
        ax.plot(x, [b["pass_at_1"][step] for b in budgets], "o-", color=f"C{i}", label=f"RL step {step}")
    top = [b["pass_at_1"][steps[-1]] for b in budgets]
    for xi, yi, label in zip(x, top, labels):
        ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set(xlabel="held-out codebase loss after SFT (nats/token)", ylabel="held-out pass@1",
           title="held-out pass@1 at fixed RL steps")
    ax = axes[2]  # the same outcomes against the base model's loss, before SFT moved it
    x_pre = [b["heldout_loss_after_pretrain"] for b in budgets]
    ax.plot(x_pre, [b["reward_mean"] for b in budgets], "o-", label=OUTCOMES["reward_mean"])
    ax.plot(x_pre, [b["pass_at_1_final"] for b in budgets], "s-", label=OUTCOMES["pass_at_1_final"])
    ax.plot(x_pre, [b["pass_at_1_before_rl"] for b in budgets], "^:", label=OUTCOMES["pass_at_1_before_rl"])
    for xi, yi, label in zip(x_pre, [b["pass_at_1_final"] for b in budgets], labels):
        ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set(xlabel="held-out codebase loss after pretraining (nats/token)", ylabel="reward / pass@1",
           title="the same against the base model's loss")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.invert_xaxis()  # lower loss to the right: the report's claim is a rising line
    seeds = ", ".join(str(s) for s in result["rl_seeds"])
    fig.suptitle(f"loss predicts RL? tiny MoE, pretraining budgets {', '.join(labels)}; RL seed(s) {seeds}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(result: dict) -> str:
    budgets = result["budgets"]
    steps = list(budgets[0]["pass_at_1"])
    head = ["pretrain steps", "tokens", "held-out loss, pretrained", "after SFT", "SFT loss",
            "RL reward mean", "reward last 1/4", f"held-out pass@1 at RL steps {' / '.join(steps)}",
            "RL timeouts", "RL s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in budgets:
        rl_seconds = sum(r["seconds"] for r in b["rl"].values())
        lines.append("| " + " | ".join([
            str(b["pretrain_steps"]), f"{b['pretrain_tokens']:,}", f"{b['heldout_loss_after_pretrain']:.3f}",
            f"{b['heldout_loss_after_sft']:.3f}", f"{b['sft']['loss_last']:.4f}", f"{b['reward_mean']:.3f}",
            f"{b['reward_last_quarter']:.3f}", " → ".join(f"{b['pass_at_1'][s]:.3f}" for s in steps),
            f"{b['timeout_share']:.3f}", f"{rl_seconds:.0f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    import torch

    torch.set_num_threads(1)
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    config = base_config(args)
    shared = Shared(config, args)
    log(f"loss predicts RL: budgets {args.steps} steps, RL seeds {args.rl_seeds}, work folder {args.out_dir}")
    started = time.perf_counter()
    # every budget's base model first, then RL seed by seed, so that an interrupted run has whole seeds
    budgets = [prepare_budget(config, args, shared, steps) for steps in args.steps]
    for seed in args.rl_seeds:
        for budget in budgets:
            run_rl_seed(budget, seed)
    for budget in budgets:
        del budget["_rl_config"]
        budget.update(aggregate(budget["rl"]))
    result = {
        "args": {"steps": args.steps, "seed": args.seed, "rl_seeds": args.rl_seeds, "quick": args.quick,
                 "recipe": str(args.recipe), "overrides": args.overrides, "heldout_batches": args.heldout_batches,
                 "out_dir": str(args.out_dir)},
        "rl_seeds": args.rl_seeds,
        "rl": {"steps": config.rl.steps, "batch_tasks": config.rl.batch_tasks, "group_size": config.rl.group_size,
               "lr": config.rl.lr, "eval_every": config.rl.eval_every, "eval_tasks": config.rl.eval_tasks,
               "eval_samples": config.rl.eval_samples},
        "budgets": budgets,
    }
    result["ordering"] = ordering(budgets)
    result["ordering_vs_loss_after_pretrain"] = ordering(budgets, "heldout_loss_after_pretrain")
    result["seconds"] = time.perf_counter() - started
    args.results.mkdir(parents=True, exist_ok=True)
    write_json(args.results / "loss_predicts_rl.json", result)
    png = plot(result, args.results / "loss_predicts_rl.png")
    print(table(result))
    print()
    for name, key in (("after SFT", "ordering"), ("after pretraining", "ordering_vs_loss_after_pretrain")):
        labels = {**OUTCOMES, **{f"pass_at_1_step_{step}": f"held-out pass@1 at RL step {step}"
                                 for step in result["budgets"][0]["pass_at_1"]}}
        for outcome, label in labels.items():
            check = result[key][outcome]
            print(f"{label}: Spearman rho(held-out loss {name}, outcome) = {check['spearman_rho']:+.2f}; lower loss "
                  f"-> higher in {check['pairs_in_order']}/{check['pairs']} pairs; report's ordering "
                  f"{'HOLDS' if check['report_ordering_holds'] else 'does NOT hold'}")
    print(f"held-out loss falls with the budget: after pretraining "
          f"{result['ordering']['loss_after_pretrain_falls_with_budget']}, after SFT "
          f"{result['ordering']['loss_after_sft_falls_with_budget']}")
    log(f"results: {args.results / 'loss_predicts_rl.json'}, plot: {png} ({result['seconds']:.0f} s this run)")
    return result


if __name__ == "__main__":
    main()
