"""Speculative decoding with MTP drafts against plain decoding, side by side.

Steps, in one run:

1. **Distil an MTP layer** (``opencomposer.pretrain.phases`` with one phase, ``losses = ["mtp"]``:
   the report's self-distillation; the model's own weights stay as they are). ``--model smollm2``
   (the default) gives SmolLM2-135M-Instruct one fresh MTP layer; ``--model PATH`` takes a
   checkpoint folder (its MTP layer is trained further, or made when it has none). The corpus is
   the project's default code corpus; the run folder is cached, so a rerun skips the training
   (``--retrain`` forces it). ``--steps 50,100,200`` (ascending) is a sweep: one distillation at a
   constant learning rate (after a warm-up of 5% of the first count), a phase ending at each
   count, and step 2 run on every phase's checkpoint, so that acceptance and speed are read
   against the distillation steps (the table per count, and a figure beside the results JSON).
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
    .venv/bin/python benchmarks/speculative.py --model PATH --steps 50,100,200,400   # the sweep
    .venv/bin/python benchmarks/speculative.py --quick   # a random tiny MoE, distilled 1 then 2 steps, 4 tokens

Results: ``benchmarks/results/speculative.json`` (``rows``: the last count's table; ``sweep``:
every count's). ``--quick`` distils on a 40-file corpus and keeps
its run folder and results in a temporary folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from _quick import parse_args

from opencomposer.config import load_recipe
from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.io import cache_dir

QUICK = {"steps": "1,2", "seq_len": 32, "train_batch": 2, "prompts": 2, "prompt_tokens": 16, "new_tokens": 4, "batch": "1",
         "repeats": 1, "corpus_files": 40}


def step_counts(text: str) -> list[int]:
    """``--steps``: one count or an ascending comma-separated list, each at least 1."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--steps: {text!r} is not a count or a comma-separated list of counts") from None
    if any(c < 1 for c in counts) or counts != sorted(set(counts)):
        raise SystemExit(f"--steps: {text!r} must be counts of at least 1, strictly ascending")
    return counts


def distil(model: str, steps: list[int], seq_len: int, batch: int, lr: float, retrain: bool, threads: int,
           out: Path, corpus_files: int) -> list[tuple[int, Path]]:
    """``(count, checkpoint)`` for each of ``steps``: the model with its MTP layer distilled that many
    steps (trained once per setting under ``out``, then cached). One count is one phase with the
    phased trainer's default (cosine) schedule; several are a phase per count at a constant rate,
    each phase's end kept as a checkpoint."""
    from opencomposer.pretrain.checkpoints import CHECKPOINTS, PREFIX
    from opencomposer.pretrain.phases import run_phases

    kind = ["model.kind=smollm2"] if model == "smollm2" else ["model.kind=hf", f"model.path={model}"]
    tag = f"{Path(model).name}-s{'-'.join(map(str, steps))}-l{seq_len}-b{batch}-lr{lr:g}"
    run_dir = out / tag
    ends = [run_dir / CHECKPOINTS / f"{PREFIX}{count:07d}" / "model" for count in steps]
    if len(steps) == 1:
        ends = [run_dir / "checkpoint"]
    if all(end.is_dir() for end in ends) and not retrain:
        print(f"distilled MTP layer: cached under {run_dir}")
        return list(zip(steps, ends))
    common = f'losses=["mtp"], seq_len={seq_len}, batch_size={batch}, lr={lr}'
    if len(steps) == 1:
        phases = [f'{{name="mtp", {common}, steps={steps[0]}, warmup_steps={max(1, steps[0] // 20)}}}']
    else:
        phases = [f'{{name="mtp-{count}", {common}, steps={count - before}, schedule="constant", '
                  f'warmup_steps={max(1, steps[0] // 20) if i == 0 else 0}}}'
                  for i, (before, count) in enumerate(zip([0, *steps], steps))]
    config = load_recipe(None, [*kind, "model.num_mtp_layers=1", f"run.out_dir={out}", f"run.name={tag}",
                                f"run.threads={threads}", f"pretrain.phases=[{', '.join(phases)}]",
                                f"pretrain.eval_every={max(1, steps[-1] // 8)}",
                                "pretrain.eval_batches=2", "pretrain.checkpoint_every=25",
                                *([f"corpus.max_files={corpus_files}"] if corpus_files else [])])
    _, _, result = run_phases(config, probes=0)
    evals = [r for r in result.history if r["kind"] == "eval"]
    print(f"held-out greedy agreement of the draft: {evals[0].get('heldout_mtp_top1', float('nan')):.3f} -> "
          f"{evals[-1].get('heldout_mtp_top1', float('nan')):.3f}")
    return list(zip(steps, ends if len(steps) > 1 else [result.checkpoint]))


