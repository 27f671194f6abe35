"""Training a model on text and on demonstrations: ``[pretrain]`` and its ``[[pretrain.phases]]``,
and ``[sft]``; one trainer runs them all as phases (``opencomposer.pretrain.plan``)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from opencomposer.config.section import ConfigError, Section
from opencomposer.config.tasks import TaskFamily

_UNTIL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")

PhaseLoss = Literal["lm", "sft", "mtp"]
"""What a phase can train: ``lm`` next-token loss on the packed code corpus; ``sft`` the
model-token loss on the oracle's recorded tool episodes; ``mtp`` multi-token prediction by
self-distillation (docs/recipe.md §3): the MTP layers (``model.num_mtp_layers``) learn the main head's
distribution at the shifted position (``opencomposer.model.mtp``), on the phase's packed corpus rows,
or on its demonstrations when it has ``sft`` and no ``lm``. ``["mtp"]`` alone distils the layers on
corpus rows with the rest of the model left as it is (the trunk gets no gradient from ``mtp``)."""


@dataclass
class PhaseConfig(Section):
    """One ``[[pretrain.phases]]`` table: a stretch of training at one sequence length with its own
    budget, learning-rate schedule, data mix and losses (``opencomposer.pretrain.phases``).

    Phases run in the order the recipe lists them; the weights, AdamW's moments and the token count
    carry over from one to the next. The optimizer's other settings (betas, weight decay, gradient
    clipping) and the evaluation cadence are the ``[pretrain]`` ones."""

    section = "pretrain.phases"

    name: str = ""
    """Label in logs, checkpoints and plots; empty: ``phase-N`` (N from 0)."""
    seq_len: int = 256
    """Tokens per packed row of the ``lm`` loss."""
    tokens: int = 0
    """Token budget of the ``lm`` loss (rows × seq_len per step, rounded up to whole steps); set
    this or ``steps``, not both."""
    steps: int = 0
    """Optimizer steps; set this or ``tokens``."""
    batch_size: int = 8
    """Packed rows per step for ``lm``."""
    lr: float = 3e-3
    """Peak learning rate of the phase."""
    warmup_steps: int = 20
    """Linear warm-up from lr / warmup_steps to lr at the start of the phase."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After the warm-up: cosine decay to ``lr × min_lr_ratio`` at the phase's end, or constant."""
    min_lr_ratio: float = 0.1
    rope_theta: float = 0.0
    """RoPE base the phase trains with, set as it starts (the model's config and its rotary
    inverse frequencies); 0 keeps the current one. The long-context extension raises it."""
    sources: list[str] = field(default_factory=list)
    """Data mix: the corpus sources (``corpus.sources`` labels) this phase draws rows from, with
    ``weights``; empty draws from every source in proportion to its tokens."""
    weights: list[float] = field(default_factory=list)
    """Relative share of rows per entry of ``sources`` (normalised; need not sum to 1)."""
    losses: list[PhaseLoss] = field(default_factory=lambda: ["lm"])
    """Which losses train, summed: ``lm``, ``sft`` (the ``[sft]`` section's demonstrations, loss on
    model tokens only), ``mtp`` (self-distillation of the MTP layers; see ``PhaseLoss``)."""
    sft_batch_size: int = 8
    """Demonstration rows (episode segments) per step for ``sft``."""
    recall_gap_chars: int = 0
    """The generated ``recall`` and ``append`` documents this phase draws, made with this gap
    (``pretrain.recall_gap_chars``); 0: that one. Long gaps teach copying across a whole window."""
    append_gap_chars: int = 0
    """The ``append`` documents' gap alone, when it differs; 0: the phase's recall gap. Short gaps
    put several list updates in a row: the append step is learned from rows dense in it."""
    until: str = ""
    """End the phase early at the first held-out evaluation (every ``pretrain.eval_every`` steps)
    whose metric meets this condition, ``"METRIC >= VALUE"`` or ``"METRIC <= VALUE"`` (a name of the
    evaluation row: ``probe_copy_accuracy >= 0.9``); ``steps`` (or ``tokens``) is then the most it
    may take. The phases after it start where it ended. A skill that forms at a phase transition
    (copying) forms after a number of steps that moves with the corpus and the seed: a phase that
    runs until its probe passes does not hand the next one a half-formed circuit. Empty: the phase
    takes its whole budget. Its learning-rate schedule spans the whole budget (``constant`` suits)."""

    def condition(self) -> tuple[str, str, float] | None:
        """``until`` as (metric, ``>=`` or ``<=``, value); None when the phase takes its budget."""
        if not self.until:
            return None
        match = _UNTIL.match(self.until)
        if match is None:
            raise ConfigError(f'pretrain.phases.until: expected "METRIC >= VALUE" or "METRIC <= VALUE" '
                              f'(probe_copy_accuracy >= 0.9), got {self.until!r}')
        return match[1], match[2], float(match[3])

    def validate(self) -> None:
        self.condition()
        for name in ("recall_gap_chars", "append_gap_chars"):
            if 0 < getattr(self, name) < 10:
                raise ConfigError(f"pretrain.phases.{name}: must be 0 (the default) or >= 10, got {getattr(self, name)}")
        if not self.losses or len(set(self.losses)) != len(self.losses):
            raise ConfigError(f"pretrain.phases.losses: expected one or more distinct losses, got {self.losses}")
        if (self.tokens > 0) == (self.steps > 0):
            raise ConfigError(f"pretrain.phases.tokens / pretrain.phases.steps: set exactly one of them to a "
                              f"positive budget, got tokens = {self.tokens}, steps = {self.steps}")
        if self.tokens < 0 or self.steps < 0:
            raise ConfigError("pretrain.phases.tokens and pretrain.phases.steps: must be >= 0")
        if self.tokens and "lm" not in self.losses:
            raise ConfigError("pretrain.phases.tokens: a token budget counts lm tokens; a phase without the 'lm' "
                              "loss sets pretrain.phases.steps")
        if self.seq_len < 8:
            raise ConfigError(f"pretrain.phases.seq_len: must be at least 8, got {self.seq_len}")
        for name in ("batch_size", "sft_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"pretrain.phases.{name}: must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ConfigError(f"pretrain.phases.lr must be > 0 and pretrain.phases.warmup_steps >= 0, got "
                              f"{self.lr} and {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"pretrain.phases.min_lr_ratio: expected a fraction in [0, 1], got {self.min_lr_ratio}")
        if self.rope_theta < 0:
            raise ConfigError(f"pretrain.phases.rope_theta: must be > 0 (or 0 to keep the model's), got {self.rope_theta}")
        if len(self.sources) != len(self.weights):
            raise ConfigError(f"pretrain.phases.sources and pretrain.phases.weights: one weight per source, got "
                              f"{len(self.sources)} sources and {len(self.weights)} weights")
        if len(set(self.sources)) != len(self.sources):
            raise ConfigError(f"pretrain.phases.sources: a source is listed twice in {self.sources}")
        if any(w < 0 for w in self.weights) or (self.weights and sum(self.weights) <= 0):
            raise ConfigError(f"pretrain.phases.weights: expected weights >= 0 with a positive sum, got {self.weights}")


def _phase(item: Any, index: int) -> PhaseConfig:
    """A ``[[pretrain.phases]]`` table (a dict from TOML or an override) as a ``PhaseConfig``; an
    error names the phase by its index (``pretrain.phases[1].seq_len``)."""
    if isinstance(item, PhaseConfig):
        return item
    if not isinstance(item, dict):
        raise ConfigError(f"pretrain.phases[{index}]: expected a table ([[pretrain.phases]]), got {item!r}")
    names = [f.name for f in dataclasses.fields(PhaseConfig)]
    unknown = sorted(set(item) - set(names))
    if unknown:
        raise ConfigError(f"unknown key pretrain.phases[{index}].{unknown[0]}; valid keys in [[pretrain.phases]]: "
                          + ", ".join(sorted(names)))
    try:
        return PhaseConfig(**item)
    except ConfigError as error:
        raise ConfigError(str(error).replace("pretrain.phases.", f"pretrain.phases[{index}].")) from None


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
    """Largest global gradient norm (clipped to it); 0: no clipping."""
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 4
    sample_prompts: list[str] = field(
        default_factory=lambda: ["def ", "import os\n", "class Config:\n    def __init__(self"]
    )
    """Prompts whose greedy completions are printed at the end."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """``[[pretrain.phases]]``: run these in order (``opencomposer.pretrain.phases``), e.g. a main
    phase, a long-context extension, an SFT phase. Empty: one phase with the fields above
    (``seq_len``, ``max_steps``, ``lr``, ...), as before phases existed. With phases, ``seq_len``,
    ``batch_size``, ``max_steps``, ``max_minutes``, ``lr``, ``min_lr_ratio`` and ``warmup_steps`` of
    this table are unused (each phase has its own); the rest apply to every phase."""
    checkpoint_every: int = 0
    """With phases: also checkpoint every N steps inside a phase (0: only at the end of each
    phase); a rerun resumes from the newest checkpoint."""
    dedup: bool = True
    """With phases: drop exact and near-duplicate files from the corpus before splitting it
    (``model.corpus.deduplicate``). Without phases the corpus is the one it always was."""
    near_duplicate_threshold: float = 0.8
    """Estimated Jaccard similarity (MinHash over 5-word shingles) from which two files count as
    near-duplicates; 1.0 keeps near-duplicates and drops exact copies only."""
    recall_documents: int = 20_000
    """With phases: documents in each generated source a phase lists (``"copy"``, ``"recall"``, ``"append"``:
    ``opencomposer.pretrain.recall``, synthetic text that teaches copying from the context)."""
    recall_gap_chars: int = 900
    """With phases: the longest stretch of code (characters) a ``recall`` or ``append`` document puts between a
    fact and where it is recalled (log-uniform from 10); about 3.5 characters a token. Raise it
    with a phase long enough to hold it, so that the model learns to copy across that distance."""
    heldout_by: Literal["project", "file"] = "project"
    """With phases: hold out whole source projects (a top-level package or module; no file of a
    held-out project is trained on) or, as without phases, single files."""

    def __post_init__(self) -> None:
        if isinstance(self.phases, list):
            self.phases = [_phase(item, i) for i, item in enumerate(self.phases)]
        super().__post_init__()

    def validate(self) -> None:
        if self.recall_documents < 1:
            raise ConfigError(f"pretrain.recall_documents: must be >= 1, got {self.recall_documents}")
        if self.recall_gap_chars < 10:
            raise ConfigError(f"pretrain.recall_gap_chars: must be >= 10, got {self.recall_gap_chars}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"pretrain.checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            raise ConfigError(f"pretrain.near_duplicate_threshold: expected a similarity in (0, 1], got "
                              f"{self.near_duplicate_threshold}")
        names = [phase.name or f"phase-{i}" for i, phase in enumerate(self.phases)]
        if len(set(names)) != len(names):
            raise ConfigError(f"pretrain.phases: phase names must differ, got {names}")
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
        if self.lr <= 0 or self.max_minutes <= 0:
            raise ConfigError(f"pretrain.lr and pretrain.max_minutes: must be > 0, got {self.lr} and {self.max_minutes}")
        if self.grad_clip < 0:
            raise ConfigError(f"pretrain.grad_clip: must be >= 0 (0: no clipping), got {self.grad_clip}")
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
    demonstrations: Literal["oracle", "explore"] = "oracle"
    """What the teacher plays on a task without a walkthrough of its own: ``oracle`` replays the
    gold patch in one turn and finishes; ``explore`` works as an engineer does, a step per turn
    (grep for the function at fault, read it, smallest edits, run the tests, finish:
    ``agent.policies.scripted.explore_script``), which a model that must find the code can learn."""
    bf16: bool = False
    """Run the forward under bf16 autocast (parameters and Adam state stay float32). On CPUs with
    AMX or AVX-512 BF16 a step of SmolLM2-135M is ~2-3x faster (docs/LOG.md, issue 17)."""
    micro_batch_tokens: int = 0
    """Gradient accumulation: a step's rows go through the model in micro-batches of at most this
    many padded positions (rows × longest, ``training.packing.micro_batches``; a longer row gets
    one of its own; on one process the prefix every row shares counts once), each backward
    adding to the gradient of the whole step, which stays the same. It bounds the activation
    memory of a step (the logits over a large vocabulary above all); 0 (default) runs the step's
    rows at once."""
    pack_tokens: int = 0
    """Sequence packing: a step's demonstrations share batch rows of at most this many positions,
    each attending only to itself (``training.packing.pack_rows``), instead of one padded row
    each; 0 (default) packs nothing. The loss is the same; the padding goes. It applies to every
    phase with the ``sft`` loss, ``[[pretrain.phases]]`` too (not to one of ``sft`` and ``mtp``
    without ``lm``, whose distillation reads one demonstration per row)."""

    def validate(self) -> None:
        if not (self.pack_tokens == 0 or self.pack_tokens >= 64):
            raise ConfigError(f"sft.pack_tokens: expected 0 (off) or at least 64, got {self.pack_tokens}")
        if not (self.micro_batch_tokens == 0 or self.micro_batch_tokens >= 64):
            raise ConfigError(f"sft.micro_batch_tokens: expected 0 (the whole step at once) or at least 64, "
                              f"got {self.micro_batch_tokens}")
        if self.demonstrations not in ("oracle", "explore"):
            raise ConfigError(f"sft.demonstrations: expected \"oracle\" or \"explore\", got {self.demonstrations!r}")
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
