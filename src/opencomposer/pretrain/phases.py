"""Phased continued pretraining (docs/recipe.md §3): ``[[pretrain.phases]]`` run in order by one command.

The report trains in three phases: most compute at one sequence length, a shorter long-context
extension at a multiple of it, and a short SFT phase on coding tasks. A recipe lists its phases
(``config.pretrain.PhaseConfig``: sequence length, token or step budget, learning-rate schedule,
data mix by corpus source, losses, RoPE base) and ``run_phases`` runs them one after the other on
one model and one AdamW (its moments carry over; each phase sets its own learning rate).

**Data.** The corpus is deduplicated (exact and near-duplicate files) and split by project
(``model.corpus``; ``pretrain.dedup``, ``pretrain.heldout_by``). Rows are packed from whole
documents, each opened by ``<|endoftext|>``, with **no attention across documents**: the position
ids restart at 0 at every document start (and at every row start, for a document continued from
the previous row), and the training forward attends inside each document at the cost of its own
length (``training.attention.packed_attention``; the other forwards take transformers' own
packed-sequence path, a block-diagonal causal mask built when the forward has position ids, no
attention mask and no cache; ``tests/pretrain/test_phases.py`` checks that a packed document's
logits equal those of the document alone). Every target is predictable from its own document: the separator opening a
document predicts its first token, a document's last token predicts the next separator (the end
of the file). Each row is drawn from one source, chosen by the phase's weights with a seeded
generator; the tokens trained per source are reported in ``mix.json``. Besides the corpus's
sources a phase may list the generated ``copy``, ``recall`` and ``append`` (``pretrain.recall``:
documents that teach copying from the context, which the tiny model does not learn from code alone).

**Losses.** ``LOSSES`` maps a name of ``PhaseConfig.losses`` to the function that computes it on
a step; a phase sums those it lists. ``lm``: next-token cross-entropy on the packed rows (plus the
MoE load-balancing term). ``sft``: cross-entropy on the model-written tokens of the oracle's tool
episodes (``pretrain.sft.record_demonstrations`` on the ``[sft]`` section's tasks, in the real
harness; prompts and tool outputs are context only). ``mtp``: multi-token prediction by
self-distillation (``model.mtp``): the MTP layers learn, by KL, the detached main head's
distribution at the shifted position, on the phase's packed rows (sharing the ``lm`` forward) or,
in a phase with ``sft`` and no ``lm``, at the demonstrations' model tokens; the trunk gets no
gradient from it. The report's schedule: MTP layers start from scratch at a mid-pretraining
checkpoint (they are built with the model, ``model.num_mtp_layers``, and untouched until the first
phase listing ``mtp``), then train jointly with ``lm`` and ``sft`` in the later phases. Evaluations
then also report ``heldout_mtp_kl`` and ``heldout_mtp_top1`` (greedy draft acceptance).

**Long context.** A phase with ``rope_theta`` sets the RoPE base as it starts: the model config's
``rope_parameters`` and every rotary embedding's inverse frequencies, recomputed by its own class
(``set_rope_theta``). Raising the base ("adjusted base frequency", as in Code Llama and Llama 3's
long-context stages) slows every rotation, so the relative angles at the new lengths stay within
the range the model has learned to read; it is one number in ``config.json``, so a checkpoint
loads with it and inference needs nothing special, and it trains the same attention at every
length (position interpolation squeezes the short-range angles the model relies on, and YaRN's
per-band ramp and attention temperature add settings a tiny model cannot justify).
Each evaluation also scores held-out loss at positions past the first phase's length and a
long-range retrieval probe (``retrieval_probe``).

**Checkpoints.** ``{run}/checkpoints/step-NNNNNNN/`` (global step) holds ``model/``, ``trainer.pt``
(AdamW state, torch RNG) and ``state.json`` (phase, step in it, tokens, the phase plan). One is
written at the end of every phase (kept) and every ``pretrain.checkpoint_every`` steps inside one
(only the newest kept), atomically. A rerun of the same recipe resumes from the newest: the model,
optimizer and counters come back, and the data streams are replayed to the same position (the
batches are regenerated from the seeded order and skipped, not trained), so the resumed run sees
exactly the batches the uninterrupted run would have (``data_crc`` in the metrics shows it).
``metrics.jsonl`` is cut back to the checkpoint's step.

**Data and context parallel** (``trainer.world_size = N``, ``parallel.cp = c``; the command launches
the group): every rank draws the same batches and takes its data-parallel share of the rows (and
of the demonstrations); the ``c`` ranks of a context-parallel group take the same rows and each
computes its chunks of every row (``distributed.context``: ``cp_forward``,
``cp_mtp_distillation_loss``). Each loss returns this rank's part of the step's loss: the
cross-entropy sums over the rank's targets divided by the whole batch's, the MTP KL sums divided
by the valid rows of every rank; the parts add up to the single-process loss, and backward of N ×
the part under FSDP's gradient average gives its gradient (``tests/distributed/test_dp_phases.py``).
The MoE load-balancing term is per rank and averaged. Rank 0 alone records the SFT demonstrations
(sent to the others), logs and writes the checkpoints, gathered whole into the same layout (Adam's
state too), so a run resumes at any world size. Held-out evaluations run whole rows on every rank.

The run folder also gets ``recipe.toml``, ``corpus.json`` (mix by source, dropped duplicates),
``mix.json`` (tokens trained per phase and source), ``heldout.png`` (held-out codebase loss
against tokens, log axis, with a log-linear fit), ``loss.png`` and the final ``checkpoint/``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opencomposer.config import Config, ConfigError, to_toml
from opencomposer.config.pretrain import PhaseConfig
from opencomposer.distributed.balance import split_rows
from opencomposer.distributed.fsdp import (
    clip_gradients,
    full_model_state,
    full_optimizer_state,
    load_optimizer_state,
    reduce_gradients,
    shard_model,
)
from opencomposer.distributed.runtime import World
from opencomposer.io import atomic_directory, atomic_write_text, discard
from opencomposer.model.corpus import CodeFile, Corpus, build_corpus
from opencomposer.pretrain.recall import SOURCES as GENERATED_SOURCES
from opencomposer.pretrain.recall import with_recall_sources
from opencomposer.training.attention import packed_attention
from opencomposer.training.forward import target_nll
from opencomposer.training.metrics import MetricsLog
from opencomposer.training.optim import build_optimizer
from opencomposer.training.progress import ProgressBar
from opencomposer.training.schedule import warmup_cosine_lr

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
PROBE_WORDS = ("amber", "basil", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
               "kelp", "lotus", "maple", "nickel", "onyx", "pepper", "quartz", "raven", "saffron", "tundra",
               "umber", "violet", "walnut", "yarrow", "zephyr")


# --------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Phase:
    """A phase as it runs: its config, its resolved step budget and its place in the run."""

    index: int
    name: str
    config: PhaseConfig
    steps: int
    first_step: int  # global step count before this phase

    @property
    def lm(self) -> bool:
        return "lm" in self.config.losses

    @property
    def rows(self) -> bool:
        """Whether the phase draws packed corpus rows: for ``lm``, and for ``mtp`` without ``sft``."""
        losses = self.config.losses
        return self.lm or ("mtp" in losses and "sft" not in losses)


def plan_phases(phases: list[PhaseConfig]) -> list[Phase]:
    """Resolve names and budgets: ``steps``, or ``tokens`` as whole steps of ``batch_size × seq_len``."""
    plan, first = [], 0
    for i, phase in enumerate(phases):
        steps = phase.steps or math.ceil(phase.tokens / (phase.batch_size * phase.seq_len))
        plan.append(Phase(i, phase.name or f"phase-{i}", phase, steps, first))
        first += steps
    return plan


def phase_lr(phase: Phase, step: int) -> float:
    """The learning rate at 0-based ``step`` of ``phase``: warm-up, then cosine to the floor or constant."""
    c = phase.config
    floor = 1.0 if c.schedule == "constant" else c.min_lr_ratio
    return warmup_cosine_lr(step, peak_lr=c.lr, warmup_steps=c.warmup_steps, total_steps=phase.steps,
                            min_lr_ratio=floor)


def recipe_toml(config: Config) -> str:
    """``config`` as TOML, its phases as ``[[pretrain.phases]]`` tables; ``load_recipe`` reads it
    back to an equal config."""
    return to_toml(config) + "\n"


# ------------------------------------------------------------------------------------------ packing


def documents(files: list[CodeFile], tokenizer: Any, batch_files: int = 32) -> Iterator[list[int]]:
    """Token ids of each file in order (tokenised in batches)."""
    for start in range(0, len(files), batch_files):
        yield from tokenizer([f.text for f in files[start : start + batch_files]], add_special_tokens=False)["input_ids"]


def pack_documents(docs: Iterator[list[int]], separator: int, seq_len: int) -> Iterator[tuple[list[int], list[int]]]:
    """Rows of ``seq_len + 1`` token ids and their position ids. Each document is ``[separator,
    *ids]``; positions count from 0 at every document start and at every row start, so a forward
    with these position ids attends within documents only (module doc)."""
    window = seq_len + 1
    ids: list[int] = []
    positions: list[int] = []
    for doc in docs:
        doc = [separator, *doc]
        while doc:
            take = doc[: window - len(ids)]
            doc = doc[len(take):]
            positions += range(len(take))
            ids += take
            if len(ids) == window:
                yield ids, positions
                ids, positions = [], []


def _seed(*parts: Any) -> list[int]:
    return [zlib.crc32(str(part).encode()) for part in parts]


def source_rows(files: list[CodeFile], tokenizer: Any, separator: int, seq_len: int, seed: list[int]
                ) -> Iterator[tuple[list[int], list[int]]]:
    """Endless packed rows of ``files``, each epoch in a fresh seeded order."""
    epoch = 0
    while True:
        order = np.random.default_rng([*seed, epoch]).permutation(len(files))
        yield from pack_documents(documents([files[i] for i in order], tokenizer), separator, seq_len)
        epoch += 1


class MixedBatches:
    """``[batch, seq_len + 1]`` ids and positions, each row from one source drawn by weight.

    Deterministic in (seed, phase): the source of every row comes from one seeded generator, and
    each source's rows from its own seeded file order, so ``skip(n)`` followed by ``next()`` gives
    what the n+1-th ``next()`` of a fresh instance gives (resume)."""

    def __init__(self, files: list[CodeFile], phase: Phase, tokenizer: Any, separator: int, seed: int):
        c = phase.config
        by_source: dict[str, list[CodeFile]] = {}
        for f in files:
            by_source.setdefault(f.source, []).append(f)
        if c.sources:
            missing = [s for s in c.sources if s not in by_source]
            if missing:
                raise ConfigError(f"pretrain.phases[{phase.index}].sources: {missing} has no training files; the "
                                  f"corpus has {sorted(by_source)}")
            self.sources = list(c.sources)
            weights = np.array(c.weights, dtype=float)
        else:  # the natural mix: every corpus source in proportion to its text (generated ones only when listed)
            self.sources = sorted(s for s in by_source if s not in GENERATED_SOURCES)
            weights = np.array([sum(len(f.text) for f in by_source[s]) for s in self.sources], dtype=float)
        self.weights = weights / weights.sum()
        self.batch_size = c.batch_size
        self.rng = np.random.default_rng(_seed(seed, "mix", phase.index))
        self.streams = {s: source_rows(by_source[s], tokenizer, separator, c.seq_len, _seed(seed, s, phase.index))
                        for s in self.sources}
        self.tokens = dict.fromkeys(self.sources, 0)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = self.rng.choice(len(self.sources), size=self.batch_size, p=self.weights)
        rows = [next(self.streams[self.sources[i]]) for i in chosen]
        for i, (ids, _) in zip(chosen, rows, strict=True):
            self.tokens[self.sources[i]] += len(ids) - 1
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])

    def skip(self, batches: int) -> None:
        for _ in range(batches):
            self.next()


def fixed_batches(files: list[CodeFile], tokenizer: Any, separator: int, seq_len: int, batch_size: int,
                  count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` packed batches of ``files`` in order (held-out evaluation sets)."""
    rows = pack_documents(documents(files, tokenizer), separator, seq_len)
    batches = []
    while len(batches) < count:
        chunk = [row for _, row in zip(range(batch_size), rows, strict=False)]
        if len(chunk) < batch_size:
            break
        batches.append((torch.tensor([r[0] for r in chunk]), torch.tensor([r[1] for r in chunk])))
    return batches


