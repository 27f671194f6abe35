"""The paths a command reads and writes, checked before it starts any work.

A command declares (in ``cli.py``) which of its arguments and which recipe keys name paths it reads
or writes; a path it reads must exist, and one it writes must be makeable: a folder where a folder
is written, not a folder where a file is, and under the nearest existing ancestor, which must be a
folder. An empty value means "not given" and is not checked. Each check returns the problem in a
few words, or None, so that the caller names the argument or key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from opencomposer.config.section import ConfigError

PathRole = Literal["input", "output", "output_dir", "output_file"]
"""What a command does with a path: reads it, or writes a folder or file there (``output``: either)."""

MODEL_PATHS: dict[str, PathRole] = {"model.path": "input", "model.tokenizer_path": "input"}
"""The recipe keys that loading the recipe's ``[model]`` reads."""


def path_problem(value: str, role: PathRole) -> str | None:
    """What is wrong with ``value`` as a path of ``role``, or None."""
    path = Path(value).expanduser()
    if role == "input":
        return None if path.exists() else "no such file or folder"
    if path.exists():
        if role == "output_dir" and not path.is_dir():
            return "exists and is not a folder"
        if role == "output_file" and path.is_dir():
            return "is a folder; expected a file path"
        return None
    ancestor = next(parent for parent in path.absolute().parents if parent.exists())
    return None if ancestor.is_dir() else f"cannot be created: {ancestor} is not a folder"


def check_recipe_paths(config: Any, roles: dict[str, PathRole]) -> None:
    """Raise ConfigError naming the first recipe key (``"rl.train_tasks"``) of ``roles`` whose
    path, or one of whose paths for a list, fails its role."""
    for key, role in roles.items():
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part)
        for item in value if isinstance(value, list) else [value]:
            problem = path_problem(item, role) if item else None
            if problem:
                raise ConfigError(f"{key}: {item}: {problem}")
