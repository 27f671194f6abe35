"""What makes SFT and RL of SmolLM2-135M practical on two cores (issue 17): each speed-up against its absence.

Data: real harness episodes. ``--tasks`` bug tasks are generated (``tasks.generators``, the
``bugs`` family: one function-level bug each, verified), and the oracle plays each in the sandbox
(``sft.demonstrations = "explore"``: grep, read, edit, run the tests, finish; five turns, about
1.6-2.2 k tokens, the first ~1,140 of them the prompt: the system prompt and tool list, about
1,100 tokens that every task shares, then the instruction). Model: SmolLM2-135M-Instruct, untouched (``model.kind = "smollm2"``). Six
measurements, each two settings on the same inputs, named as ``--only`` takes them:

1. ``bf16``: one SFT step (``training.forward.token_logprobs``, the masked mean cross-entropy of
   ``pretrain.sft``, backward, an AdamW step) on ``--batch`` episode rows, fp32 against bf16
   autocast (shared-prefix forward on in both). The weights are restored before every timed
   step, so every step starts from the same weights; the note gives the relative difference of
   the loss and of the gradient norm between the two, and how near each side comes to the
   machine's matrix throughput: the FLOPs a step computes (``torch.utils.flop_counter``, one
   untimed step) over its seconds, against one matrix product at the model's MLP shape in the
   same precision, timed in the same run (``matmul_peak_tflops``, ``fraction_of_peak``).
2. ``shared_prefix``: the same step (bf16) with ``share_prefix`` off against on: the system
   prompt every row shares computed once instead of once per row.
3. ``kv_cache``: the sampler (``LocalEngine``) generating each turn of a recorded episode, the
   context growing turn by turn as the agent loop grows it (the prompt, then every earlier turn
   and tool output of the recording), ``--new-tokens`` sampled tokens per turn (EOS ignored),
   with the engine's prefix cache off against on (``prefix_cache_tokens``): with it, a turn
   prefills only what was appended since the last one. The cache starts cold every repeat.
4. ``group_batching``: ``--group`` samples of one agent prompt, ``--new-tokens`` each, as G
   separate calls against one call with ``n = G`` (the prefill shared, the decode batched). The
   separate calls use the seeds the batched call gives its rows, so both sides sample the same
   tokens (batch-invariant decoding). Prefix cache off.
5. ``turn_cap``: the untouched model's first turn on each task's agent prompt (it does not
   follow the tool format yet, so it often writes until the cap), with the larger of ``--caps``
   against the smaller as ``max_new_tokens``, stopping at ``<|im_end|>`` / EOS like the agent
   policy; seconds per turn and the share of turns that hit the cap.

6. ``rl_step``: one step of the project's RL loop (``rl.loop.run_rl``, the synchronous source)
   with ``recipes/smollm2-bugs.toml``'s settings: ``--rl-tasks`` freshly generated bug tasks ×
   ``--group`` rollouts (16 episodes by default) sampled, graded in the sandbox and trained on,
   from the untouched model (or ``--policy``, an SFT checkpoint), the recipe's speed-ups off (fp32
   training, no prefix cache, a batch starts without the episodes still in a tool call:
   ``inference.batch_wait_s = 0``) against on. The trainer runs the step's shared prefix once on
   both sides (there is no setting for it). Seconds are the loop's own ``step_s`` (rollouts and
   grading, then the update: ``train_s``); model loading and task generation are not counted.
   Issue 40's target is the second side's seconds: at most 120 on two cores.

Sampling at temperature 1 with fixed seeds (the same in every repeat, so repeats time the same
work). Every measurement runs its two sides interleaved, alternating which goes first, after one
untimed warm-up of each (none in ``--quick``); reported is the median over ``--repeats``.
``--quick`` also cuts the trainer's rows to their first 1,216 positions (the shared system prompt,
the instruction and part of the first turn; ``--row-tokens``), so that a step stays short.
``--clock cpu`` times by the process's CPU time instead of the wall clock (for ``--threads 1``
on a machine other work shares; with more threads it sums theirs).

    .venv/bin/python benchmarks/smollm2_practical.py [--threads 2] [--repeats 3] [--tasks 8] [--batch 4]
        [--new-tokens 48] [--group 4] [--caps 128 512] [--row-tokens 0] [--only bf16,kv_cache] [--clock wall|cpu]
    .venv/bin/python benchmarks/smollm2_practical.py --quick --threads 1   # every row, tiny (~2-3 min)

Writes ``benchmarks/results/smollm2_practical.json`` (``--out``) and prints one table: per
measurement the setting without the speed-up and with it, seconds of each (per step, per
episode's turns, per group, per turn), the speed-up (seconds without / seconds with: above 1 the
second setting is faster) and a note (the accuracy or the work behind the time). Ratios, not
seconds, are what carries over to another machine; the test (``tests/bench``) asserts none of
them.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

MEASUREMENTS = ("bf16", "shared_prefix", "kv_cache", "group_batching", "turn_cap", "rl_step")
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-bugs.toml"
RL_STEP_TARGET_S = 120.0  # issue 40: a SmolLM2 RL step of 16 episodes in two minutes on two cores
CACHE_TOKENS = 16384  # the prefix cache's budget in positions: a whole episode fits
LEARNING_RATE = 2e-5
TRAINER_PAIRS = {"bf16": ("fp32", "bf16"), "shared_prefix": ("bf16, no shared prefix", "bf16")}  # without, with
QUICK = dict(tasks=2, batch=2, new_tokens=8, repeats=1, group=2, caps=[16, 32], row_tokens=1216, rl_tasks=1,
             rl_turns=2)


def _sibling(name: str):
    """Another script of ``benchmarks/`` (not a package), imported for its helpers."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prefix_cache = _sibling("prefix_cache")  # CLOCKS, PrefillTimer, _sync; its ``clock`` is set by --clock
