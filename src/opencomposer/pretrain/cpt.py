"""Continued pretraining on the code corpus (RECIPE.md §3, first phase).

Documents are tokenised lazily (only as many as the run will consume), joined with
``<|endoftext|>`` and cut into ``seq_len + 1`` windows (next-token prediction: the window minus its
last token is the input, minus its first token is the target). Training is plain AdamW with a
linear warm-up and cosine decay, gradient clipping, and the MoE load-balancing loss where the model
family defines one. Held-out codebase loss is measured on files the training never sees.

What this is not (yet): the report's 32k → 256k long-context phases, MXFP8 training and MTP
self-distillation; those build on this loop.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, PretrainConfig, load_recipe, to_toml
from opencomposer.model.corpus import CodeFile, Corpus, build_corpus


def token_stream(files: list[CodeFile], tokenizer: Any, separator_id: int, batch_files: int = 32) -> Iterator[int]:
    """Token ids of ``files`` in order, separated by ``separator_id``; tokenised in batches."""
    for start in range(0, len(files), batch_files):
        texts = [f.text for f in files[start : start + batch_files]]
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            yield from ids
            yield separator_id


def packed_batches(
    files: list[CodeFile], tokenizer: Any, separator_id: int, batch_size: int, seq_len: int, repeat: bool = True
) -> Iterator[torch.Tensor]:
    """``[batch_size, seq_len + 1]`` windows of the token stream; cycles when ``repeat``."""
    window = seq_len + 1
    while True:
        buffer: list[int] = []
        rows: list[list[int]] = []
        for token in token_stream(files, tokenizer, separator_id):
            buffer.append(token)
            if len(buffer) == window:
                rows.append(buffer)
                buffer = []
                if len(rows) == batch_size:
                    yield torch.tensor(rows)
                    rows = []
        if not repeat:
            return


def lm_loss(model: torch.nn.Module, batch: torch.Tensor, aux_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Mean next-token cross-entropy over ``batch`` [B, T+1], plus ``aux_coef`` × load-balancing loss."""
    want_aux = aux_coef > 0 and hasattr(model.config, "router_aux_loss_coef")
    out = model(input_ids=batch[:, :-1], output_router_logits=want_aux) if want_aux else model(input_ids=batch[:, :-1])
    logits = out.logits.float()  # [B, T, V]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    metrics = {"loss": ce.item()}
    loss = ce
    if want_aux and getattr(out, "aux_loss", None) is not None:
        loss = loss + aux_coef * out.aux_loss
        metrics["aux_loss"] = out.aux_loss.item()
    return loss, metrics


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    model.eval()
    losses = [lm_loss(model, b)[1]["loss"] for b in batches]
    model.train()
    return sum(losses) / len(losses)


def lr_at(step: int, config: PretrainConfig, total_steps: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at ``total_steps``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, config: PretrainConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on norms, biases and other 1-D parameters."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=tuple(config.betas),
    )


@dataclass
class PretrainResult:
    steps: int
    tokens: int
    seconds: float
    history: list[dict] = field(default_factory=list)  # one row per log step
    heldout: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss)

    @property
    def first_loss(self) -> float:
        return self.history[0]["loss"]

    @property
    def last_loss(self) -> float:
        return self.history[-1]["loss"]


