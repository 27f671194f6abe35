"""``opencomposer quickstart``: the pipeline on a tiny MoE on CPU, in minutes.

The stages, each with a progress bar (plain lines when stdout is not a terminal), all under
``{run.out_dir}/{run.name}`` (``runs/quickstart``):

1. **pretrain**: gather the code corpus, train the tokenizer, pretrain the tiny Qwen3-MoE while the
   loss falls, show sampled completions, save ``checkpoint/`` (plain transformers loads it);
2. **sft**: the oracle plays the recipe's task family in the real harness and the pretrained model
   learns its turns (``sft/``); with the packaged recipe the teacher is imperfect (half of its
   demonstrations write a decoy word), so that the SFT model solves about half of the tasks;
3. **rl**: the synchronous RL loop in the harness, from the SFT checkpoint, evaluating the held-out
   split before, during and after (``rl/``; a rerun starts this stage afresh);
4. **report**: the RL curves as PNG (``rl/report.png``), the held-out pass rate before and after,
   and ``report.html``: every stage on one self-contained page (images embedded), with the hack
   monitor's rate and every flagged episode's reasons and diff (``rl.report.hack_monitor_section``).

Stages 2-3 run when the recipe names a task family (``sft.task_family``) and ``rl.steps > 0``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import replace
from pathlib import Path

from opencomposer.config import Config, load_recipe, to_toml

DEFAULT_RECIPE = "quickstart.toml"  # shipped in opencomposer/recipes/


def _cost_sections(report, run_dir: Path) -> None:
    """What each stage cost (its ``cost.json``, ``training.cost``): pretraining in the run folder,
    SFT in ``sft/`` and RL in ``rl/``; the formula once, after them."""
    import json

    from opencomposer.training.cost import COST_FILE, FORMULA, cost_rows

    stages = [(name, folder / COST_FILE) for name, folder in
              (("pretraining", run_dir), ("SFT", run_dir / "sft"), ("RL", run_dir / "rl"))]
    stages = [(name, path) for name, path in stages if path.is_file()]
    if not stages:
        return
    report.section("cost", "Cost")
    for name, path in stages:
        report.text(f"{name} ({path}):")
        report.table(["quantity", "value"], cost_rows(json.loads(path.read_text())))
    report.code(FORMULA, caption="How it is computed (opencomposer.training.cost)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from opencomposer.training.html import HtmlReport

    config = load_recipe(args.recipe, args.overrides, packaged=DEFAULT_RECIPE)
    console = Console(soft_wrap=True)  # paths and long lines stay whole, to copy from a log
    console.rule("[bold]opencomposer quickstart")
    started = time.perf_counter()
    run_dir = config.run.path
    report = HtmlReport(f"opencomposer quickstart: {run_dir}")
    report.section("pretrain", "1. Pretraining")
    model, tokenizer, result, checkpoint = _pretrain(config, console, report)

    header = ["step", "tokens", "train", "held-out"]
    rows = _loss_rows(result.history, config.pretrain.log_every)
    table = Table(title="loss (nats/token)")
    for column in header:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    falling = result.last_loss < result.first_loss
    loss_line = (f"loss {result.first_loss:.3f} → {result.last_loss:.3f} over {result.steps} steps, "
                 f"{result.tokens:,} tokens, {result.seconds:.0f} s")
    console.print(loss_line.replace(" over", " [green](falling)[/] over" if falling else " [red](not falling)[/] over"))
    report.text(loss_line + (" (falling)" if falling else " (not falling)"))
    report.image(run_dir / "loss.png", "pretraining loss")
    report.table([*header[:2], "train loss", "held-out loss"], rows)

    report.section("samples", "Sampled completions")
    report.text("The pretrained model continues each prompt (in-process sampler, the recipe's [sampling]).")
    for prompt, completion in _show_samples(model, tokenizer, config, console):
        report.code(prompt + completion, caption=repr(prompt))
    console.print(
        f"\ncheckpoint: {checkpoint}\nmetrics:    {run_dir / 'metrics.jsonl'}\n"
        f"plot:       {run_dir / 'loss.png'}\nrecipe:     {run_dir / 'recipe.toml'}"
    )
    if config.sft.task_family and config.rl.steps > 0:
        _sft_rl_report(config, Path(checkpoint), console, report)
    _cost_sections(report, run_dir)
    seconds = time.perf_counter() - started
    report.section("recipe", "Recipe")
    report.text(f"The whole run took {seconds:.0f} s. Resolved recipe ({run_dir / 'recipe.toml'}):")
    report.code(to_toml(config))
    page = report.write(run_dir / "report.html")
    console.print(f"report:  {page}\ndone in {seconds:.0f} s")
    return 0 if falling else 1


def _loss_rows(history: list[dict], every: int) -> list[list[str]]:
    """The loss table: the training loss at the first step, every ``every`` steps and the last,
    and at each step with an evaluation, beside its held-out loss."""
    held = {row["step"]: row["heldout_loss"] for row in history if "heldout_loss" in row}
    train = [row for row in history if row["kind"] == "train"]
    shown = [row for row in train if row["step"] == 1 or row["step"] % every == 0 or row["step"] in held
             or row is train[-1]]
    return [[str(row["step"]), f"{row['tokens']:,}", f"{row['loss']:.3f}",
             f"{held[row['step']]:.3f}" if row["step"] in held else ""] for row in shown]


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


def _sft_rl_report(config: Config, checkpoint: Path, console, report) -> None:
    from opencomposer.pretrain.plots import plot_loss
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl
    from opencomposer.rl.report import draw_report, hack_monitor_section

    sft_config, rl_config = stage_configs(config, checkpoint)
    sft = config.sft
    console.rule(f"[bold]SFT on oracle episodes of the {sft.task_family!r} task family")
    _, _, result, sft_out = run_sft(sft_config)
    sft_line = (f"{result.steps} steps on {result.demonstrations} demonstrations, loss {result.first_loss:.3f} → "
                f"{result.last_loss:.3f}, {result.seconds:.0f} s")
    console.print(f"{sft_line}; checkpoint: {sft_out}")
    report.section("sft", "2. SFT")
    teacher = (f"; {sft.wrong_share:.0%} of the demonstrations write the decoy {sft.decoy_word!r} instead of the "
               f"word asked for (an imperfect teacher), so the model learns to be right about "
               f"{1 - sft.wrong_share:.0%} of the time" if sft.wrong_share else "")
    report.text(f"The oracle plays tasks of the {sft.task_family!r} family in the sandboxed harness and the "
                f"pretrained model learns its turns{teacher}. {sft_line}.")
    report.image(plot_loss(result.history, config.run.path / "sft-loss.png", title="SFT loss"), "SFT loss")

    rl = rl_config.rl
    console.rule(f"[bold]RL: {rl.steps} steps × {rl.batch_tasks} tasks × {rl.group_size} rollouts "
                 f"in the sandboxed harness")
    shutil.rmtree(rl_config.run.path, ignore_errors=True)  # a rerun of the demo starts RL afresh
    summary = run_rl(rl_config)
    paths = draw_report(summary.run_dir)
    report.section("rl", "3. RL")
    report.text(f"{rl.steps} steps of {rl.batch_tasks} tasks × {rl.group_size} rollouts in the sandboxed "
                f"harness, rewarded by the hidden test, from the SFT checkpoint ({summary.seconds:.0f} s). "
                f"Held-out: {rl.eval_tasks} tasks of phrasings never trained on × {rl.eval_samples} samples, "
                f"the same sampling seeds at every evaluation.")
    report.image(paths[-1], "RL curves")
    hack_monitor_section(report, summary.run_dir)
    report.section("heldout", "4. Held-out pass rate before and after RL")
    first, last = summary.first_eval, summary.last_eval
    if first and last:
        k = int(last["k"])
        console.print(f"held-out pass@1 {first['pass_at_1']:.3f} → {last['pass_at_1']:.3f}, best-of-{k} "
                      f"{first['best_of_k']:.3f} → {last['best_of_k']:.3f}, mean reward "
                      f"{first['mean_reward']:.3f} → {last['mean_reward']:.3f} ({summary.seconds:.0f} s)")
        report.table(["step", "held-out pass@1", f"best-of-{k}", "mean reward", "episodes"],
                     [[int(e["step"]), f"{e['pass_at_1']:.3f}", f"{e['best_of_k']:.3f}", f"{e['mean_reward']:.3f}",
                       int(e["episodes"])] for e in summary.evaluations])
        report.text(f"pass@1 {first['pass_at_1']:.3f} → {last['pass_at_1']:.3f} "
                    f"({last['pass_at_1'] - first['pass_at_1']:+.3f}) from step {int(first['step'])} to "
                    f"step {int(last['step'])}.")
    else:
        report.text("No held-out evaluation ran (rl.eval_every = 0).", note=True)
    console.print(f"RL run:  {summary.run_dir}\ncurves:  {paths[-1]}\nmodel:   {summary.run_dir / 'checkpoints'}")


def _pretrain(config: Config, console, report):
    from opencomposer.model.loading import parameter_counts
    from opencomposer.pretrain.cpt import run_pretraining

    with console.status("gathering the corpus and training the tokenizer ..."):
        from opencomposer.model.corpus import build_corpus
        from opencomposer.model.loading import default_tokenizer

        corpus = build_corpus(config.corpus, seed=config.run.seed)
        tokenizer = default_tokenizer(config.corpus, config.tokenizer, config.run.seed)
    sample = corpus.train[:50]
    tokens = sum(len(tokenizer.encode(f.text)) for f in sample)
    corpus_line = (f"corpus: {len(corpus.train):,} training files, {len(corpus.heldout):,} held out, "
                   f"{corpus.num_bytes / 1e6:.1f} MB; tokenizer: {len(tokenizer):,} tokens, "
                   f"{sum(len(f.text.encode()) for f in sample) / tokens:.2f} bytes/token")
    console.print(corpus_line)
    model, tokenizer, result, checkpoint = run_pretraining(config, corpus, tokenizer)
    counts = parameter_counts(model)
    model_line = (f"model: {type(model).__name__}, {counts['total'] / 1e6:.2f} M parameters "
                  f"({counts['active'] / 1e6:.2f} M active per token)")
    console.print(model_line)
    report.text(f"{corpus_line} (the local Python installation's .py files; nothing is downloaded).")
    report.text(model_line)
    return model, tokenizer, result, checkpoint


def _show_samples(model, tokenizer, config: Config, console) -> list[tuple[str, str]]:
    """Print and return (prompt, completion) for each of the recipe's sample prompts."""
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
    samples = []
    for prompt_text, completion in zip(config.pretrain.sample_prompts, engine.generate(prompts, params)):
        console.print(Panel(prompt_text + completion.text, title="sample", expand=False))
        samples.append((prompt_text, completion.text))
    return samples
