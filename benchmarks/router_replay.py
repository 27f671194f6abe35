"""Sampler/trainer mismatch with router replay off, on and filtered (report §6.2; R3, arXiv 2510.11370).

The sampler (``LocalEngine``) samples from a copy of the policy; the trainer scores the sampled
tokens in float32 (``training.forward.token_logprobs``, the trainer's forward) with
``rl.router_replay`` off, ``replay`` and ``filtered`` (``--threshold``, default the recipe's 0.5;
``--extra-thresholds`` adds ``filtered@T`` rows, 0.9 by default).
Sampler settings ("scenarios"):

- ``fp32``: the engine's default path in float32; for the Qwen3-MoE the batch-invariant decoder,
  which differs from the trainer's forward by summation order only (the control); for DeepSeek-V3
  the transformers forward over the whole batch;
- ``fp32_batched`` (Qwen3-MoE): float32, ``batch_invariant=False``: one left-padded prefill and
  batched decode steps, so rows depend on what shares their batch;
- ``bf16``: the sampler's copy of the weights in bfloat16 (the realistic gap: inference kernels in
  low precision, the trainer in float32);
- ``stale``: float32, but the sampler holds the weights from ``--stale-steps`` Adam steps (at
  ``--stale-lr``, 1e-3 like the tiny RL recipes) before the trainer's: an asynchronous sampler one
  version behind, or an in-flight update. The gap the confidence filter is for, since a stale
  router's choice can be implausible for the current one.

Reported per model, scenario and replay mode, over the sampled (model) tokens: ``mismatch_kl``
(mean per-token k3 estimate of KL(sampler ‖ trainer), ``rl.losses.mismatch_kl``), ``kl_k1``
(mean of log π_sampler − log π_trainer), ``log_ratio_abs_p99`` and ``log_ratio_abs_max`` of
|log π_trainer − log π_sampler|; per scenario, the routing agreement per MoE layer (share of the
sampler's (position, expert) choices that the trainer's own routing makes too, over every context
position) and, for ``filtered``, the replace rate.

Models: the tiny Qwen3-MoE and tiny DeepSeek-V3 at their default sizes, pretrained for
``--steps`` steps on the code corpus first (a random router scores every expert alike, which
makes every rounding difference a flip and overstates the mismatch).

    .venv/bin/python benchmarks/router_replay.py [--steps 150 --stale-steps 1 --stale-lr 1e-3 --prompts 16 --samples 4 --tokens 48]
    .venv/bin/python benchmarks/router_replay.py --quick

Results are printed and written to benchmarks/results/router_replay.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from _quick import parse_args

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"steps": 2, "prompts": 2, "prompt_tokens": 16, "samples": 2, "tokens": 4, "corpus_files": 60}


def pretrained(kind: str, tokenizer, corpus, steps: int, stale_steps: int, stale_lr: float, seed: int):
    """(model after ``steps`` pretraining steps, the same model before its last ``stale_steps``,
    which run at the constant rate ``stale_lr``)."""
    from opencomposer.config import ModelConfig, PretrainConfig
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.cpt import pretrain

    model, _ = load_model(ModelConfig(kind=kind), tokenizer, seed=seed)
    files = corpus.train[:800]
    config = PretrainConfig(max_steps=steps - stale_steps, seq_len=128, batch_size=8, eval_batches=0,
                            warmup_steps=10, max_minutes=30)
    pretrain(model, tokenizer, files, [], config, progress=False, seed=seed)
    stale = copy.deepcopy(model).eval()
    config = PretrainConfig(max_steps=stale_steps, seq_len=128, batch_size=8, eval_batches=0, warmup_steps=0,
                            lr=stale_lr, min_lr_ratio=1.0, max_minutes=30)
    pretrain(model, tokenizer, files[::-1], [], config, progress=False, seed=seed + 1)
    return model.eval(), stale


def prompts_from(corpus, tokenizer, count: int, length: int, quick: bool = False) -> list[list[int]]:
    """The first ``length`` tokens of ``count`` held-out files (those that have as many). A quick
    run's small corpus may hold too few held-out files (2% of them): it takes the rest from the
    training files, the last first; a measurement refuses to."""
    prompts = []
    files = [*corpus.heldout, *(corpus.train[::-1] if quick else [])]
    for code_file in files:
        ids = tokenizer.encode(code_file.text)
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == count:
            break
    if len(prompts) < count:
        raise SystemExit(f"router_replay: {len(corpus.heldout)} held-out files give {len(prompts)} prompts of "
                         f"{length} tokens, not --prompts {count}; raise --corpus-files")
    return prompts


def sample_rows(model, stale, tokenizer, prompts, scenario: str, args) -> list:
    """Sample with the scenario's sampler; one ``SequenceRow`` per completion, routes included."""
    from opencomposer.inference.local import LocalEngine
    from opencomposer.training.packing import SequenceRow
    from opencomposer.types import SamplingParams

    sampler = copy.deepcopy(stale if scenario == "stale" else model)
    if scenario == "bf16":
        sampler = sampler.to(torch.bfloat16)
    engine = LocalEngine(sampler, tokenizer, batch_invariant=scenario != "fp32_batched")
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, seed=args.seed, ignore_eos=True)
    rows = []
    for completion in engine.generate(prompts, params, n=args.samples):
        prompt = prompts[completion.prompt_index]
        ids = np.asarray(prompt + completion.token_ids, dtype=np.int64)
        routes = np.concatenate([completion.prompt_routed_experts, completion.routed_experts]).astype(np.int32)
        mask = np.zeros(len(ids), dtype=bool)
        mask[len(prompt):] = True
        logprobs = np.zeros(len(ids), dtype=np.float32)
        logprobs[len(prompt):] = completion.logprobs
        rows.append(SequenceRow(episode=len(rows), input_ids=ids[:-1], target_ids=ids[1:], loss_mask=mask[1:],
                                sampler_logprobs=logprobs[1:], routes=routes[:-1]))
    return rows


