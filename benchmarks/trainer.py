"""Training throughput of one RL step: opencomposer's trainer against TRL's ``GRPOTrainer`` loss step.

Both sides train the same model on the same batch: B prompts × G completions, every prompt made of
a system prefix shared by all (an agent harness's system prompt and tool list) plus a short
instruction of its own, every completion C tokens. Both take one Adam step per batch with the KL
term off, and with a loss that sums per-token terms over a constant (ours: the Composer loss;
TRL: ``loss_type = "dr_grpo"``). Timed: forward (log-probs and entropy), loss, backward, optimizer
step. Not timed: generation, rewards, the reference model.

    .venv/bin/pip install -e ".[bench]"     # TRL, pinned; it leaves torch 2.13.0 alone (`make bench` does it)
    .venv/bin/python benchmarks/trainer.py [--threads 1] [--steps 5]
    .venv/bin/python benchmarks/trainer.py --quick    # seconds; without TRL installed, ours only

Prints tokens per second (prompt + completion tokens of the batch, per second of step) for ours,
ours without the shared-prefix forward, and TRL twice: as ``GRPOConfig`` ships (gradient
checkpointing on) and with gradient checkpointing off (faster when memory allows). The ratio is
taken against the faster TRL configuration. The target is >= 1.5x TRL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _quick import parse_args

QUICK = {"prompts": 1, "group": 2, "prefix": 32, "instruction": 8, "completion": 16, "hidden": 32, "layers": 1,
         "experts": 2, "steps": 1}


def build_model(args):
    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import default_tokenizer, load_model

    spec = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, head_dim=args.hidden // 4,
                       num_experts=args.experts, moe_intermediate_size=args.hidden)
    return load_model(spec, default_tokenizer(), seed=0)


def synthetic_batch(args):
    """prompt ids [B*G, P], completion ids [B*G, C], advantages [B*G] (group-centred)."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(10, 4000, args.prefix)
    prompts = [np.concatenate([prefix, rng.integers(10, 4000, args.instruction)]) for _ in range(args.prompts)]
    prompt_ids = np.stack([prompts[i // args.group] for i in range(args.prompts * args.group)])
    completion_ids = rng.integers(10, 4000, (args.prompts * args.group, args.completion))
    rewards = rng.random((args.prompts, args.group))
    advantages = (rewards - rewards.mean(1, keepdims=True)).reshape(-1)
    return prompt_ids, completion_ids, advantages


def time_steps(step, steps: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours(model, tokenizer, batch, args, share_prefix: bool) -> float:
    import opencomposer.rl.step as step_module
    from opencomposer.config import RLConfig
    from opencomposer.rl.step import train_step
    from opencomposer.training.forward import token_logprobs
    from opencomposer.training.optim import build_optimizer
    from opencomposer.training.packing import SequenceRow, collate, micro_batches

    prompt_ids, completion_ids, advantages = batch
    rows = []
    for i in range(len(prompt_ids)):
        ids = np.concatenate([prompt_ids[i], completion_ids[i]])
        mask = np.zeros(len(ids), dtype=bool)
        mask[len(prompt_ids[i]):] = True
        rows.append(SequenceRow(i // args.group, ids[:-1], ids[1:], mask[1:], np.zeros(len(ids) - 1, np.float32),
                                float(advantages[i])))
    config = RLConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens)
    config.kl.reference, config.kl.coef = "none", 0.0
    batches = [collate(chunk, 0) for chunk in micro_batches(rows, config.micro_batch_tokens)]
    optimizer = build_optimizer(model, lr=config.lr, betas=tuple(config.adam_betas), eps=config.adam_eps)
    original = step_module.token_logprobs

    def forward(model, batch, **kwargs):  # train_step chooses share_prefix itself: this side's choice replaces it
        return original(model, batch, **{**kwargs, "share_prefix": share_prefix})

    step_module.token_logprobs = forward
    try:
        return time_steps(lambda: train_step(model, optimizer, batches, config), args.steps)
    finally:
        step_module.token_logprobs = token_logprobs


def trl(model, tokenizer, batch, args, checkpointing: bool) -> float:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompt_ids, completion_ids, advantages = batch
    n = len(prompt_ids)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=n, num_generations=args.group,
            max_completion_length=args.completion, beta=0.0, loss_type="dr_grpo", learning_rate=1e-6,
            report_to=[], use_cpu=True, bf16=False, logging_steps=10_000, save_strategy="no",
            gradient_accumulation_steps=1, optim="adamw_torch", weight_decay=0.0,
            gradient_checkpointing=checkpointing,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=config,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * n}), processing_class=tokenizer,
        )
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a full run
        policy = trainer.model
        policy.train()
        inputs = {
            "prompt_ids": torch.from_numpy(prompt_ids), "prompt_mask": torch.ones(prompt_ids.shape, dtype=torch.long),
            "completion_ids": torch.from_numpy(completion_ids),
            "completion_mask": torch.ones(completion_ids.shape, dtype=torch.long),
            "advantages": torch.from_numpy(advantages).float(), "num_items_in_batch": torch.tensor(float(completion_ids.size)),
        }

        def step():
            loss = trainer.compute_loss(policy, inputs)
            loss.backward()
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        return time_steps(step, args.steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="B: prompts per batch")
    parser.add_argument("--group", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--prefix", type=int, default=1024, help="tokens of the shared system prefix")
    parser.add_argument("--instruction", type=int, default=64, help="tokens of each prompt's own part")
    parser.add_argument("--completion", type=int, default=128, help="C: tokens per completion")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=1 << 20, help="ours: one micro-batch by default")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (median reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parse_args(parser, QUICK)
    try:
        import trl as trl_package
    except ImportError:
        if not args.quick:
            print('TRL is not installed: .venv/bin/pip install -e ".[bench]" (or run `make bench`)', file=sys.stderr)
            return 2
        trl_package = None
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = synthetic_batch(args)
    tokens = batch[0].size + batch[1].size
    results = {}
    trl_sides = {"TRL (default config)": True, "TRL, no grad. checkpointing": False} if trl_package else {}
    for name in ("ours", "ours, no shared prefix", *trl_sides):
        model, tokenizer = build_model(args)  # a fresh copy per side: same weights, fresh optimizer
        if name in trl_sides:
            seconds = trl(model, tokenizer, batch, args, checkpointing=trl_sides[name])
        else:
            seconds = ours(model, tokenizer, batch, args, share_prefix=name == "ours")
        results[name] = seconds
    trl_version = trl_package.__version__ if trl_package else "not installed"
    print(f"torch {torch.__version__}, TRL {trl_version}, {torch.get_num_threads()} threads; "
          f"batch {args.prompts} prompts x {args.group} completions, prompt {args.prefix}+{args.instruction}, "
          f"completion {args.completion} tokens ({tokens:,} tokens/step)")
    for name, seconds in results.items():
        print(f"  {name:<24} {seconds * 1000:9.1f} ms/step  {tokens / seconds:10,.0f} tokens/s")
    ratio = None
    if trl_sides:
        fastest_trl = min(results[name] for name in trl_sides)
        ratio = fastest_trl / results["ours"]
        print(f"ours / TRL throughput (against TRL's faster configuration): {ratio:.2f}x (target >= 1.5x); "
              f"without the shared prefix: {fastest_trl / results['ours, no shared prefix']:.2f}x")
    if args.json:
        record = {"torch": torch.__version__, "trl": trl_version, "threads": torch.get_num_threads(),
                  "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  "tokens_per_step": int(tokens),
                  "seconds_per_step": results, "ratio_vs_fastest_trl": ratio}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
