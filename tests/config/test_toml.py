"""``to_toml`` writes every value a config can hold as TOML that reads back to an equal config."""

from __future__ import annotations

import dataclasses
import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencomposer.config import (
    AgentConfig,
    Config,
    CorpusConfig,
    PretrainConfig,
    RLConfig,
    RunConfig,
    from_dict,
    load_recipe,
    to_toml,
)
from opencomposer.config.loader import toml_value

# Any Unicode text a str can hold in a file: control characters, quotes, backslashes, astral planes
# (lone surrogates are refused by the sections, as no UTF-8 file can hold them).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


def reload(config: Config) -> Config:
    return from_dict(Config, tomllib.loads(to_toml(config)))


@settings(max_examples=300, deadline=None)
@given(name=TEXT, prompt=TEXT, sources=st.lists(TEXT, max_size=4))
def test_any_string_round_trips(name, prompt, sources):
    config = Config(run=RunConfig(name=name), agent=AgentConfig(system_prompt=prompt),
                    corpus=CorpusConfig(sources=sources))
    assert reload(config) == config


@settings(max_examples=200, deadline=None)
@given(lr=st.floats(min_value=1e-300, max_value=1e300), eps=st.floats(min_value=5e-324, max_value=1.0),
       minutes=st.floats(min_value=1e-30, max_value=1e30))
def test_any_finite_float_round_trips_exactly(lr, eps, minutes):
    config = Config(rl=RLConfig(lr=lr, adam_eps=eps), pretrain=PretrainConfig(max_minutes=minutes))
    assert reload(config) == config


SCALARS = st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | TEXT


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=12))
def test_any_value_is_valid_toml(value):
    """Nested and empty lists too, though no section holds them today."""
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_not_written(value):
    with pytest.raises(ValueError, match="finite"):
        toml_value(value)


def test_written_recipe_loads_from_a_file(tmp_path):
    config = load_recipe(None, ["run.name=a\"b\\c\n\td\x01é😀", "corpus.sources=[]", "rl.lr=1e-30",
                                "sandbox.ro_binds=['/opt/venv']"])
    assert config.run.name == "a\"b\\c\n\td\x01é😀"
    path = tmp_path / "recipe.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    assert load_recipe(path) == config


def test_every_field_is_written():
    written = tomllib.loads(to_toml(Config()))
    assert written == dataclasses.asdict(Config())


def test_arrays_of_tables_round_trip(tmp_path):
    """A phased recipe (``[[pretrain.phases]]``) writes back as arrays of tables and reads back equal."""
    from pathlib import Path

    from opencomposer.config import load_recipe, to_toml

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "pretrain-phases.toml"
    config = load_recipe(recipe, [])
    text = to_toml(config)
    assert text.count("[[pretrain.phases]]") == len(config.pretrain.phases) >= 2
    (tmp_path / "r.toml").write_text(text)
    assert load_recipe(tmp_path / "r.toml", []) == config