def pretrain(
    model: torch.nn.Module,
    tokenizer: Any,
    train_files: list[CodeFile],
    heldout_files: list[CodeFile],
    config: PretrainConfig,
    *,
    metrics_path: Path | None = None,
    progress: bool = True,
    seed: int = 0,
) -> PretrainResult:
    """Train ``model`` in place for ``config.max_steps`` steps or ``config.max_minutes``."""
    from opencomposer.model.tokenizer import document_separator_id

    torch.manual_seed(seed)
    separator = document_separator_id(tokenizer)
    batches = packed_batches(train_files, tokenizer, separator, config.batch_size, config.seq_len)
    heldout: list[torch.Tensor] = []
    if heldout_files and config.eval_batches:
        for batch in packed_batches(heldout_files, tokenizer, separator, config.batch_size, config.seq_len, False):
            heldout.append(batch)
            if len(heldout) == config.eval_batches:
                break
    optimizer = make_optimizer(model, config)
    aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0
    result = PretrainResult(steps=0, tokens=0, seconds=0.0)
    sink = metrics_path.open("a") if metrics_path else None
    model.train()
    start = time.perf_counter()
    deadline = start + 60 * config.max_minutes
    bar = _progress(progress)
    with bar:
        task = bar.add_task("pretraining", total=config.max_steps, loss=float("nan"))
        for step in range(config.max_steps):
            batch = next(batches)
            # the schedule follows whichever budget runs out first, steps or wall-clock time
            time_step = round(config.max_steps * (time.perf_counter() - start) / (60 * config.max_minutes))
            lr = lr_at(max(step, time_step), config, config.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss, metrics = lm_loss(model, batch, aux_coef)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip).item()
            optimizer.step()
            result.steps = step + 1
            result.tokens += batch[:, 1:].numel()
            elapsed = time.perf_counter() - start
            row = {"step": step + 1, "lr": lr, "grad_norm": grad_norm, "tokens": result.tokens,
                   "seconds": elapsed, **metrics}
            if heldout and ((step + 1) % config.eval_every == 0 or step == 0):
                row["heldout_loss"] = evaluate(model, heldout)
                result.heldout.append((step + 1, row["heldout_loss"]))
            if step == 0 or (step + 1) % config.log_every == 0 or "heldout_loss" in row:
                result.history.append(row)
                if sink:
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
            bar.update(task, advance=1, loss=metrics["loss"])
            if time.perf_counter() > deadline:
                break
    if heldout and (not result.heldout or result.heldout[-1][0] != result.steps):
        final = evaluate(model, heldout)
        result.heldout.append((result.steps, final))
        result.history.append({"step": result.steps, "heldout_loss": final, "loss": result.history[-1]["loss"]})
    result.seconds = time.perf_counter() - start
    model.eval()
    if sink:
        sink.close()
    return result


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        disable=not enabled,
    )


def plot_loss(history: list[dict], path: Path, title: str = "pretraining loss") -> Path:
    """Training and held-out loss against step, to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    train = [(r["step"], r["loss"]) for r in history if "loss" in r and "lr" in r]
    held = [(r["step"], r["heldout_loss"]) for r in history if "heldout_loss" in r]
    if train:
        ax.plot(*zip(*train), label="train")
    if held:
        ax.plot(*zip(*held), "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_pretraining(
    config: Config, corpus: Corpus | None = None, tokenizer: Any = None, progress: bool = True
) -> tuple[Any, Any, PretrainResult, Path]:
    """Corpus → tokenizer → model → pretrain → checkpoint, all under ``config.run.path``.

    ``corpus`` and ``tokenizer`` may be passed in when the caller already built them."""
    from opencomposer.model.loading import TINY_KINDS, default_tokenizer, load_model, save_checkpoint
    from opencomposer.model.tokenizer import load_tokenizer

    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    run_dir = config.run.path
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.toml").write_text(to_toml(config))
    corpus = corpus or build_corpus(config.corpus, seed=config.run.seed)
    if config.model.kind in TINY_KINDS and not config.model.path:
        if tokenizer is None:
            tokenizer = (
                load_tokenizer(config.model.tokenizer_path)
                if config.model.tokenizer_path
                else default_tokenizer(config.corpus, config.tokenizer, config.run.seed)
            )
        model, tokenizer = load_model(config.model, tokenizer, seed=config.run.seed)
    else:
        model, tokenizer = load_model(config.model, seed=config.run.seed)
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    result = pretrain(model, tokenizer, corpus.train, corpus.heldout, config.pretrain,
                      metrics_path=metrics, progress=progress, seed=config.run.seed)
    from opencomposer.io import atomic_directory

    # built aside and renamed into place: a crash leaves the old checkpoint or the new one, never a part
    checkpoint = atomic_directory(run_dir / "checkpoint", lambda folder: save_checkpoint(model, tokenizer, folder))
    plot_loss(result.history, run_dir / "loss.png")
    return model, tokenizer, result, checkpoint


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    _, _, result, checkpoint = run_pretraining(config)
    print(f"{result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s; "
          f"loss {result.first_loss:.3f} → {result.last_loss:.3f}; checkpoint: {checkpoint}")
    return 0
