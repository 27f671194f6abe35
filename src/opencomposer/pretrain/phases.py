"""The pretraining trainer: phases run in order on one model and one AdamW (docs/recipe.md §3).

Every training recipe is a list of phases (``pretrain.plan``): ``[[pretrain.phases]]`` as listed
(most compute at one sequence length, a long-context extension, a short SFT phase), ``[pretrain]``
without them as one phase, ``[sft]`` as one phase of the ``sft`` loss. A phase has its sequence
length, token or step budget, learning-rate schedule, data mix by source (``pretrain.data``),
losses (``pretrain.losses``) and RoPE base; the weights, AdamW's moments and the token count carry
over from one phase to the next, and each phase sets its own learning rate. ``Trainer`` runs the
phases; ``run_phases`` (``opencomposer pretrain``) sets up a run folder around it, and
``train_in_memory`` trains a model in place without one (``pretrain.cpt.pretrain``,
``pretrain.sft.sft``, and ``run_sft`` under it).

**Long context.** A phase with ``rope_theta`` sets the RoPE base as it starts: the model config's
``rope_parameters`` and every rotary embedding's inverse frequencies, recomputed by its own class
(``set_rope_theta``). Raising the base ("adjusted base frequency", as in Code Llama and Llama 3's
long-context stages) slows every rotation, so the relative angles at the new lengths stay within
the range the model has learned to read; it is one number in ``config.json``, so a checkpoint
loads with it and inference needs nothing special (position interpolation squeezes the
short-range angles the model relies on, and YaRN's per-band ramp and attention temperature add
settings a tiny model cannot justify). Evaluations (``pretrain.evaluation``) then also score
held-out loss past the first phase's length and the retrieval probes.

**Checkpoints** (``pretrain.checkpoints``; a recipe that lists phases): at the end of every phase
and every ``pretrain.checkpoint_every`` steps. A rerun of the same recipe resumes from the newest:
the model, optimizer and counters come back, and the data streams are replayed to the same
position (regenerated from their seeds and skipped, not trained), so the resumed run sees exactly
the batches the uninterrupted run would have (``data_crc`` in the metrics shows it).
``metrics.jsonl`` is cut back to the checkpoint's step. The one phase of a recipe without
``[[pretrain.phases]]`` keeps no step checkpoints and starts afresh, as it always did.

**Data and context parallel** (``trainer.world_size = N``, ``parallel.cp = c``; the command launches
the group): every rank draws the same batches and takes its data-parallel share of the rows (and
of the demonstrations, ``distributed.balance``); the ``c`` ranks of a context-parallel group take
the same rows and each computes its chunks of every row (``distributed.context``). Each loss
returns this rank's part of the step's loss; the parts add up to the single-process loss, and
backward of N × the part under FSDP's gradient average gives its gradient
(``tests/distributed/test_dp_phases.py``). The step's metrics are merged over the ranks by
``training.metrics.merge_ranks`` (``MERGE``). Rank 0 alone records the SFT demonstrations (sent
to the others), logs and writes the checkpoints, gathered whole into the same layout (Adam's
state too), so a run resumes at any world size. Held-out evaluations run whole rows on every rank.

**SFT's options** (``sft.pack_tokens``, ``sft.micro_batch_tokens``, ``sft.bf16``) apply to every
phase with the ``sft`` loss: a step's demonstrations are packed several to a row after the split
over the ranks, then run in micro-batches (gradient accumulation: each divided by the whole
step's tokens, so the step's gradient is the same); a rank with fewer micro-batches than another
runs empty forwards (``training.forward.padding_forward``) so that FSDP's collectives match.

The run folder gets ``recipe.toml``, ``corpus.json`` (mix by source, dropped duplicates),
``metrics.jsonl`` (and ``tb/``), ``mix.json`` (tokens trained per phase and source),
``heldout.png``, ``loss.png``, the final ``checkpoint/`` and, with phases, ``checkpoints/``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ConfigError
from opencomposer.config.pretrain import PretrainConfig, SFTConfig
from opencomposer.distributed.balance import split_rows
from opencomposer.distributed.fsdp import (
    clip_gradients,
    full_model_state,
    load_optimizer_state,
    reduce_gradients,
    shard_model,
)
from opencomposer.distributed.runtime import World
from opencomposer.io import atomic_directory, atomic_write_text
from opencomposer.model.corpus import Corpus, build_corpus, corpus_versions
from opencomposer.pretrain.checkpoints import (
    FRESH,
    latest_checkpoint,
    plan_state,
    resume_state,
    save_phase_checkpoint,
    whole_state,
)
from opencomposer.pretrain.data import DemonstrationBatches, MixedBatches, generated_corpora, phase_gaps
from opencomposer.pretrain.demonstrations import demonstrations
from opencomposer.pretrain.evaluation import Evaluator
from opencomposer.pretrain.losses import LOSSES, StepData
from opencomposer.pretrain.plan import Phase, phase_lr, pretraining_plan, recipe_toml
from opencomposer.pretrain.recall import SOURCES as GENERATED_SOURCES
from opencomposer.training.cost import CostMeter
from opencomposer.training.cost import finish as finish_cost
from opencomposer.training.metrics import Merge, MetricsLog, merge_ranks
from opencomposer.training.optim import build_optimizer
from opencomposer.training.progress import ProgressBar

MERGE: dict[str, Merge] = {"loss": "sum", "lm_loss": "sum", "sft_loss": "sum", "aux_loss": "mean"}
"""How a step's metrics combine over the ranks: the loss parts add up, the per-rank load-balancing
loss is averaged, the rest are the whole batch's on every rank already (rank 0's is kept)."""
SUMMED = ("loss", "lm_loss", "sft_loss")
"""The metrics that add up over a step's micro-batches."""


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
    mix: dict[str, dict[str, int]] = field(default_factory=dict)  # lm tokens trained per phase and source
    demonstrations: int = 0  # demonstrations the sft loss drew from

    @property
    def first_loss(self) -> float:
        return next(r["loss"] for r in self.history if r["kind"] == "train")

    @property
    def last_loss(self) -> float:
        return next(r["loss"] for r in reversed(self.history) if r["kind"] == "train")

    @property
    def heldout(self) -> list[tuple[int, float]]:
        """(step, held-out loss) of every evaluation that measured it."""
        return [(r["step"], r["heldout_loss"]) for r in self.history if "heldout_loss" in r]


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



