"""The rl.* recipe sections: the report's defaults, strict loading, impossible combinations."""

import pytest

from opencomposer.config import Config, ConfigError, load_recipe, to_toml


def test_defaults_follow_the_report():
    rl = Config().rl
    assert rl.advantage.std_normalize is False  # no division by the group std
    assert (rl.kl.estimator, rl.kl.placement, rl.kl.reference) == ("k1", "reward", "initial")
    assert rl.loss.name == "composer"  # constant normaliser, no clipping, no IS


def test_overrides_and_toml_round_trip(tmp_path):
    config = load_recipe(None, ["rl.loss.name=dapo", "rl.kl.estimator=k3", "rl.length_penalty.q=1.0"])
    assert (config.rl.loss.name, config.rl.kl.estimator, config.rl.length_penalty.q) == ("dapo", "k3", 1.0)
    path = tmp_path / "recipe.toml"
    path.write_text(to_toml(config))
    assert load_recipe(path).rl == config.rl


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rl.loss.name=reinforce", "rl.loss.name"),
        ("rl.kl.estimator=k4", "rl.kl.estimator"),
        ("rl.kl.reference=none", "needs a reference policy"),
        ("rl.kl.coef=-0.1", "rl.kl.coef"),
        ("rl.length_penalty.k=0", "rl.length_penalty.k"),
        ("rl.length_penalty.turns=-1", "rl.length_penalty.turns"),
        ("rl.reward.todo_unfinished=-0.05", "sign is fixed"),
        ("rl.loss.clip_eps=1.5", "rl.loss.clip_eps"),
        ("rl.loss.tis_cap=0.5", "rl.loss.tis_cap"),
        ("rl.loss.token_budgett=5", "did you mean 'token_budget'"),
    ],
)
def test_impossible_values_fail_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, [override])


def test_no_kl_is_a_valid_recipe():
    config = load_recipe(None, ["rl.kl.reference=none", "rl.kl.coef=0"])
    assert config.rl.kl.coef == 0.0