_quick = _sibling("_quick")  # the --quick flag every benchmark has


def clock() -> float:
    return prefix_cache.clock()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Harness(NamedTuple):
    """The model, its tokenizer and the oracle's episodes on freshly generated bug tasks."""

    model: Any
    tokenizer: Any
    episodes: list  # [Episode], one segment each
    pad_id: int


def harness(tasks: int) -> Harness:
    from opencomposer.config import Config, ModelConfig, TasksConfig
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.sft import record_demonstrations
    from opencomposer.tasks.generators.registry import TaskFactory, generate

    model, tokenizer = load_model(ModelConfig(kind="smollm2"), seed=0)
    config = Config()
    config.sft.demonstrations = "explore"  # grep, read, edit, run the tests, finish
    task_config = TasksConfig(multi_bug_fraction=0.0, bug_styles=["function"], max_turns=8)
    with tempfile.TemporaryDirectory(prefix="smollm2-practical-") as folder:
        factory = TaskFactory("bugs", seed=0, split="train", config=task_config, sandbox=config.sandbox)
        made = [r.task for r in generate(factory, tasks, Path(folder)) if r.task is not None]
        if len(made) < tasks:
            raise RuntimeError(f"only {len(made)} of {tasks} bug tasks could be generated")
        episodes = record_demonstrations(made, tokenizer, config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Harness(model, tokenizer, episodes, int(pad_id))


def interleaved(sides: dict[str, Callable[[], dict]], repeats: int, warmup: bool) -> dict[str, list[dict]]:
    """Run every side ``repeats`` times, the order rotating each repeat; each returns a dict with
    its ``seconds`` (and whatever else it measured)."""
    names = list(sides)
    if warmup:
        for run in sides.values():
            run()
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(sides[name]())
    return runs


def median(runs: list[dict], key: str = "seconds") -> float:
    return statistics.median(run[key] for run in runs)


def relative(a: float, b: float) -> float:
    """|a - b| / |b|."""
    return abs(a - b) / abs(b)


def pair(settings: tuple[str, str], runs: dict[str, list[dict]], note: str, **extra: Any) -> dict:
    """One table row: the setting without the speed-up, then with it; speed-up = seconds without / with."""
    seconds = [median(runs[name]) for name in settings]
    return dict(settings=list(settings), seconds=seconds, speedup=seconds[0] / seconds[1], note=note, **extra,
                runs={name: runs[name] for name in settings})


# -- trainer -------------------------------------------------------------------------------------


def trainer_rows(h: Harness, batch: int, row_tokens: int):
    """The first ``batch`` episodes' rows, cut to ``row_tokens`` positions when that is > 0."""
    from opencomposer.training.packing import collate, episode_rows

    rows = episode_rows(h.episodes)[:batch]
    if len(rows) < batch:
        raise ValueError(f"--batch {batch}: only {len(rows)} episode rows (raise --tasks)")
    if row_tokens:
        rows = [replace(row, **{f.name: getattr(row, f.name)[:row_tokens] for f in fields(row)
                                if isinstance(getattr(row, f.name), np.ndarray)}) for row in rows]
    collated = collate(rows, h.pad_id)
    if not collated.loss_mask.any():
        raise ValueError(f"--row-tokens {row_tokens}: the cut rows hold no model token")
    return collated, sum(len(row) for row in rows)


def trainer(h: Harness, args: argparse.Namespace, wanted: set[str]) -> dict[str, dict]:
    """Measurements 1 and 2: the SFT step in the configurations they need, interleaved."""
    from opencomposer.training.forward import shared_prefix_length, token_logprobs
    from opencomposer.training.optim import build_optimizer

    batch, tokens = trainer_rows(h, args.batch, args.row_tokens)
    model = h.model
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = build_optimizer(model, lr=LEARNING_RATE, weight_decay=0.01)
    for parameter in model.parameters():  # a zero-gradient step builds Adam's state before any timing
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    def step(bf16: bool, share_prefix: bool) -> Callable[[], dict]:
        def run() -> dict:
            model.load_state_dict(initial)  # every step from the same weights
            model.train()
            prefix_cache._sync()
            started = clock()
            logprobs, _ = token_logprobs(model, batch, with_entropy=False, bf16=bf16, share_prefix=share_prefix)
            loss = -torch.where(batch.loss_mask, logprobs, 0.0).sum() / batch.loss_mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            prefix_cache._sync()
            seconds = clock() - started
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            return dict(seconds=seconds, loss=float(loss.detach()), grad_norm=float(grad_norm))
        return run

    configs = {"fp32": (False, True), "bf16": (True, True), "bf16, no shared prefix": (True, False)}  # bf16, share
    needed = dict.fromkeys(setting for name, settings in TRAINER_PAIRS.items() if name in wanted for setting in settings)
    runs = interleaved({name: step(*configs[name]) for name in needed}, args.repeats, args.warmup)
    flops = {name: counted_flops(step(*configs[name])) for name in needed}  # what each step computes, untimed
    peak = {dtype: matmul_peak(dtype) for dtype in ("fp32", "bf16")} if "bf16" in wanted else {}
    model.load_state_dict(initial)
    model.eval()
    optimizer.zero_grad(set_to_none=True)
    shape = dict(rows=int(batch.input_ids.shape[0]), padded_length=int(batch.input_ids.shape[1]), tokens=tokens,
                 model_tokens=int(batch.loss_mask.sum()), shared_prefix_tokens=shared_prefix_length(batch))
    out = {}
    for name, settings in TRAINER_PAIRS.items():
        if name not in wanted:
            continue
        losses = [median(runs[s], "loss") for s in settings]
        norms = [median(runs[s], "grad_norm") for s in settings]
        loss_diff, norm_diff = relative(losses[1], losses[0]), relative(norms[1], norms[0])
        note = f"loss {losses[0]:.4f} -> {losses[1]:.4f} ({loss_diff:.1e} rel), grad norm {norm_diff:.1e} rel"
        if "fp32" in runs and "fp32" not in settings:  # how far each side's loss is from the fp32 step's
            fp32 = median(runs["fp32"], "loss")
            to_fp32 = [relative(loss, fp32) for loss in losses]
            note += f"; loss vs fp32 {to_fp32[0]:.1e} / {to_fp32[1]:.1e} rel"
        rates = [flops[s] / median(runs[s]) / 1e12 for s in settings]
        extra: dict[str, Any] = {}
        if name == "bf16":  # each side against the machine's matrix product in its own precision
            fractions = [rate / peak[dtype] for rate, dtype in zip(rates, ("fp32", "bf16"))]
            note += (f"; {rates[0]:.3f} / {rates[1]:.3f} TFLOP/s = {fractions[0]:.0%} / {fractions[1]:.0%} of "
                     f"the fp32 / bf16 matrix product ({peak['fp32']:.3f} / {peak['bf16']:.3f})")
            extra = dict(matmul_peak_tflops=peak, fraction_of_peak=fractions)
        out[name] = pair(settings, runs, note, flops=[flops[s] for s in settings], tflops_per_second=rates, **extra,
                         tokens_per_second=[tokens / s for s in (median(runs[n]) for n in settings)],
                         loss=losses, grad_norm=norms, loss_rel_diff=loss_diff, grad_norm_rel_diff=norm_diff,
                         batch=shape)
    return out


def counted_flops(run: Callable[[], dict]) -> float:
    """The floating-point operations one step computes (forward, backward, the optimizer's products
    are none), as ``torch.utils.flop_counter`` counts its matrix products and attention: what the
    step does, so the shared prefix computed once counts once and the vocabulary projection only
    where a position is scored (not the 6·N·T of a model-FLOPs account)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return float(counter.get_total_flops())


def matmul_peak(dtype: str, seconds: float = 2.0) -> float:
    """TFLOP/s of one matrix product at the model's MLP shape (2,048 positions × 576 → 1,536), on
    this process's threads and clock: the rate a step made of such products could reach."""
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2048, 576, generator=generator).to(kind)
    b = torch.randn(576, 1536, generator=generator).to(kind)
    for _ in range(3):
        a @ b
    started, products = clock(), 0
    while clock() - started < seconds:
        a @ b
        products += 1
    return products * 2 * 2048 * 576 * 1536 / (clock() - started) / 1e12


