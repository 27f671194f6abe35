"""The recipes the commands default to ship inside the package, so an installed wheel runs the same
quickstart as a source checkout; ``recipes/`` at the repository root keeps identical copies."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from opencomposer.config import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = resources.files("opencomposer") / "recipes"


@pytest.mark.parametrize("name", sorted(r.name for r in PACKAGED.iterdir() if r.name.endswith(".toml")))
def test_the_repository_copy_is_identical_to_the_packaged_recipe(name: str) -> None:
    root_copy = ROOT / "recipes" / name
    assert root_copy.read_text() == (PACKAGED / name).read_text(), (
        f"recipes/{name} differs from src/opencomposer/recipes/{name}, the copy that ships; "
        f"edit the packaged one and copy it over: cp src/opencomposer/recipes/{name} recipes/{name}"
    )


def test_without_a_recipe_path_the_quickstart_loads_the_packaged_recipe() -> None:
    """What the quickstart runs when given no recipe (``load_recipe(packaged=...)``; the loader's own
    cases are in tests/config/test_packaged.py)."""
    config = load_recipe(None, ["pretrain.max_steps=7"], packaged="quickstart.toml")
    # the recipe, not the dataclass defaults under the quickstart's name (what a wheel used to run)
    assert config != load_recipe(None, ["run.name=quickstart", "pretrain.max_steps=7"])
    assert (config.sft.task_family, config.pretrain.max_steps) == ("tiny-composed", 7)  # SFT and RL stages run


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "recipes").glob("*.toml")))
def test_every_recipe_of_the_repository_loads(name: str) -> None:
    """Every shipped recipe resolves and passes every section's checks (a renamed key or a value
    out of range would otherwise surface only when someone runs it)."""
    config = load_recipe(ROOT / "recipes" / name)
    assert config.run.name
