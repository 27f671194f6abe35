"""``Config``: a whole recipe, one field per TOML table, and the rules between its tables."""

from __future__ import annotations

from dataclasses import dataclass, field

from opencomposer.config.ablation import AblationConfig
from opencomposer.config.agent import AgentConfig, SamplingConfig
from opencomposer.config.basecheck import BasecheckConfig
from opencomposer.config.bench import EvalConfig
from opencomposer.config.grading import GradingConfig
from opencomposer.config.inference import InferenceConfig
from opencomposer.config.model import CorpusConfig, ModelConfig, TokenizerConfig
from opencomposer.config.numerics import NumericsConfig
from opencomposer.config.parallel import ParallelConfig, TrainerConfig
from opencomposer.config.pretrain import PretrainConfig, SFTConfig
from opencomposer.config.rl import RLConfig
from opencomposer.config.run import RunConfig
from opencomposer.config.sandbox import SandboxConfig
from opencomposer.config.section import ConfigError, Section
from opencomposer.config.services import ServicesConfig
from opencomposer.config.tasks import TasksConfig


@dataclass
class Config(Section):
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
    basecheck: BasecheckConfig = field(default_factory=BasecheckConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)

    def validate(self) -> None:
        # [numerics] converts the routed experts (opencomposer.numerics.convert); a dense model has none
        if self.numerics.recipe != "bf16" and self.model.kind == "smollm2":
            raise ConfigError(
                f"numerics.recipe = {self.numerics.recipe!r} converts MoE experts, and model.kind = \"smollm2\" "
                'is dense; use a MoE model (model.kind = "tiny_moe", "tiny_deepseek_v3" or an "hf" MoE folder)'
            )
        # a context-parallel group is cp ranks of the trainer's group (distributed.runtime); under
        # torchrun (world_size 1 here) the launcher's WORLD_SIZE is checked when the group forms
        size = self.trainer.world_size
        for axis, degree in (("cp", self.parallel.cp), ("ep", self.parallel.ep)):
            if degree > 1 and size > 1 and size % degree:
                raise ConfigError(f"parallel.{axis} = {degree}: trainer.world_size = {size} is not a multiple of it "
                                  f"(each {'context' if axis == 'cp' else 'expert'}-parallel group is {degree} ranks)")
        if self.inference.backend == "vllm" and self.rl.router_replay != "off" and not self.inference.enable_prefix_caching:
            raise ConfigError(f"rl.router_replay = {self.rl.router_replay!r} replays the routes the sampler reports, and "
                              "vLLM reports them only with its prefix cache on: set inference.enable_prefix_caching = "
                              "true (or rl.router_replay = \"off\")")
        if self.trainer.optimizer_checkpoint == "sharded" and self.parallel.ep > 1:
            raise ConfigError("trainer.optimizer_checkpoint = \"sharded\" writes FSDP's shards; with parallel.ep > 1 "
                              "the expert shards are per-rank tensors it cannot place: use \"full\" (the default)")
        # The sandbox clamps every command to max_timeout_s: a longer test limit would silently not hold.
        for key, timeout_s in (("grading.timeout_s", self.grading.timeout_s),
                               ("tasks.test_timeout_s", self.tasks.test_timeout_s)):
            if timeout_s > self.sandbox.max_timeout_s:
                raise ConfigError(
                    f"{key}: {timeout_s:g} s exceeds sandbox.max_timeout_s = {self.sandbox.max_timeout_s:g} s, "
                    "where the sandbox would cut the test run; raise sandbox.max_timeout_s or lower the limit"
                )