# -- sampler -------------------------------------------------------------------------------------


def turn_contexts(episode) -> list[list[int]]:
    """The context before each model turn of a recorded episode: the prompt, then every earlier
    turn and its tool output."""
    segment = episode.segments[0]
    ids, contexts = list(segment.prompt_ids), []
    for turn in segment.turns:
        contexts.append(list(ids))
        ids += list(turn.token_ids) + list(turn.observation_ids)
    return contexts


def timed_generate(engine, prompts: list[list[int]], params, **kwargs) -> tuple[list, float]:
    prefix_cache._sync()
    started = clock()
    completions = engine.generate(prompts, params, **kwargs)
    prefix_cache._sync()
    return completions, clock() - started


def kv_cache(h: Harness, args: argparse.Namespace) -> dict:
    """Measurement 3: each turn of the first episode, the engine's prefix cache off against on."""
    from opencomposer.inference import LocalEngine, SamplingParams

    contexts = turn_contexts(h.episodes[0])
    engines = {"cache off": LocalEngine(h.model, h.tokenizer),
               "cache on": LocalEngine(h.model, h.tokenizer, prefix_cache_tokens=CACHE_TOKENS)}

    def chain(engine) -> Callable[[], dict]:
        def run() -> dict:
            if engine.prefix_cache is not None:
                engine.prefix_cache.invalidate()  # every repeat starts cold
            before = replace(engine.stats)
            seconds, sampled = 0.0, []
            timer = prefix_cache.PrefillTimer()
            with timer.active():
                for turn, context in enumerate(contexts):
                    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=1000 + turn,
                                            ignore_eos=True)
                    [completion], spent = timed_generate(engine, [context], params)
                    seconds += spent
                    sampled.append(completion.token_ids)
            return dict(seconds=seconds, prefill_seconds=timer.seconds, sampled=sampled,
                        prefill_tokens=engine.stats.prefill_tokens - before.prefill_tokens,
                        prefill_tokens_reused=engine.stats.prefill_tokens_reused - before.prefill_tokens_reused)
        return run

    with torch.inference_mode():
        runs = interleaved({name: chain(engine) for name, engine in engines.items()}, args.repeats, args.warmup)
    settings = ("cache off", "cache on")
    same = all(a["sampled"] == b["sampled"] for a, b in zip(runs[settings[0]], runs[settings[1]]))
    prefilled = [median(runs[s], "prefill_tokens") for s in settings]
    for side in runs.values():
        for run in side:
            del run["sampled"]
    return pair(settings, runs, f"prefill {prefilled[0]:.0f} -> {prefilled[1]:.0f} tokens, same tokens: "
                                f"{'yes' if same else 'no'}",
                turns=len(contexts), context_tokens=[len(c) for c in contexts], new_tokens=args.new_tokens,
                prefill_tokens=prefilled, prefill_seconds=[median(runs[s], "prefill_seconds") for s in settings],
                same_tokens=same)


