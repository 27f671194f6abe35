"""The recipes the commands default to ship inside the package, so an installed wheel runs the same
quickstart as a source checkout; ``recipes/`` at the repository root keeps identical copies."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from opencomposer.commands import load_recipe_or_packaged, packaged_recipe
from opencomposer.config import ConfigError, load_recipe

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = resources.files("opencomposer") / "recipes"


def test_the_quickstart_recipe_is_a_package_resource() -> None:
    resource = packaged_recipe("quickstart.toml")
    assert resource.is_file()
    assert "[model]" in resource.read_text()


@pytest.mark.parametrize("name", sorted(r.name for r in PACKAGED.iterdir() if r.name.endswith(".toml")))
def test_the_repository_copy_is_identical_to_the_packaged_recipe(name: str) -> None:
    root_copy = ROOT / "recipes" / name
    assert root_copy.read_text() == (PACKAGED / name).read_text(), (
        f"recipes/{name} differs from src/opencomposer/recipes/{name}, the copy that ships; "
        f"edit the packaged one and copy it over: cp src/opencomposer/recipes/{name} recipes/{name}"
    )


def test_without_a_recipe_path_the_quickstart_loads_the_packaged_recipe() -> None:
    config = load_recipe_or_packaged(None, ["pretrain.max_steps=7"], default="quickstart.toml")
    with resources.as_file(packaged_recipe("quickstart.toml")) as path:
        expected = load_recipe(path, ["pretrain.max_steps=7"])
    assert config == expected
    # the recipe, not the dataclass defaults under the quickstart's name (what a wheel used to run)
    assert config != load_recipe(None, ["run.name=quickstart", "pretrain.max_steps=7"])
    assert (config.sft.task_family, config.pretrain.max_steps) == ("tiny-composed", 7)  # SFT and RL stages run


def test_a_recipe_path_wins_over_the_packaged_default(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.toml"
    recipe.write_text('[run]\nname = "mine"\n')
    assert load_recipe_or_packaged(str(recipe), [], default="quickstart.toml").run.name == "mine"


def test_an_unknown_packaged_recipe_names_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="no packaged recipe 'nope.toml'.*quickstart.toml"):
        packaged_recipe("nope.toml")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "recipes").glob("*.toml")))
def test_every_recipe_of_the_repository_loads(name: str) -> None:
    """Every shipped recipe resolves and passes every section's checks (a renamed key or a value
    out of range would otherwise surface only when someone runs it)."""
    config = load_recipe(ROOT / "recipes" / name)
    assert config.run.name
