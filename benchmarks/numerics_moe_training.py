"""Train the same tiny Qwen3-MoE in bf16, mxfp8 and nvfp4_fwd_mxfp8_bwd and compare the losses.

Same initial weights, same batches in the same order, same optimiser; only ``numerics.recipe``
changes (experts converted with ``opencomposer.numerics.convert.convert_model``; add
``--quantize-linears`` to convert attention too). Data: Python source from the local installation
(``model.corpus``), a byte-level BPE trained on it, packed into fixed-length sequences.

Tiny models trained for a few hundred steps are chaotic: a different rounding anywhere changes
a routing decision, and from then on the runs differ by as much as two seeds do. So each recipe
runs for every seed in ``--seeds`` (a seed fixes the initial weights and the batch order), and the
gap to bf16 is reported per seed and averaged, beside the seed-to-seed spread of bf16 itself.

Writes ``benchmarks/results/numerics_moe_loss.png`` (seed-mean training loss, smoothed, and
held-out loss of the three recipes) and ``numerics_moe_training.json`` (all curves and gaps).

    .venv/bin/python benchmarks/numerics_moe_training.py [--steps 400 --seeds 0 1 --threads 1]
    .venv/bin/python benchmarks/numerics_moe_training.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from _quick import parse_args

from opencomposer.config import CorpusConfig, NumericsConfig
from opencomposer.model.corpus import build_corpus
from opencomposer.model.tokenizer import document_separator_id, train_tokenizer
from opencomposer.numerics.convert import convert_model

QUICK = {"steps": 3, "batch_size": 2, "seq_len": 32, "hidden": 32, "layers": 1, "experts": 2, "vocab_size": 300,
         "files": 20, "warmup": 1, "eval_every": 3, "eval_batches": 1, "seeds": [0]}
RECIPES = ("bf16", "mxfp8", "nvfp4_fwd_mxfp8_bwd")


def token_stream(texts: list[str], tokenizer) -> torch.Tensor:
    separator = document_separator_id(tokenizer)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(separator)
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, count: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """``count`` batches ``[batch_size, seq_len]`` of random windows, fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len, (count, batch_size), generator=g)
    return [torch.stack([stream[s : s + seq_len] for s in row.tolist()]) for row in starts]


