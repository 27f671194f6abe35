"""One optimizer step of the policy: forward every micro-batch, the RL loss, backward, clip, Adam.

Report §4.1 (docs/recipe.md §4): single epoch (each batch of rollouts is used for exactly one step),
**Adam, full-parameter updates**. Our Adam is ``torch.optim.Adam`` with β = (0.9, 0.999),
ε = 1e-8 and no weight decay by default (the report names Adam and nothing else; these are
Adam's paper values), all in ``rl.adam_betas`` / ``rl.adam_eps``. The trainer builds it
(``training.optim``) and sets its learning rate before each step (``training.schedule``: constant
after an optional linear warm-up, ``rl.lr_warmup_steps``, or a cosine decay, ``rl.lr_schedule``).

Gradients of the micro-batches add up before the step. That is exact for the composer loss (its
normaliser is a constant) and, because we pass the step's token and sequence counts to
``LossInputs``, for the mean-based ablations too; a sequence never spans two micro-batches.
The gradient norm is clipped to ``rl.grad_clip`` (0: no clipping). A non-finite gradient norm
stops the run with an error instead of corrupting the weights.

Returns ``(loss, metrics)``: the step's loss and token-weighted means of the loss metrics
(entropy, KL to the sampler and to the reference, ratio range, ...), plus the gradient norm, and
the off-policy statistics of the whole step (``rl.losses.ratio_metrics``: ``ratio_mean``,
``log_ratio_abs_p99``; ``rl.losses.mismatch_kl``: ``mismatch_kl``; with ``trainer_version``,
``rl.losses.staleness_metrics``: ``staleness_mean``, ``staleness_max``, ``staleness_hist/<s>``).
They measure and change nothing: corrections for staleness are the opt-in losses ``tis`` and
``ppo_clip``.

With ``rl.router_replay`` on, every forward replays the sampler's routes (report §6.2;
``model.routing.RouterReplay``, ``training.forward``), and the step reports
``router_replay_replace_rate`` (replayed experts the confidence filter replaced; 0 for plain
``replay``) and ``router_replay_agreement`` (replayed experts the trainer's own top-k also chose).

**Data parallel** (``world``, ``opencomposer.distributed``): every rank calls ``train_step`` on its
share of the step's rows, with the whole step's token and sequence counts (``step_tokens``,
``step_sequences``), so each rank's loss is its part of the step's sum. FSDP2 *averages* gradients
over the ranks, so each rank backpropagates N × its loss and the average is the sum: the gradient,
clipping and update equal the single process's on all the rows (``tests/distributed``). Ranks with
fewer micro-batches run zero-loss forwards until all have run as many (FSDP gathers each layer's
weights collectively), and the metrics are merged over the ranks, so every rank returns the
single-process numbers.

**Context parallel** (``world.cp > 1``): the ranks of a context-parallel group get the same
micro-batches (whole rows, padded to a multiple of 2·cp positions); each forwards its chunks of
the rows with attention over the whole rows (``training.forward.cp_token_logprobs``) and takes the
loss over its positions only (``distributed.context.split_batch``). The step's token and
sequence counts and each episode's token count already describe whole rows, so every rank's loss
is its positions' part of the step's sum, and the N × scaling above holds over all N ranks: the
keys' and values' gathers send each position's gradient back to the rank that computed it.
"""

from __future__ import annotations

import dataclasses

import torch

from opencomposer.config import RLConfig
from opencomposer.distributed.context import split_batch
from opencomposer.distributed.fsdp import clip_gradients, reduce_gradients
from opencomposer.distributed.runtime import World
from opencomposer.model.routing import ReplayStats, RouterReplay
from opencomposer.rl.losses import LossInputs, mismatch_kl, ratio_metrics, rl_loss, staleness_metrics
from opencomposer.training.forward import (
    StepPrefix,
    batch_to,
    cp_token_logprobs,
    padding_forward,
    step_prefix_length,
    token_logprobs,
)
from opencomposer.training.metrics import merge_ranks
from opencomposer.types import TrainBatch


def _merge(total: dict[str, float], metrics: dict[str, float], tokens: float) -> None:
    for name, value in metrics.items():
        if name == "tokens":
            total[name] = total.get(name, 0.0) + value
        elif name == "ratio_max":
            total[name] = max(total.get(name, value), value)
        elif name == "ratio_min":
            total[name] = min(total.get(name, value), value)
        else:  # token-weighted mean, divided at the end
            total[name] = total.get(name, 0.0) + value * tokens


