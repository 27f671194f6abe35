"""``load_recipe(packaged=NAME)``: without a recipe path, the recipe shipped inside the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import ConfigError, load_recipe

REPOSITORY_COPY = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"


def test_the_packaged_recipe_is_read_when_no_path_is_given(tmp_path):
    packaged = load_recipe(None, ["pretrain.max_steps=7"], packaged="quickstart.toml")
    assert packaged == load_recipe(REPOSITORY_COPY, ["pretrain.max_steps=7"])
    assert packaged.pretrain.max_steps == 7
    recipe = tmp_path / "mine.toml"
    recipe.write_text('[run]\nname = "mine"\n')
    assert load_recipe(recipe, [], packaged="quickstart.toml").run.name == "mine"  # a path wins


def test_an_unknown_packaged_recipe_names_the_shipped_ones():
    with pytest.raises(ConfigError, match=r"no packaged recipe 'nope\.toml'; opencomposer/recipes/ holds .*quickstart"):
        load_recipe(None, [], packaged="nope.toml")