class _NoLog:
    """The metrics log of a run without one (ranks other than 0, a model trained in memory)."""

    def __enter__(self) -> _NoLog:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> None:
        return None

    def sync(self) -> None:
        return None


@dataclass
class Trainer:
    """Trains ``model`` with ``optimizer`` through the phases of ``plan`` (module doc).

    ``corpora``: the training corpus by the generated documents' gaps (``data.generated_corpora``),
    for phases that draw rows; ``demonstrations``: records the episodes of phases with the ``sft``
    loss (called once, on rank 0); ``run_dir``: where step checkpoints go (None: none);
    ``host``: rank 0's whole copy of the model under data parallelism (checkpoints gather into it);
    ``on_step(global_step)``: called after each step and its checkpoint (a test interrupts a run
    from it)."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    settings: PretrainConfig
    plan: list[Phase]
    world: World
    sft: SFTConfig
    seed: int
    corpora: dict[tuple[int, int], Corpus] = field(default_factory=dict)
    demonstrations: Callable[[], list] | None = None
    evaluator: Evaluator | None = None
    log: Any = field(default_factory=_NoLog)
    progress: bool = False
    run_dir: Path | None = None
    host: torch.nn.Module | None = None
    on_step: Callable[[int], None] | None = None
    cost: CostMeter | None = None  # counts the positions trained (training.cost)

    def train(self, state: dict[str, Any], resumed_from: Path | None = None) -> PhasedResult:
        """Every phase from ``state`` (``checkpoints.FRESH`` or a checkpoint's) on; the result."""
        self.result = PhasedResult(steps=state["global_step"], tokens=state["tokens"], seconds=0.0, phases=[],
                                   resumed_from=resumed_from, mix=state.get("mix", {}))
        self.device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.episodes: list | None = None
        self.start = time.perf_counter()
        self.budgets = list(self.plan)  # the recipe's plan, which a checkpoint names (``plan_state``)
        for index, steps in state.get("ended", {}).items():  # phases a condition ended early (``until``)
            self.shorten(int(index), steps)
        if state.get("phase_end") or state["step"] == self.plan[state["phase"]].steps:  # start the next phase
            state = {**state, "phase": state["phase"] + 1, "step": 0}
        self.ended = dict(state.get("ended", {}))
        for index in range(state["phase"], len(self.plan)):  # by index: an early end moves the later phases
            self.run_phase(self.plan[index], state["step"] if index == state["phase"] else 0)
        self.result.seconds = time.perf_counter() - self.start
        self.model.eval()
        return self.result

    def run_phase(self, phase: Phase, first: int) -> None:
        """Train ``phase`` from its step ``first`` (0, or where a checkpoint stopped): evaluations at
        its start, every ``eval_every`` steps and at its end; checkpoints every ``checkpoint_every``
        steps and at its end. A wall-clock budget (``phase.minutes``) can end it early."""
        summary = PhaseSummary(phase.name, phase.config.seq_len, phase.steps, 0)
        self.result.phases.append(summary)
        self.enter(phase)
        rows, demos = self.streams(phase, first)
        if first == 0:
            scores = self.evaluate(phase, phase.first_step, "start", summary)
            self.condition_met(phase, scores)  # a metric the evaluation lacks is refused now, not steps later
        self.model.train()
        started = time.perf_counter()
        every = self.settings.checkpoint_every
        with ProgressBar(phase.name, phase.steps, status="loss {loss:.3f}", completed=first, enabled=self.progress,
                         every=self.settings.log_every) as bar:
            for step in range(first, phase.steps):
                row = self.step(phase, step, rows, demos, summary, time.perf_counter() - started)
                global_step = phase.first_step + step + 1
                last = step + 1 == phase.steps or self.out_of_time(phase, started)
                if last or (step + 1) % self.settings.eval_every == 0:
                    scores = self.evaluate(phase, global_step, "end" if last else "during", summary)
                    if not last and self.condition_met(phase, scores):
                        last = True
                        self.ended[str(phase.index)] = step + 1
                        self.shorten(phase.index, step + 1)
                        summary.steps = step + 1
                        if self.progress and self.world.main:
                            metric = phase.config.condition()[0]
                            print(f"{phase.name}: {phase.config.until} at step {step + 1} of {phase.steps} "
                                  f"({metric} {scores[metric]:.3f}); the phase ends here", flush=True)
                    elif (condition := phase.config.condition()) and last and step + 1 == phase.steps \
                            and self.progress and self.world.main:  # the budget spent, the condition not met
                        metric = condition[0]
                        print(f"{phase.name}: {phase.config.until} not met in {phase.steps} steps "
                              f"({metric} {scores.get(metric, float('nan')):.3f}); the next phase starts anyway",
                              flush=True)
                if self.run_dir is not None and (last or (every and (step + 1) % every == 0)):
                    self.checkpoint(phase, step + 1, last)
                bar.update(step + 1, loss=row["loss"])
                if self.on_step is not None:
                    self.on_step(global_step)
                if last:
                    break

    def condition_met(self, phase: Phase, scores: dict[str, float]) -> bool:
        """Whether ``scores`` (an evaluation row) meet the phase's ``until`` (never without one);
        rank 0's scores decide for every rank, so all of them end the phase at the same step."""
        condition = phase.config.condition()
        if condition is None:
            return False
        metric, op, value = condition
        if metric not in scores:
            raise ConfigError(f"{phase.key('until')}: the evaluation has no metric {metric!r}; it measures "
                              + (", ".join(sorted(scores)) or "nothing (pretrain.eval_batches = 0 or no held-out files)"))
        return bool(self.world.broadcast(scores[metric] >= value if op == ">=" else scores[metric] <= value))

    def shorten(self, index: int, steps: int) -> None:
        """Phase ``index`` ended after ``steps`` steps (its ``until``): the phases after it start there."""
        cut = self.plan[index].steps - steps
        self.plan[index] = dataclasses.replace(self.plan[index], steps=steps)
        for i in range(index + 1, len(self.plan)):
            self.plan[i] = dataclasses.replace(self.plan[i], first_step=self.plan[i].first_step - cut)

    def enter(self, phase: Phase) -> None:
        """Set the phase's RoPE base and row length on the model (and on rank 0's whole copy)."""
        c = phase.config
        for target in (self.model, self.host) if self.host is not None else (self.model,):
            if c.rope_theta and rope_theta(target) != c.rope_theta:
                set_rope_theta(target, c.rope_theta)
            if phase.rows and c.seq_len > getattr(target.config, "max_position_embeddings", c.seq_len):
                target.config.max_position_embeddings = c.seq_len

    def streams(self, phase: Phase, first: int) -> tuple[MixedBatches | None, DemonstrationBatches | None]:
        """The phase's row and demonstration streams, replayed to its step ``first``."""
        c = phase.config
        rows = demos = None
        if phase.rows:
            from opencomposer.model.tokenizer import document_separator_id

            rows = MixedBatches(self.corpora[phase_gaps(c, self.settings)].train, phase, self.tokenizer,
                                document_separator_id(self.tokenizer), self.seed)
        if "sft" in c.losses:
            if self.episodes is None:  # the sandboxed episodes run once, on rank 0
                self.episodes = self.world.broadcast(self.demonstrations() if self.world.main else None)
                self.result.demonstrations = len(self.episodes)
            demos = DemonstrationBatches(self.episodes, c.sft_batch_size, self.seed, phase.index)
        for stream in (rows, demos):  # replay the draws up to the checkpoint (and its token counts)
            if stream is not None:
                stream.skip(first)
        return rows, demos

    def out_of_time(self, phase: Phase, started: float) -> bool:
        """Whether the phase's wall-clock budget is spent (rank 0's clock decides for every rank)."""
        return bool(phase.minutes) and self.world.broadcast(time.perf_counter() - started > 60 * phase.minutes)

    def step(self, phase: Phase, step: int, rows: MixedBatches | None, demos: DemonstrationBatches | None,
             summary: PhaseSummary, seconds: float) -> dict[str, float]:
        """One optimizer step at 0-based ``step`` of ``phase``: its batch, backward, clipping, AdamW;
        logs and returns the row of metrics."""
        parts, crc, tokens = self.batch(phase, rows, demos)
        lr = phase_lr(phase, phase.schedule_step(step, seconds))
        if phase.minutes:
            lr = self.world.broadcast(lr)  # rank 0's clock decides, so every rank steps alike
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.backward(phase, parts)
        reduce_gradients(self.model, self.world)
        grad_norm = clip_gradients([p for p in self.model.parameters() if p.grad is not None],
                                   self.settings.grad_clip or math.inf, self.world)
        self.optimizer.step()
        global_step = phase.first_step + step + 1
        self.result.steps = global_step
        if rows is not None:
            self.result.tokens += tokens
            summary.tokens += tokens
            self.result.mix[phase.name] = dict(rows.tokens)
        row = {**merge_ranks(self.world, metrics, MERGE), "lr": lr, "grad_norm": grad_norm,
               "tokens": self.result.tokens, "phase": phase.index, "phase_step": step + 1,
               "data_crc": crc % 2**24, "seconds": time.perf_counter() - self.start}
        if math.isnan(summary.first_loss):
            summary.first_loss = row["loss"]
        summary.last_loss = row["loss"]
        self.log.log(global_step, "train", row)
        self.result.history.append({"step": global_step, "kind": "train", **row})
        return row

    def batch(self, phase: Phase, rows: MixedBatches | None, demos: DemonstrationBatches | None
              ) -> tuple[list[StepData], int, int]:
        """The step's batch: this rank's share of it as the parts its backward runs (one, or one per
        micro-batch of demonstrations, the rows in the first), the whole batch's checksum and its
        lm tokens."""
        from opencomposer.training.forward import batch_to
        from opencomposer.training.packing import collate

        world = self.world
        common = {"hidden": "mtp" in phase.config.losses, "world": world, "pad_id": self.pad_id, "bf16": self.sft.bf16}
        first, crc, tokens = StepData(**common), 0, 0
        if rows is not None:
            ids, positions = rows.next()
            crc, tokens = zlib.crc32(ids.numpy().tobytes()), ids[:, 1:].numel()
            if self.cost is not None:  # the whole batch's rows, of ids[:, :-1] each
                self.cost.train_rows("pretraining", [ids.shape[1] - 1] * ids.shape[0])
            if world.distributed:  # this rank's rows (every rank of a CP group the same)
                ids = ids.tensor_split(world.dp_size)[world.dp_rank]
                positions = positions.tensor_split(world.dp_size)[world.dp_rank]
                first.lm_share = ids[:, 1:].numel() / (tokens * world.cp)
            first.ids, first.positions = ids.to(self.device), positions.to(self.device)
        if demos is None:
            return [first], crc, tokens
        chosen = demos.next_rows()
        crc = zlib.crc32(collate(chosen, self.pad_id).input_ids.numpy().tobytes(), crc)
        demo_tokens = sum(row.model_tokens for row in chosen)  # the whole batch's, on every rank
        if self.cost is not None:
            self.cost.train_rows("sft", [len(row) for row in chosen])
        if world.distributed:
            chosen = split_rows(chosen, world.dp_size)[world.dp_rank]
        parts = []
        for i, chunk in enumerate(self.demo_chunks(chosen)):
            part = first if i == 0 else StepData(**common)
            part.demos, part.demo_tokens = batch_to(collate(chunk, self.pad_id), self.device), demo_tokens
            parts.append(part)
        return parts, crc, tokens

    def demo_chunks(self, rows: list) -> list[list]:
        """This rank's demonstrations packed several to a row (``sft.pack_tokens``) and cut into
        micro-batches (``sft.micro_batch_tokens``); one chunk of one row each without them."""
        from opencomposer.training.forward import MIN_SHARED_PREFIX
        from opencomposer.training.packing import common_prefix, micro_batches, pack_rows

        if self.sft.pack_tokens:  # after the split over the ranks: it balances whole sequences
            rows = pack_rows(rows, self.sft.pack_tokens)
        if not self.sft.micro_batch_tokens:
            return [rows]
        # one process computes the shared prefix once (training.forward), so the budget counts it once
        prefix = 0 if self.world.distributed else common_prefix(rows, MIN_SHARED_PREFIX)
        return micro_batches(rows, self.sft.micro_batch_tokens, prefix)

    def backward(self, phase: Phase, parts: list[StepData]) -> dict[str, float]:
        """Backward of each part's summed losses (× N under FSDP, which averages gradients over the
        ranks: the parts of every rank add up to the step's loss); this rank's metrics of the step."""
        from opencomposer.training.forward import padding_forward

        metrics: dict[str, float] = {}
        for part in parts:
            loss, values = torch.zeros((), device=self.device), {}
            for name in phase.config.losses:
                term, found = LOSSES[name](self.model, part)
                loss = loss + term
                values.update(found)
            (loss * self.world.size if self.world.distributed else loss).backward()
            for name, value in {"loss": loss.item(), **values}.items():
                metrics[name] = metrics.get(name, 0.0) + value if name in SUMMED else value
        if parts[0].demos is not None:  # FSDP gathers layers collectively: match the busiest rank
            for _ in range(self.world.max(len(parts)) - len(parts)):
                padding_forward(self.model, self.device)
        return metrics

    def evaluate(self, phase: Phase, global_step: int, when: str, summary: PhaseSummary) -> dict[str, float]:
        """Log the held-out row of ``phase`` at ``global_step``, when the run measures anything; the row."""
        scores = self.evaluator(self.model, phase) if self.evaluator is not None else {}
        if not scores:
            return scores
        row = {"tokens": self.result.tokens, "phase": phase.index, **scores}
        self.log.log(global_step, "eval", row)
        self.result.history.append({"step": global_step, "kind": "eval", "when": when, **row})
        summary.evals.append(row)
        return scores

    def checkpoint(self, phase: Phase, step: int, last: bool) -> None:
        """Write ``checkpoints/step-N`` after ``step`` steps of ``phase`` (collective; rank 0 writes)."""
        self.log.sync()
        whole, optimizer_state = whole_state(self.model, self.optimizer, self.host, self.world)
        if self.world.main:
            save_phase_checkpoint(self.run_dir, whole, self.tokenizer, optimizer_state, {
                "phase": phase.index, "phase_name": phase.name, "step": step, "global_step": phase.first_step + step,
                "tokens": self.result.tokens, "phase_end": last, "mix": self.result.mix,
                "plan": plan_state(self.budgets), "ended": self.ended})


def train_in_memory(model: torch.nn.Module, tokenizer: Any, settings: PretrainConfig, plan: list[Phase], *,
                    seed: int = 0, corpus: Corpus | None = None, demonstrations: Callable[[], list] | None = None,
                    sft: SFTConfig | None = None, log: MetricsLog | None = None, progress: bool = False,
                    world: World | None = None, cost: CostMeter | None = None) -> PhasedResult:
    """Train ``model`` in place (on the device it is on) through ``plan``, without a run folder:
    no checkpoints, no resume. ``corpus``: the rows' files and the held-out ones; ``world``: this
    rank of a data- (and context-) parallel group, ``model`` then sharded in place."""
    world = world or World()
    sft = sft or SFTConfig()
    check_world(plan, world, sft)
    shard_model(model, world)
    optimizer = build_optimizer(model, lr=plan[0].config.lr, betas=tuple(settings.betas),
                                weight_decay=settings.weight_decay)
    torch.manual_seed(seed)
    corpora = generated_corpora(corpus, tokenizer, settings, seed) if corpus is not None else {}
    trainer = Trainer(model, tokenizer, optimizer, settings, plan, world, sft, seed, corpora=corpora,
                      demonstrations=demonstrations, evaluator=_evaluator(corpus, tokenizer, plan, settings, 0, seed),
                      log=log or _NoLog(), progress=progress, cost=cost)
    return trainer.train(dict(FRESH))


def _evaluator(corpus: Corpus | None, tokenizer: Any, plan: list[Phase], settings: PretrainConfig, probes: int,
               seed: int) -> Evaluator | None:
    """The run's held-out measurements; None without held-out files or phases that draw rows."""
    if corpus is None or not corpus.heldout or not any(p.rows for p in plan):
        return None
    from opencomposer.model.tokenizer import document_separator_id

    return Evaluator(corpus, tokenizer, document_separator_id(tokenizer), plan, settings, probes, seed)


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
    """``opencomposer pretrain``: run (or resume) the recipe's phases under ``config.run.path``
    (module doc). ``corpus`` and ``tokenizer`` may be passed in when the caller already built
    them; ``probes``: retrieval probes per evaluation when phases differ in length (0: none);
    ``on_step``: as ``Trainer``'s. ``world``: this rank of a data- (and context-) parallel group;
    rank 0 returns the whole model, the other ranks their shards."""
    from opencomposer.model.device import apply_run_settings, resolve_device

    settings, plan = pretraining_plan(config.pretrain)
    world = world or World()
    check_world(plan, world, config.sft)
    device = world.device if world.distributed else resolve_device(config.run.device)
    apply_run_settings(config.run)
    run_dir, resumable = config.run.path, bool(config.pretrain.phases)  # one [pretrain] phase starts afresh
    corpus = _prepare_run(config, corpus, world, progress, resumable)
    # rank 0 picks the checkpoint; the others get its choice once rank 0's model is built (below)
    checkpoint = (latest_checkpoint(run_dir) if resumable else None) if world.main else world.broadcast(None)
    state = resume_state(checkpoint, plan)
    model, tokenizer = _build_model(config, tokenizer, device, checkpoint)
    cost = CostMeter("pretrain", config.run, model, devices=world.size)  # before sharding: the whole model's N
    if checkpoint is not None:
        cost.resume(run_dir)
    if world.main and world.distributed:
        world.barrier()
        world.broadcast(checkpoint)
    host, optimizer = _prepare_model(model, config, settings, plan, world, checkpoint, progress)
    if progress and checkpoint is not None:
        print(f"resuming {checkpoint.name}: phase {plan[state['phase']].name}, step {state['step']}")
    trainer = Trainer(model, tokenizer, optimizer, settings, plan, world, config.sft, config.run.seed,
                      corpora=generated_corpora(corpus, tokenizer, settings, config.run.seed),
                      demonstrations=lambda: demonstrations(config, tokenizer),
                      evaluator=_evaluator(corpus, tokenizer, plan, settings, probes, config.run.seed),
                      progress=progress, run_dir=run_dir if resumable else None, host=host, on_step=on_step,
                      cost=cost)
    resume_step = state["global_step"] if checkpoint is not None else None
    with (MetricsLog(run_dir, resume_step=resume_step, trackers=config.run.trackers, recipe=recipe_toml(config),
                     name=config.run.name) if world.main else _NoLog()) as trainer.log:
        result = trainer.train(state, checkpoint)
    model = _finish_run(config, trainer, result)
    if world.main:
        finish_cost(cost, run_dir, f"opencomposer pretrain: {run_dir}")
    return model, tokenizer, result


def _prepare_run(config: Config, corpus: Corpus | None, world: World, progress: bool,
                 resumable: bool = False) -> Corpus:
    """The run folder with ``recipe.toml`` and ``corpus.json``, and the corpus (rank 0 builds and
    caches corpus and tokenizer first; the others reuse them). A run that would resume from a
    checkpoint on another corpus than the one it started on (``corpus.json``'s fingerprint: another
    environment, or a changed ``[corpus]``) is refused: its batches would not be the ones it began."""
    pc, run_dir = config.pretrain, config.run.path
    if not world.main:
        world.barrier()
    if world.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "recipe.toml", recipe_toml(config))
    if corpus is None and pc.phases:
        corpus = build_corpus(config.corpus, seed=config.run.seed, dedup=pc.dedup,
                              near_duplicate_threshold=pc.near_duplicate_threshold, heldout_by=pc.heldout_by)
    elif corpus is None:  # without phases: the corpus such a recipe always had
        corpus = build_corpus(config.corpus, seed=config.run.seed)
    _check_recipe(config, corpus)
    report = {"mix": corpus.mix(), "dropped": corpus.dropped, "train_files": len(corpus.train),
              "heldout_files": len(corpus.heldout), "heldout_by": pc.heldout_by if pc.phases else "file",
              "fingerprint": corpus.fingerprint(), "versions": corpus_versions(config.corpus)}
    if world.main:
        _check_same_corpus(run_dir, report, resumable)
        atomic_write_text(run_dir / "corpus.json", json.dumps(report, indent=1) + "\n")
    if progress:
        print_corpus(report)
    return corpus


