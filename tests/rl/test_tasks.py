"""RL's task stream is single-epoch: a built-in family's stream holds each training prompt once, the
held-out suite each held-out prompt once, and a recipe asking for more is refused at start
(``opencomposer rl`` exits with status 2 and names both counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.rl.tasks import TaskStream, heldout_tasks
from opencomposer.tasks.generators.tiny import split_size

ROOT = Path(__file__).resolve().parents[2]


def test_a_family_stream_holds_each_training_prompt_once(tmp_path):
    config = load_recipe(None, ["rl.task_family=tiny", "rl.eval_tasks=50", "rl.eval_every=1"])
    stream = TaskStream(config, tmp_path)
    assert stream.size == split_size("train", "tiny") == 20
    instructions = [stream.task(i).instruction for i in range(stream.size)]
    assert len(set(instructions)) == 20  # every prompt once, none twice
    with pytest.raises(IndexError, match="holds 20 tasks"):
        stream.task(20)
    heldout = heldout_tasks(config, tmp_path)
    assert len(heldout) == 8 == len({t.instruction for t in heldout})  # eval_tasks = 50 takes the split whole
    assert not {t.instruction for t in heldout} & set(instructions)


def test_a_recipe_asking_for_more_tasks_than_the_stream_holds_is_refused(tmp_path):
    config = load_recipe(None, ["rl.task_family=tiny-composed", "rl.steps=29", "rl.batch_tasks=4"])
    stream = TaskStream(config, tmp_path)
    stream.check_length(28 * 4)  # 112 fit exactly
    with pytest.raises(ConfigError, match=r"holds 112 distinct prompts, but rl.steps × rl.batch_tasks = 29 × 4 = 116"):
        stream.check_length(29 * 4)


def test_opencomposer_rl_exits_2_and_names_both_counts(tmp_path, capsys):
    from opencomposer.cli import main

    code = main(["rl", "--set", "rl.task_family=tiny", "--set", "rl.steps=6", "--set", "rl.batch_tasks=4",
                 "--set", f"run.out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "holds 20 distinct prompts" in err and "6 × 4 = 24" in err and "single epoch" in err
    assert not list(tmp_path.rglob("initial"))  # refused before any model was built


@pytest.mark.parametrize("recipe", ["recipes/rl-tiny.toml", "recipes/quickstart.toml"])
def test_shipped_recipes_fit_their_family(recipe):
    config = load_recipe(ROOT / recipe)
    family = config.rl.task_family or config.sft.task_family  # the quickstart's RL stage takes SFT's family
    assert config.rl.steps * config.rl.batch_tasks <= split_size("train", family)
    assert config.rl.eval_tasks <= split_size("heldout", family)  # every evaluation at its full size
