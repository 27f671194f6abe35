"""Every section checks itself whenever it is made: in code, by ``dataclasses.replace`` or from a
recipe, with the same ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from opencomposer.config import (
    Config,
    ConfigError,
    GradingConfig,
    HttpPolicyConfig,
    KLConfig,
    ModelConfig,
    NumericsConfig,
    PretrainConfig,
    RLConfig,
    SandboxConfig,
    TasksConfig,
    load_recipe,
)


def test_rules_hold_for_configs_built_in_code():
    with pytest.raises(ConfigError, match=r"model\.top_k: 9 exceeds model\.num_experts = 8"):
        ModelConfig(top_k=9)
    with pytest.raises(ConfigError, match="needs a reference policy"):
        KLConfig(reference="none", coef=0.1)
    with pytest.raises(ConfigError, match=r"agent\.http\.base_url: 'localhost' is not an http\(s\) URL"):
        HttpPolicyConfig(base_url="localhost")


def test_rules_hold_for_replace():
    model = ModelConfig()
    with pytest.raises(ConfigError, match=r"model\.path: required"):
        dataclasses.replace(model, kind="hf")
    assert dataclasses.replace(model, kind="hf", path="/ckpt").path == "/ckpt"


def test_types_and_choices_are_checked_in_code():
    with pytest.raises(ConfigError, match=r"model\.kind: 'gpt5' \(str\) is not one of 'tiny_moe'"):
        ModelConfig(kind="gpt5")
    with pytest.raises(ConfigError, match=r"model\.num_experts: expected an integer, got 8\.0 \(float\)"):
        ModelConfig(num_experts=8.0)
    with pytest.raises(ConfigError, match=r"sandbox\.ro_binds: expected a list, got \('/opt',\) \(tuple\)"):
        SandboxConfig(ro_binds=("/opt",))
    with pytest.raises(ConfigError, match=r"rl\.adam_betas\[1\]: expected a number, got '0\.99' \(str\)"):
        RLConfig(adam_betas=[0.9, "0.99"])
    with pytest.raises(ConfigError, match=r"rl\.kl: expected a KLConfig \(the \[rl\.kl\] table\)"):
        RLConfig(kl={"coef": 0.0})


def test_integers_widen_to_floats():
    config = GradingConfig(timeout_s=20)
    assert config.timeout_s == 20.0 and type(config.timeout_s) is float


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"^pretrain\.lr: expected a finite number, got"):
        PretrainConfig(lr=bad)
    with pytest.raises(ConfigError, match=r"^pretrain\.betas\[0\]: expected a finite number"):
        PretrainConfig(betas=[bad, 0.95])
    text = {math.inf: "inf", -math.inf: "-inf"}.get(bad, "nan")
    with pytest.raises(ConfigError, match=r"^rl\.kl\.coef: expected a finite number"):
        load_recipe(None, [f"rl.kl.coef={text}"])


def test_recipe_numerics_reach_the_config_and_a_dense_model_is_refused():
    """``[numerics]`` is applied by the commands (``tests/rl/test_numerics_rl.py``); the one rule
    between tables: a dense model has no experts to convert."""
    report = NumericsConfig(recipe="nvfp4_fwd_mxfp8_bwd", quantize_dispatch=True)
    assert Config(numerics=report).numerics.quantize_dispatch
    config = load_recipe(None, ["numerics.recipe=mxfp8", "numerics.mx_scale_mode=rceil"])
    assert config.numerics == NumericsConfig(recipe="mxfp8", mx_scale_mode="rceil")
    with pytest.raises(ConfigError, match=r'^numerics\.recipe = \'mxfp8\' converts MoE experts, and model\.kind = "smollm2"'):
        load_recipe(None, ["numerics.recipe=mxfp8", "model.kind=smollm2"])
    assert load_recipe(None, ["model.kind=smollm2"]).numerics == NumericsConfig()


def test_test_limits_must_fit_the_sandbox():
    """The sandbox cuts every command at ``sandbox.max_timeout_s``; a longer limit would be a lie."""
    with pytest.raises(ConfigError, match=r"grading\.timeout_s: 900 s exceeds sandbox\.max_timeout_s = 600 s"):
        load_recipe(None, ["grading.timeout_s=900"])
    with pytest.raises(ConfigError, match=r"tasks\.test_timeout_s: 120 s exceeds sandbox\.max_timeout_s = 100 s"):
        load_recipe(None, ["sandbox.max_timeout_s=100", "sandbox.timeout_s=60", "grading.timeout_s=100"])
    config = load_recipe(None, ["sandbox.max_timeout_s=900", "grading.timeout_s=900"])
    assert config.grading.timeout_s == 900.0
    with pytest.raises(ConfigError, match=r"tasks\.test_timeout_s: 700 s"):
        Config(tasks=TasksConfig(test_timeout_s=700))


def test_eval_policy_must_name_a_policy():
    with pytest.raises(ConfigError, match=r"eval\.policy: 'gpt:4' names no policy; expected one of oracle"):
        load_recipe(None, ["eval.policy=gpt:4"])


def test_importing_config_does_not_import_torch():
    code = ("import sys\nimport opencomposer.config\nopencomposer.config.load_recipe(None)\n"
            "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_router_replay_on_vllm_needs_its_prefix_cache():
    """vLLM reports a MoE's routes only with its prefix cache on: replay without it would fail at
    the first train step, after a whole step of sampling, so the recipe is refused up front."""
    with pytest.raises(ConfigError, match=r"rl\.router_replay = 'replay' replays the routes .*inference\.enable_prefix_caching"):
        load_recipe(None, ["inference.backend=vllm", "inference.enable_prefix_caching=false", "rl.router_replay=replay"])
    load_recipe(None, ["inference.backend=vllm", "inference.enable_prefix_caching=false"])  # replay off
    load_recipe(None, ["inference.enable_prefix_caching=false", "rl.router_replay=replay"])  # the local sampler


def test_an_async_run_with_stale_tokens_and_no_importance_weight_is_warned():
    from opencomposer.config.rl import CORRECTING_LOSSES, RLConfig, uncorrected_staleness

    def rl(**fields):
        config = RLConfig()
        for key, value in fields.items():
            setattr(config, key, value)
        return config

    warned = uncorrected_staleness(rl(mode="async", max_staleness=2))  # the composer loss by default
    assert warned is not None and "rl.max_staleness = 2" in warned and "'tis' or 'ppo_clip'" in warned
    assert uncorrected_staleness(rl(mode="async", max_staleness=0)) is None  # sync bit for bit
    assert uncorrected_staleness(rl(mode="sync", max_staleness=4)) is None  # the bound is async's only
    for name in CORRECTING_LOSSES:  # every loss that weighs a token by pi_theta / pi_sampler
        config = rl(mode="async", max_staleness=2)
        config.loss.name = name
        assert uncorrected_staleness(config) is None, name