def _check_same_corpus(run_dir: Path, report: dict[str, Any], resumable: bool) -> None:
    """Raise ConfigError if ``run_dir`` holds a checkpoint to resume and its ``corpus.json`` names
    another corpus than ``report`` (runs from before the fingerprint was recorded pass)."""
    previous = run_dir / "corpus.json"
    if not (resumable and previous.is_file() and latest_checkpoint(run_dir) is not None):
        return
    before = json.loads(previous.read_text()).get("fingerprint")
    if before is not None and before != report["fingerprint"]:
        raise ConfigError(
            f"{run_dir}: the corpus differs from the one this run started on (fingerprint {before[:16]} "
            f"then, {report['fingerprint'][:16]} now; versions now {report['versions']}), so resuming would "
            "not continue its batches; restore the environment or [corpus], or start a new run.name")


def _prepare_model(model: torch.nn.Module, config: Config, settings: PretrainConfig, plan: list[Phase],
                   world: World, checkpoint: Path | None, progress: bool
                   ) -> tuple[torch.nn.Module | None, torch.optim.Optimizer]:
    """Convert and shard ``model``, build AdamW and restore its state (and torch's RNG) from
    ``checkpoint``; returns rank 0's whole copy of the model under data parallelism, and the optimizer."""
    import copy

    from opencomposer.model.mtp import mtp_layers
    from opencomposer.numerics.convert import convert_model

    if any("mtp" in p.config.losses for p in plan) and not mtp_layers(model):
        raise ConfigError("pretrain.phases.losses: 'mtp' trains the model's MTP layers and it has none; set "
                          "model.num_mtp_layers (1 is DeepSeek-V3's and the speculative decoder's depth)")
    convert_model(model, config.numerics)
    host = copy.deepcopy(model).cpu() if world.distributed and world.main else None  # to checkpoint from
    shard_model(model, world)
    optimizer = build_optimizer(model, lr=plan[0].config.lr, betas=tuple(settings.betas),
                                weight_decay=settings.weight_decay)
    if checkpoint is None:
        torch.manual_seed(config.run.seed)
        return host, optimizer
    # rank 0 reads Adam's state and hands each rank its part
    saved = torch.load(checkpoint / "trainer.pt", weights_only=False, map_location="cpu") if world.main else {}
    load_optimizer_state(model, optimizer, saved.get("optimizer"), world)
    torch.set_rng_state(world.broadcast(saved.get("torch_rng")))
    return host, optimizer


