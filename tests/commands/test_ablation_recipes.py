"""Every study under recipes/ablations/ loads, names valid values, has at least three seeds, and
plans its runs (nothing runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.commands.ablate import check_values, plan
from opencomposer.config import load_recipe

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted((ROOT / "recipes" / "ablations").glob("*.toml"))


@pytest.mark.parametrize("recipe", STUDIES, ids=[path.stem for path in STUDIES])
def test_a_shipped_study_plans(recipe: Path, tmp_path: Path):
    config = load_recipe(recipe)
    study = config.ablation
    overrides = [f"model.path={tmp_path}"] if study.prefix == "none" else []  # a checkpoint made beforehand
    check_values(str(recipe), overrides, study)
    runs, jobs = plan(str(recipe), overrides, study, tmp_path / "study")
    assert len(study.seeds) >= 3 and len(study.grid()) >= 2
    assert len(runs) == len(study.grid()) * len(study.seeds) == len({run.run_dir for run in runs})
    assert config.run.name == recipe.stem


def test_the_studies_of_the_report_gaps_ship():
    assert {path.stem for path in STUDIES} >= {"advantage-std", "reward-signals", "kl", "length-normalisation",
                                               "router-replay", "staleness", "context-policy", "nvfp4-division"}