# ------------------------------------------------------------------------------------------- losses


def packed_forward(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, router_logits: bool = False):
    """The forward on packed rows: inputs ``ids[:, :-1]`` at their position ids, no cache (the
    document mask needs it off; module doc)."""
    extra = {"output_router_logits": True} if router_logits else {}
    with packed_attention(model, positions[:, :-1]):
        return model(input_ids=ids[:, :-1], position_ids=positions[:, :-1], use_cache=False, **extra)


def token_losses(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target of packed rows, ``[B, T]``."""
    return target_nll(packed_forward(model, ids, positions).logits, ids[:, 1:])


@dataclass
class StepData:
    """What a step's losses read: the packed corpus rows and/or the demonstration batch, and the
    main forward on the rows, run once a step for every loss that reads it (``lm_forward``).

    Under data and context parallelism (``world``, module doc) ``ids``/``positions`` and ``demos``
    are this rank's share of the batch, ``lm_share`` its share of the rows' targets and
    ``demo_tokens`` the whole demonstration batch's model tokens: each loss returns this rank's
    part of the step's loss (the parts add up over the ranks) and metrics of the whole batch or,
    for ``lm_loss``, ``sft_loss`` and ``aux_loss``, this rank's part (``merge_step_metrics``)."""

    ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    demos: Any = None  # a training.packing TrainBatch
    hidden: bool = False  # the rows' forward also returns the last hidden state (for ``mtp``)
    world: World = field(default_factory=World)
    lm_share: float = 1.0  # this rank's share of the rows' targets
    demo_tokens: int = 0  # model tokens of the whole demonstration batch (0: this batch's)
    pad_id: int = 0
    _forward: Any = None
    _forward_grad: bool = False

    def lm_forward(self, model: torch.nn.Module, grad: bool = True):
        """The model's forward on the packed rows (inputs ``ids[:, :-1]``; this rank's chunks of
        them under context parallelism), with the router logits when the MoE load-balancing term
        is on; computed once and reused, recomputed only when a loss needs the graph that an
        earlier no-graph call did not build."""
        if self._forward is None or (grad and not self._forward_grad):
            aux = (getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0) > 0
            extra = {"output_router_logits": True} if aux else {}
            ids, positions = self.ids[:, :-1], self.positions[:, :-1]
            with torch.enable_grad() if grad else torch.no_grad():
                if self.world.cp > 1:
                    from opencomposer.distributed.context import cp_forward

                    self._forward = cp_forward(model, ids, positions, self.world.cp_group, hidden=self.hidden, **extra)
                else:
                    with packed_attention(model, positions):
                        self._forward = model(input_ids=ids, position_ids=positions, use_cache=False,
                                              output_hidden_states=self.hidden, **extra)
            self._forward_grad = grad
        return self._forward

    def lm_targets(self) -> torch.Tensor:
        """The targets of this rank's positions of the rows."""
        targets = self.ids[:, 1:]
        if self.world.cp > 1:
            from opencomposer.distributed.context import split_sequence

            targets = split_sequence(targets, self.world.cp, self.world.cp_rank)
        return targets


def lm_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean next-token cross-entropy over the packed rows, plus the MoE load-balancing term (per
    rank and averaged over the ranks, as data-parallel MoE training does)."""
    aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0
    out = data.lm_forward(model)
    ce = target_nll(out.logits, data.lm_targets()).mean()
    loss = ce * data.lm_share
    metrics = {"lm_loss": loss.item()}
    if aux_coef > 0 and getattr(out, "aux_loss", None) is not None:
        loss = loss + aux_coef * out.aux_loss / data.world.size
        metrics["aux_loss"] = out.aux_loss.item()
    return loss, metrics


def sft_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean cross-entropy over the model-written tokens of the demonstration batch (the SFT loss)."""
    from opencomposer.pretrain.sft import model_token_nll

    tokens = data.demo_tokens or int(data.demos.loss_mask.sum())
    loss = model_token_nll(model, data.demos, data.world, data.pad_id, bf16=False) / tokens
    return loss, {"sft_loss": loss.item(), "sft_tokens": tokens}


def mtp_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Self-distillation of the MTP layers onto the main head (``model.mtp``): on the packed rows
    when the step has them (sharing the ``lm`` loss's forward), else on the demonstration rows
    whose targets are model tokens (the positions speculative decoding drafts). Normalised by the
    valid rows of every rank, so the ranks' parts add up to the whole batch's loss."""
    from opencomposer.model.mtp import mtp_distillation_loss

    world = data.world
    if data.ids is not None:
        out = data.lm_forward(model, grad=False)
        ids, positions, targets = data.ids[:, :-1], data.positions[:, :-1], None
    else:
        demos = data.demos
        ids, positions, targets = demos.input_ids, demos.position_ids, demos.loss_mask
        if world.cp > 1:
            from opencomposer.distributed.context import pad_batch_for_cp

            demos = pad_batch_for_cp(demos, world.cp, data.pad_id)
            ids, positions, targets = demos.input_ids, demos.position_ids, demos.loss_mask
        with torch.no_grad():
            if world.cp > 1:
                from opencomposer.distributed.context import cp_forward

                out = cp_forward(model, ids, positions, world.cp_group, hidden=True)
            else:
                out = model(input_ids=ids, position_ids=positions, use_cache=False, output_hidden_states=True)
    if world.cp > 1:
        from opencomposer.distributed.context import cp_mtp_distillation_loss

        return cp_mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids, positions, world.cp_group,
                                        targets=targets, count_group=None)
    reduce = world.all_reduce_sum if world.distributed else None
    return mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids, positions, targets=targets,
                                 reduce=reduce)


def merge_step_metrics(world: World, metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics from every rank's (``StepData``): the loss parts summed, the load-balancing
    loss averaged, the rest (already the whole batch's) as they are."""
    if not world.distributed:
        return metrics
    gathered = world.gather(metrics)
    merged = dict(metrics)
    for name in ("lm_loss", "sft_loss", "loss"):
        if name in metrics:
            merged[name] = sum(m[name] for m in gathered)
    if "aux_loss" in metrics:
        merged["aux_loss"] = sum(m["aux_loss"] for m in gathered) / len(gathered)
    return merged


LOSSES: dict[str, Callable[[torch.nn.Module, StepData], tuple[torch.Tensor, dict[str, float]]]] = {
    "lm": lm_step_loss,
    "sft": sft_step_loss,
    "mtp": mtp_step_loss,
}


class DemonstrationBatches:
    """Seeded epochs over the rows of recorded episodes, ``batch_size`` rows a step (as
    ``pretrain.sft.sft`` draws them); ``skip`` replays the draws for a resume."""

    def __init__(self, episodes: list, tokenizer: Any, batch_size: int, seed: int, phase_index: int):
        from opencomposer.training.packing import episode_rows

        self.rows = episode_rows(episodes)
        if not self.rows:
            raise ValueError("sft phase: the demonstrations hold no model tokens")
        self.pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        self.batch_size = batch_size
        self.rng = np.random.default_rng(_seed(seed, "sft", phase_index))
        self.order: list[int] = []

    def _chosen(self) -> list:
        while len(self.order) < self.batch_size:
            self.order += self.rng.permutation(len(self.rows)).tolist()
        chosen, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
        return [self.rows[i] for i in chosen]

    def next(self):
        return self.collate(self._chosen())

    def next_rows(self) -> list:
        """The next batch's rows, uncollated (a data-parallel rank collates its share)."""
        return self._chosen()

    def collate(self, rows: list):
        from opencomposer.training.packing import collate

        return collate(rows, self.pad)

    def skip(self, batches: int) -> None:
        for _ in range(batches):
            self._chosen()


# ------------------------------------------------------------------------------------------- model


def set_rope_theta(model: torch.nn.Module, theta: float) -> None:
    """Train (and save) ``model`` with RoPE base ``theta``: set it in the config and recompute the
    inverse frequencies of every rotary embedding module with its own class, so the model family's
    rule (which head dimensions rotate, any scaling) is kept. The buffers are not in the checkpoint;
    ``config.json`` carries the base, so a saved model loads with it."""
    config = model.config
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:
        raise ValueError(f"{type(model).__name__}: the config has no rope_parameters to set rope_theta in")
    params["rope_theta"] = float(theta)
    config.rope_parameters = params
    if hasattr(config, "rope_theta"):
        config.rope_theta = float(theta)
    found = 0
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "original_inv_freq"):
            fresh = type(module)(config=config)
            device = module.inv_freq.device
            module.inv_freq = fresh.inv_freq.to(device)
            module.original_inv_freq = fresh.original_inv_freq.to(device)
            module.attention_scaling = fresh.attention_scaling
            found += 1
    if not found:
        raise ValueError(f"{type(model).__name__}: no rotary embedding module found to set rope_theta in")


def rope_theta(model: torch.nn.Module) -> float:
    return float((getattr(model.config, "rope_parameters", None) or {}).get("rope_theta", 0.0))


# -------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], beyond: int = 0
                 ) -> dict[str, float]:
    """Mean held-out cross-entropy; with ``beyond``, also at targets whose input position is below
    it (``near``) and at or past it (``far``), the positions a shorter phase never trained."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    losses, positions = [], []
    for ids, pos in batches:
        losses.append(token_losses(model, ids.to(device), pos.to(device)).cpu())
        positions.append(pos[:, :-1])
    model.train(was_training)
    loss, pos = torch.cat(losses), torch.cat(positions)
    out = {"loss": float(loss.mean())}
    if beyond:
        far = pos >= beyond
        out["near"] = float(loss[~far].mean()) if (~far).any() else float("nan")
        out["far"] = float(loss[far].mean()) if far.any() else float("nan")
        out["far_tokens"] = int(far.sum())
    return out


@torch.no_grad()
def heldout_mtp(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """The MTP layers on held-out rows: ``heldout_mtp_kl`` (the self-distillation loss) and
    ``heldout_mtp_top1`` (depth 1's argmax agreeing with the main head's: the acceptance rate of
    greedy speculative decoding), averaged over the batches."""
    from opencomposer.model.mtp import mtp_distillation_loss

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    kl, top1 = [], []
    for ids, pos in batches:
        ids, pos = ids.to(device), pos.to(device)
        out = model(input_ids=ids[:, :-1], position_ids=pos[:, :-1], use_cache=False, output_hidden_states=True)
        _, metrics = mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids[:, :-1], pos[:, :-1])
        kl.append(metrics["mtp_kl"])
        top1.append(metrics.get("mtp_top1_1", float("nan")))
    model.train(was_training)
    return {"heldout_mtp_kl": float(np.mean(kl)), "heldout_mtp_top1": float(np.mean(top1))}


def _probe_code(filler: list[CodeFile], tokenizer: Any, tokens: int, what: str) -> list[int]:
    """About ``tokens`` tokens of held-out code (whole documents) to fill probes with."""
    code: list[int] = []
    for doc in documents(filler, tokenizer):  # enough held-out code for every probe, no more
        code += doc
        if len(code) >= tokens:
            break
    if not code:
        raise ValueError(f"{what}: no held-out code to fill the probes with")
    return code


def probe_documents(tokenizer: Any, filler: list[CodeFile], length: int, count: int, seed: int = 0
                    ) -> list[tuple[list[int], int, int]]:
    """``count`` long-range retrieval probes of ``length`` tokens: (ids, start of the answer,
    distance). A probe is a file that assigns a random value to a fresh name in its first line,
    ``probe_name_K = "maple_onyx"``, continues with held-out code, and ends with ``assert
    probe_name_K == "``: the model should complete the value, which only the first line tells.
    Built in token space, so the answer's tokens are exactly those planted."""
    from opencomposer.model.tokenizer import document_separator_id

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = np.random.default_rng(_seed(seed, "probe", length))
    code = _probe_code(filler, tokenizer, length * count, "retrieval probe")
    probes = []
    for k in range(count):
        name = f"probe_name_{k}"
        value = tok("_".join(rng.choice(PROBE_WORDS, size=2, replace=False)))
        head = [document_separator_id(tokenizer), *tok(f'{name} = "'), *value, *tok('"\n')]
        tail = tok(f'\nassert {name} == "')
        room = length - len(head) - len(tail) - len(value) + 1  # inputs: everything but the last answer token
        if room < 0:
            raise ValueError(f"retrieval probe: {length} tokens cannot hold a probe")
        start = int(rng.integers(0, max(1, len(code) - room)))
        filler_ids = (code * (1 + room // len(code)))[start : start + room]
        ids = head + filler_ids + tail + value
        probes.append((ids, len(head) + len(filler_ids) + len(tail), len(filler_ids) + len(tail) + 1))
    return probes


def append_probe_documents(tokenizer: Any, filler: list[CodeFile], length: int, count: int, seed: int = 0
                           ) -> list[tuple[list[int], int, int]]:
    """``count`` append probes of about ``length`` tokens, in ``probe_documents``' form (ids, start
    of the answer, distance). A probe assigns a fresh name a list of 1-4 probe words
    (``probe_list_K = "amber cobalt"``), continues with held-out code, marks a new word
    (``key: fjord``), continues with a third as much code and assigns the name again with the list
    copied (``probe_list_K = "amber cobalt``): the answer is the new word (`` fjord``), where
    copying the first assignment predicts the closing quote instead (``pretrain.recall``, the
    ``append`` source). Built in token space like the retrieval probe."""
    from opencomposer.model.tokenizer import document_separator_id

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = np.random.default_rng(_seed(seed, "append-probe", length))
    code = _probe_code(filler, tokenizer, length * count, "append probe")
    probes = []
    for k in range(count):
        words = [str(w) for w in rng.choice(PROBE_WORDS, size=int(rng.integers(2, 6)), replace=False)]
        opening = tok(f'probe_list_{k} = "') + tok(words[0])
        for word in words[1:-1]:
            opening += tok(f" {word}")
        answer = tok(f" {words[-1]}")
        head = [document_separator_id(tokenizer), *opening, *tok('"\n')]
        mark = [*tok("\nkey:"), *answer, *tok("\n")]
        again = [*tok("\n"), *opening]
        room = length - len(head) - len(mark) - len(again) - len(answer) + 1
        if room < 4:
            raise ValueError(f"append probe: {length} tokens cannot hold a probe")
        far = room - room // 4  # the list ~3/4 of the row back, the word ~1/4
        start = int(rng.integers(0, max(1, len(code) - room)))
        spread = (code * (1 + room // len(code)))[start : start + room]
        ids = head + spread[:far] + mark + spread[far:] + again + answer
        probes.append((ids, len(ids) - len(answer), len(ids) - len(answer) - len(head) + 1))
    return probes


@torch.no_grad()
def retrieval_probe(model: torch.nn.Module, probes: list[tuple[list[int], int, int]]) -> dict[str, float]:
    """Score probes: ``accuracy`` (the greedy completion is the planted value, every token of it:
    with the true prefix fed in, greedy decoding reproduces the value exactly when each of its
    tokens is the argmax), ``first_token`` (the value's first token is the argmax) and
    ``logprob`` (mean log-probability of the value's tokens)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    exact, first, logprob = [], [], []
    for ids, answer, _ in probes:
        tensor = torch.tensor([ids], device=device)
        logits = model(input_ids=tensor[:, :-1], position_ids=torch.arange(len(ids) - 1, device=device)[None],
                       use_cache=False).logits[0, answer - 1 :].float()
        target = tensor[0, answer:]
        exact.append(bool((logits.argmax(-1) == target).all()))
        first.append(bool(logits[0].argmax() == target[0]))
        logprob.append(float(torch.log_softmax(logits, -1).gather(-1, target[:, None]).mean()))
    model.train(was_training)
    return {"accuracy": float(np.mean(exact)), "first_token": float(np.mean(first)), "logprob": float(np.mean(logprob)),
            "distance": float(np.mean([d for _, _, d in probes]))}


# ------------------------------------------------------------------------------------- checkpoints


def _checkpoints(run_dir: Path) -> list[Path]:
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(PREFIX) and (p / "state.json").is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    found = _checkpoints(run_dir)
    return found[-1] if found else None


def save_phase_checkpoint(run_dir: Path, model: torch.nn.Module, tokenizer: Any, optimizer: dict[str, Any],
                          state: dict[str, Any]) -> Path:
    """Write ``checkpoints/step-NNNNNNN`` atomically, then drop older mid-phase checkpoints (those
    that end a phase stay). ``model``: whole (not sharded); ``optimizer``: its state dict in the
    single-process layout (``distributed.fsdp.full_optimizer_state``)."""
    from opencomposer.model.loading import save_checkpoint

    def write(folder: Path) -> None:
        save_checkpoint(model, tokenizer, folder / "model")
        torch.save({"optimizer": optimizer, "torch_rng": torch.get_rng_state()}, folder / "trainer.pt")
        (folder / "state.json").write_text(json.dumps(state, indent=1))

    (run_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    for stale in (run_dir / CHECKPOINTS).glob(f".{PREFIX}*.tmp*"):  # left by a kill mid-write
        discard(stale)
    path = atomic_directory(run_dir / CHECKPOINTS / f"{PREFIX}{state['global_step']:07d}", write)
    for old in _checkpoints(run_dir):
        if old != path and not json.loads((old / "state.json").read_text()).get("phase_end"):
            discard(old)
    return path


# -------------------------------------------------------------------------------------------- run


@dataclass
class PhaseSummary:
    name: str
    seq_len: int
    steps: int
    tokens: int  # lm tokens trained in this phase
    first_loss: float = float("nan")
    last_loss: float = float("nan")
    evals: list[dict[str, float]] = field(default_factory=list)  # every evaluation row of the phase


@dataclass
class PhasedResult:
    steps: int
    tokens: int
    seconds: float
    phases: list[PhaseSummary]
    history: list[dict] = field(default_factory=list)  # every logged row, this process's only
    resumed_from: Path | None = None
    checkpoint: Path | None = None


def _plan_state(plan: list[Phase]) -> list[dict[str, Any]]:
    return [{"name": p.name, "steps": p.steps, **dataclasses.asdict(p.config)} for p in plan]


def _build_model(config: Config, tokenizer: Any, device: torch.device, checkpoint: Path | None):
    from opencomposer.model.loading import TINY_KINDS, default_tokenizer, load_model
    from opencomposer.model.tokenizer import load_tokenizer

    if checkpoint is not None:
        spec = dataclasses.replace(config.model, kind="hf", path=str(checkpoint / "model"))
        return load_model(spec, seed=config.run.seed, device=device)
    if config.model.kind in TINY_KINDS and not config.model.path:
        if tokenizer is None:
            tokenizer = (load_tokenizer(config.model.tokenizer_path) if config.model.tokenizer_path
                         else default_tokenizer(config.corpus, config.tokenizer, config.run.seed))
        return load_model(config.model, tokenizer, seed=config.run.seed, device=device)
    return load_model(config.model, seed=config.run.seed, device=device)


def phase_gaps(phase: PhaseConfig, pc: Any) -> tuple[int, int]:
    """The (recall, append) gaps of the generated documents ``phase`` draws."""
    recall = phase.recall_gap_chars or pc.recall_gap_chars
    return recall, phase.append_gap_chars or recall


def generated_corpora(corpus: Corpus, tokenizer: Any, pc: Any, seed: int) -> dict[tuple[int, int], Corpus]:
    """``corpus`` with the generated sources its phases list (``pretrain.recall``), one per pair of
    gaps in use (``phase_gaps``): a phase draws the documents made with its ``recall_gap_chars``
    and ``append_gap_chars``. The held-out files and the natural training files are the same in all."""
    by_gaps: dict[tuple[int, int], set[str]] = {}
    for phase in pc.phases:
        by_gaps.setdefault(phase_gaps(phase, pc), set()).update(phase.sources)
    return {gaps: with_recall_sources(corpus, tokenizer, names, pc.recall_documents, seed, *gaps)
            for gaps, names in by_gaps.items()}


def _check_recipe(config: Config, corpus: Corpus) -> None:
    """Refuse, before any training, what would only fail in a later phase."""
    sources = {f.source for f in corpus.train}
    if clash := sorted(sources & set(GENERATED_SOURCES)):
        raise ConfigError(f"corpus.sources: {clash} is the name of a generated source (pretrain.recall); rename the "
                          f"folder")
    sources |= set(GENERATED_SOURCES)
    for i, phase in enumerate(config.pretrain.phases):
        missing = [s for s in phase.sources if s not in sources]
        if missing:
            raise ConfigError(f"pretrain.phases[{i}].sources: {missing} has no training files; the corpus has "
                              f"{sorted(sources - set(GENERATED_SOURCES))} (corpus.sources), and "
                              f"{list(GENERATED_SOURCES)} are generated (pretrain.recall)")
        if "sft" in phase.losses and not (config.sft.task_family or config.sft.tasks):
            raise ConfigError(f"pretrain.phases[{i}].losses: 'sft' trains on demonstrations of the [sft] tasks; set "
                              'sft.task_family (e.g. "tiny-composed") or sft.tasks')


def _demonstrations(config: Config, tokenizer: Any) -> list:
    """The oracle's episodes on the ``[sft]`` section's tasks, recorded in the real harness."""
    import tempfile

    from opencomposer.pretrain.sft import demonstration_tasks, record_demonstrations

    with tempfile.TemporaryDirectory(prefix="opencomposer-phase-sft-") as scratch:
        tasks = demonstration_tasks(config, Path(scratch) / "tasks")
        return record_demonstrations(tasks, tokenizer, config)


def run_phases(
    config: Config,
    corpus: Corpus | None = None,
    tokenizer: Any = None,
    *,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    probes: int = 16,
    world: World | None = None,
) -> tuple[torch.nn.Module, Any, PhasedResult]:
    """Run (or resume) every phase of ``config.pretrain.phases`` under ``config.run.path``; see the
    module doc. ``on_step(global_step)`` is called after each step and its checkpoint (a test
    interrupts a run from it). ``probes``: retrieval probes per evaluation when phases differ in
    length (0: none). ``world``: this rank of a data- (and context-) parallel group (module doc);
    rank 0 returns the whole model, the other ranks their shards."""
    from opencomposer.model.device import apply_run_settings, resolve_device
    from opencomposer.model.tokenizer import document_separator_id
    from opencomposer.numerics.convert import convert_model

    pc = config.pretrain
    if not pc.phases:
        raise ConfigError("pretrain.phases: empty; run_pretraining (pretrain.cpt) trains a recipe without phases")
    plan = plan_phases(pc.phases)
    world = world or World()
    _check_world(plan, world)
    device = world.device if world.distributed else resolve_device(config.run.device)
    apply_run_settings(config.run)
    run_dir = config.run.path
    if not world.main:
        world.barrier()  # rank 0 builds (and caches) corpus and tokenizer first; the others reuse them
    if world.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "recipe.toml", recipe_toml(config))
    corpus = corpus or build_corpus(config.corpus, seed=config.run.seed, dedup=pc.dedup,
                                    near_duplicate_threshold=pc.near_duplicate_threshold, heldout_by=pc.heldout_by)
    _check_recipe(config, corpus)
    report = {"mix": corpus.mix(), "dropped": corpus.dropped, "train_files": len(corpus.train),
              "heldout_files": len(corpus.heldout), "heldout_by": pc.heldout_by}
    if world.main:
        atomic_write_text(run_dir / "corpus.json", json.dumps(report, indent=1) + "\n")
    if progress:
        print_corpus(report)

    # rank 0 picks the checkpoint; the others get its choice once rank 0's model is built (below)
    checkpoint = latest_checkpoint(run_dir) if world.main else world.broadcast(None)
    state: dict[str, Any] = {"phase": 0, "step": 0, "global_step": 0, "tokens": 0, "mix": {}}
    if checkpoint is not None:
        state = json.loads((checkpoint / "state.json").read_text())
        if state["plan"] != _plan_state(plan):
            raise ConfigError(f"cannot resume {checkpoint}: its [[pretrain.phases]] differ from the recipe's; restore "
                              f"the recipe or start a fresh run folder (run.name)")
    model, tokenizer = _build_model(config, tokenizer, device, checkpoint)
    if world.main and world.distributed:
        world.barrier()
        world.broadcast(checkpoint)
    from opencomposer.model.mtp import mtp_layers

    if any("mtp" in p.config.losses for p in plan) and not mtp_layers(model):
        raise ConfigError("pretrain.phases.losses: 'mtp' trains the model's MTP layers and it has none; set "
                          "model.num_mtp_layers (1 is DeepSeek-V3's and the speculative decoder's depth)")
    convert_model(model, config.numerics)
    host = copy.deepcopy(model).cpu() if world.distributed and world.main else None  # to checkpoint from
    shard_model(model, world)
    optimizer = build_optimizer(model, lr=plan[0].config.lr, betas=tuple(pc.betas), weight_decay=pc.weight_decay)
    if checkpoint is not None:  # rank 0 reads Adam's state and hands each rank its part
        saved = (torch.load(checkpoint / "trainer.pt", weights_only=False, map_location="cpu")
                 if world.main else {})
        load_optimizer_state(model, optimizer, saved.get("optimizer"), world)
        torch.set_rng_state(world.broadcast(saved.get("torch_rng")))
        if progress:
            print(f"resuming {checkpoint.name}: phase {plan[state['phase']].name}, step {state['step']}")
    else:
        torch.manual_seed(config.run.seed)
    if state["step"] == plan[state["phase"]].steps:  # the checkpoint ends a phase: start the next
        state = {**state, "phase": state["phase"] + 1, "step": 0}

    corpora = generated_corpora(corpus, tokenizer, pc, config.run.seed)  # by gap: the documents phases draw
    separator = document_separator_id(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    base_len = plan[0].config.seq_len
    long_len = max(p.config.seq_len for p in plan if p.lm) if any(p.lm for p in plan) else base_len
    eval_sets: dict[int, list] = {}
    long_eval = fixed_batches(corpus.heldout, tokenizer, separator, long_len, max(1, pc.batch_size // 2),
                              pc.eval_batches) if long_len > base_len and pc.eval_batches else []
    probe_sets: dict[str, list] = {}  # the probe at the longest length, and one within the first phase's
    filler = corpus.heldout or [f for f in corpus.train if f.source not in GENERATED_SOURCES]
    if long_len > base_len and probes:
        probe_sets["probe_long"] = probe_documents(tokenizer, filler, long_len, probes, config.run.seed)
        with contextlib.suppress(ValueError):  # a first phase too short to hold a probe has no short one
            probe_sets["probe_short"] = probe_documents(tokenizer, filler, base_len, probes, config.run.seed)
    if probes:  # the append probe at each length a phase trains the append source at
        for length in sorted({p.config.seq_len for p in plan if p.lm and "append" in p.config.sources}):
            with contextlib.suppress(ValueError):
                probe_sets[f"probe_append_{length}"] = append_probe_documents(tokenizer, filler, length, probes,
                                                                              config.run.seed)
    demos = None
    result = PhasedResult(steps=state["global_step"], tokens=state["tokens"], seconds=0.0, phases=[],
                          resumed_from=checkpoint)
    start = time.perf_counter()
    mix: dict[str, dict[str, int]] = state.get("mix", {})

    with (MetricsLog(run_dir, resume_step=state["global_step"] if checkpoint is not None else None) if world.main
          else _NoLog()) as log:

        def evaluate(phase: Phase, global_step: int, when: str) -> dict[str, float]:
            row: dict[str, float] = {"tokens": result.tokens, "phase": phase.index}
            if phase.rows and pc.eval_batches:
                if phase.config.seq_len not in eval_sets:
                    eval_sets[phase.config.seq_len] = fixed_batches(corpus.heldout, tokenizer, separator,
                                                                    phase.config.seq_len, phase.config.batch_size,
                                                                    pc.eval_batches)
                if eval_sets[phase.config.seq_len]:
                    row["heldout_loss"] = heldout_loss(model, eval_sets[phase.config.seq_len])["loss"]
                    if mtp_layers(model):
                        row.update(heldout_mtp(model, eval_sets[phase.config.seq_len]))
            if long_eval:
                scores = heldout_loss(model, long_eval, beyond=base_len)
                row.update(heldout_long_loss=scores["loss"], heldout_near_loss=scores["near"],
                           heldout_far_loss=scores["far"])
            for label, subset in probe_sets.items():
                for key, value in retrieval_probe(model, subset).items():
                    row[f"{label}_{key}"] = value
            log.log(global_step, "eval", row)
            result.history.append({"step": global_step, "kind": "eval", "when": when, **row})
            return row

        for phase in plan[state["phase"]:]:
            c = phase.config
            first = state["step"] if phase.index == state["phase"] else 0
            summary = PhaseSummary(phase.name, c.seq_len, phase.steps, 0)
            result.phases.append(summary)
            for target in (model, host) if host is not None else (model,):  # rank 0's whole copy too
                if c.rope_theta and rope_theta(target) != c.rope_theta:
                    set_rope_theta(target, c.rope_theta)
                if c.seq_len > getattr(target.config, "max_position_embeddings", c.seq_len):
                    target.config.max_position_embeddings = c.seq_len
            batches = (MixedBatches(corpora[phase_gaps(phase.config, pc)].train, phase, tokenizer, separator,
                                    config.run.seed)
                       if phase.rows else None)
            demo_batches = None
            if "sft" in c.losses:
                if demos is None:  # the sandboxed episodes run once, on rank 0
                    demos = world.broadcast(_demonstrations(config, tokenizer) if world.main else None)
                demo_batches = DemonstrationBatches(demos, tokenizer, c.sft_batch_size, config.run.seed, phase.index)
            for stream in (batches, demo_batches):  # replay the draws up to the checkpoint (and its token counts)
                if stream is not None:
                    stream.skip(first)
            if first == 0:
                summary.evals.append(evaluate(phase, phase.first_step, "start"))
            model.train()
            with ProgressBar(phase.name, phase.steps, status="loss {loss:.3f}", completed=first, enabled=progress,
                             every=pc.log_every) as bar:
                for step in range(first, phase.steps):
                    global_step = phase.first_step + step + 1
                    data = StepData(hidden="mtp" in c.losses, world=world, pad_id=int(pad_id))
                    crc = 0
                    if batches is not None:
                        ids, positions = batches.next()
                        crc = zlib.crc32(ids.numpy().tobytes())
                        step_tokens = ids[:, 1:].numel()
                        if world.distributed:  # this rank's rows (every rank of a CP group the same)
                            ids = ids.tensor_split(world.dp_size)[world.dp_rank]
                            positions = positions.tensor_split(world.dp_size)[world.dp_rank]
                            data.lm_share = ids[:, 1:].numel() / (step_tokens * world.cp)
                        data.ids, data.positions = ids.to(device), positions.to(device)
                    if demo_batches is not None:
                        from opencomposer.training.forward import batch_to

                        rows = demo_batches.next_rows()
                        crc = zlib.crc32(demo_batches.collate(rows).input_ids.numpy().tobytes(), crc)
                        data.demo_tokens = sum(row.model_tokens for row in rows)
                        if world.distributed:
                            rows = split_rows(rows, world.dp_size)[world.dp_rank]
                        data.demos = batch_to(demo_batches.collate(rows), device)
                    lr = phase_lr(phase, step)
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                    loss = torch.zeros((), device=device)
                    metrics: dict[str, float] = {}
                    for name in c.losses:
                        term, values = LOSSES[name](model, data)
                        loss = loss + term
                        metrics.update(values)
                    optimizer.zero_grad(set_to_none=True)
                    # FSDP averages gradients over the ranks; N × each rank's part sums them
                    (loss * world.size if world.distributed else loss).backward()
                    reduce_gradients(model, world)
                    grad_norm = clip_gradients([p for p in model.parameters() if p.grad is not None], pc.grad_clip,
                                               world)
                    optimizer.step()
                    if batches is not None:
                        result.tokens += step_tokens
                        summary.tokens += step_tokens
                        mix[phase.name] = dict(batches.tokens)
                    result.steps = global_step
                    metrics = merge_step_metrics(world, {"loss": loss.item(), **metrics})
                    row = {**metrics, "lr": lr, "grad_norm": grad_norm, "tokens": result.tokens,
                           "phase": phase.index, "phase_step": step + 1, "data_crc": crc % 2**24,
                           "seconds": time.perf_counter() - start}
                    if math.isnan(summary.first_loss):
                        summary.first_loss = row["loss"]
                    summary.last_loss = row["loss"]
                    log.log(global_step, "train", row)
                    result.history.append({"step": global_step, "kind": "train", **row})
                    last = step + 1 == phase.steps
                    if last or (step + 1) % pc.eval_every == 0:
                        summary.evals.append(evaluate(phase, global_step, "end" if last else "during"))
                    if last or (pc.checkpoint_every and (step + 1) % pc.checkpoint_every == 0):
                        log.sync()
                        whole, optimizer_state = _whole_state(model, optimizer, host, world)
                        if world.main:
                            save_phase_checkpoint(run_dir, whole, tokenizer, optimizer_state, {
                                "phase": phase.index, "phase_name": phase.name, "step": step + 1,
                                "global_step": global_step, "tokens": result.tokens, "phase_end": last,
                                "mix": mix, "plan": _plan_state(plan)})
                    bar.update(step + 1, loss=row["loss"])
                    if on_step is not None:
                        on_step(global_step)
    result.seconds = time.perf_counter() - start
    if world.distributed:
        full = full_model_state(model, world)  # collective; rank 0 gets the whole weights
        if not world.main:
            model.eval()
            return model, tokenizer, result
        host.load_state_dict(full)
        model = host
    atomic_write_text(run_dir / "mix.json", json.dumps(mix, indent=1) + "\n")
    from opencomposer.model.loading import save_checkpoint

    result.checkpoint = atomic_directory(run_dir / "checkpoint", lambda folder: save_checkpoint(model, tokenizer, folder))
    from opencomposer.training.metrics import read_metrics

    rows = read_metrics(run_dir)  # the whole run's rows, those before a resume included
    plot_heldout(rows, run_dir / "heldout.png", [p.first_step for p in plan[1:]])
    from opencomposer.pretrain.cpt import plot_loss

    plot_loss([{"step": r["step"], **r} for r in rows if r["kind"] == "train"] +
              [{"step": r["step"], "heldout_loss": r["heldout_loss"]} for r in rows
               if r["kind"] == "eval" and "heldout_loss" in r], run_dir / "loss.png", "phased pretraining loss")
    model.eval()
    return model, tokenizer, result


class _NoLog:
    """The metrics log of ranks other than 0: they compute what rank 0 logs, and write nothing."""

    def __enter__(self) -> _NoLog:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> None:
        return None

    def sync(self) -> None:
        return None


def _check_world(plan: list[Phase], world: World) -> None:
    """Refuse, before any training, a phase that leaves a data-parallel rank without rows or
    whose rows do not split into context-parallel chunks."""
    for phase in plan:
        c = phase.config
        if phase.rows and c.batch_size < world.dp_size:
            raise ConfigError(f"pretrain.phases ({phase.name}): batch_size = {c.batch_size} gives some of the "
                              f"{world.dp_size} data-parallel ranks no rows; use at least one row per rank")
        if "sft" in c.losses and c.sft_batch_size < world.dp_size:
            raise ConfigError(f"pretrain.phases ({phase.name}): sft_batch_size = {c.sft_batch_size} gives some of "
                              f"the {world.dp_size} data-parallel ranks no demonstrations")
        if world.distributed and (world.ep == 1 or world.ep_fsdp) and "mtp" in c.losses \
                and not {"lm", "sft"} & set(c.losses):
            # the trunk's forward runs without gradient, so FSDP2's backward hooks (registered on
            # its outputs) never fire and the MTP layers' gradients would not be reduced
            raise ConfigError(f"pretrain.phases ({phase.name}): losses = {c.losses} trains the MTP layers alone, "
                              "which does not run under FSDP (trainer.world_size > 1, or parallel.ep_fsdp) yet; "
                              "add 'lm' or 'sft', run it in one process, or with parallel.ep alone")
        if phase.rows and world.cp > 1 and c.seq_len % (2 * world.cp):
            raise ConfigError(f"pretrain.phases ({phase.name}): seq_len = {c.seq_len} does not split into the "
                              f"{2 * world.cp} chunks of context parallelism (parallel.cp = {world.cp})")


def _whole_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, host: torch.nn.Module | None,
                 world: World) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model whole and the optimizer's state in the single-process layout (collective under
    data parallelism: rank 0 gets them in ``host``, the other ranks nothing useful)."""
    if not world.distributed:
        return model, optimizer.state_dict()
    weights = full_model_state(model, world)
    optimizer_state = full_optimizer_state(model, optimizer, world)
    if world.main:
        host.load_state_dict(weights)
    return host, optimizer_state


def phases_worker(world: World, config: Config) -> PhasedResult | None:
    """``distributed.launch``'s function for ``opencomposer pretrain`` with phases: rank 0's result."""
    _, _, result = run_phases(config, progress=world.main, world=world)
    return result if world.main else None


def print_corpus(report: dict[str, Any]) -> None:
    """The corpus by source: files and bytes in training, files held out, duplicates dropped."""
    dropped = report["dropped"]
    print(f"corpus: {report['train_files']} training files, {report['heldout_files']} held out "
          f"(by {report['heldout_by']}); duplicates dropped: {dropped.get('exact', 0)} exact, {dropped.get('near', 0)} near")
    total = sum(row["train_bytes"] for row in report["mix"].values()) or 1
    for source, row in sorted(report["mix"].items()):
        print(f"  {source}: {row['train_files']} files ({row['train_projects']} projects), "
              f"{row['train_bytes'] / 1e6:.1f} MB = {row['train_bytes'] / total:.0%} of training bytes; "
              f"held out {row['heldout_files']} files ({row['heldout_projects']} projects)")


def loglinear_fit(tokens: list[float], losses: list[float]) -> tuple[float, float]:
    """Least-squares ``loss ≈ a + b · log10(tokens)``: (a, b); b < 0 when the loss falls."""
    b, a = np.polyfit(np.log10(tokens), losses, 1)
    return float(a), float(b)


def plot_heldout(rows: list[dict], path: Path, boundaries: list[int]) -> Path | None:
    """Held-out codebase loss against tokens trained on a log axis, phase starts marked, with the
    log-linear fit over the evaluations after the first (docs/recipe.md §3: it falls log-linearly)."""
    points = [(r["tokens"], r["heldout_loss"], r["step"]) for r in rows
              if r.get("kind") == "eval" and "heldout_loss" in r and r.get("tokens", 0) > 0]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    tokens, losses, steps = zip(*points, strict=True)
    ax.plot(tokens, losses, "o-", label="held-out codebase loss")
    if len(points) >= 3:
        a, b = loglinear_fit(list(tokens), list(losses))
        grid = np.geomspace(min(tokens), max(tokens), 50)
        ax.plot(grid, a + b * np.log10(grid), "--", color="gray", label=f"fit: {a:.2f} {b:+.2f}·log10(tokens)")
    for boundary in boundaries:
        before = [t for t, _, s in points if s <= boundary]
        if before:
            ax.axvline(max(before), color="red", alpha=0.3, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("tokens trained (log)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("held-out codebase loss (dotted: phase starts)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
