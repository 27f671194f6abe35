"""Prefix cache of ``LocalEngine``: prefill saved on an agent's chain of calls, and the summary call's time.

Motivation (self-summarisation): the summary request is appended to the live context so that the
engine reuses its key/value cache for it. Without a prefix cache every call of an agent prefills
its whole context again; with one (``LocalEngine(prefix_cache_tokens=...)``) a call prefills only
what was appended since the previous call.

Workload, the agent loop's token-level context (``agent.protocol.TokenTranscript``, the tool
schemas in the system prompt): a first user message carrying a long source file, cut so that the
first prompt has about ``--context`` tokens, then ``--turns`` model turns of ``--new-tokens`` sampled tokens (temperature 1,
seeded, EOS ignored), each followed by a tool output of about ``--tool-tokens`` tokens (another
source file, as a read would return it); after the last tool output the loop's summary request
(``agent.context.SUMMARY_REQUEST``) as a user message, and the summary call (``--summary-tokens``
new tokens). Each call's prompt is the previous prompt, its completion and the appended tokens,
as in the agent loop. Two engines run the same chain with the same seeds: the cache off (today's
engine) and on. Models: the random tiny MoE, and SmolLM2-135M-Instruct when ``opencomposer models``
has it cached (skipped otherwise).

Reported per model: prefill positions computed over the whole chain and for the summary call,
with and without the cache, and their ratio; the summary call's wall time and the time spent in
prefills (``InvariantDecoder.prefill``, timed around the call), with and without, and their ratio;
the whole chain's wall time; whether both chains sampled the same tokens, the largest
log-probability difference between them up to the first token they differ at (a reused prefix
changes float rounding only, so at temperature 1 a draw that lands within that rounding of the
boundary between two tokens picks the other one, and the chains go separate ways from there),
and where that happened (repeat, call, token, and the two tokens' log-probabilities). Median of
``--repeats`` repeats, the two engines alternating. ``--clock cpu`` times by the process's CPU time
instead of the wall clock, for one-thread runs on a machine other work shares.

    .venv/bin/python benchmarks/prefix_cache.py [--models tiny_moe,smollm2] [--context 2500] [--turns 4]
                                               [--repeats 3] [--threads N] [--clock wall|cpu] [--device cpu|cuda]
    .venv/bin/python benchmarks/prefix_cache.py --quick    # the tiny MoE, one short turn
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import opencomposer
from opencomposer.agent.context import SUMMARY_REQUEST
from opencomposer.agent.protocol import TokenTranscript, initial_messages
from opencomposer.agent.tools import tool_schemas
from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.inference.invariant import InvariantDecoder
from opencomposer.types import Message

QUICK = {"models": "tiny_moe", "context": 200, "turns": 1, "new_tokens": 4, "tool_tokens": 30, "summary_tokens": 4,
         "repeats": 1}
SOURCE = Path(opencomposer.__file__).parent
CONTEXT_FILE = SOURCE / "inference" / "local.py"  # the file the task hands the agent
TOOL_FILES = [SOURCE / "inference" / name for name in ("batching.py", "invariant.py", "decoders.py", "sampling.py")]
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # set by --clock


def clip(tokenizer, text: str, tokens: int) -> str:
    """The start of ``text``, about ``tokens`` tokens of it."""
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids, skip_special_tokens=False)


class PrefillTimer:
    """Seconds (of ``clock``) spent in ``InvariantDecoder.prefill`` while active (synchronised on CUDA)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def active(self):
        original = InvariantDecoder.prefill

        def timed(decoder, *args, **kwargs):
            _sync()
            started = clock()
            try:
                return original(decoder, *args, **kwargs)
            finally:
                _sync()
                self.seconds += clock() - started

        InvariantDecoder.prefill = timed
        try:
            yield self
        finally:
            InvariantDecoder.prefill = original


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def chain(engine: LocalEngine, tokenizer, args: argparse.Namespace, seed: int) -> dict:
    """Run the agent chain (module doc) on ``engine``; per-call prefill counts and times."""
    def task(file_tokens: int) -> TokenTranscript:
        instruction = ("Fix the failing test in this file. Here it is:\n```python\n"
                       + clip(tokenizer, CONTEXT_FILE.read_text(), file_tokens) + "\n```")
        return TokenTranscript(tokenizer, tool_schemas(), initial_messages(instruction))

    transcript = task(max(0, args.context - len(task(0).prompt_ids)))
    ids = list(transcript.prompt_ids)
    calls, sampled = [], []
    for turn in range(args.turns + 1):
        summary = turn == args.turns
        params = SamplingParams(max_new_tokens=args.summary_tokens if summary else args.new_tokens,
                                temperature=1.0, seed=seed * 1000 + turn, ignore_eos=True)
        before = (engine.stats.prefill_tokens, engine.stats.prefill_tokens_reused)
        timer = PrefillTimer()
        with timer.active():
            _sync()
            started = clock()
            [completion] = engine.generate([ids], params)
            _sync()
            seconds = clock() - started
        calls.append(dict(prompt_tokens=len(ids), summary=summary, seconds=seconds, prefill_seconds=timer.seconds,
                          prefill_tokens=engine.stats.prefill_tokens - before[0],
                          prefill_tokens_reused=engine.stats.prefill_tokens_reused - before[1]))
        sampled.append((completion.token_ids, completion.logprobs))
        if summary:
            break
        transcript.model_turn(completion.token_ids, completion.finish_reason)
        output = clip(tokenizer, TOOL_FILES[turn % len(TOOL_FILES)].read_text(), args.tool_tokens)
        appended = [Message("tool", output)]
        if turn == args.turns - 1:
            appended.append(Message("user", SUMMARY_REQUEST))  # appended to the live context
        _, environment = transcript.environment_turn(appended)
        ids = ids + completion.token_ids + environment
    return dict(calls=calls, sampled=sampled)


