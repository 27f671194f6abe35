"""The handlers of the ``opencomposer`` command, one module per command.

Each handler takes the parsed ``argparse.Namespace``, turns it into typed arguments (a ``Config``
from the recipe and ``--set`` overrides, paths, counts) and calls the library; no library module
imports argparse. ``cli.py`` declares the arguments and imports a handler only when it runs.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from opencomposer.config import Config, ConfigError, load_recipe


def packaged_recipe(name: str) -> Traversable:
    """The recipe ``name`` shipped inside the package (``opencomposer/recipes/``), found through
    ``importlib.resources`` so that an installed wheel has it too, not only a source checkout."""
    resource = resources.files("opencomposer") / "recipes" / name
    if not resource.is_file():
        shipped = sorted(r.name for r in (resources.files("opencomposer") / "recipes").iterdir())
        raise ConfigError(f"no packaged recipe {name!r}; opencomposer/recipes/ holds {', '.join(shipped) or 'none'}")
    return resource


def load_recipe_or_packaged(recipe: str | None, overrides: list[str], default: str) -> Config:
    """The recipe at ``recipe``, or when none is given the packaged recipe ``default``; then the
    dotted ``overrides``."""
    if recipe is not None:
        return load_recipe(recipe, overrides)
    with resources.as_file(packaged_recipe(default)) as path:
        return load_recipe(path, overrides)
