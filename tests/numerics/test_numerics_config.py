"""The ``[numerics]`` recipe section: defaults, choices and impossible combinations."""

import pytest

from opencomposer.config import Config, ConfigError, NumericsConfig, load_recipe


def test_defaults_leave_the_model_in_high_precision():
    config = load_recipe(None)
    assert isinstance(config, Config) and config.numerics == NumericsConfig()
    assert config.numerics.recipe == "bf16" and config.numerics.division == "exact"


def test_overrides_select_the_report_recipe():
    config = load_recipe(None, ["numerics.recipe=nvfp4_fwd_mxfp8_bwd", "numerics.quantize_dispatch=true"])
    assert config.numerics.recipe == "nvfp4_fwd_mxfp8_bwd" and config.numerics.quantize_dispatch


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["numerics.recipe=fp4"],
            "numerics.recipe: 'fp4' (str) is not one of 'bf16', 'mxfp8', 'nvfp4_fwd_mxfp8_bwd'",
        ),
        (["numerics.recipe=mxfp8", "numerics.reciprocal_ulp=1"], 'needs numerics.division = "approx"'),
        (["numerics.division=approx", "numerics.reciprocal_ulp=2"], "expected -1, 0 or 1, got 2"),
        (["numerics.quantize_linears=true"], 'do nothing with numerics.recipe = "bf16"'),
        (["numerics.mx_scale_mode=ceil"], "numerics.mx_scale_mode: 'ceil'"),
    ],
)
def test_bad_values_fail_at_load_time_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe(None, overrides)
