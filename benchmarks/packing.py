"""Sequence packing (``rl.pack_tokens``) against one padded row per segment, in one RL step.

Three ways to lay out the same rows, side by side on the same model and the same machine:

- ``padded+prefix``: one row per segment, right-padded, the shared-prefix forward on (one process's
  default: the common system prompt is computed once per micro-batch);
- ``padded``: one row per segment, the shared prefix off (what every data-parallel rank runs);
- ``packed``: segments packed into rows of ``--pack-tokens`` (``training.packing.pack_rows``);
- ``prefix-once``: ``padded+prefix`` with micro-batches that count the shared prefix once in
  ``--micro-batch-tokens`` (``micro_batches(..., prefix)``, what one process's RL trainer and SFT
  did before ``step-prefix``), so more rows share each computation of it;
- ``step-prefix``: ``prefix-once``'s micro-batches with the prefix run once for the whole step
  (``training.forward.StepPrefix``: what one process's RL trainer does now).

Two length mixes: ``harness`` (every row opens with the same ``--prefix`` tokens, a system prompt
and tool list, then an episode tail of 100 to 2,000 tokens, log-uniform: agent rollouts) and
``mixed`` (64 to 2,048 tokens, log-uniform, nothing shared: trajectories from different harnesses,
or SFT data). Timed: forward, RL loss, backward and Adam over the step's micro-batches (median of
``--steps`` after a warm-up). Reported: positions computed (real and padded), seconds per step,
tokens per second, and the speed of ``packed`` over each of the others.

    .venv/bin/python benchmarks/packing.py                       # tiny MoE, both mixes
    .venv/bin/python benchmarks/packing.py --model smollm2-shape --rows 8 --steps 2
    .venv/bin/python benchmarks/packing.py --quick               # three rows of the harness mix, one step
    .venv/bin/python benchmarks/packing.py --model smollm2-shape --mix harness --rows 16 \
        --micro-batch-tokens 4096 --layouts prefix-once,step-prefix   # smollm2-bugs' RL step shape
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import _quick
import numpy as np
import torch

QUICK = {"rows": 3, "prefix": 64, "steps": 1, "mix": "harness"}
LAYOUTS = ("padded+prefix", "padded", "packed", "prefix-once", "step-prefix")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2-shape"], default="tiny",
                        help="tiny: the rl-tiny MoE shape; smollm2-shape: SmolLM2-135M's architecture, random weights")
    parser.add_argument("--mix", choices=["harness", "mixed", "both"], default="both")
    parser.add_argument("--rows", type=int, default=32, help="segments in the step (default: %(default)s)")
    parser.add_argument("--prefix", type=int, default=1100, help="shared tokens of the harness mix (default: %(default)s)")
    parser.add_argument("--pack-tokens", type=int, default=4096, help="rl.pack_tokens (default: %(default)s)")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192, help="rl.micro_batch_tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of: " + ", ".join(LAYOUTS))
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/packing.json)")
    args = _quick.parse_args(parser, QUICK, argv)
    if args.out is None:
        args.out = args.results_dir / "packing.json"
    if not 64 <= args.pack_tokens <= args.micro_batch_tokens:
        parser.error("--pack-tokens must be between 64 and --micro-batch-tokens")
    args.layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    unknown = sorted(set(args.layouts) - set(LAYOUTS))
    if unknown or not args.layouts:
        parser.error(f"--layouts: expected some of {list(LAYOUTS)}, got {args.layouts}")
    return args


def build_model(name: str):
    if name == "smollm2-shape":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                             tie_word_embeddings=True, rope_theta=100000.0)
        return LlamaForCausalLM(config), 49152
    import dataclasses

    from opencomposer.config import load_recipe
    from opencomposer.model.loading import load_model

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "rl-tiny.toml"
    model, tokenizer = load_model(dataclasses.replace(load_recipe(recipe).model, path=""), seed=0)
    return model, len(tokenizer)


def make_rows(mix: str, count: int, prefix_len: int, vocab: int, seed: int = 0):
    from opencomposer.training.packing import SequenceRow

    rng = np.random.default_rng(seed)
    prefix = rng.integers(10, vocab, prefix_len) if mix == "harness" else np.zeros(0, dtype=np.int64)
    low, high = (100, 2000) if mix == "harness" else (64, 2048)
    rows = []
    for i in range(count):
        tail = int(np.exp(rng.uniform(np.log(low), np.log(high))))
        ids = np.concatenate([prefix, rng.integers(10, vocab, tail)]).astype(np.int64)
        mask = np.zeros(len(ids), dtype=bool)
        mask[len(prefix) + tail // 4 :] = True  # model tokens after an instruction
        rows.append(SequenceRow(i, ids[:-1], ids[1:], mask[1:], np.zeros(len(ids) - 1, np.float32),
                                advantage=float(rng.normal())))
    return rows


def time_layout(model, rows, layout: str, args) -> dict[str, float]:
    import opencomposer.rl.step as step_module
    from opencomposer.config import RLConfig
    from opencomposer.rl.step import train_step
    from opencomposer.training.forward import MIN_SHARED_PREFIX, step_prefix_length, token_logprobs
    from opencomposer.training.optim import build_optimizer
    from opencomposer.training.packing import (
        collate,
        common_prefix,
        micro_batches,
        pack_rows,
        padded_positions,
    )

    laid = pack_rows(rows, args.pack_tokens) if layout == "packed" else list(rows)
    real, padded = padded_positions(laid, args.micro_batch_tokens)
    config = RLConfig(lr=1e-7, micro_batch_tokens=args.micro_batch_tokens)
    config.kl.reference, config.kl.coef = "none", 0.0
    prefix = common_prefix(laid, MIN_SHARED_PREFIX) if layout in ("prefix-once", "step-prefix") else 0
    batches = [collate(chunk, 0) for chunk in micro_batches(laid, config.micro_batch_tokens, prefix)]
    optimizer = build_optimizer(model, lr=config.lr)

    def forward(model, batch, **kwargs):
        kwargs["share_prefix"] = layout in ("padded+prefix", "prefix-once", "step-prefix")
        return token_logprobs(model, batch, **kwargs)

    step_module.token_logprobs = forward
    if layout != "step-prefix":  # the prefix computed per micro-batch (or not shared at all)
        step_module.step_prefix_length = lambda *args, **kwargs: 0
    try:
        train_step(model, optimizer, batches, config)  # warm-up
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            train_step(model, optimizer, batches, config)
            times.append(time.perf_counter() - start)
    finally:
        step_module.token_logprobs = token_logprobs
        step_module.step_prefix_length = step_prefix_length
    seconds = statistics.median(times)
    return {"seconds": seconds, "tokens_per_s": real / seconds, "positions_real": real,
            "positions_padded": padded, "padding_fraction": 1 - real / padded, "micro_batches": len(batches),
            "rows": len(laid)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, vocab = build_model(args.model)
    mixes = ["harness", "mixed"] if args.mix == "both" else [args.mix]
    results = {"model": args.model, "threads": args.threads, "rows": args.rows, "prefix": args.prefix,
               "pack_tokens": args.pack_tokens, "micro_batch_tokens": args.micro_batch_tokens, "mixes": {}}
    for mix in mixes:
        rows = make_rows(mix, args.rows, args.prefix, vocab)
        measured = {}
        for layout in args.layouts:
            measured[layout] = time_layout(model, rows, layout, args)
            m = measured[layout]
            print(f"{mix:8s} {layout:14s} {m['seconds']:8.2f} s/step  {m['tokens_per_s']:9.0f} tok/s  "
                  f"padding {m['padding_fraction']:5.1%}  {m['rows']:3d} rows  {m['micro_batches']:2d} micro-batches",
                  flush=True)
        speed = {f"{fast}_over_{slow}": measured[slow]["seconds"] / measured[fast]["seconds"]
                 for fast in ("packed", "prefix-once", "step-prefix") for slow in LAYOUTS
                 if fast in measured and slow in measured and slow != fast and slow != "packed"
                 and (fast, slow) != ("prefix-once", "step-prefix")}
        for name, ratio in speed.items():
            fast, slow = name.split("_over_")
            print(f"{mix:8s} {fast} is {ratio:.2f}x {slow}", flush=True)
        results["mixes"][mix] = {"layouts": measured, **speed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
