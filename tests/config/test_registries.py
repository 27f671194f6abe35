"""Every choice list of the recipe equals the registry of the code that dispatches on it, so a
choice the loader accepts is one the code can run, and every one the code can run is accepted."""

from __future__ import annotations

import dataclasses
import typing

from opencomposer.config import LossConfig, ModelConfig, RLConfig, SFTConfig, TasksConfig, load_recipe
from opencomposer.config.agent import POLICY_NAMES
from opencomposer.config.section import field_types


def choices(section: type, name: str) -> list[str]:
    """The choices of a ``Literal`` field, sorted (the order of a registry does not matter)."""
    return sorted(typing.get_args(field_types(section)[name]))


def test_loss_names_are_the_losses():
    from opencomposer.rl.losses import LOSSES

    assert choices(LossConfig, "name") == sorted(LOSSES)


def test_task_families_are_the_tiny_families():
    from opencomposer.tasks.generators.tiny import FAMILIES

    for section in (RLConfig, SFTConfig):
        assert choices(section, "task_family") == sorted(["", *FAMILIES]), section.__name__


def test_model_kinds_are_what_loading_builds():
    from opencomposer.model.loading import MODEL_KINDS, TINY_KINDS

    assert choices(ModelConfig, "kind") == sorted(MODEL_KINDS)
    assert sorted(MODEL_KINDS) == sorted([*TINY_KINDS, "hf", "smollm2"])


def test_policy_names_are_the_policies():
    from opencomposer.agent.policy import POLICIES

    assert sorted(POLICY_NAMES) == sorted(POLICIES)
    for name in POLICIES:
        assert load_recipe(None, [f"eval.policy={name}:argument"]).eval.policy == f"{name}:argument"


def test_mixing_weights_are_the_generator_kinds():
    """A ``mixed`` stream draws kind ``GENERATOR_KINDS[i]`` with the i-th ``tasks.*_weight``."""
    from opencomposer.tasks.generators.registry import GENERATOR_KINDS

    weights = [f.name for f in dataclasses.fields(TasksConfig) if f.name.endswith("_weight")]
    assert weights == [f"{kind}_weight" for kind in GENERATOR_KINDS]