def group_batching(h: Harness, args: argparse.Namespace) -> dict:
    """Measurement 4: G samples of one agent prompt, G calls against one call with ``n = G``."""
    from opencomposer.inference import LocalEngine, SamplingParams
    from opencomposer.inference.local import row_seed

    prompt = list(h.episodes[0].segments[0].prompt_ids)
    engine = LocalEngine(h.model, h.tokenizer)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=2000, ignore_eos=True)

    def separate() -> dict:
        seconds, sampled = 0.0, []
        for sample in range(args.group):
            [completion], spent = timed_generate(engine, [prompt], params, row_seeds=[row_seed(params.seed, 0, sample)])
            seconds += spent
            sampled.append(completion.token_ids)
        return dict(seconds=seconds, sampled=sampled)

    def batched() -> dict:
        completions, seconds = timed_generate(engine, [prompt], params, n=args.group)
        return dict(seconds=seconds, sampled=[c.token_ids for c in completions])

    with torch.inference_mode():
        runs = interleaved({"G separate calls": separate, "one call, n = G": batched}, args.repeats, args.warmup)
    settings = ("G separate calls", "one call, n = G")
    same = all(a["sampled"] == b["sampled"] for a, b in zip(runs[settings[0]], runs[settings[1]]))
    for side in runs.values():
        for run in side:
            del run["sampled"]
    return pair(settings, runs, f"G = {args.group}, {args.new_tokens} tokens each, same samples: "
                                f"{'yes' if same else 'no'}",
                group=args.group, prompt_tokens=len(prompt), new_tokens=args.new_tokens, same_tokens=same)


