"""``config.paths``: what each role refuses, and recipe keys named in the error (list values too)."""

from __future__ import annotations

import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.config.paths import check_recipe_paths, path_problem


def test_each_role_refuses_what_it_cannot_use(tmp_path):
    folder, file = tmp_path / "folder", tmp_path / "file"
    folder.mkdir()
    file.write_text("x")
    assert path_problem(str(tmp_path / "missing"), "input") == "no such file or folder"
    assert path_problem(str(file), "input") is path_problem(str(folder), "input") is None
    assert path_problem(str(file), "output_dir") == "exists and is not a folder"
    assert path_problem(str(folder), "output_file") == "is a folder; expected a file path"
    assert path_problem(str(folder), "output") is path_problem(str(file), "output") is None
    for role in ("output", "output_dir", "output_file"):
        assert path_problem(str(tmp_path / "new" / "deeper"), role) is None  # made with its parents
        assert path_problem(str(file / "out"), role) == f"cannot be created: {file} is not a folder"


def test_recipe_keys_are_named_and_empty_values_skipped(tmp_path):
    config = load_recipe(None, [f"basecheck.nll_repos=['{tmp_path}', '{tmp_path / 'gone'}']"])
    check_recipe_paths(config, {"model.path": "input", "rl.train_tasks": "input"})  # both empty: not given
    with pytest.raises(ConfigError, match=rf"^basecheck\.nll_repos: {tmp_path / 'gone'}: no such file or folder$"):
        check_recipe_paths(config, {"basecheck.nll_repos": "input"})
