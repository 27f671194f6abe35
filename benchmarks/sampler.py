"""LocalEngine against transformers `generate` on grouped sampling, side by side in one run.

Workload (issue 2): 4 prompts x 8 samples x 128 new tokens, temperature 1, no truncation, EOS
ignored so all sides produce exactly the same number of tokens. Models: the tiny MoE and
SmolLM2-135M-Instruct. Two prompt sets: ``chat`` (a bare user request, 30-45 tokens) and ``agent``
(the same requests inside the agent harness's first prompt: system prompt and tool list, as every
RL rollout starts). Three sides: LocalEngine as it runs (batch-invariant decoding,
``inference.invariant``), LocalEngine's previous fast path (``batch_invariant=False``: shared
left-padded prefill, ``LeanDecoder`` steps) and transformers ``generate``. Reports tokens/s for
each, the price of batch invariance (invariant / fast), the ratio to ``generate`` and the prompt
positions LocalEngine prefills a call (and saves against prefilling every sample); median of
repeats, the sides interleaved within each repeat. ``--clock cpu`` times by the process's CPU time
instead of the wall clock, for one-thread runs on a machine other work shares.

    python benchmarks/sampler.py [--repeats 3] [--models tiny_moe,smollm2] [--prompts chat,agent] [--threads N]
                                 [--clock wall|cpu]
    python benchmarks/sampler.py --quick    # the tiny MoE, chat prompts, 2 samples x 4 tokens
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _quick import parse_args

from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.model.loading import load_model

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date and returns a datetime.",
    "Explain what this does: `sorted(set(x) & set(y), key=len)`",
    "Refactor this loop into a list comprehension:\nresult = []\nfor item in items:\n    if item.ok:\n        result.append(item.value)",
    "Add type hints to: def merge(a, b): return {**a, **b}",
]
QUICK = {"repeats": 1, "models": "tiny_moe", "prompts": "chat", "samples": 2, "new_tokens": 4}


def ours(engine: LocalEngine, prompts: list[list[int]], seed: int, samples: int, new_tokens: int) -> int:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed, ignore_eos=True)
    out = engine.generate(prompts, params, n=samples)
    return sum(len(c.token_ids) for c in out)


def theirs(model, prompts: list[list[int]], seed: int, pad_id: int, samples: int, new_tokens: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        num_return_sequences=samples, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
    )
    return (out.shape[1] - width) * out.shape[0]


def prompt_ids(tokenizer, style: str) -> list[list[int]]:
    if style == "chat":
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=False) for p in PROMPTS]
    else:
        from opencomposer.agent.protocol import initial_messages, message_dicts
        from opencomposer.agent.tools import tool_schemas

        texts = [tokenizer.apply_chat_template(message_dicts(initial_messages(p)), tools=tool_schemas(),
                                               add_generation_prompt=True, tokenize=False) for p in PROMPTS]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def bench(kind: str, style: str, args: argparse.Namespace, clock=time.perf_counter) -> dict:
    model, tokenizer = load_model(kind)
    prompts = prompt_ids(tokenizer, style)
    engine = LocalEngine(model, tokenizer)
    fast = LocalEngine(model, tokenizer, batch_invariant=False)
    sides = {
        "ours": lambda seed: ours(engine, prompts, seed, args.samples, args.new_tokens),
        "fast": lambda seed: ours(fast, prompts, seed, args.samples, args.new_tokens),
        "transformers": lambda seed: theirs(model, prompts, seed, engine.pad_id, args.samples, args.new_tokens),
    }
    rows = {name: [] for name in sides}
    with torch.inference_mode():
        for run in sides.values():  # warm-up
            run(0)
        for r in range(args.repeats):
            for name, run in sides.items():
                t = clock()
                n = run(r)
                rows[name].append(n / (clock() - t))
    result = {name: statistics.median(v) for name, v in rows.items()}
    result["ratio"] = result["ours"] / result["transformers"]
    result["invariant_ratio"] = result["ours"] / result["fast"]
    result["model"] = kind
    result["prompts"] = style
    result["prompt_tokens"] = [len(p) for p in prompts]
    result["tokens_per_run"] = len(prompts) * args.samples * args.new_tokens
    # prompt positions LocalEngine runs a call (the n samples of a prompt share one prefill and,
    # in decoding, the prompt's full key/value blocks), against prefilling every sample as generate does
    result["prefill_tokens"] = engine.stats.prefill_tokens // (args.repeats + 1)
    result["prefill_tokens_saved"] = args.samples * sum(result["prompt_tokens"]) - result["prefill_tokens"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--models", default="tiny_moe,smollm2", help="comma list of model kinds")
    parser.add_argument("--prompts", default="chat,agent", help="comma list of prompt sets: chat, agent")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per sample (EOS ignored)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0: torch default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock, or the process's CPU time (one thread, shared machine)")
    parser.add_argument("--out", help="results JSON (default: benchmarks/results/sampler.json)")
    args = parse_args(parser, QUICK)
    if args.out is None:
        args.out = str(args.results_dir / "sampler.json")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(f"{'model':<10} {'prompts':<8} {'prompt tokens':>14} {'LocalEngine tok/s':>18} {'fast path tok/s':>16} "
          f"{'inv/fast':>9} {'generate tok/s':>15} {'ratio':>7} {'prefill tokens (saved)':>23}", flush=True)
    results = []
    for kind in args.models.split(","):
        for style in args.prompts.split(","):  # a row as each finishes, the JSON so far after each
            results.append(r := bench(kind, style, args, clock))
            span = f"{min(r['prompt_tokens'])}-{max(r['prompt_tokens'])}"
            print(f"{r['model']:<10} {r['prompts']:<8} {span:>14} {r['ours']:>18.1f} {r['fast']:>16.1f} "
                  f"{r['invariant_ratio']:>8.2f}x {r['transformers']:>15.1f} {r['ratio']:>6.2f}x "
                  f"{r['prefill_tokens']:>12} ({r['prefill_tokens_saved']})", flush=True)
            Path(args.out).write_text(json.dumps({"threads": torch.get_num_threads(), "clock": args.clock,
                                                  "results": results}, indent=2))


if __name__ == "__main__":
    main()
