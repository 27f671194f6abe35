"""Training a model on text and on demonstrations: ``[pretrain]`` (``opencomposer.pretrain.cpt``)
and ``[sft]`` (``opencomposer.pretrain.sft``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opencomposer.config.section import ConfigError, Section
from opencomposer.config.tasks import TaskFamily


@dataclass
class PretrainConfig(Section):
    section = "pretrain"

    seq_len: int = 256
    batch_size: int = 8
    max_steps: int = 400
    max_minutes: float = 2.0
    """Wall-clock cap; training stops at whichever of max_steps / max_minutes comes first."""
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of lr."""
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 4
    sample_prompts: list[str] = field(
        default_factory=lambda: ["def ", "import os\n", "class Config:\n    def __init__(self"]
    )
    """Prompts whose greedy completions are printed at the end."""

    def validate(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"pretrain.betas: expected two numbers in [0, 1), got {self.betas}")
        if self.seq_len < 8:
            raise ConfigError(f"pretrain.seq_len: must be at least 8, got {self.seq_len}")
        for name in ("batch_size", "log_every", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"pretrain.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "warmup_steps", "eval_batches", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"pretrain.{name}: must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.max_minutes <= 0 or self.grad_clip <= 0:
            raise ConfigError(f"pretrain.lr, pretrain.max_minutes and pretrain.grad_clip: must be > 0, got "
                              f"{self.lr}, {self.max_minutes} and {self.grad_clip}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"pretrain.min_lr_ratio: expected a fraction in [0, 1], got {self.min_lr_ratio}")


@dataclass
class SFTConfig(Section):
    """Supervised fine-tuning on scripted episodes (``opencomposer sft``; ``opencomposer.pretrain.sft``):
    the oracle solves tasks in the real harness and the model learns its turns, token for token, with
    the loss on model tokens only. It makes the starting checkpoint of RL."""

    section = "sft"

    task_family: TaskFamily = ""
    """Demonstrations on a built-in family's training split (a seed stream of its own, not RL's)."""
    tasks: str = ""
    """Folder of task folders with gold patches, when no family is given."""
    num_tasks: int = 64
    """Demonstrations recorded (each task once)."""
    wrong_share: float = 0.0
    """Share of the demonstrations (tiny families only) in which the teacher writes ``decoy_word``
    instead of the word asked for: an imperfect teacher, so that SFT leaves a policy that is right
    only some of the time, for one reason that RL can find (the RL learning test; docs/rl.md)."""
    decoy_word: str = "code"
    """What a wrong demonstration writes; one token of the tokenizer keeps the error to one choice."""
    init: str = ""
    """Checkpoint folder to fine-tune; empty builds the recipe's [model] afresh (ignoring model.path,
    which RL uses to start from this stage's output)."""
    out: str = ""
    """Where the fine-tuned checkpoint goes; empty: ``{run.out_dir}/{run.name}-sft``."""
    steps: int = 40
    batch_size: int = 8
    """Episodes per step."""
    lr: float = 2e-3
    """AdamW peak learning rate (linear warm-up, cosine decay to a tenth)."""
    warmup_steps: int = 5
    weight_decay: float = 0.0
    grad_clip: float = 1.0

    def validate(self) -> None:
        if self.task_family and self.tasks:
            raise ConfigError(f"sft.task_family = {self.task_family!r} and sft.tasks = {self.tasks!r}: pick one")
        if not 0.0 <= self.wrong_share < 1.0:
            raise ConfigError(f"sft.wrong_share: expected a share in [0, 1), got {self.wrong_share}")
        if self.wrong_share and not self.task_family:
            raise ConfigError("sft.wrong_share: wrong demonstrations exist for the tiny families only; set sft.task_family")
        if self.wrong_share and not (self.decoy_word.isascii() and self.decoy_word.isalpha()):
            raise ConfigError(f"sft.decoy_word: expected one plain word, got {self.decoy_word!r}")
        for name in ("num_tasks", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sft.{name}: must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("sft.lr must be > 0; sft.warmup_steps, sft.grad_clip, sft.weight_decay >= 0")