def turn_cap(h: Harness, args: argparse.Namespace) -> dict:
    """Measurement 5: the untouched model's first turn on every task, the larger cap against the smaller."""
    from opencomposer.inference import LocalEngine, SamplingParams
    from opencomposer.model.tokenizer import stop_token_ids

    prompts = [list(episode.segments[0].prompt_ids) for episode in h.episodes]
    engine = LocalEngine(h.model, h.tokenizer)
    stops = stop_token_ids(h.tokenizer)
    small, large = sorted(args.caps)

    def turns(cap: int) -> Callable[[], dict]:
        def run() -> dict:
            seconds, hits, tokens = 0.0, 0, 0
            for index, prompt in enumerate(prompts):
                params = SamplingParams(max_new_tokens=cap, temperature=1.0, seed=3000 + index, stop_token_ids=stops)
                [completion], spent = timed_generate(engine, [prompt], params)
                seconds += spent
                hits += completion.finish_reason == "length"
                tokens += len(completion.token_ids)
            return dict(seconds=seconds / len(prompts), cap_hit_share=hits / len(prompts),
                        tokens_per_turn=tokens / len(prompts))
        return run

    settings = (f"cap {large}", f"cap {small}")
    with torch.inference_mode():
        runs = interleaved({settings[0]: turns(large), settings[1]: turns(small)}, args.repeats, args.warmup)
    shares = [median(runs[s], "cap_hit_share") for s in settings]
    lengths = [median(runs[s], "tokens_per_turn") for s in settings]
    return pair(settings, runs, f"cap hit {shares[0]:.2f} / {shares[1]:.2f}, tokens/turn "
                                f"{lengths[0]:.0f} / {lengths[1]:.0f}",
                caps=[large, small], turns=len(prompts), cap_hit_share=shares, tokens_per_turn=lengths)