def _finish_run(config: Config, trainer: Trainer, result: PhasedResult) -> torch.nn.Module:
    """Gather the model whole on rank 0 and write ``mix.json``, ``checkpoint/`` and the plots;
    returns the whole model (rank 0) or this rank's shards."""
    from opencomposer.model.loading import save_checkpoint
    from opencomposer.pretrain.plots import plot_heldout, plot_loss
    from opencomposer.training.metrics import read_metrics

    model, world, run_dir = trainer.model, trainer.world, config.run.path
    if world.distributed:
        full = full_model_state(model, world)  # collective; rank 0 gets the whole weights
        if not world.main:
            return model
        trainer.host.load_state_dict(full)
        model = trainer.host.eval()
    atomic_write_text(run_dir / "mix.json", json.dumps(result.mix, indent=1) + "\n")
    result.checkpoint = atomic_directory(run_dir / "checkpoint",
                                         lambda folder: save_checkpoint(model, trainer.tokenizer, folder))
    rows = read_metrics(run_dir)  # the whole run's rows, those before a resume included
    plot_heldout(rows, run_dir / "heldout.png", [p.first_step for p in trainer.plan[1:]])
    plot_loss([r for r in rows if r["kind"] == "train"] +
              [r for r in rows if r["kind"] == "eval" and "heldout_loss" in r], run_dir / "loss.png")
    return model


