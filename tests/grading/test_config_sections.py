"""The harness's recipe sections: defaults load, bad values fail naming the key."""

from __future__ import annotations

import pytest

from opencomposer.config import ConfigError, load_recipe


def test_defaults_and_overrides():
    config = load_recipe(None, ["sandbox.isolation=none", "sandbox.ro_binds=['/opt/venv']", "eval.workers=2",
                                "agent.http.model=gpt-x", "grading.lint=false"])
    assert (config.sandbox.isolation, config.sandbox.ro_binds, config.eval.workers) == ("none", ["/opt/venv"], 2)
    assert (config.agent.http.model, config.grading.lint, config.eval.policy) == ("gpt-x", False, "oracle")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sandbox.isolation=docker", "sandbox.isolation: 'docker' (str) is not one of 'bwrap', 'none'"),
        ("sandbox.memory_mb=0", "sandbox.memory_mb: must be positive, got 0"),
        ("sandbox.timeout_s=900", "sandbox.timeout_s: 900.0 exceeds sandbox.max_timeout_s = 600.0"),
        ("sandbox.ro_binds=['venv']", "sandbox.ro_binds: 'venv' is not an absolute path"),
        ("agent.max_observation_chars=10", "agent.max_observation_chars: must be at least 200"),
        ("agent.http.base_url=localhost:8000", "agent.http.base_url: 'localhost:8000' is not an http(s) URL"),
        ("eval.passes=0", "eval.passes and eval.workers must be >= 1"),
        ("grading.timeout_s=-1", "grading.timeout_s and grading.per_test_timeout_s must be positive"),
        ("eval.worker=2", "unknown key 'eval.worker' (did you mean 'workers'?)"),
    ],
)
def test_bad_values_name_the_key(override: str, message: str):
    with pytest.raises(ConfigError) as info:
        load_recipe(None, [override])
    assert message in str(info.value)
