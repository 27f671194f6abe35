"""Recipes: nested dataclass configs, loaded from TOML with dotted overrides.

A run is a TOML recipe (``recipes/*.toml``) plus a few ``--set section.key=value`` overrides.
Every component owns one dataclass, fields documented in place, in the module of its layer:
``run``, ``model`` (model, tokenizer, corpus), ``sandbox``, ``agent`` (agent, HTTP policy,
sampling), ``grading``, ``tasks``, ``rl``, ``pretrain`` (pretraining, SFT), ``numerics``,
``bench`` (eval), ``basecheck`` (the base-model checks), ``parallel`` (trainer, parallel),
``ablation`` (the grid of ``opencomposer ablate``);
``recipe.Config`` holds them all. Every section checks itself whenever it is made
(``section.Section``), so an unknown key, a value of the wrong type, a choice outside its
``Literal`` or an impossible combination fails with a ``ConfigError`` that names the key, the value
and what was expected, whether the config came from a file, an override or code.
``loader`` reads and writes recipes.

This package imports nothing heavy (no torch), so the CLI can load and check a recipe instantly.
"""

from opencomposer.config.ablation import AblationConfig
from opencomposer.config.agent import AgentConfig, HttpPolicyConfig, SamplingConfig
from opencomposer.config.basecheck import BasecheckConfig
from opencomposer.config.bench import EvalConfig
from opencomposer.config.grading import GradingConfig
from opencomposer.config.inference import InferenceConfig
from opencomposer.config.loader import apply_override, from_dict, load_recipe, to_toml
from opencomposer.config.model import CorpusConfig, ModelConfig, TokenizerConfig
from opencomposer.config.numerics import NumericsConfig
from opencomposer.config.parallel import ParallelConfig, TrainerConfig
from opencomposer.config.pretrain import PretrainConfig, SFTConfig
from opencomposer.config.recipe import Config
from opencomposer.config.rl import (
    AdvantageConfig,
    KLConfig,
    LengthPenaltyConfig,
    LossConfig,
    RewardConfig,
    RLConfig,
)
from opencomposer.config.run import RunConfig
from opencomposer.config.sandbox import SandboxConfig
from opencomposer.config.section import ConfigError
from opencomposer.config.services import ServicesConfig
from opencomposer.config.tasks import TasksConfig

__all__ = [
    "AblationConfig",
    "AdvantageConfig",
    "AgentConfig",
    "BasecheckConfig",
    "Config",
    "ConfigError",
    "CorpusConfig",
    "EvalConfig",
    "GradingConfig",
    "HttpPolicyConfig",
    "InferenceConfig",
    "KLConfig",
    "LengthPenaltyConfig",
    "LossConfig",
    "ModelConfig",
    "NumericsConfig",
    "ParallelConfig",
    "PretrainConfig",
    "RLConfig",
    "RewardConfig",
    "RunConfig",
    "SFTConfig",
    "SamplingConfig",
    "SandboxConfig",
    "ServicesConfig",
    "TasksConfig",
    "TokenizerConfig",
    "TrainerConfig",
    "apply_override",
    "from_dict",
    "load_recipe",
    "to_toml",
]