def check_world(plan: list[Phase], world: World, sft: SFTConfig) -> None:
    """Refuse, before any training, a phase that leaves a data-parallel rank without rows, whose
    rows do not split into context-parallel chunks, or that cannot run as asked."""
    for phase in plan:
        c, losses = phase.config, set(phase.config.losses)
        if phase.rows and c.batch_size < world.dp_size:
            raise ConfigError(f"{phase.key('batch_size')} = {c.batch_size} gives some of the {world.dp_size} "
                              "data-parallel ranks no rows; use at least one row per rank")
        if "sft" in losses and c.sft_batch_size < world.dp_size:
            raise ConfigError(f"{phase.key('sft_batch_size')} = {c.sft_batch_size} gives some of the "
                              f"{world.dp_size} data-parallel ranks no rows; use at least one row per rank")
        if world.distributed and (world.ep == 1 or world.ep_fsdp) and losses == {"mtp"}:
            # the trunk's forward runs without gradient, so FSDP2's backward hooks (registered on
            # its outputs) never fire and the MTP layers' gradients would not be reduced
            raise ConfigError(f"pretrain.phases ({phase.name}): losses = {c.losses} trains the MTP layers alone, "
                              "which does not run under FSDP (trainer.world_size > 1, or parallel.ep_fsdp) yet; "
                              "add 'lm' or 'sft', run it in one process, or with parallel.ep alone")
        if phase.rows and world.cp > 1 and c.seq_len % (2 * world.cp):
            raise ConfigError(f"{phase.key('seq_len')} = {c.seq_len}: context parallelism (parallel.cp = "
                              f"{world.cp}) splits each row into {2 * world.cp} equal chunks; use a multiple of "
                              f"{2 * world.cp}")
        if losses >= {"sft", "mtp"} and "lm" not in losses and (sft.pack_tokens or sft.micro_batch_tokens):
            raise ConfigError(f"pretrain.phases ({phase.name}): 'mtp' distils on one whole demonstration per row; "
                              "set sft.pack_tokens and sft.micro_batch_tokens to 0")


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