# -- the RL step ---------------------------------------------------------------------------------


def rl_step(args: argparse.Namespace) -> dict:
    """Measurement 6: one step of the RL loop on fresh bug tasks, the recipe's speed-ups off against on."""
    from opencomposer.config import load_recipe
    from opencomposer.rl.loop import run_rl
    from opencomposer.tasks.generators.registry import TaskFactory, generate
    from opencomposer.training.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="smollm2-rl-step-") as folder:
        root = Path(folder)
        base = load_recipe(RECIPE, [f"tasks.max_turns={args.rl_turns}"])  # a task's turn limit is written with it
        factory = TaskFactory("bugs", seed=1, split="train", config=base.tasks, sandbox=base.sandbox)
        made = [r.task for r in generate(factory, args.rl_tasks, root / "tasks") if r.task is not None]
        if len(made) < args.rl_tasks:
            raise RuntimeError(f"only {len(made)} of {args.rl_tasks} bug tasks could be generated")
        model = [f"model.path={args.policy}"] if args.policy else ["model.kind=smollm2", "model.path="]
        common = [*model, f"run.out_dir={root}", f"run.threads={args.threads}", f"rl.train_tasks={root / 'tasks'}",
                  "rl.eval_suite=", "rl.eval_every=0", "rl.steps=1", f"rl.batch_tasks={args.rl_tasks}",
                  f"rl.group_size={args.group}", "rl.checkpoint_every=1"]
        if args.quick:
            common.append(f"sampling.max_new_tokens={args.new_tokens}")
        sides = {"fp32, no prefix cache, no batch wait": ["rl.bf16=false", "inference.prefix_cache_tokens=0",
                                                           "inference.batch_wait_s=0"],
                 "the recipe": []}
        count = itertools.count()

        def side(overrides: list[str]) -> Callable[[], dict]:
            def run() -> dict:
                name = f"step-{next(count)}"
                run_rl(load_recipe(RECIPE, [*common, f"run.name={name}", *overrides]), progress=False)
                [row] = read_metrics(root / name, "train")
                return dict(seconds=row["step_s"], train_s=row["train_s"], rollout_s=row["step_s"] - row["train_s"],
                            episodes=args.rl_tasks * args.group, episode_tokens=row["episode_tokens"],
                            episode_turns=row["episode_turns"], reward=row["reward_mean"],
                            engine_calls=row.get("engine_calls"), engine_rows=row.get("engine_rows"))
            return run

        runs = interleaved({name: side(overrides) for name, overrides in sides.items()}, args.repeats, warmup=False)
    settings = tuple(sides)
    rollout_s = [median(runs[s], "rollout_s") for s in settings]
    train_s = [median(runs[s], "train_s") for s in settings]
    with_s = median(runs[settings[1]])
    tokens = median(runs[settings[1]], "episode_tokens")
    note = (f"{args.rl_tasks * args.group} episodes, {tokens:.0f} model tokens each: rollouts+grading "
            f"{rollout_s[0]:.0f} / {rollout_s[1]:.0f} s, "
            f"update {train_s[0]:.0f} / {train_s[1]:.0f} s; target <= {RL_STEP_TARGET_S:.0f} s "
            f"({'met' if with_s <= RL_STEP_TARGET_S else 'not met'})")
    return pair(settings, runs, note, rollout_s=rollout_s, train_s=train_s, target_s=RL_STEP_TARGET_S,
                episodes=args.rl_tasks * args.group, episode_tokens=tokens,
                policy=args.policy or "untouched SmolLM2-135M-Instruct")


# -- report --------------------------------------------------------------------------------------


