"""``[rl]`` and its sub-tables: the RL recipe (docs/recipe.md §4) and its synchronous loop
(``opencomposer.rl``). Each sub-table is one formula of ``opencomposer.rl``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section
from opencomposer.config.tasks import TaskFamily


@dataclass
class AdvantageConfig(Section):
    """Group-relative advantages (docs/recipe.md §4, report §4.1; ``opencomposer.rl.advantages``)."""

    section = "rl.advantage"

    std_normalize: bool = False
    """Divide by the group's standard deviation (GRPO). The report does not: it blows up tiny
    behavioural differences when every rollout of a group is equally correct. Ablation only."""
    std_eps: float = 1e-6
    """Added to the standard deviation before dividing (our choice; the report has no division)."""

    def validate(self) -> None:
        if self.std_eps <= 0:
            raise ConfigError(f"rl.advantage.std_eps: must be > 0, got {self.std_eps}")


@dataclass
class KLConfig(Section):
    """KL regulariser to a reference policy (docs/recipe.md §4, report §4.1; ``opencomposer.rl.kl``)."""

    section = "rl.kl"

    estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token estimator of KL(policy ‖ reference). The report uses k1; k3 (GRPO's) and k2 are
    ablations. k3's variance explodes as the policies drift; k2 is biased."""
    placement: Literal["reward", "loss"] = "reward"
    """``reward``: a detached per-episode penalty coef·Σ_t k(t), subtracted from the reward before
    the advantage (the only placement in which k1 gives the KL gradient). ``loss``: coef·k(t) added
    to every model token's loss; with k1 its expected gradient is zero (an ablation that proves it)."""
    coef: float = 0.001
    """β. The report does not give it; 1e-3 per token keeps a 10k-token episode drifting by 0.01
    nats per token at a 0.1 reward penalty, a tenth of the ``resolved`` term."""
    reference: Literal["initial", "none"] = "initial"
    """``initial``: the checkpoint RL starts from (report silent; our default). ``none``: no KL."""

    def validate(self) -> None:
        if self.coef < 0:
            raise ConfigError(f"rl.kl.coef: must be >= 0, got {self.coef}")
        if self.reference == "none" and self.coef > 0:
            raise ConfigError(
                f'rl.kl.coef: {self.coef} needs a reference policy, but rl.kl.reference = "none"; '
                'set rl.kl.coef = 0 or rl.kl.reference = "initial"'
            )


@dataclass
class LengthPenaltyConfig(Section):
    """Length penalty C(x) = ((1+kx)^(1-q) - 1)/(k(1-q)) on a weighted length x (docs/recipe.md §4,
    report §4.2; ``opencomposer.rl.length_penalty``). The report gives no values; ours below."""

    section = "rl.length_penalty"

    coef: float = 1e-5
    """Reward units per unit of C. With k = 1e-3, q = 0.5: 0.008 at x = 1k, 0.046 at x = 10k."""
    k: float = 1e-3
    """Scale of x at which the penalty starts to bend (1/k ≈ 1000 weighted tokens); > 0."""
    q: float = 0.5
    """Curvature: 0 is linear, 1 is logarithmic, > 1 saturates at 1/(k(q-1)); >= 0."""
    thinking_tokens: float = 1.0
    """Weight of each thinking token in x."""
    tool_call_tokens: float = 1.0
    """Weight of each token the model writes inside tool calls."""
    tool_output_tokens: float = 0.1
    """Weight of each tool-output token (the environment writes them; they cost context, not
    generation, so they weigh less)."""
    final_message_tokens: float = 1.0
    """Weight of each final-message token."""
    tool_calls: float = 10.0
    """Weight per tool call."""
    turns: float = 100.0
    """Weight per turn (model round trip). Larger than ``tool_calls`` so that issuing calls in
    parallel within one turn is cheaper than issuing them one turn at a time."""

    def validate(self) -> None:
        if self.k <= 0:
            raise ConfigError(f"rl.length_penalty.k: must be > 0, got {self.k}")
        if self.q < 0:
            raise ConfigError(f"rl.length_penalty.q: must be >= 0 (concave for q > 0), got {self.q}")
        for name in ("coef", "thinking_tokens", "tool_call_tokens", "tool_output_tokens",
                     "final_message_tokens", "tool_calls", "turns"):
            if getattr(self, name) < 0:
                raise ConfigError(f"rl.length_penalty.{name}: must be >= 0, got {getattr(self, name)}")