def tiny_moe(vocab_size: int, seed: int, args: argparse.Namespace):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
        num_experts=args.experts,
        num_experts_per_tok=2,
        max_position_embeddings=args.seq_len,
        tie_word_embeddings=True,
    )
    return Qwen3MoeForCausalLM(config)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(recipe: str, seed: int, vocab_size: int, train_batches, eval_batches, args) -> dict:
    model = tiny_moe(vocab_size, seed, args)
    convert_model(
        model, NumericsConfig(recipe=recipe, quantize_linears=args.quantize_linears and recipe != "bf16")
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    train_losses, eval_points = [], []
    start = time.time()
    for step, ids in enumerate(train_batches):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        train_losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == len(train_batches):
            with torch.no_grad():
                held_out = sum(model(input_ids=b, labels=b).loss.item() for b in eval_batches) / len(
                    eval_batches
                )
            eval_points.append((step + 1, held_out))
            print(
                f"  {recipe:20s} seed {seed} step {step + 1:4d}  train {loss.item():.3f}  held-out {held_out:.3f}  ({time.time() - start:.0f}s)"
            )
    return {"train": train_losses, "eval": eval_points, "seconds": time.time() - start}


def smooth(values: list[float], window: int) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--eval-every", type=int, default=25, help="held-out loss every this many steps")
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="each fixes the init and the batch order")
    parser.add_argument("--quantize-linears", action="store_true", help="convert the attention linears too")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps the default")
    args = parse_args(parser, QUICK)
    if args.threads:
        torch.set_num_threads(args.threads)

    corpus = build_corpus(CorpusConfig(max_files=args.files, heldout_fraction=0.1), seed=0)
    tokenizer = train_tokenizer([f.text for f in corpus.train], args.vocab_size)
    train_stream = token_stream([f.text for f in corpus.train], tokenizer)
    heldout_stream = token_stream([f.text for f in corpus.heldout], tokenizer)
    eval_batches = batches(heldout_stream, args.eval_batches, args.batch_size, args.seq_len, seed=12345)
    print(
        f"corpus: {len(corpus.train)} train / {len(corpus.heldout)} held-out files, {len(train_stream)} train tokens; "
        f"model hidden {args.hidden}, {args.layers} layers, {args.experts} experts; {args.steps} steps of "
        f"{args.batch_size}x{args.seq_len}; seeds {args.seeds}; torch threads {torch.get_num_threads()}"
    )
    runs: dict[str, dict[int, dict]] = {recipe: {} for recipe in RECIPES}
    for seed in args.seeds:
        train_batches = batches(train_stream, args.steps, args.batch_size, args.seq_len, seed)
        for recipe in RECIPES:
            runs[recipe][seed] = train(recipe, seed, len(tokenizer), train_batches, eval_batches, args)

    tail = max(1, args.steps // 10)

    def final_train(run: dict) -> float:
        return sum(run["train"][-tail:]) / tail

    summary: dict[str, dict] = {}
    for recipe in RECIPES:
        per_seed = {
            seed: {
                "final_train_loss_mean_last_10pct": final_train(run),
                "final_heldout_loss": run["eval"][-1][1],
                "train_gap_to_bf16": final_train(run) - final_train(runs["bf16"][seed]),
                "heldout_gap_to_bf16": run["eval"][-1][1] - runs["bf16"][seed]["eval"][-1][1],
                "seconds": run["seconds"],
            }
            for seed, run in runs[recipe].items()
        }
        summary[recipe] = {
            "per_seed": per_seed,
            **{
                f"mean_{key}": sum(v[key] for v in per_seed.values()) / len(per_seed)
                for key in (
                    "final_train_loss_mean_last_10pct",
                    "final_heldout_loss",
                    "train_gap_to_bf16",
                    "heldout_gap_to_bf16",
                    "seconds",
                )
            },
        }
    bf16_heldout = [v["final_heldout_loss"] for v in summary["bf16"]["per_seed"].values()]
    seed_spread = max(bf16_heldout) - min(bf16_heldout)
    print(
        f"\n{'recipe':22s} {'train (last 10%)':>17s} {'gap':>8s} {'held-out':>9s} {'gap':>8s} {'per-seed held-out gaps':>24s} {'s/run':>6s}"
    )
    for recipe, s in summary.items():
        gaps = " ".join(f"{v['heldout_gap_to_bf16']:+.3f}" for v in s["per_seed"].values())
        print(
            f"{recipe:22s} {s['mean_final_train_loss_mean_last_10pct']:17.4f} {s['mean_train_gap_to_bf16']:+8.4f} "
            f"{s['mean_final_heldout_loss']:9.4f} {s['mean_heldout_gap_to_bf16']:+8.4f} {gaps:>24s} {s['mean_seconds']:6.0f}"
        )
    print(f"bf16 seed-to-seed spread of the final held-out loss: {seed_spread:.4f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for recipe in RECIPES:
        seeds = list(runs[recipe].values())
        mean_train = [sum(r["train"][i] for r in seeds) / len(seeds) for i in range(args.steps)]
        (line,) = ax.plot(
            range(1, args.steps + 1), smooth(mean_train, 10), label=f"{recipe} train (10-step mean)"
        )
        steps = [step for step, _ in seeds[0]["eval"]]
        mean_eval = [sum(r["eval"][i][1] for r in seeds) / len(seeds) for i in range(len(steps))]
        ax.plot(steps, mean_eval, "o--", color=line.get_color(), label=f"{recipe} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"Tiny Qwen3-MoE on Python source, mean of seeds {args.seeds}: experts by numerics.recipe")
    ax.grid(alpha=0.3)
    ax.legend()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.results_dir / "numerics_moe_loss.png", dpi=120, bbox_inches="tight")
    (args.results_dir / "numerics_moe_training.json").write_text(
        json.dumps(
            {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "summary": summary, "bf16_seed_spread": seed_spread, "runs": runs}, indent=2
        )
    )
    print(f"wrote {args.results_dir / 'numerics_moe_loss.png'} and {args.results_dir / 'numerics_moe_training.json'}")


if __name__ == "__main__":
    main()
