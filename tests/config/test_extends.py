"""A recipe that extends another (``extends = "PATH"``, relative to the recipe): the base's tables
merged key by key under the recipe's own values."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.config.loader import to_toml

BASE = '[run]\nname = "base"\nseed = 3\n[rl]\nlr = 1e-4\nsteps = 5\nadam_betas = [0.9, 0.95]\n[rl.kl]\ncoef = 0.01\n'


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_recipe_wins_key_by_key_and_tables_merge(tmp_path: Path):
    write(tmp_path, "base.toml", BASE)
    child = write(tmp_path, "studies/child.toml",
                  'extends = "../base.toml"\n[run]\nname = "child"\n[rl]\nadam_betas = [0.8, 0.9]\n[rl.kl]\nestimator = "k3"\n')
    config = load_recipe(child, ["rl.steps=7"])
    assert (config.run.name, config.run.seed) == ("child", 3)
    assert (config.rl.lr, config.rl.steps, config.rl.adam_betas) == (1e-4, 7, [0.8, 0.9])  # a list replaces
    assert (config.rl.kl.coef, config.rl.kl.estimator) == (0.01, "k3")
    assert "extends" not in to_toml(config)  # what a run records is the resolved recipe


def test_a_chain_of_extends(tmp_path: Path):
    write(tmp_path, "a.toml", BASE)
    write(tmp_path, "b.toml", 'extends = "a.toml"\n[rl]\nsteps = 6\n')
    c = write(tmp_path, "c.toml", 'extends = "b.toml"\n[run]\nname = "c"\n')
    config = load_recipe(c)
    assert (config.run.name, config.rl.steps, config.rl.lr) == ("c", 6, 1e-4)


@pytest.mark.parametrize("text, message", [
    ('extends = "missing.toml"\n', "extends 'missing.toml': recipe not found"),
    ("extends = 3\n", "extends: expected the path of a recipe"),
    ('extends = "self.toml"\n', "a cycle"),
])
def test_bad_extends_is_one_clear_error(tmp_path: Path, text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        load_recipe(write(tmp_path, "self.toml", text))


def test_a_cycle_through_two_recipes(tmp_path: Path):
    write(tmp_path, "x.toml", 'extends = "y.toml"\n')
    with pytest.raises(ConfigError, match=r"a cycle \(.*y.toml -> .*x.toml -> .*y.toml\)"):
        load_recipe(write(tmp_path, "y.toml", 'extends = "x.toml"\n'))


def test_an_unknown_key_in_the_base_is_still_refused(tmp_path: Path):
    write(tmp_path, "base.toml", "[rl]\nno_such_key = 1\n")
    with pytest.raises(ConfigError, match="no_such_key"):
        load_recipe(write(tmp_path, "child.toml", 'extends = "base.toml"\n'))