@dataclass
class RewardConfig(Section):
    """Weights of the named reward terms (docs/recipe.md §4, report §4.2; ``opencomposer.rl.rewards``).
    Every weight is >= 0; each term's sign is fixed by its definition (penalties subtract). The
    report names the terms but gives no weights; ours keep correctness dominant."""

    section = "rl.reward"

    resolved: float = 1.0
    """Times 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes (and the rubric holds)."""
    fail_to_pass: float = 0.1
    """Times the fraction of FAIL_TO_PASS tests that pass (partial credit)."""
    pass_to_pass: float = 0.1
    """Times (pass_to_pass fraction - 1): a penalty for breaking tests that used to pass."""
    succinctness: float = 0.05
    """Times -log(1 + max(0, ρ - succinctness_slack)), ρ = (lines changed + 1)/(reference lines
    changed + 1); tasks without a reference change get no succinctness term."""
    succinctness_slack: float = 2.0
    """Diffs up to this multiple of the reference change size cost nothing."""
    lint_added: float = 0.02
    """Per new lint finding on the touched files (capped at ``count_cap``)."""
    todo_unfinished: float = 0.05
    """Per TODO/FIXME/XXX marker the diff leaves behind (capped)."""
    broken_tool_calls: float = 0.05
    """Per unparseable turn or rejected tool call (capped)."""
    reasoning_in_comments: float = 0.05
    """Per added comment line that reads as the model's reasoning (capped)."""
    run_tool_collapse: float = 0.1
    """Once, when every tool call of the episode went to ``run_tool`` (at least
    ``collapse_min_calls`` calls)."""
    run_tool: str = "run"
    """Name of the shell tool whose exclusive use counts as collapse."""
    collapse_min_calls: int = 3
    """Fewer calls than this are too few to call it a collapse."""
    count_cap: int = 5
    """Counted penalties stop growing after this many occurrences, so one bad habit cannot
    outweigh correctness."""
    hack_penalty: float = 0.5
    """Once, when the hack monitor flags the diff (``grading.hack_monitor``; ``reward.json``'s
    ``hack_suspected``). Half of ``resolved``: a flagged hack that passes earns less than an honest
    pass, while a false alarm on an honest pass still leaves it above every failure. 0 turns it off."""

    def validate(self) -> None:
        for name in ("resolved", "fail_to_pass", "pass_to_pass", "succinctness", "lint_added",
                     "todo_unfinished", "broken_tool_calls", "reasoning_in_comments", "run_tool_collapse",
                     "hack_penalty"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"rl.reward.{name}: weights must be >= 0 (the term's sign is fixed), "
                    f"got {getattr(self, name)}"
                )
        if self.succinctness_slack < 1:
            raise ConfigError(f"rl.reward.succinctness_slack: must be >= 1, got {self.succinctness_slack}")
        if self.collapse_min_calls < 1 or self.count_cap < 1:
            raise ConfigError("rl.reward.collapse_min_calls and rl.reward.count_cap: must be >= 1")