def bench(kind: str, args: argparse.Namespace) -> dict:
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model(kind)
    model = model.to(args.device)
    engines = {"off": LocalEngine(model, tokenizer),
               "on": LocalEngine(model, tokenizer, prefix_cache_tokens=args.cache_tokens)}
    assert engines["on"].prefix_cache is not None, f"{kind}: the prefix cache does not apply to this model"
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    divergences, worst = [], 0.0
    with torch.inference_mode():
        for engine in engines.values():  # warm-up, a short chain
            chain(engine, tokenizer, argparse.Namespace(**{**vars(args), "turns": 1, "context": 200}), seed=99)
        for repeat in range(args.repeats):
            results = {}
            for name in (("off", "on") if repeat % 2 == 0 else ("on", "off")):
                if engines[name].prefix_cache is not None:
                    engines[name].prefix_cache.invalidate()  # each repeat starts cold
                results[name] = chain(engines[name], tokenizer, args, seed=repeat)
                runs[name].append(results[name])
            pairs = zip(results["off"]["sampled"], results["on"]["sampled"])
            for call, ((tokens_off, logprobs_off), (tokens_on, logprobs_on)) in enumerate(pairs):
                same = [a == b for a, b in zip(tokens_off, tokens_on)]
                common = same.index(False) if False in same else len(same)
                worst = max([worst, *(abs(a - b) for a, b in zip(logprobs_off[:common], logprobs_on[:common]))])
                if common < len(same):  # the contexts differ from here on
                    divergences.append(dict(repeat=repeat, call=call, token=common,
                                            logprob_off=logprobs_off[common], logprob_on=logprobs_on[common]))
                    break

    def median(name: str, key: str, summary_only: bool = False) -> float:
        return statistics.median(sum(c[key] for c in run["calls"] if c["summary"] or not summary_only)
                                 for run in runs[name])

    out = {"model": kind, "context_tokens": runs["off"][0]["calls"][0]["prompt_tokens"],
           "summary_prompt_tokens": runs["off"][0]["calls"][-1]["prompt_tokens"],
           "calls": args.turns + 1, "same_tokens": not divergences, "max_logprob_diff": worst,
           "divergences": divergences}
    for name in engines:
        out[name] = {
            "chain_prefill_tokens": median(name, "prefill_tokens"),
            "chain_prefill_tokens_reused": median(name, "prefill_tokens_reused"),
            "chain_seconds": median(name, "seconds"),
            "summary_prefill_tokens": median(name, "prefill_tokens", summary_only=True),
            "summary_prefill_tokens_reused": median(name, "prefill_tokens_reused", summary_only=True),
            "summary_seconds": median(name, "seconds", summary_only=True),
            "summary_prefill_seconds": median(name, "prefill_seconds", summary_only=True),
            "runs": [run["calls"] for run in runs[name]],
        }
    off, on = out["off"], out["on"]
    out["chain_prefill_ratio"] = on["chain_prefill_tokens"] / off["chain_prefill_tokens"]
    out["summary_prefill_ratio"] = on["summary_prefill_tokens"] / off["summary_prefill_tokens"]
    out["summary_time_ratio"] = on["summary_seconds"] / off["summary_seconds"]
    out["summary_prefill_time_ratio"] = on["summary_prefill_seconds"] / off["summary_prefill_seconds"]
    out["chain_time_ratio"] = on["chain_seconds"] / off["chain_seconds"]
    return out