def replay_modes(threshold: float, extra: list[float]) -> dict[str, tuple[str, float]]:
    """Name -> (rl.router_replay, threshold): off, replay, filtered at ``threshold``, and filtered at
    each ``extra`` threshold ("filtered@0.9")."""
    modes = {"off": ("off", threshold), "replay": ("replay", threshold), "filtered": ("filtered", threshold)}
    modes.update({f"filtered@{t:g}": ("filtered", t) for t in extra})
    return modes


@torch.no_grad()
def score(model, rows, pad_id: int, mode: str, threshold: float) -> dict:
    from opencomposer.model.routing import RouterReplay
    from opencomposer.rl.losses import mismatch_kl, ratio_metrics
    from opencomposer.training.forward import token_logprobs
    from opencomposer.training.packing import collate, micro_batches

    replay = None if mode == "off" else RouterReplay(model, mode, threshold)
    log_ratios = []
    for chunk in micro_batches(rows, 8192):
        batch = collate(chunk, pad_id)
        logprobs, _ = token_logprobs(model, batch, with_entropy=False, replay=replay)
        log_ratios.append((logprobs - batch.sampler_logprobs)[batch.loss_mask])
    log_ratios = torch.cat(log_ratios).double()
    out = {
        "tokens": int(log_ratios.numel()),
        **mismatch_kl(log_ratios),
        "kl_k1": float((-log_ratios).mean()),
        "log_ratio_abs_p99": ratio_metrics(log_ratios)["log_ratio_abs_p99"],
        "log_ratio_abs_max": float(log_ratios.abs().max()),
    }
    if replay is not None:
        out.update(replay.metrics())
        out["agreement_per_layer"] = replay.stats.agreement_per_layer()
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150, help="pretraining steps per model")
    parser.add_argument("--stale-steps", type=int, default=1, help="Adam steps the stale sampler is behind")
    parser.add_argument("--stale-lr", type=float, default=1e-3, help="learning rate of those steps")
    parser.add_argument("--prompts", type=int, default=16, help="prompts cut from the held-out code")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=48, help="tokens sampled per completion")
    parser.add_argument("--threshold", type=float, default=0.5, help="rl.router_replay_threshold of 'filtered'")
    parser.add_argument("--extra-thresholds", type=float, nargs="*", default=[0.9],
                        help="further thresholds of the filter, reported as filtered@T")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", default=["tiny_moe", "tiny_deepseek_v3"])
    parser.add_argument("--corpus-files", type=int, default=1500, help="source files of the pretraining corpus")
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/router_replay.json)")
    args = parse_args(parser, QUICK)
    if args.out is None:
        args.out = args.results_dir / "router_replay.json"

    from opencomposer.config import CorpusConfig
    from opencomposer.model.corpus import build_corpus
    from opencomposer.model.loading import default_tokenizer

    torch.manual_seed(args.seed)
    tokenizer = default_tokenizer()
    corpus = build_corpus(CorpusConfig(max_files=args.corpus_files))
    prompts = prompts_from(corpus, tokenizer, args.prompts, args.prompt_tokens, quick=args.quick)
    pad_id = int(tokenizer.pad_token_id)
    results = {"args": {k: _shown(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "results_dir"},
               "torch_threads": torch.get_num_threads(), "models": {}}
    for kind in args.kinds:
        started = time.perf_counter()
        model, stale = pretrained(kind, tokenizer, corpus, args.steps, args.stale_steps, args.stale_lr, args.seed)
        print(f"{kind}: pretrained {args.steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
        scenarios = ["fp32", "fp32_batched", "bf16", "stale"] if kind == "tiny_moe" else ["fp32", "bf16", "stale"]
        results["models"][kind] = {}
        for scenario in scenarios:
            rows = sample_rows(model, stale, tokenizer, prompts, scenario, args)
            modes = replay_modes(args.threshold, args.extra_thresholds)
            by_mode = {name: score(model, rows, pad_id, *setting) for name, setting in modes.items()}
            results["models"][kind][scenario] = by_mode
            agreement = by_mode["replay"]["agreement_per_layer"]
            print(f"  {scenario:>12}: routing agreement per layer " + " ".join(f"{a:.4f}" for a in agreement),
                  flush=True)
            for mode, r in by_mode.items():
                extra = f"  replace rate {r['router_replay_replace_rate']:.4f}" if mode.startswith("filtered") else ""
                print(f"  {scenario:>12} {mode:>12}: mismatch_kl {r['mismatch_kl']:.3e}  kl_k1 {r['kl_k1']:+.3e}  "
                      f"|log ratio| p99 {r['log_ratio_abs_p99']:.3e} max {r['log_ratio_abs_max']:.3e}{extra}",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