def print_table(measurements: dict[str, dict]) -> None:
    header = (f"{'measurement':<15} {'without':<24} {'with':<16} {'s without':>10} {'s with':>9} "
              f"{'speed-up':>9}  note")
    print(header)
    print("-" * len(header))
    for name, row in measurements.items():
        without, with_ = row["settings"]
        print(f"{name:<15} {without:<24} {with_:<16} {row['seconds'][0]:>10.3f} {row['seconds'][1]:>9.3f} "
              f"{row['speedup']:>8.2f}x  {row['note']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=8, help="bug tasks generated, one oracle episode each")
    parser.add_argument("--batch", type=int, default=4, help="episode rows per trainer step")
    parser.add_argument("--row-tokens", type=int, default=0,
                        help="cut every trainer row to its first N positions (0: whole episodes)")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens sampled per turn (kv_cache) and per sample (group_batching)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (group_batching)")
    parser.add_argument("--caps", type=int, nargs=2, default=[128, 512], help="the two per-turn token caps")
    parser.add_argument("--rl-tasks", type=int, default=4, help="tasks of the RL step (x --group episodes)")
    parser.add_argument("--rl-turns", type=int, default=8, help="the RL step's tasks.max_turns (the recipe's 8)")
    parser.add_argument("--policy", default="", help="rl_step: a checkpoint to start from (default: the untouched model)")
    parser.add_argument("--only", default=",".join(MEASUREMENTS), help="comma list of: " + ", ".join(MEASUREMENTS))
    parser.add_argument("--clock", choices=tuple(prefix_cache.CLOCKS), default="wall",
                        help="wall clock, or the process's CPU time (one thread, shared machine)")
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/smollm2_practical.json)")
    args = _quick.parse_args(parser, QUICK, argv)
    if args.out is None:
        args.out = args.results_dir / "smollm2_practical.json"
    args.warmup = not args.quick  # and no warm-up
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(args.only) - set(MEASUREMENTS))
    if unknown:
        parser.error(f"--only: unknown measurement(s) {unknown}; expected some of {list(MEASUREMENTS)}")
    if args.batch > args.tasks:
        parser.error(f"--batch {args.batch} needs at least as many --tasks (got {args.tasks})")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    prefix_cache.clock = prefix_cache.CLOCKS[args.clock]
    torch.manual_seed(0)
    started = time.perf_counter()
    measurements: dict[str, dict] = {}
    wanted = set(args.only)
    data: dict[str, Any] = {}
    if wanted - {"rl_step"}:  # the oracle's episodes; the RL step makes its own
        h = harness(args.tasks)
        log(f"{len(h.episodes)} oracle episodes on generated bug tasks ({time.perf_counter() - started:.0f} s)")
        data = dict(episodes=len(h.episodes), episode_tokens=[len(e.segments[0].token_ids()) for e in h.episodes],
                    prompt_tokens=[len(e.segments[0].prompt_ids) for e in h.episodes],
                    turns=[len(e.turns) for e in h.episodes], seconds=time.perf_counter() - started)
    if wanted & set(TRAINER_PAIRS):
        measurements.update(trainer(h, args, wanted))
        log(f"trainer steps: {', '.join(sorted(wanted & set(TRAINER_PAIRS)))} ({time.perf_counter() - started:.0f} s)")
    for name, measure in (("kv_cache", kv_cache), ("group_batching", group_batching), ("turn_cap", turn_cap)):
        if name in wanted:
            measurements[name] = measure(h, args)
            log(f"{name} ({time.perf_counter() - started:.0f} s)")
    if "rl_step" in wanted:
        measurements["rl_step"] = rl_step(args)
        log(f"rl_step ({time.perf_counter() - started:.0f} s)")
    measurements = {name: measurements[name] for name in MEASUREMENTS if name in measurements}
    print_table(measurements)
    results = dict(args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                   torch_threads=torch.get_num_threads(), clock=args.clock, data=data, measurements=measurements,
                   seconds=time.perf_counter() - started)
    if not all(math.isfinite(row["speedup"]) for row in measurements.values()):
        raise RuntimeError(f"a ratio is not finite: { {k: v['speedup'] for k, v in measurements.items()} }")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