def heldout_prompts(tokenizer, count: int, length: int, corpus_files: int, top_up: bool = False) -> list[list[int]]:
    """The first ``length`` tokens of held-out code files of the default corpus (long enough ones).
    ``top_up`` (``--quick``, whose small corpus holds out a file or two) fills the rest from training
    files; otherwise too few held-out files is an error."""
    from opencomposer.config import CorpusConfig
    from opencomposer.model.corpus import build_corpus

    corpus = build_corpus(CorpusConfig(max_files=corpus_files) if corpus_files else CorpusConfig(), seed=0)
    prompts = []
    for f in [*corpus.heldout, *(corpus.train if top_up else [])]:
        ids = tokenizer(f.text, add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == count:
            return prompts
    raise SystemExit(f"only {len(prompts)} held-out files of at least {length} tokens for --prompts {count}: "
                     "lower --prompts or --prompt-tokens, or raise --corpus-files")


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 or a checkpoint folder")
    parser.add_argument("--steps", default="300", help="distillation steps, or an ascending list (a sweep)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--retrain", action="store_true", help="distil again even if the run folder is cached")
    parser.add_argument("--corpus-files", type=int, default=0, help="cap the code corpus (0: the default corpus)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts decoded")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", default="1,8", help="rows per generate call, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/speculative.json)")
    args = parse_args(parser, QUICK)
    if args.out is None:
        args.out = args.results_dir / "speculative.json"
    torch.set_num_threads(args.threads)

    from opencomposer.model.loading import load_model, save_checkpoint

    runs = cache_dir() / "benchmarks" / "speculative"
    if args.quick:
        runs = args.results_dir / "runs"
        args.model = str(save_checkpoint(*load_model("tiny_moe", seed=0), args.results_dir / "tiny-moe"))
    counts = step_counts(str(args.steps))
    distilled = distil(args.model, counts, args.seq_len, args.train_batch, args.lr, args.retrain, args.threads,
                       runs, args.corpus_files)
    sweep, prompts = [], None
    for count, checkpoint in distilled:
        model, tokenizer = load_model(checkpoint)
        engine = LocalEngine(model, tokenizer)
        if prompts is None:  # every checkpoint has the base model's tokenizer
            prompts = heldout_prompts(tokenizer, args.prompts, args.prompt_tokens, args.corpus_files, args.quick)
        print(f"MTP layer distilled {count} steps")
        print(f"{'T':>3}  {'batch':>5}  {'plain tok/s':>11}  {'speculative tok/s':>17}  {'speed-up':>8}  "
              f"{'acceptance':>10}  identical (T=0)")
        rows = []
        for temperature in (0.0, 1.0):
            for batch in (int(b) for b in args.batch.split(",")):
                params = SamplingParams(max_new_tokens=args.new_tokens, temperature=temperature, ignore_eos=True,
                                        seed=0)
                row = measure(engine, prompts, params, batch, args.repeats)
                rows.append(row)
                print(f"{temperature:>3g}  {batch:>5d}  {row['plain_tokens_per_s']:>11.1f}  "
                      f"{row['speculative_tokens_per_s']:>17.1f}  {row['speedup']:>7.2f}x  "
                      f"{row['acceptance']:>10.3f}  {row.get('greedy_identical', '-')}", flush=True)
        sweep.append({"distil_steps": count, "checkpoint": str(checkpoint), "rows": rows})
    result = {"model": args.model, "checkpoint": sweep[-1]["checkpoint"], "distil_steps": counts[-1],
              "prompts": len(prompts), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "threads": args.threads, "repeats": args.repeats, "rows": sweep[-1]["rows"], "sweep": sweep}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if len(sweep) > 1:
        figure = args.out.with_suffix(".png")
        plot_sweep(sweep, figure)
        print(f"wrote {figure}")


def plot_sweep(sweep: list[dict], path: Path) -> None:
    """Draft acceptance and speed-up against distillation steps, a line per temperature and batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    counts = [point["distil_steps"] for point in sweep]
    for i, row in enumerate(sweep[0]["rows"]):
        label = f"T={row['temperature']:g}, {row['batch']} row{'s' if row['batch'] > 1 else ''}"
        left.plot(counts, [point["rows"][i]["acceptance"] for point in sweep], marker="o", label=label)
        right.plot(counts, [point["rows"][i]["speedup"] for point in sweep], marker="o", label=label)
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    for axis in (left, right):  # counts usually double: equal spacing on a log axis
        axis.set_xscale("log")
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.minorticks_off()
    left.set(xlabel="MTP distillation steps", ylabel="draft acceptance", ylim=(0, 1), title="Draft acceptance")
    right.set(xlabel="MTP distillation steps", ylabel="speculative / plain tokens per second",
              title="Speed-up (1 = break even)")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
