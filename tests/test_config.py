"""Recipes load strictly: bad keys, types and combinations fail with the promised messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import Config, ConfigError, apply_override, from_dict, load_recipe, to_toml

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.toml"))


def test_defaults_build_and_validate():
    config = load_recipe(None)
    assert config.model.kind == "tiny_moe"
    assert config.model.top_k <= config.model.num_experts


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_loads(recipe):
    assert isinstance(load_recipe(recipe), Config)


def test_overrides_are_typed_by_toml():
    config = load_recipe(None, ["model.num_experts=16", "pretrain.lr=1e-4", "model.kind=tiny_deepseek_v3",
                                "corpus.sources=['stdlib']", "pretrain.betas=[0.9, 0.99]"])
    assert config.model.num_experts == 16
    assert config.pretrain.lr == 1e-4
    assert config.model.kind == "tiny_deepseek_v3"
    assert config.corpus.sources == ["stdlib"]
    assert config.pretrain.betas == [0.9, 0.99]


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(ConfigError) as e:
        load_recipe(None, ["model.num_expert=8"])
    message = str(e.value)
    assert "'model.num_expert'" in message and "did you mean 'num_experts'" in message
    assert "num_layers" in message  # lists the valid keys


def test_unknown_section():
    with pytest.raises(ConfigError, match=r"unknown key 'modle'.*did you mean 'model'"):
        from_dict(Config, {"modle": {}})


def test_wrong_type_names_value_and_expectation():
    with pytest.raises(ConfigError, match=r"model\.num_experts: expected an integer, got 'eight' \(str\)"):
        load_recipe(None, ["model.num_experts=eight"])
    with pytest.raises(ConfigError, match=r"pretrain\.lr: expected a number, got True \(bool\)"):
        load_recipe(None, ["pretrain.lr=true"])


def test_choice_outside_literal_lists_valid_choices():
    with pytest.raises(ConfigError) as e:
        load_recipe(None, ["model.kind=gpt5"])
    assert "model.kind: 'gpt5' (str) is not one of 'tiny_moe', 'tiny_deepseek_v3', 'hf', 'smollm2'" == str(e.value)


def test_impossible_combinations():
    with pytest.raises(ConfigError, match=r"model\.top_k: 9 exceeds model\.num_experts = 8"):
        load_recipe(None, ["model.top_k=9"])
    with pytest.raises(ConfigError, match=r"model\.path: required when model\.kind = \"hf\""):
        load_recipe(None, ["model.kind=hf"])
    with pytest.raises(ConfigError, match=r"model\.num_kv_heads: 3 must divide model\.num_heads = 4"):
        load_recipe(None, ["model.num_kv_heads=3"])


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply_override({}, "model.num_experts")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_override({"model": 3}, "model.kind=hf")


def test_bad_recipe_file(tmp_path):
    with pytest.raises(ConfigError, match="recipe not found"):
        load_recipe(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nkind = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(bad)


def test_toml_round_trip(tmp_path):
    config = load_recipe(None, ["model.num_experts=16", "run.name=x y \"z\""])
    path = tmp_path / "r.toml"
    path.write_text(to_toml(config))
    assert load_recipe(path) == config
