"""Continued pretraining on the code corpus (docs/recipe.md §3, first phase).

Documents are tokenised lazily (only as many as the run will consume), joined with
``<|endoftext|>`` and cut into ``seq_len + 1`` windows (next-token prediction: the window minus its
last token is the input, minus its first token is the target). Training is plain AdamW (no decay
on biases, norms and embeddings) with a linear warm-up and cosine decay, gradient clipping, and the
MoE load-balancing loss where the model family defines one; the optimizer, schedule, device,
progress display and metrics log are the shared ones of ``training``. Held-out codebase loss is
measured on files the training never sees. ``run_pretraining`` leaves ``metrics.jsonl``, ``tb/``,
``loss.png`` and ``checkpoint/`` under ``run.path``. With ``[numerics]`` set, the model trains with
the experts' (and, with ``quantize_linears``, the other linears') matmuls in that format
(``numerics.convert``); the checkpoint holds the same high-precision weights either way.

**Data parallel** (``trainer.world_size > 1``; ``opencomposer.distributed``): every rank reads the
same batch stream and trains on its slice of each batch's rows, with the model sharded by FSDP2.
Each rank's cross-entropy is weighted by its share of the batch's tokens (× N, since FSDP averages
gradients over the ranks), so the gradient is the single-process gradient of the whole batch
(``tests/distributed/test_dp_pretrain.py``). The MoE load-balancing loss is the exception: it is
computed on each rank's slice and averaged, as data-parallel MoE training does everywhere. Every
rank runs the held-out evaluation (FSDP's forwards are collective); rank 0 alone logs and writes
the checkpoint, gathered whole, in the same layout as one process.

**Context parallel** (``parallel.cp = c``): the rows are split over ``world_size / c``
data-parallel positions, and each row's ``seq_len`` input positions over the ``c`` ranks of a
context-parallel group (``distributed.context``: chunks ``r`` and ``2c - 1 - r`` of ``2c``,
attention over the whole row), so ``seq_len`` must be a multiple of ``2c``. Each rank's
cross-entropy sum over its positions is divided by the batch's token count (× N for FSDP), so the
gradient is again the single process's.

What this is not (yet): the report's 32k → 256k long-context phases and MTP self-distillation;
those build on this loop.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ConfigError, PretrainConfig, to_toml
from opencomposer.distributed.fsdp import clip_gradients, full_model_state, reduce_gradients, shard_model
from opencomposer.distributed.runtime import World
from opencomposer.model.corpus import CodeFile, Corpus, build_corpus
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.numerics.convert import convert_model
from opencomposer.training.forward import target_nll
from opencomposer.training.metrics import MetricsLog
from opencomposer.training.optim import build_optimizer
from opencomposer.training.progress import ProgressBar
from opencomposer.training.schedule import warmup_cosine_lr


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


def lm_loss(model: torch.nn.Module, batch: torch.Tensor, aux_coef: float = 0.0,
            ce_weight: float = 1.0, world: World | None = None) -> tuple[torch.Tensor, dict]:
    """Mean next-token cross-entropy over ``batch`` [B, T+1] times ``ce_weight`` (a data-parallel
    rank's share, module doc), plus ``aux_coef`` × load-balancing loss. ``metrics["loss"]`` is the
    unweighted mean. Under context parallelism (``world.cp > 1``) the mean is over this rank's
    positions of the rows (``distributed.context``)."""
    want_aux = aux_coef > 0 and hasattr(model.config, "router_aux_loss_coef")
    extra = {"output_router_logits": True} if want_aux else {}
    inputs, targets = batch[:, :-1], batch[:, 1:]
    if world is not None and world.cp > 1:
        from opencomposer.distributed.context import cp_forward, split_sequence

        positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
        out = cp_forward(model, inputs, positions, world.cp_group, **extra)
        targets = split_sequence(targets, world.cp, world.cp_rank)
    else:
        out = model(input_ids=inputs, **extra)
    ce = target_nll(out.logits, targets).mean()  # logits [B, T, V] (T / cp under context parallelism)
    metrics = {"loss": ce.item()}
    loss = ce * ce_weight if ce_weight != 1.0 else ce
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
    log: MetricsLog | None = None,
    progress: bool = True,
    seed: int = 0,
    world: World | None = None,
) -> PretrainResult:
    """Train ``model`` in place (on the device it is on) for ``config.max_steps`` steps or
    ``config.max_minutes``; the rows of ``history`` also go to ``log`` when given. ``world``: this
    rank of a data-parallel group (module doc); ``model`` is then sharded in place."""
    from opencomposer.model.tokenizer import document_separator_id

    torch.manual_seed(seed)
    separator = document_separator_id(tokenizer)
    batches = packed_batches(train_files, tokenizer, separator, config.batch_size, config.seq_len)
    world = world or World()
    if world.distributed and config.batch_size < world.dp_size:
        raise ConfigError(f"pretrain.batch_size = {config.batch_size} gives some of the {world.dp_size} "
                          "data-parallel ranks no rows; use at least one row per rank")
    if world.cp > 1 and config.seq_len % (2 * world.cp):
        raise ConfigError(f"pretrain.seq_len = {config.seq_len}: context parallelism (parallel.cp = {world.cp}) "
                          f"splits each row into {2 * world.cp} equal chunks; use a multiple of {2 * world.cp}")
    shard_model(model, world)
    device = next(model.parameters()).device
    heldout: list[torch.Tensor] = []
    if heldout_files and config.eval_batches:
        for batch in packed_batches(heldout_files, tokenizer, separator, config.batch_size, config.seq_len, False):
            heldout.append(batch.to(device))
            if len(heldout) == config.eval_batches:
                break
    optimizer = build_optimizer(model, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay)
    aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0
    result = PretrainResult(steps=0, tokens=0, seconds=0.0)
    model.train()
    start = time.perf_counter()
    deadline = start + 60 * config.max_minutes
    with ProgressBar("pretraining", config.max_steps, status="loss {loss:.3f}", enabled=progress,
                     every=config.log_every) as bar:
        for step in range(config.max_steps):
            batch = next(batches).to(device)
            # the schedule follows whichever budget runs out first, steps or wall-clock time
            time_step = round(config.max_steps * (time.perf_counter() - start) / (60 * config.max_minutes))
            lr = warmup_cosine_lr(max(step, time_step), peak_lr=config.lr, warmup_steps=config.warmup_steps,
                                  total_steps=config.max_steps, min_lr_ratio=config.min_lr_ratio)
            lr = world.broadcast(lr)  # rank 0's clock decides, so every rank steps alike
            for group in optimizer.param_groups:
                group["lr"] = lr
            if world.distributed:
                # this rank's rows (and positions, under CP); its mean CE weighted by its share of
                # the batch's tokens, × N for FSDP's average
                share = batch.tensor_split(world.dp_size)[world.dp_rank]
                weight = len(share) / (len(batch) * world.cp)
                loss, metrics = lm_loss(model, share, aux_coef, ce_weight=world.size * weight, world=world)
                metrics = merge_rank_metrics(world, metrics, weight)
            else:
                loss, metrics = lm_loss(model, batch, aux_coef)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            reduce_gradients(model, world)
            grad_norm = clip_gradients(list(model.parameters()), config.grad_clip, world)
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
                if log:
                    log.log(step + 1, "train", {k: v for k, v in row.items() if k != "step"})
            bar.update(step + 1, loss=metrics["loss"])
            if world.broadcast(time.perf_counter() > deadline):
                break
    if heldout and (not result.heldout or result.heldout[-1][0] != result.steps):
        final = evaluate(model, heldout)
        result.heldout.append((result.steps, final))
        result.history.append({"step": result.steps, "heldout_loss": final, "loss": result.history[-1]["loss"]})
        if log:
            log.log(result.steps, "eval", {"heldout_loss": final})
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def merge_rank_metrics(world: World, metrics: dict[str, float], share: float) -> dict[str, float]:
    """The batch's metrics from every rank's: the cross-entropy weighted by each rank's share of the
    batch's tokens (so it is the whole batch's mean), the load-balancing loss averaged over the ranks."""
    gathered = world.gather((metrics, share))
    merged = {"loss": sum(m["loss"] * w for m, w in gathered)}
    if "aux_loss" in metrics:
        merged["aux_loss"] = sum(m["aux_loss"] for m, _ in gathered) / len(gathered)
    return merged


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
    config: Config, corpus: Corpus | None = None, tokenizer: Any = None, progress: bool = True,
    world: World | None = None,
) -> tuple[Any, Any, PretrainResult, Path]:
    """Corpus → tokenizer → model → pretrain → checkpoint, all under ``config.run.path``.

    ``corpus`` and ``tokenizer`` may be passed in when the caller already built them. ``world``:
    this rank of a data-parallel group (``distributed.launch``; module doc). Every rank returns;
    only rank 0's files and result are the run's."""
    from opencomposer.model.loading import TINY_KINDS, default_tokenizer, load_model, save_checkpoint
    from opencomposer.model.tokenizer import load_tokenizer

    world = world or World()
    device = world.device if world.distributed else resolve_device(config.run.device)
    apply_run_settings(config.run)
    run_dir = config.run.path
    if not world.main:
        world.barrier()  # rank 0 builds (and caches) corpus and tokenizer first; the others reuse them
    if world.main:
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
        model, tokenizer = load_model(config.model, tokenizer, seed=config.run.seed, device=device)
    else:
        model, tokenizer = load_model(config.model, seed=config.run.seed, device=device)
    if world.main and world.distributed:
        world.barrier()
    convert_model(model, config.numerics)
    host = copy.deepcopy(model).cpu() if world.distributed and world.main else None  # to checkpoint from
    if not world.main:
        result = pretrain(model, tokenizer, corpus.train, corpus.heldout, config.pretrain,
                          progress=False, seed=config.run.seed, world=world)
        full_model_state(model, world)  # rank 0 gathers the checkpoint
        return model, tokenizer, result, run_dir / "checkpoint"
    with MetricsLog(run_dir) as log:
        result = pretrain(model, tokenizer, corpus.train, corpus.heldout, config.pretrain,
                          log=log, progress=progress, seed=config.run.seed, world=world)
        log.sync()
    if host is not None:
        host.load_state_dict(full_model_state(model, world))
        model = host
    from opencomposer.io import atomic_directory

    # built aside and renamed into place: a crash leaves the old checkpoint or the new one, never a part
    checkpoint = atomic_directory(run_dir / "checkpoint", lambda folder: save_checkpoint(model, tokenizer, folder))
    plot_loss(result.history, run_dir / "loss.png")
    return model, tokenizer, result, checkpoint


def pretrain_worker(world: World, config: Config) -> tuple[PretrainResult, Path] | None:
    """``distributed.launch``'s function for ``opencomposer pretrain``: rank 0's result and
    checkpoint folder (what the command prints), None on the other ranks."""
    _, _, result, checkpoint = run_pretraining(config, progress=world.main, world=world)
    return (result, checkpoint) if world.main else None