def count_sequences(batches: list[TrainBatch]) -> int:
    """Sequences of the step with a model token: episodes when the batches say which (a chain's
    segments, in any micro-batch, count once), else rows."""
    if all(b.episode_ids is not None for b in batches):
        return len({int(e) for b in batches for e in b.episode_ids[b.loss_mask.bool()].unique()})
    return sum(int(b.loss_mask.any(1).sum()) for b in batches)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[TrainBatch],
    config: RLConfig,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    trainer_version: int | None = None,
    world: World | None = None,
    step_tokens: float | None = None,
    step_sequences: float | None = None,
) -> tuple[float, dict[str, float]]:
    """Accumulate the loss's gradient over ``batches`` (the step's micro-batches), clip, step.
    Tokens are scored as the sampler drew them (``temperature``, ``top_p``, ``top_k``; see
    ``training.forward.token_logprobs``). ``trainer_version``: the policy version of the weights
    being trained; with it, each token's staleness against the version that sampled it
    (``TrainBatch.versions``, which every batch must then carry) is reported. ``world``,
    ``step_tokens``, ``step_sequences``: this rank's place in a data-parallel step and the whole
    step's model tokens and sequences (module doc); by default one process and these batches."""
    if trainer_version is not None and any(b.versions is None for b in batches):
        raise ValueError(f"trainer_version={trainer_version} given, but a batch carries no sampler versions")
    world = world or World()
    device = next(model.parameters()).device
    num_tokens = float(step_tokens if step_tokens is not None else sum(int(b.loss_mask.sum()) for b in batches))
    num_sequences = float(step_sequences if step_sequences is not None else count_sequences(batches))
    scale = float(world.size)  # FSDP averages gradients over the ranks; N × each share sums them
    replay = None
    if config.router_replay != "off":
        replay = RouterReplay(model, config.router_replay, config.router_replay_threshold)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    totals: dict[str, float] = {}
    log_ratios, versions = [], []  # [tokens] per micro-batch, for the step-wide statistics
    # one process runs the prefix every micro-batch shares once for the step (a sharded policy
    # computes every row in full, below)
    prefix_length = 0 if world.distributed else step_prefix_length(batches, by_routes=replay is not None)
    step_prefix = StepPrefix(model, batches[0], prefix_length, config.bf16, replay) if prefix_length else None
    for batch in batches:
        batch = batch_to(batch, device)
        # the shared-prefix forward (training.forward) sends gradient into a second forward of each
        # layer through its key/value cache, past FSDP's backward hooks, which then find the
        # layer's weights resharded; a sharded policy computes every row in full instead
        if world.cp > 1:
            logprobs, entropy = cp_token_logprobs(model, batch, world.cp_group, replay=replay, temperature=temperature,
                                                  top_p=top_p, top_k=top_k, bf16=config.bf16)
            batch = split_batch(batch, world.cp, world.cp_rank)  # this rank's positions, aligned with logprobs
        else:
            logprobs, entropy = token_logprobs(model, batch, bf16=config.bf16, temperature=temperature,
                                               top_p=top_p, top_k=top_k, replay=replay,
                                               share_prefix=not world.distributed, step_prefix=step_prefix)
        inputs = dataclasses.replace(
            LossInputs.from_batch(batch, logprobs, entropy), num_tokens=num_tokens, num_sequences=num_sequences
        )
        loss, metrics = rl_loss(inputs, config.loss, config.kl)
        (loss * scale if scale != 1 else loss).backward()
        total_loss += float(loss.detach())
        _merge(totals, metrics, metrics["tokens"])
        mask = batch.loss_mask.bool()
        log_ratios.append((logprobs.detach() - batch.sampler_logprobs)[mask])
        if trainer_version is not None:
            versions.append(batch.versions[mask])
    if step_prefix is not None:
        step_prefix.backward()
    for _ in range(world.max(len(batches)) - len(batches)):
        padding_forward(model, device)
    if world.distributed:
        total_loss, totals, log_ratios, versions = merged_step(world, total_loss, totals, log_ratios, versions, replay)
    reduce_gradients(model, world)  # expert parallelism; FSDP reduced during backward
    parameters = [p for p in model.parameters() if p.grad is not None]
    max_norm = config.grad_clip if config.grad_clip > 0 else float("inf")
    grad_norm = clip_gradients(parameters, max_norm, world)
    if not torch.isfinite(torch.tensor(grad_norm)):
        raise FloatingPointError(
            f"non-finite gradient norm ({grad_norm}); the step was not applied. Lower rl.lr or enable rl.grad_clip"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    tokens = max(totals.get("tokens", 0.0), 1.0)
    metrics = {
        name: value if name in ("tokens", "ratio_max", "ratio_min") else value / tokens
        for name, value in totals.items()
    }
    if log_ratios:
        metrics.update(ratio_metrics(torch.cat(log_ratios)))
        metrics.update(mismatch_kl(torch.cat(log_ratios)))
    if replay is not None:
        metrics.update(replay.metrics())
    if versions:
        metrics.update(staleness_metrics(torch.cat(versions), trainer_version))
    metrics["grad_norm"] = grad_norm
    metrics["micro_batches"] = float(len(batches))
    return total_loss, metrics


# What ``merged_step`` sends besides the metric sums; ``_``-prefixed so no metric name collides.
_STEP_RULES = {"ratio_max": "max", "ratio_min": "min", "_log_ratios": "concat", "_versions": "concat"}


def merged_step(world: World, total_loss: float, totals: dict[str, float], log_ratios: list[torch.Tensor],
                versions: list[torch.Tensor], replay: RouterReplay | None):
    """Every rank's loss, metric sums, log-ratios, versions and replay counts, combined as one
    process would have computed them over all the rows (``training.metrics.merge_ranks``: sums by
    default, the ratios' extremes, the per-token tensors joined in rank order)."""
    local = {"_loss": total_loss, **totals, "_log_ratios": [t.cpu() for t in log_ratios],
             "_versions": [t.cpu() for t in versions]}
    counts = [] if replay is None else [field.name for field in dataclasses.fields(ReplayStats)]
    local.update({f"_replay_{name}": getattr(replay.stats, name) for name in counts})
    merged = merge_ranks(world, local, _STEP_RULES, default="sum")
    if replay is not None:
        replay.stats = ReplayStats(*(merged.pop(f"_replay_{name}") for name in counts))
    loss, ratios, step_versions = merged.pop("_loss"), merged.pop("_log_ratios"), merged.pop("_versions")
    return loss, merged, ratios, step_versions
