"""The trainer: from graded groups to one optimizer step, and new weights for the sampler.

Order of one step (docs/rl.md, "How a trainer calls them"):

1. ``score``: rows for every scored episode (``training.packing``); the **reference forward** over them
   (a frozen copy of the checkpoint RL started from, ``rl.kl.reference = "initial"``; none with
   ``"none"``); the KL penalty coef·Σ_t k(t) per episode, from the sampler's logprobs and the
   reference's (placement ``"reward"``); then each episode's named-term reward
   (``rewards.episode_reward``) and the group advantages (``advantages.episode_advantages``).
   Infrastructure failures are never scored; groups left with fewer than two scored episodes
   are dropped.
2. ``train``: the rows of episodes that have an advantage, micro-batched, through ``step.train_step``
   (recomputed logprobs, with the sampler's routes replayed when ``rl.router_replay`` asks,
   ``rl_loss``, backward, clipping, Adam); given the version it trains, it also reports how stale
   the sampled tokens were.
3. ``publish``: the new weights go into the sampler with the step number as policy version.

The trainer holds the policy, the reference and the optimizer; the loop (``rl.loop``) owns the
task stream, rollouts, logging and checkpoints.

**Data parallel** (``trainer.world_size > 1``, ``world``): the policy is sharded over the ranks
with FSDP2 (``distributed.fsdp``), and so are its gradients and Adam's state. Rank 0 runs the whole
loop (sampling, scoring with the unsharded reference, evaluation, logs, records, checkpoints); the
other ranks only train, in ``follow``. Each of rank 0's collective calls (``train``, ``publish``,
``state_dict``, ``load_state_dict``, ``full_model``, ``stop``) first broadcasts a command, so the
followers enter the same collective. ``train`` sends every rank the step's scored rows; each takes
its cost-balanced share (``distributed.balance``) and ``step.train_step`` makes the sum of the
shares' gradients the single-process gradient.

**Context parallel** (``parallel.cp = c``): the shares are split over the ``world_size / c``
data-parallel positions; the ``c`` ranks of one position take the same rows, padded to a multiple
of ``2·c`` positions, and each scores its chunks of every row (``step.train_step``).

**Sequence packing** (``rl.pack_tokens``): each share's sequences are packed several to a batch row
(``training.packing.pack_rows``) after the split, so the balance works on whole sequences and the
packing removes the padding of each rank's micro-batches; the reference forward packs the same
way. The step reports ``padding_fraction`` and, over data-parallel ranks, ``dp_cost_imbalance``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opencomposer.agent.context import chain_metrics
from opencomposer.config import Config, ConfigError
from opencomposer.distributed.balance import row_cost, split_rows
from opencomposer.distributed.context import pad_batch_for_cp
from opencomposer.distributed.fsdp import (
    full_model_state,
    full_optimizer_state,
    load_optimizer_state,
    load_sharded_optimizer,
    save_sharded_optimizer,
    shard_model,
)
from opencomposer.distributed.runtime import World, current_world
from opencomposer.model.routing import replayable_routers
from opencomposer.rl.advantages import episode_advantages
from opencomposer.rl.kl import sequence_kl_penalty
from opencomposer.rl.losses import staleness_metrics
from opencomposer.rl.rewards import episode_reward
from opencomposer.rl.step import train_step
from opencomposer.sandbox.patch import diff_stats
from opencomposer.training.forward import MIN_SHARED_PREFIX, reference_logprobs
from opencomposer.training.optim import build_optimizer
from opencomposer.training.packing import (
    Row,
    SequenceRow,
    collate,
    common_prefix,
    episode_rows,
    micro_batches,
    pack_rows,
    padded_positions,
    row_parts,
    unpack,
)
from opencomposer.training.schedule import warmup_cosine_lr
from opencomposer.types import Episode, EpisodeStatus, Group


@dataclass
class ScoredStep:
    """What ``score`` hands to ``train``: the rows that enter the loss, and what it measured."""

    rows: list[SequenceRow]
    metrics: dict[str, float] = field(default_factory=dict)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` that never trains (the reference policy)."""
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