@dataclass
class LossConfig(Section):
    """Policy-gradient loss (docs/recipe.md §4, report §4.1; ``opencomposer.rl.losses``)."""

    section = "rl.loss"

    name: Literal["composer", "grpo", "dr_grpo", "dapo", "ppo_clip", "tis"] = "composer"
    """``composer``: -Σ_t A·log π over model tokens / ``token_budget`` (the report's). Ablations:
    ``grpo`` (clipped, per-sequence mean), ``dr_grpo`` (clipped, / sequences·max_sequence_tokens),
    ``dapo`` (asymmetric clip, token mean), ``ppo_clip`` and ``tis`` (the composer loss with PPO
    ratio clipping, or with truncated importance sampling, against the sampler logprobs)."""
    token_budget: int = 65_536
    """The constant the composer, ppo_clip and tis losses divide by (report: "a constant"; value
    not given). Roughly the model tokens of one step; with Adam it only moves eps and clipping."""
    max_sequence_tokens: int = 16_384
    """Dr. GRPO's per-sequence constant (its generation budget; matches Budgets.max_tokens)."""
    clip_eps: float = 0.2
    """PPO clip range 1 ± eps for grpo, dr_grpo and ppo_clip; DAPO's lower side."""
    clip_eps_high: float = 0.28
    """DAPO's upper side ("clip-higher", the DAPO paper's value); only dapo reads it."""
    tis_cap: float = 2.0
    """Truncation C of the importance weight min(π_θ/π_sampler, C) for ``tis``."""

    def validate(self) -> None:
        if self.token_budget <= 0 or self.max_sequence_tokens <= 0:
            raise ConfigError("rl.loss.token_budget and rl.loss.max_sequence_tokens: must be > 0")
        if not 0 < self.clip_eps < 1:
            raise ConfigError(f"rl.loss.clip_eps: must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high <= 0:
            raise ConfigError(f"rl.loss.clip_eps_high: must be > 0, got {self.clip_eps_high}")
        if self.tis_cap < 1:
            raise ConfigError(f"rl.loss.tis_cap: must be >= 1, got {self.tis_cap}")


@dataclass
class RLConfig(Section):
    """The RL recipe (docs/recipe.md §4) and its synchronous loop, ``opencomposer rl`` (``opencomposer.rl.loop``).
    Each sub-table is one formula in ``opencomposer.rl``; the fields below drive the trainer and the loop."""

    section = "rl"

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    length_penalty: LengthPenaltyConfig = field(default_factory=LengthPenaltyConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    steps: int = 10
    """Optimizer steps. Single epoch (report §4.1): the task stream must hold ``steps × batch_tasks``
    tasks, and each is trained on exactly once."""
    batch_tasks: int = 4
    """B: tasks per step."""
    group_size: int = 8
    """G: rollouts per task, fixed (report §4.1); the advantage baseline is the group mean."""
    lr: float = 1e-6
    """Adam learning rate after the warm-up (the report gives no schedule; see ``lr_schedule``)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: ``constant``, or ``cosine`` decay from ``lr`` to ``min_lr_ratio × lr`` at
    update ``rl.steps``, so that a run ends on small steps (a small policy trained at a constant
    rate can be caught by its last update in the middle of a dip; docs/LOG.md)."""
    min_lr_ratio: float = 0.1
    """Where ``cosine`` ends, as a fraction of ``lr``."""
    lr_warmup_steps: int = 0
    """Linear warm-up of the learning rate over the first N optimizer steps (0: none). Adam's first
    updates move every parameter by about ``lr`` whatever its gradient, which can wreck a small
    policy; a warm-up lets the second-moment estimates settle first."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's β1, β2 (report: "Adam"; these are Adam's paper values)."""
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    """Largest global gradient norm; 0 turns clipping off."""
    bf16: bool = False
    """Run the trainer's forward passes (policy and reference) under bf16 autocast; parameters and
    Adam's state stay in the model's dtype."""
    micro_batch_tokens: int = 16_384
    """Padded positions (rows × longest row) per micro-batch; bounds activation memory. On one
    process the prefix every row shares (the system prompt) counts once, as the shared-prefix
    forward computes it once (``training.packing.micro_batches``). Gradients of the micro-batches
    of a step add up before the one optimizer step."""
    pack_tokens: int = 0
    """Sequence packing: segments share batch rows of at most this many positions, each attending
    only to itself (``training.packing.pack_rows``), instead of one padded row each; 0 (default)
    packs nothing. Packing removes padding, but a packed micro-batch runs without the shared-prefix
    forward (which computes the common system prompt once), so on one process it pays where the
    rows' lengths differ a lot and their common prefix is short; under data parallelism (no shared
    prefix there) it only saves. At most ``micro_batch_tokens``."""
    router_replay: Literal["off", "replay", "filtered"] = "off"
    """Router replay (report §6.2; R3): the trainer's forward selects the experts the sampler
    routed each position to (``Completion.prompt_routed_experts`` and ``routed_experts``, carried
    by the segments into ``TrainBatch.routes``) and weights them with its own router scores, so the
    router still learns. ``replay``: every recorded route; ``filtered``: with the confidence filter
    (``router_replay_threshold``). ``off`` (our default, so dense models and existing runs are
    unchanged): the trainer routes by itself. MoE models only; the reference forward always routes
    by itself. See docs/numerics.md, "Router replay"."""
    router_replay_threshold: float = 0.5
    """Confidence filter of ``router_replay = "filtered"``: a replayed expert whose trainer gate
    score (softmax probability; for DeepSeek-V3 the sigmoid affinity, without the load-balancing
    bias) is below this fraction of the smallest gate score among the trainer's own top-k is
    replaced by the trainer's best own candidate not already selected. The report gives no value.
    0.5: rounding differences between sampler and trainer flip only near-ties, whose replayed
    expert scores close to the trainer's k-th (ratio near 1) and is kept; an expert the trainer
    scores at under half its weakest own pick comes from something else (stale weights, another
    format), and the trainer's own choice is the plausible one. In (0, 1]."""
    task_family: TaskFamily = ""
    """Generate the training stream and the held-out suite from a built-in family
    (``opencomposer.tasks.generators.tiny``; its held-out split never appears in training) into
    ``{run}/tasks``; then ``train_tasks`` and ``eval_suite`` stay empty. The stream holds each of the
    family's training prompts once (single epoch), so ``steps × batch_tasks`` must fit in it."""
    train_tasks: str = ""
    """Folder of training task folders (docs/task-format.md). The stream is all of them in an order
    shuffled by ``run.seed``."""
    eval_suite: str = ""
    """Folder of held-out task folders; its first ``eval_tasks`` tasks by id are evaluated."""
    eval_tasks: int = 16
    """Held-out tasks per evaluation (at most: a smaller suite, or a family's smaller held-out
    split, is evaluated whole, each task once)."""
    eval_every: int = 0
    """Evaluate the held-out suite before the first step, every N steps and after the last; 0 never."""
    eval_samples: int = 4
    """K: samples per held-out task, on a fixed seed set. pass@1 is the mean resolved rate over all
    samples, best-of-K the share of tasks with at least one resolved sample."""
    checkpoint_every: int = 1
    """Save a resumable checkpoint every N steps (and after the last). A crash replays the steps
    after the last checkpoint; their tasks count as trained only once a checkpoint holds them."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: sampling waits for training and training for sampling (``rl.loop``). ``async``:
    the four services run at once (``opencomposer.services``; ``[services]``, docs/services.md),
    sampling for later steps while the trainer trains, within ``max_staleness``."""
    max_staleness: int = 1
    """Async only: no token trained at version t was sampled by a version older than
    t - max_staleness. 0 reproduces the synchronous loop exactly (the same rollouts and weights).
    Above 0, the ``composer`` loss trains on stale tokens as if the current policy had sampled them;
    on ``recipes/rl-tiny.toml`` that broke the policy in 1 of 3 seeds at 1, 2 of 3 at 2 and 3 of 3
    at 4, and ``tis`` or ``ppo_clip`` kept all three at 2 (docs/ablations.md, the staleness
    studies); a run warns (``uncorrected_staleness``)."""
    stale_policy: Literal["wait", "drop", "recompute"] = "wait"
    """Async only: how the bound is kept. ``wait``: groups are admitted only as far ahead as the
    bound allows and trained in admission order, so none can exceed it (a slow group holds the
    step back). ``drop``: steps take groups as they finish; one that would exceed the bound is
    recorded as dropped. ``recompute``: such a group is sampled again at the current version.
    Dropped and recomputed groups are counted in the train metrics."""
    task_sampling: Literal["in_order", "harder_later"] = "in_order"
    """Which task of the pool each step draws (``rl.tasks``; report §4.1, "increasingly harder data
    points" late in training). ``in_order``: the stream's order (the pool shuffled by ``run.seed``).
    ``harder_later``: the same order before step ``harder_from_step``; from it on, each step draws
    ``batch_tasks`` tasks without replacement from those not yet drawn, with weights
    exp(``harder_weight`` · z), z the task's estimated difficulty standardised over the remaining
    pool (``rl.tasks.DifficultyEstimator``: failure rate, turns and model tokens of the rollouts of
    alike tasks). Single epoch holds either way; the task record says why each task was drawn.
    Synchronous mode only (``mode = "sync"``): the asynchronous services sample ahead of the
    estimates a draw needs."""
    harder_from_step: int = 1
    """``harder_later``: the first step (1-based, like the record's ``step``) whose tasks are drawn
    by difficulty; the steps before it draw in order and feed the estimates. 1: from the start
    (with nothing observed yet, every estimate is equal and the first draws are uniform)."""
    harder_weight: float = 1.0
    """``harder_later``: β of the weights exp(β · z); 0 draws uniformly among the remaining tasks, 1
    makes a task one standard deviation harder e ≈ 2.7 times as likely to be drawn. >= 0."""
    task_pass_rate_band: list[float] = field(default_factory=list)
    """[LOW, HIGH]: train only on the tasks the policy RL starts from resolves at a rate in
    LOW..HIGH (inclusive), measured before the first step on ``task_pass_rate_samples`` episodes
    each, in the stream's order until ``steps × batch_tasks`` are kept (``rl.screening``; the rates
    in ``{run}/tasks/pass_rates.json``). A group that all passes or all fails has zero advantages;
    ``[0.125, 0.875]`` with 8 samples keeps the tasks solved at least once and failed at least
    once. Empty (default): every task of the stream, unscreened."""
    task_pass_rate_samples: int = 8
    """Episodes per candidate task when ``task_pass_rate_band`` screens the pool."""
    rollout_workers: int = 0
    """Episodes run at once (threads, each with its own sandbox; their model calls are batched);
    0 runs a whole step, B × G episodes, at once. Their commands (tool calls, grading) still run
    at most ``sandbox.max_concurrent`` at a time."""

    def validate(self) -> None:
        for name in ("steps", "eval_every", "lr_warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"rl.{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("batch_tasks", "eval_tasks", "eval_samples", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rl.{name}: must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ConfigError(f"rl.group_size: must be >= 2 (the group mean is the baseline), got {self.group_size}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"rl.min_lr_ratio: expected a fraction in [0, 1], got {self.min_lr_ratio}")
        if self.lr <= 0 or self.adam_eps <= 0:
            raise ConfigError(f"rl.lr and rl.adam_eps: must be > 0, got {self.lr} and {self.adam_eps}")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"rl.adam_betas: expected two numbers in [0, 1), got {self.adam_betas}")
        if self.grad_clip < 0:
            raise ConfigError(f"rl.grad_clip: must be >= 0 (0 = off), got {self.grad_clip}")
        if not 0.0 < self.router_replay_threshold <= 1.0:
            raise ConfigError(
                f"rl.router_replay_threshold: expected a ratio in (0, 1], got {self.router_replay_threshold}"
            )
        if self.micro_batch_tokens < 64:
            raise ConfigError(f"rl.micro_batch_tokens: must be at least 64, got {self.micro_batch_tokens}")
        if not (self.pack_tokens == 0 or 64 <= self.pack_tokens <= self.micro_batch_tokens):
            raise ConfigError(f"rl.pack_tokens: expected 0 (off) or 64 to rl.micro_batch_tokens "
                              f"({self.micro_batch_tokens}), got {self.pack_tokens}")
        if self.rollout_workers < 0:
            raise ConfigError(f"rl.rollout_workers: must be >= 0 (0 = the whole step), got {self.rollout_workers}")
        if self.max_staleness < 0:
            raise ConfigError(f"rl.max_staleness: must be >= 0, got {self.max_staleness}")
        if self.harder_from_step < 1:
            raise ConfigError(f"rl.harder_from_step: must be >= 1 (the first step is 1), got {self.harder_from_step}")
        if self.harder_weight < 0:
            raise ConfigError(f"rl.harder_weight: must be >= 0 (0 draws uniformly), got {self.harder_weight}")
        if self.task_sampling == "harder_later" and self.mode != "sync":
            raise ConfigError(
                f'rl.task_sampling = "harder_later" draws each step\'s tasks from the estimates of the steps before, '
                f'and rl.mode = {self.mode!r} samples ahead of them: use rl.mode = "sync" or rl.task_sampling = "in_order"'
            )
        band = self.task_pass_rate_band
        if band and not (len(band) == 2 and 0.0 <= band[0] <= band[1] <= 1.0):
            raise ConfigError(f"rl.task_pass_rate_band: expected [] (off) or [LOW, HIGH] with 0 <= LOW <= HIGH <= 1, "
                              f"got {band}")
        if self.task_pass_rate_samples < 1:
            raise ConfigError(f"rl.task_pass_rate_samples: must be >= 1, got {self.task_pass_rate_samples}")
        if self.task_family and (self.train_tasks or self.eval_suite):
            raise ConfigError(
                f"rl.task_family = {self.task_family!r} generates the tasks; leave rl.train_tasks and "
                f"rl.eval_suite empty (got {self.train_tasks!r} and {self.eval_suite!r})"
            )


CORRECTING_LOSSES = ("ppo_clip", "tis", "grpo", "dr_grpo", "dapo")  # each weighs a token by π_θ / π_sampler


def uncorrected_staleness(rl: RLConfig) -> str | None:
    """The warning an asynchronous run gets when it may train on stale tokens with a loss that
    does not weigh them by π_θ / π_sampler (``composer``), or None."""
    if rl.mode != "async" or rl.max_staleness == 0 or rl.loss.name in CORRECTING_LOSSES:
        return None
    return (f"rl.mode = 'async' with rl.max_staleness = {rl.max_staleness} and rl.loss.name = {rl.loss.name!r}: "
            f"tokens up to {rl.max_staleness} version(s) stale are trained as if the current policy sampled them; "
            f"on the tiny recipe this broke the policy in some seeds (docs/ablations.md, staleness studies). "
            f"rl.loss.name = 'tis' or 'ppo_clip' corrects for it; rl.max_staleness = 0 avoids it")
