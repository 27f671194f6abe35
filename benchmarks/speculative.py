"""Speculative decoding with MTP drafts against plain decoding, side by side.

Steps, in one run:

1. **Distil an MTP layer** (``opencomposer.pretrain.phases`` with one phase, ``losses = ["mtp"]``:
   the report's self-distillation; the model's own weights stay as they are). ``--model smollm2``
   (the default) gives SmolLM2-135M-Instruct one fresh MTP layer; ``--model PATH`` takes a
   checkpoint folder (its MTP layer is trained further, or made when it has none). The corpus is
   the project's default code corpus; the run folder is cached, so a rerun skips the training
   (``--retrain`` forces it).
2. **Decode** the first ``--prompt-tokens`` tokens of held-out code files, ``--new-tokens`` new
   tokens each (EOS ignored, so every row decodes the same number), with plain decoding and with
   ``speculative = "mtp"``, the two alternating over ``--repeats`` repeats, at temperature 0 and 1,
   ``--batch`` rows per call. Reported per setting: tokens per second each way and their ratio,
   the draft acceptance rate, tokens per verifying forward, and, at temperature 0, whether the two
   decoded exactly the same tokens (they must: ``inference.speculative``).

DeepSeek-V3 reports 85-90% acceptance of the second token and about 1.8x decoding speed with one
MTP module (arXiv 2412.19437, §5.4.3).

    .venv/bin/python benchmarks/speculative.py [--model smollm2|PATH] [--steps 300] [--batch 1,8]
                                              [--new-tokens 64] [--repeats 3] [--threads 2]

Results: ``benchmarks/results/speculative.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from opencomposer.config import load_recipe
from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.io import cache_dir

RESULTS = Path(__file__).parent / "results" / "speculative.json"


def distil(model: str, steps: int, seq_len: int, batch: int, lr: float, retrain: bool, threads: int) -> Path:
    """The checkpoint with a distilled MTP layer (trained once per setting, then cached)."""
    from opencomposer.pretrain.phases import run_phases

    kind = ["model.kind=smollm2"] if model == "smollm2" else ["model.kind=hf", f"model.path={model}"]
    tag = f"{Path(model).name}-s{steps}-l{seq_len}-b{batch}-lr{lr:g}"
    out = cache_dir() / "benchmarks" / "speculative"
    checkpoint = out / tag / "checkpoint"
    if checkpoint.is_dir() and not retrain:
        print(f"distilled MTP layer: cached at {checkpoint}")
        return checkpoint
    phase = (f'pretrain.phases=[{{name="mtp", losses=["mtp"], seq_len={seq_len}, steps={steps}, batch_size={batch}, '
             f'lr={lr}, warmup_steps={max(1, steps // 20)}}}]')
    config = load_recipe(None, [*kind, "model.num_mtp_layers=1", f"run.out_dir={out}", f"run.name={tag}",
                                f"run.threads={threads}", phase, f"pretrain.eval_every={max(1, steps // 4)}",
                                "pretrain.eval_batches=2", "pretrain.checkpoint_every=25"])
    _, _, result = run_phases(config, probes=0)
    evals = [r for r in result.history if r["kind"] == "eval"]
    print(f"held-out greedy agreement of the draft: {evals[0].get('heldout_mtp_top1', float('nan')):.3f} -> "
          f"{evals[-1].get('heldout_mtp_top1', float('nan')):.3f}")
    return result.checkpoint


def heldout_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """The first ``length`` tokens of held-out code files of the default corpus (long enough ones)."""
    from opencomposer.config import CorpusConfig
    from opencomposer.model.corpus import build_corpus

    corpus = build_corpus(CorpusConfig(), seed=0)
    prompts = []
    for f in corpus.heldout:
        ids = tokenizer(f.text, add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == count:
            break
    return prompts


def measure(engine: LocalEngine, prompts: list[list[int]], params: SamplingParams, batch: int, repeats: int) -> dict:
    runs: dict[str, list[float]] = {"off": [], "mtp": []}
    outputs: dict[str, list] = {}
    drafts = accepted = 0
    for _ in range(repeats):
        for mode in ("off", "mtp"):
            before = dataclasses.replace(engine.stats)
            start = time.perf_counter()
            done = []
            for i in range(0, len(prompts), batch):
                done += engine.generate(prompts[i : i + batch], dataclasses.replace(params, speculative=mode))
            runs[mode].append(time.perf_counter() - start)
            outputs[mode] = done
            if mode == "mtp":
                drafts += engine.stats.draft_tokens - before.draft_tokens
                accepted += engine.stats.draft_accepted - before.draft_accepted
    tokens = sum(len(c.token_ids) for c in outputs["off"])
    plain, fast = statistics.median(runs["off"]), statistics.median(runs["mtp"])
    acceptance = accepted / drafts if drafts else float("nan")
    row = {"temperature": params.temperature, "batch": batch, "tokens": tokens,
           "plain_tokens_per_s": tokens / plain, "speculative_tokens_per_s": tokens / fast,
           "speedup": plain / fast, "acceptance": acceptance, "tokens_per_forward": 1 + acceptance,
           "seconds_plain": runs["off"], "seconds_speculative": runs["mtp"]}
    if params.temperature == 0:
        row["greedy_identical"] = all(a.token_ids == b.token_ids and a.logprobs == b.logprobs
                                      for a, b in zip(outputs["off"], outputs["mtp"], strict=True))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a checkpoint folder")
    parser.add_argument("--steps", type=int, default=300, help="distillation steps")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", default="1,8", help="rows per generate call, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from opencomposer.model.loading import load_model

    checkpoint = distil(args.model, args.steps, args.seq_len, args.train_batch, args.lr, args.retrain, args.threads)
    model, tokenizer = load_model(checkpoint)
    engine = LocalEngine(model, tokenizer)
    prompts = heldout_prompts(tokenizer, args.prompts, args.prompt_tokens)
    rows = []
    for temperature in (0.0, 1.0):
        for batch in (int(b) for b in args.batch.split(",")):
            params = SamplingParams(max_new_tokens=args.new_tokens, temperature=temperature, ignore_eos=True, seed=0)
            row = measure(engine, prompts, params, batch, args.repeats)
            rows.append(row)
            print(f"T={temperature:g} batch {batch:2d}: plain {row['plain_tokens_per_s']:7.1f} tok/s, speculative "
                  f"{row['speculative_tokens_per_s']:7.1f} tok/s ({row['speedup']:.2f}x), acceptance "
                  f"{row['acceptance']:.3f}" + (f", identical {row['greedy_identical']}" if temperature == 0 else ""))
    result = {"model": args.model, "checkpoint": str(checkpoint), "distil_steps": args.steps,
              "prompts": len(prompts), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "threads": args.threads, "repeats": args.repeats, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
