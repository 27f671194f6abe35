"""What the trainer runs: every training recipe as a list of phases (``pretrain.phases``).

The one trainer knows phases only. ``[[pretrain.phases]]`` are taken as listed; ``[pretrain]``
without them is one phase named ``pretraining`` made of its own fields (sequence length, steps,
batch, learning rate), capped at ``pretrain.max_minutes`` of wall-clock time; ``[sft]`` (``opencomposer
sft``) is one phase named ``sft`` whose losses are ``["sft"]``, with the SFT section's schedule
(cosine to a tenth of ``sft.lr``), Adam's default betas and no held-out evaluation. Each returns
the settings every phase shares (a ``PretrainConfig``: betas, weight decay, clipping, evaluation
and checkpoint cadence) and the plan.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from opencomposer.config import Config, to_toml
from opencomposer.config.pretrain import PhaseConfig, PretrainConfig, SFTConfig
from opencomposer.training.schedule import warmup_cosine_lr

SFT_MIN_LR_RATIO = 0.1  # the SFT recipe's cosine ends at a tenth of sft.lr
SFT_BETAS = [0.9, 0.999]  # Adam's defaults, as SFT always trained with


@dataclass(frozen=True)
class Phase:
    """A phase as it runs: its config, its resolved step budget and its place in the run."""

    index: int
    name: str
    config: PhaseConfig
    steps: int
    first_step: int  # global step count before this phase
    section: str = "pretrain.phases"  # where the recipe sets it: errors name its keys (``key``)
    minutes: float = 0.0  # wall-clock budget (the single [pretrain] phase's max_minutes); 0: none

    @property
    def lm(self) -> bool:
        return "lm" in self.config.losses

    @property
    def rows(self) -> bool:
        """Whether the phase draws packed corpus rows: for ``lm``, and for ``mtp`` without ``sft``."""
        losses = self.config.losses
        return self.lm or ("mtp" in losses and "sft" not in losses)

    def key(self, name: str) -> str:
        """The recipe key that sets this phase's field ``name``, for error messages."""
        if self.section == "sft":
            return "sft." + {"sft_batch_size": "batch_size"}.get(name, name)
        if self.section == "pretrain":
            return f"pretrain.{name}"
        return f"pretrain.phases[{self.index}].{name}"

    def schedule_step(self, step: int, seconds: float) -> int:
        """The step the learning-rate schedule is at: ``step``, or further along when the phase's
        wall-clock budget (``minutes``) is running out faster than its steps."""
        if not self.minutes:
            return step
        return max(step, round(self.steps * seconds / (60 * self.minutes)))


def plan_phases(phases: list[PhaseConfig], section: str = "pretrain.phases", minutes: float = 0.0) -> list[Phase]:
    """Resolve names and budgets: ``steps``, or ``tokens`` as whole steps of ``batch_size × seq_len``."""
    plan, first = [], 0
    for i, phase in enumerate(phases):
        steps = phase.steps or math.ceil(phase.tokens / (phase.batch_size * phase.seq_len))
        plan.append(Phase(i, phase.name or f"phase-{i}", phase, steps, first, section, minutes))
        first += steps
    return plan


def pretraining_plan(pc: PretrainConfig) -> tuple[PretrainConfig, list[Phase]]:
    """``[pretrain]`` as the trainer runs it (module doc): its phases, or the one phase of its fields."""
    if pc.phases:
        return pc, plan_phases(pc.phases)
    phase = PhaseConfig(name="pretraining", seq_len=pc.seq_len, steps=pc.max_steps, batch_size=pc.batch_size,
                        lr=pc.lr, warmup_steps=pc.warmup_steps, min_lr_ratio=pc.min_lr_ratio)
    return dataclasses.replace(pc, phases=[phase]), plan_phases([phase], "pretrain", pc.max_minutes)


def sft_plan(sft: SFTConfig) -> tuple[PretrainConfig, list[Phase]]:
    """``[sft]`` as the trainer runs it (module doc): one phase of the ``sft`` loss."""
    phase = PhaseConfig(name="sft", losses=["sft"], steps=sft.steps, sft_batch_size=sft.batch_size, lr=sft.lr,
                        warmup_steps=sft.warmup_steps, min_lr_ratio=SFT_MIN_LR_RATIO)
    settings = PretrainConfig(phases=[phase], betas=SFT_BETAS, weight_decay=sft.weight_decay, grad_clip=sft.grad_clip,
                              log_every=1, eval_batches=0)
    return settings, plan_phases([phase], "sft")


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
