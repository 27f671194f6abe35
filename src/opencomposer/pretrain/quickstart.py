"""``opencomposer quickstart``: the pipeline on a tiny MoE on CPU, in minutes.

Today it runs the first stage end to end: gather the code corpus, train the tokenizer, pretrain the
tiny Qwen3-MoE with a progress bar while the loss falls, show sampled completions from the
in-process sampler, and save a checkpoint that plain transformers loads. Later stages (SFT, RL,
evaluation, report) attach here as they land.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opencomposer.config import Config, load_recipe

DEFAULT_RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "quickstart.toml"


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    recipe = args.recipe or (DEFAULT_RECIPE if DEFAULT_RECIPE.is_file() else None)
    config = load_recipe(recipe, ["run.name=quickstart", *args.overrides] if recipe is None else args.overrides)
    console = Console()
    console.rule("[bold]opencomposer quickstart")
    started = time.perf_counter()
    model, tokenizer, result, checkpoint = _pretrain(config, console)

    table = Table(title="loss (nats/token)")
    for column in ("step", "tokens", "train", "held-out"):
        table.add_column(column, justify="right")
    for row in result.history:
        table.add_row(
            str(row["step"]),
            f"{row.get('tokens', result.tokens):,}",
            f"{row['loss']:.3f}",
            f"{row['heldout_loss']:.3f}" if "heldout_loss" in row else "",
        )
    console.print(table)
    falling = result.last_loss < result.first_loss
    console.print(
        f"loss {result.first_loss:.3f} → {result.last_loss:.3f} "
        + ("[green](falling)" if falling else "[red](not falling)")
        + f" over {result.steps} steps, {result.tokens:,} tokens, {result.seconds:.0f} s"
    )
    _show_samples(model, tokenizer, config, console)
    run_dir = config.run.path
    console.print(
        f"\ncheckpoint: {checkpoint}\nmetrics:    {run_dir / 'metrics.jsonl'}\n"
        f"plot:       {run_dir / 'loss.png'}\nrecipe:     {run_dir / 'recipe.toml'}"
    )
    console.print(f"done in {time.perf_counter() - started:.0f} s")
    return 0 if falling else 1


def _pretrain(config: Config, console):
    from opencomposer.model.loading import parameter_counts
    from opencomposer.pretrain.cpt import run_pretraining

    with console.status("gathering the corpus and training the tokenizer ..."):
        from opencomposer.model.loading import default_tokenizer
        from opencomposer.pretrain.corpus import build_corpus

        corpus = build_corpus(config.corpus, seed=config.run.seed)
        tokenizer = default_tokenizer(config.corpus, config.tokenizer, config.run.seed)
    sample = corpus.train[:50]
    tokens = sum(len(tokenizer.encode(f.text)) for f in sample)
    console.print(
        f"corpus: {len(corpus.train):,} training files, {len(corpus.heldout):,} held out, "
        f"{corpus.num_bytes / 1e6:.1f} MB; tokenizer: {len(tokenizer):,} tokens, "
        f"{sum(len(f.text.encode()) for f in sample) / tokens:.2f} bytes/token"
    )
    model, tokenizer, result, checkpoint = run_pretraining(config, corpus, tokenizer)
    counts = parameter_counts(model)
    console.print(
        f"model: {type(model).__name__}, {counts['total'] / 1e6:.2f} M parameters "
        f"({counts['active'] / 1e6:.2f} M active per token)"
    )
    return model, tokenizer, result, checkpoint


def _show_samples(model, tokenizer, config: Config, console) -> None:
    from rich.panel import Panel

    from opencomposer.inference import LocalEngine, SamplingParams

    engine = LocalEngine(model, tokenizer)
    prompts = [tokenizer.encode(p) for p in config.pretrain.sample_prompts]
    params = SamplingParams(
        max_new_tokens=config.sampling.max_new_tokens,
        temperature=config.sampling.temperature,
        top_p=config.sampling.top_p,
        top_k=config.sampling.top_k,
        seed=config.run.seed,
    )
    for prompt_text, completion in zip(config.pretrain.sample_prompts, engine.generate(prompts, params)):
        console.print(Panel(prompt_text + completion.text, title="sample", expand=False))