class Trainer:
    """Scores groups and trains the policy on them (see module doc)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: Config,
                 reference: torch.nn.Module | None = None, world: World | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.rl = config.rl
        self.world = world or current_world()  # the launched group's, when there is one
        self.reference = reference
        if self.rl.kl.reference == "initial" and reference is None and self.world.main:
            self.reference = frozen_copy(model)  # scoring runs on rank 0 only
        # rank 0 keeps an unsharded copy, refreshed from the shards, for checkpoints and the sampler
        self.host = copy.deepcopy(model) if self.world.distributed and self.world.main else None
        shard_model(model, self.world)
        # full-parameter Adam, no weight decay (report §4.1; rl.step)
        self.optimizer = build_optimizer(model, lr=self.rl.lr, betas=tuple(self.rl.adam_betas), eps=self.rl.adam_eps)
        self.updates = 0  # optimizer steps applied (skipped steps do not count); drives the warm-up
        self.sharded_optimizer = config.trainer.optimizer_checkpoint == "sharded"
        if self.rl.router_replay != "off":
            try:
                replayable_routers(model)
            except ValueError as e:
                raise ConfigError(f"rl.router_replay = {self.rl.router_replay!r}: {e}") from e
        # π and π_ref are scored as the sampler draws: at the sampling temperature, cut by top-p /
        # top-k (training.forward.token_logprobs); greedy sampling records the plain log-softmax
        sampling = config.sampling
        greedy = sampling.temperature == 0
        self.temperature = 1.0 if greedy else sampling.temperature
        self.top_p = 1.0 if greedy else sampling.top_p
        self.top_k = 0 if greedy else sampling.top_k
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)

    # ------------------------------------------------------------------------------------------
    def score(self, groups: list[Group]) -> ScoredStep:
        """Reference forward, KL penalty, rewards and advantages (in this order; see module doc)."""
        episodes = [episode for group in groups for episode in group.episodes]
        tasks = [group.task for group in groups for _ in group.episodes]
        scored = [episode if episode.scored else None for episode in episodes]
        rows = episode_rows(episodes, [0.0 if e is not None else None for e in scored])
        if self.reference is not None and rows:
            self._reference_pass(rows)
        penalties = self._kl_penalties(rows, len(episodes))
        metrics: dict[str, float] = {}
        for i, (episode, task) in enumerate(zip(episodes, tasks, strict=True)):
            if not episode.scored:
                continue
            reference_lines = diff_stats(task.gold_patch).lines_changed if task.gold_patch else None
            episode.reward, episode.reward_terms = episode_reward(
                episode, self.rl.reward, self.rl.length_penalty,
                kl_penalty=float(penalties[i]), reference_lines_changed=reference_lines,
            )
        advantages, advantage_metrics = episode_advantages(
            [group.episodes for group in groups], self.rl.advantage.std_normalize, self.rl.advantage.std_eps
        )
        metrics.update(advantage_metrics)
        flat = [a for group_advantages in advantages for a in group_advantages]
        for group, group_advantages in zip(groups, advantages, strict=True):
            group.advantages = [a if a is not None else float("nan") for a in group_advantages]
        kept = []
        for row in rows:
            if flat[row.episode] is not None:
                row.advantage = float(flat[row.episode])
                kept.append(row)
        metrics.update(self._reward_metrics(episodes))
        if self.reference is not None and rows:
            kl_values = [float(penalties[i]) for i, e in enumerate(episodes) if e.scored]
            metrics["kl_penalty_mean"] = float(np.mean(kl_values)) if kl_values else 0.0
        return ScoredStep(rows=kept, metrics=metrics)

    def _reference_pass(self, rows: list[SequenceRow]) -> None:
        for chunk in micro_batches(self._packed(rows), self.rl.micro_batch_tokens):
            batch = collate(chunk, self.pad_id)
            logprobs = reference_logprobs(self.reference, batch, bf16=self.rl.bf16, temperature=self.temperature,
                                          top_p=self.top_p, top_k=self.top_k)
            parts = [part for row in chunk for part in row_parts(row)]
            for part, values in zip(parts, unpack(logprobs, chunk), strict=True):
                part.ref_logprobs = values

    def _kl_penalties(self, rows: list[SequenceRow], num_episodes: int) -> np.ndarray:
        """coef·Σ_t k(t) per episode (placement "reward"), else zeros."""
        kl = self.rl.kl
        totals = torch.zeros(num_episodes, dtype=torch.float64)
        if self.reference is None or kl.placement != "reward" or kl.coef == 0 or not rows:
            return totals.numpy()
        for chunk in micro_batches(self._packed(rows), self.rl.micro_batch_tokens):
            batch = collate(chunk, self.pad_id)
            totals += sequence_kl_penalty(
                batch.sampler_logprobs.double(), batch.ref_logprobs.double(), batch.loss_mask,
                batch.episode_ids.clamp(min=0), num_episodes, kl.coef, kl.estimator,
            )
        return totals.numpy()

    @staticmethod
    def _reward_metrics(episodes: list[Episode]) -> dict[str, float]:
        scored = [e for e in episodes if e.scored]
        if not scored:
            return {}
        out = {
            "resolved_rate": float(np.mean([e.grade.resolved for e in scored])),
            "tampered_rate": float(np.mean([e.grade.tampered for e in scored])),  # grading.integrity, grading.testrun
            "hack_suspected_rate": float(np.mean([e.grade.hack_suspected for e in scored])),  # grading.hack_monitor
            # harness bugs (sandbox.patch DiffRoundTripError): graded from the workspace, counted here
            "diff_round_trip_failures": float(sum(e.grade.diff_round_trip_failed for e in scored)),
            "episode_tokens": float(np.mean([sum(len(t.token_ids) for t in e.turns) for e in scored])),
            "episode_turns": float(np.mean([len(e.turns) for e in scored])),
            "episodes_timeout": float(sum(e.status == EpisodeStatus.TIMEOUT for e in scored)),
            "episodes_format_error": float(sum(e.status == EpisodeStatus.FORMAT_ERROR for e in scored)),
        }
        for name in scored[0].reward_terms:
            out[f"reward/{name}"] = float(np.mean([e.reward_terms[name] for e in scored]))
        out.update(chain_metrics(scored))  # self-summary chains (agent.context), when there are any
        return out

    # ------------------------------------------------------------------------------------------
    def learning_rate(self, update: int) -> float:
        """The rate of applied update ``update`` (0 is the first): a linear warm-up over the first
        ``rl.lr_warmup_steps``, then ``rl.lr`` (constant) or a cosine from ``rl.lr`` down to
        ``rl.min_lr_ratio × rl.lr`` at update ``rl.steps``."""
        rl = self.rl
        return warmup_cosine_lr(
            update, peak_lr=rl.lr, warmup_steps=rl.lr_warmup_steps, total_steps=rl.steps,
            min_lr_ratio=1.0 if rl.lr_schedule == "constant" else rl.min_lr_ratio, floor_on_last_step=True,
        )

    def train(self, scored: ScoredStep, version: int | None = None) -> tuple[float, dict[str, float]]:
        """One optimizer step on the scored rows. A step without gradient (no rows, or every
        advantage zero and no KL term in the loss) skips the forward and the update: Adam would
        otherwise keep moving the weights on momentum alone (and the warm-up does not advance).

        ``version``: the policy version of the weights this step trains; with it the metrics
        include the staleness of the rows' tokens (``rl.losses.staleness_metrics``), skipped
        steps too."""
        kl_in_loss = self.rl.kl.placement == "loss" and self.rl.kl.coef > 0
        if not scored.rows or (not kl_in_loss and all(row.advantage == 0.0 for row in scored.rows)):
            metrics = {"tokens": float(sum(row.model_tokens for row in scored.rows)), "grad_norm": 0.0,
                       "micro_batches": 0.0, "skipped": 1.0}
            if version is not None and scored.rows:
                versions = np.concatenate([row.versions[row.loss_mask] for row in scored.rows])
                metrics.update(staleness_metrics(torch.from_numpy(versions), version))
            return 0.0, metrics
        lr = self.learning_rate(self.updates)
        self._command("train", scored.rows, version, lr)
        loss, metrics = self._train_rows(scored.rows, version, lr)
        self.updates += 1
        metrics["skipped"] = 0.0
        metrics["lr"] = lr
        metrics.update(self._layout_metrics(scored.rows))
        return loss, metrics

    def _packed(self, rows: list[SequenceRow]) -> list[Row]:
        """``rows`` as batch rows: packed several to a row with ``rl.pack_tokens``, else as they are."""
        return pack_rows(rows, self.rl.pack_tokens) if self.rl.pack_tokens else list(rows)

    def _shares(self, rows: list[SequenceRow]) -> list[list[Row]]:
        """Each data-parallel position's batch rows: the step's sequences split by attention cost
        (``distributed.balance``; whole sequences, the finest unit that keeps a sequence on one
        rank), then packed (``rl.pack_tokens``) within each share."""
        shares = split_rows(rows, self.world.dp_size) if self.world.distributed else [rows]
        return [self._packed(share) for share in shares]

    def _prefix(self, share: list[Row]) -> int:
        """The positions a micro-batch's budget counts once: one process computes the rows' shared
        prefix once per micro-batch (``training.forward``); a sharded policy computes every row in full."""
        return 0 if self.world.distributed else common_prefix(share, MIN_SHARED_PREFIX)

    def _layout_metrics(self, rows: list[SequenceRow]) -> dict[str, float]:
        """How the step's rows were laid out: ``padding_fraction`` (padded positions of all the
        micro-batches, every rank) and, over data-parallel ranks, ``dp_cost_imbalance`` (the
        busiest rank's ``distributed.balance.row_cost`` over the mean; 1 is perfect)."""
        shares = self._shares(rows)
        real, padded = (sum(n) for n in zip(*(padded_positions(s, self.rl.micro_batch_tokens, self._prefix(s))
                                              for s in shares), strict=True))
        metrics = {"padding_fraction": 1.0 - real / max(padded, 1)}
        if len(shares) > 1:
            costs = [sum(row_cost(len(part)) for row in share for part in row_parts(row)) for share in shares]
            metrics["dp_cost_imbalance"] = max(costs) / max(sum(costs) / len(costs), 1e-9)
        return metrics

    def _train_rows(self, rows: list[SequenceRow], version: int | None, lr: float) -> tuple[float, dict[str, float]]:
        """``train_step`` on this rank's share of ``rows`` (all of them in a single process)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        world, counts = self.world, {}
        if world.distributed:
            counts = {"step_tokens": float(sum(row.model_tokens for row in rows)),
                      "step_sequences": float(len({row.episode for row in rows if row.model_tokens}))}
        share = self._shares(rows)[world.dp_rank]  # the same share on a CP group's ranks
        batches = [collate(chunk, self.pad_id)
                   for chunk in micro_batches(share, self.rl.micro_batch_tokens, self._prefix(share))]
        if world.cp > 1:  # whole rows, padded so that each splits into 2·cp equal chunks
            batches = [pad_batch_for_cp(batch, world.cp, self.pad_id) for batch in batches]
        return train_step(self.model, self.optimizer, batches, self.rl, temperature=self.temperature,
                          top_p=self.top_p, top_k=self.top_k, trainer_version=version, world=world, **counts)

    def publish(self, engine: Any, version: int) -> None:
        """Push the policy's weights into the sampler, tagged with ``version``."""
        self._command("publish")
        engine.load_weights(full_model_state(self.model, self.world), version)

    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Adam's state (in the single-process layout at any world size) and the update count; with
        ``trainer.optimizer_checkpoint = "sharded"`` the count and the format only: the state itself
        goes to ``save_optimizer``."""
        if self.sharded_optimizer:
            return {"optimizer_format": "sharded", "updates": self.updates}
        self._command("state_dict")
        return {"optimizer": full_optimizer_state(self.model, self.optimizer, self.world), "updates": self.updates}

    def save_optimizer(self, folder: Path) -> None:
        """Every rank writes its shard of Adam's state into ``folder`` (``distributed.fsdp.save_sharded_optimizer``)."""
        self._command("save_optimizer", str(folder))
        save_sharded_optimizer(self.model, self.optimizer, folder, self.world)

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """Restore what ``state_dict`` returned; a sharded one (whatever this run's own format)
        reads its shards from ``folder``, the checkpoint's ``optimizer/``, at any world size."""
        if state.get("optimizer_format") == "sharded":
            if folder is None:
                raise ValueError("Trainer.load_state_dict: a sharded optimizer state needs its folder")
            self._command("load_sharded", str(folder))
            load_sharded_optimizer(self.model, self.optimizer, folder, self.world)
        else:
            self._command("load_state_dict")
            load_optimizer_state(self.model, self.optimizer, state["optimizer"], self.world)
        self.updates = int(state.get("updates", 0))

    def full_model(self) -> torch.nn.Module:
        """The policy with every weight whole, for checkpoints: the model itself in a single
        process, rank 0's host copy (refreshed from the shards) under data parallelism."""
        if not self.world.distributed:
            return self.model
        self._command("full_model")
        self.host.load_state_dict(full_model_state(self.model, self.world))
        return self.host

    # ------------------------------------------------------------------------------------------
    def _command(self, name: str, *args: Any) -> None:
        """Rank 0: tell the followers which collective comes next (module doc)."""
        if self.world.distributed:
            if not self.world.main:
                raise RuntimeError(f"Trainer.{name} is called by rank 0; rank {self.world.rank} runs follow()")
            self.world.broadcast((name, args))

    def stop(self) -> None:
        """Rank 0: release the followers (their ``follow`` returns)."""
        self._command("stop")

    def follow(self) -> None:
        """Ranks > 0: run rank 0's collectives as its commands arrive, until ``stop``."""
        while True:
            name, args = self.world.broadcast(None)
            if name == "stop":
                return
            if name == "train":
                self._train_rows(*args)
            elif name == "publish":
                full_model_state(self.model, self.world)
            elif name == "state_dict":
                full_optimizer_state(self.model, self.optimizer, self.world)
            elif name == "load_state_dict":
                load_optimizer_state(self.model, self.optimizer, None, self.world)
            elif name == "save_optimizer":
                save_sharded_optimizer(self.model, self.optimizer, args[0], self.world)
            elif name == "load_sharded":
                load_sharded_optimizer(self.model, self.optimizer, args[0], self.world)
            elif name == "full_model":
                full_model_state(self.model, self.world)
            else:
                raise RuntimeError(f"rank {self.world.rank}: unknown trainer command {name!r} from rank 0")