def phases_worker(world: World, config: Config) -> PhasedResult | None:
    """``distributed.launch``'s function for ``opencomposer pretrain``: rank 0's result."""
    _, _, result = run_phases(config, progress=world.main, world=world)
    return result if world.main else None


def print_corpus(report: dict[str, Any]) -> None:
    """The corpus by source: files and bytes in training, files held out, duplicates dropped."""
    dropped = report["dropped"]
    print(f"corpus: {report['train_files']} training files, {report['heldout_files']} held out "
          f"(by {report['heldout_by']}); duplicates dropped: {dropped.get('exact', 0)} exact, {dropped.get('near', 0)} near")
    if "fingerprint" in report:
        versions = ", ".join(f"{k} {v}" for k, v in report.get("versions", {}).items())
        print(f"  fingerprint {report['fingerprint'][:16]}" + (f" ({versions})" if versions else ""))
    total = sum(row["train_bytes"] for row in report["mix"].values()) or 1
    for source, row in sorted(report["mix"].items()):
        print(f"  {source}: {row['train_files']} files ({row['train_projects']} projects), "
              f"{row['train_bytes'] / 1e6:.1f} MB = {row['train_bytes'] / total:.0%} of training bytes; "
              f"held out {row['heldout_files']} files ({row['heldout_projects']} projects)")
