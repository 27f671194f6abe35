"""``--set key=value``: the text is read by the type of the field it names, never guessed."""

from __future__ import annotations

import pytest

from opencomposer.config import ConfigError, apply_override, load_recipe


def test_string_field_takes_the_text_as_it_is():
    config = load_recipe(None, ["run.name=2024", "agent.system_prompt=true", "agent.http.model=[1, 2]",
                                "sandbox.root_dir=1e-3", "run.out_dir= spaced "])
    assert config.run.name == "2024"
    assert config.agent.system_prompt == "true"
    assert config.agent.http.model == "[1, 2]"
    assert config.sandbox.root_dir == "1e-3"
    assert config.run.out_dir == " spaced "


def test_string_field_accepts_a_quoted_toml_string():
    """What ``cli``'s shorthand flags write (``--suite DIR`` becomes ``eval.suite="DIR"``)."""
    config = load_recipe(None, ['eval.suite="my suite"', "run.name='2024'", 'agent.system_prompt="a\\tb"'])
    assert (config.eval.suite, config.run.name, config.agent.system_prompt) == ("my suite", "2024", "a\tb")
    assert load_recipe(None, ['run.name=x y "z"']).run.name == 'x y "z"'  # not one TOML string: verbatim


def test_choice_field_takes_the_text():
    assert load_recipe(None, ["rl.kl.estimator=k3"]).rl.kl.estimator == "k3"
    assert load_recipe(None, ['rl.kl.estimator="k2"']).rl.kl.estimator == "k2"


def test_numbers_booleans_and_lists_are_read_as_toml():
    config = load_recipe(None, ["model.num_experts=8", "rl.lr=3e-4", "rl.adam_eps=1", "grading.lint=false",
                                "corpus.sources=['stdlib', '/src']", "sandbox.ro_binds=[]",
                                "pretrain.betas=[0.8, 0.9]"])
    assert config.model.num_experts == 8
    assert config.rl.lr == 3e-4 and config.rl.adam_eps == 1.0 and type(config.rl.adam_eps) is float
    assert config.grading.lint is False
    assert config.corpus.sources == ["stdlib", "/src"] and config.sandbox.ro_binds == []
    assert config.pretrain.betas == [0.8, 0.9]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_experts=8.5", "model.num_experts: expected an integer, got 8.5 (float)"),
        ("model.num_experts=\"8\"", "model.num_experts: expected an integer, got '8' (str)"),
        ("grading.lint=yes", "grading.lint: expected true or false, got 'yes' (str)"),
        ("grading.lint=1", "grading.lint: expected true or false, got 1 (int)"),
        ("corpus.sources=stdlib", "corpus.sources: expected a list, got 'stdlib' (str)"),
        ("corpus.sources=[1]", "corpus.sources[0]: expected a string, got 1 (int)"),
        ("model.top_k=2\nmodel = 3", "model.top_k: expected an integer"),
    ],
)
def test_text_that_does_not_fit_the_field_names_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_recipe(None, [override])
    assert message in str(info.value)


def test_keys_are_checked_before_anything_is_set():
    data: dict = {}
    with pytest.raises(ConfigError, match=r"unknown key 'rl\.kl\.coeff' \(did you mean 'coef'\?\)"):
        apply_override(data, "rl.kl.coeff=0")
    with pytest.raises(ConfigError, match=r"'run\.name' is a value, not a section"):
        apply_override(data, "run.name.first=x")
    with pytest.raises(ConfigError, match=r"unknown key 'section'"):
        apply_override(data, "section=x")
    assert data == {}
