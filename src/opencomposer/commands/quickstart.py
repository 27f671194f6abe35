"""``opencomposer quickstart``: the pipeline on a tiny MoE on CPU, in minutes.

The stages, each with a progress bar, all under ``{run.out_dir}/{run.name}`` (``runs/quickstart``):

1. **pretrain**: gather the code corpus, train the tokenizer, pretrain the tiny Qwen3-MoE while the
   loss falls, show sampled completions, save ``checkpoint/`` (plain transformers loads it);
2. **sft**: the oracle plays the recipe's task family in the real harness and the pretrained model
   learns its turns (``sft/``), so that it solves the tasks some of the time;
3. **rl**: the synchronous RL loop in the harness, from the SFT checkpoint, evaluating the held-out
   split before, during and after (``rl/``; a rerun starts this stage afresh);
4. **report**: the RL curves as PNG (``rl/report.png``) and the held-out pass rate before and after.

Stages 2-4 run when the recipe names a task family (``sft.task_family``) and ``rl.steps > 0``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import replace
from pathlib import Path

from opencomposer.commands import load_recipe_or_packaged
from opencomposer.config import Config

DEFAULT_RECIPE = "quickstart.toml"  # shipped in opencomposer/recipes/


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    config = load_recipe_or_packaged(args.recipe, args.overrides, default=DEFAULT_RECIPE)
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
    if config.sft.task_family and config.rl.steps > 0:
        _sft_rl_report(config, Path(checkpoint), console)
    console.print(f"done in {time.perf_counter() - started:.0f} s")
    return 0 if falling else 1


def stage_configs(config: Config, checkpoint: Path) -> tuple[Config, Config]:
    """The SFT and RL recipes of stages 2 and 3, derived from the quickstart recipe: SFT fine-tunes
    the pretrained ``checkpoint`` into ``{run}/sft``; RL starts from there and runs in ``{run}/rl``."""
    run_dir = config.run.path
    sft = replace(config, sft=replace(config.sft, init=str(checkpoint), out=str(run_dir / "sft")))
    rl = replace(
        config,
        model=replace(config.model, kind="hf", path=str(run_dir / "sft")),
        run=replace(config.run, out_dir=str(run_dir), name="rl"),
        rl=replace(config.rl, task_family=config.rl.task_family or config.sft.task_family),
    )
    return sft, rl


def _sft_rl_report(config: Config, checkpoint: Path, console) -> None:
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl
    from opencomposer.rl.report import draw_report

    sft_config, rl_config = stage_configs(config, checkpoint)
    console.rule(f"[bold]SFT on oracle episodes of the {config.sft.task_family!r} task family")
    _, _, result, sft_out = run_sft(sft_config)
    console.print(f"{result.steps} steps on {result.demonstrations} demonstrations, loss {result.first_loss:.3f} → "
                  f"{result.last_loss:.3f}, {result.seconds:.0f} s; checkpoint: {sft_out}")
    console.rule(f"[bold]RL: {rl_config.rl.steps} steps × {rl_config.rl.batch_tasks} tasks × "
                 f"{rl_config.rl.group_size} rollouts in the sandboxed harness")
    shutil.rmtree(rl_config.run.path, ignore_errors=True)  # a rerun of the demo starts RL afresh
    summary = run_rl(rl_config)
    paths = draw_report(summary.run_dir)
    first, last = summary.first_eval, summary.last_eval
    if first and last:
        k = int(last["k"])
        console.print(f"held-out pass@1 {first['pass_at_1']:.3f} → {last['pass_at_1']:.3f}, best-of-{k} "
                      f"{first['best_of_k']:.3f} → {last['best_of_k']:.3f}, mean reward "
                      f"{first['mean_reward']:.3f} → {last['mean_reward']:.3f} ({summary.seconds:.0f} s)")
    console.print(f"RL run:  {summary.run_dir}\nreport:  {paths[-1]}\nmodel:   {summary.run_dir / 'checkpoints'}")


def _pretrain(config: Config, console):
    from opencomposer.model.loading import parameter_counts
    from opencomposer.pretrain.cpt import run_pretraining

    with console.status("gathering the corpus and training the tokenizer ..."):
        from opencomposer.model.corpus import build_corpus
        from opencomposer.model.loading import default_tokenizer

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