def main() -> None:
    # imported here, not at the top: smollm2_practical.py loads this file by path for its helpers
    from _quick import parse_args

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny_moe,smollm2", help="comma list of model kinds (smollm2 if cached)")
    parser.add_argument("--context", type=int, default=2500, help="tokens of the first prompt (about)")
    parser.add_argument("--turns", type=int, default=4, help="model turns before the summary request")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens sampled per turn")
    parser.add_argument("--tool-tokens", type=int, default=150, help="tokens of each tool output")
    parser.add_argument("--summary-tokens", type=int, default=32, help="tokens of the summary call")
    parser.add_argument("--cache-tokens", type=int, default=16384, help="the engine's prefix_cache_tokens")
    parser.add_argument("--repeats", type=int, default=3, help="chains per model and cache setting")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall clock, or the process's CPU time (one thread, shared machine)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="results JSON (default: benchmarks/results/prefix_cache.json)")
    args = parse_args(parser, QUICK)
    if args.out is None:
        args.out = str(args.results_dir / "prefix_cache.json")
    if args.threads:
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    results = []
    for kind in args.models.split(","):
        if kind == "smollm2":
            from opencomposer.model.smollm2 import smollm2_path

            if not (smollm2_path() / "model.safetensors").is_file():
                print(f"smollm2: not cached at {smollm2_path()}, skipped (`opencomposer models fetch`)")
                continue
        results.append(bench(kind, args))
    print(f"{'model':<9} {'context':>7} {'summary':>7} | {'chain prefill off/on':>21} {'ratio':>6} | "
          f"{'summary prefill off/on':>22} {'ratio':>6} | {'summary s off/on':>17} {'ratio':>6} | "
          f"{'its prefill s off/on':>20} {'ratio':>6} | {'chain s ratio':>13} | {'same':>4} {'max dlogp':>9}")
    for r in results:
        off, on = r["off"], r["on"]
        print(f"{r['model']:<9} {r['context_tokens']:>7} {r['summary_prompt_tokens']:>7} | "
              f"{off['chain_prefill_tokens']:>10.0f}/{on['chain_prefill_tokens']:<10.0f} "
              f"{r['chain_prefill_ratio']:>6.3f} | "
              f"{off['summary_prefill_tokens']:>11.0f}/{on['summary_prefill_tokens']:<10.0f} "
              f"{r['summary_prefill_ratio']:>6.3f} | "
              f"{off['summary_seconds']:>8.3f}/{on['summary_seconds']:<8.3f} {r['summary_time_ratio']:>6.3f} | "
              f"{off['summary_prefill_seconds']:>9.3f}/{on['summary_prefill_seconds']:<10.3f} "
              f"{r['summary_prefill_time_ratio']:>6.3f} | {r['chain_time_ratio']:>13.3f} | "
              f"{'yes' if r['same_tokens'] else 'no':>4} {r['max_logprob_diff']:>9.1e}")
    for r in results:
        for d in r["divergences"]:
            print(f"{r['model']}: repeat {d['repeat']}, call {d['call']}, token {d['token']}: the chains sampled "
                  f"different tokens (logprob {d['logprob_off']:.3f} without the cache, {d['logprob_on']:.3f} with)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                          "torch_threads": torch.get_num_threads(),
                                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
