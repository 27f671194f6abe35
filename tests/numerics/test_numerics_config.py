"""``NumericsConfig``: its choices and impossible combinations, the values reaching the matmul
recipe, and the ``[numerics]`` recipe section."""

import pytest

from opencomposer.config import Config, ConfigError, NumericsConfig, from_dict, load_recipe
from opencomposer.numerics.qlinear import MXSpec, NVFP4Spec, matmul_recipe


def test_defaults_leave_the_model_in_high_precision():
    config = load_recipe(None)
    assert isinstance(config, Config) and config.numerics == NumericsConfig()
    assert matmul_recipe(config.numerics) is None


def test_parsed_values_reach_the_matmul_recipe():
    numerics = from_dict(NumericsConfig, {
        "recipe": "nvfp4_fwd_mxfp8_bwd", "mx_scale_mode": "rceil", "mx_grad_dtype": "e5m2",
        "nvfp4_activation_scale": "tensor", "nvfp4_weight_scale": "token", "division": "approx",
        "reciprocal_ulp": -1,
    })
    recipe = matmul_recipe(numerics)
    assert recipe.forward_input == NVFP4Spec("tensor", "approx", -1)
    assert recipe.forward_weight == NVFP4Spec("token", "approx", -1)
    assert recipe.backward_grad == MXSpec("e5m2", 32, "rceil")
    assert recipe.backward_operand == MXSpec("e4m3", 32, "rceil")


def test_a_recipe_may_set_every_numerics_key():
    config = load_recipe(None, [
        "numerics.recipe=nvfp4_fwd_mxfp8_bwd", "numerics.quantize_dispatch=true", "numerics.quantize_linears=true",
        "numerics.mx_scale_mode=rceil", "numerics.mx_grad_dtype=e5m2", "numerics.nvfp4_activation_scale=tensor",
        "numerics.nvfp4_weight_scale=token", "numerics.division=approx", "numerics.reciprocal_ulp=1",
    ])
    assert config.numerics == NumericsConfig(
        recipe="nvfp4_fwd_mxfp8_bwd", quantize_dispatch=True, quantize_linears=True, mx_scale_mode="rceil",
        mx_grad_dtype="e5m2", nvfp4_activation_scale="tensor", nvfp4_weight_scale="token", division="approx",
        reciprocal_ulp=1,
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"reciprocal_ulp": 1, "recipe": "mxfp8"}, 'needs numerics.division = "approx"'),
        ({"division": "approx", "reciprocal_ulp": 2}, "expected -1, 0 or 1, got 2"),
        ({"quantize_linears": True}, 'do nothing with numerics.recipe = "bf16"'),
        ({"quantize_dispatch": True}, 'do nothing with numerics.recipe = "bf16"'),
    ],
)
def test_impossible_combinations_are_refused_wherever_built(fields, message):
    with pytest.raises(ConfigError, match=message):
        NumericsConfig(**fields)
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, [f"numerics.{key}={str(value).lower()}" for key, value in fields.items()])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["numerics.recipe=fp4"], "numerics.recipe: 'fp4' (str) is not one of 'bf16', 'mxfp8', 'nvfp4_fwd_mxfp8_bwd'"),
        (["numerics.mx_scale_mode=ceil"], "numerics.mx_scale_mode: 'ceil'"),
        (["numerics.reciprocal_ulp=0.5"], "numerics.reciprocal_ulp: expected an integer, got 0.5 (float)"),
    ],
)
def test_bad_values_fail_at_load_time_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_recipe(None, overrides)
    assert message in str(info.value)
