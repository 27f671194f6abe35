"""``[inference] backend`` selects the engine, through ``inference.factory.make_engine``, everywhere
an engine is made: the RL loop's sampler, the inference service (embedded and Ray), the evaluation
service, the ``local`` agent policy and ``opencomposer serve``.

``vllm`` is replaced by a recording stand-in (``VLLMEngine.from_model`` patched): these tests
check the routing, not vLLM (``tests/inference/test_vllm_engine.py`` checks the adapter).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from opencomposer.config import Config, ConfigError, InferenceConfig, apply_override, from_dict
from opencomposer.inference.factory import make_engine
from opencomposer.inference.local import LocalEngine

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "opencomposer"


class _StandIn:
    """What the patched ``VLLMEngine.from_model`` returns: an ``Engine`` that records its birth."""

    def __init__(self, model, tokenizer, config, policy_version=0):
        self.model, self.tokenizer, self.config, self.policy_version = model, tokenizer, config, policy_version
        self.max_positions = 4096

    def generate(self, prompts, params, n=1, row_seeds=None):
        raise AssertionError("not sampled in these tests")

    def load_weights(self, state_dict, version):
        self.policy_version = version


@pytest.fixture
def vllm_stand_in(monkeypatch):
    from opencomposer.inference import vllm

    made: list[_StandIn] = []

    def from_model(model, tokenizer, config, *, policy_version=0, folder=None):
        made.append(_StandIn(model, tokenizer, config, policy_version))
        return made[-1]

    monkeypatch.setattr(vllm.VLLMEngine, "from_model", staticmethod(from_model))
    return made


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model

    return load_model(ModelConfig(kind="tiny_moe"), tiny_tokenizer, seed=0)


def _vllm_config(**inference) -> Config:
    return Config(inference=InferenceConfig(backend="vllm", **inference))


def test_the_section_defaults_to_local_and_checks_itself():
    config = Config()
    assert config.inference.backend == "local" and config.inference.enable_prefix_caching
    data: dict = {}
    apply_override(data, "inference.backend=vllm")
    apply_override(data, "inference.max_model_len=8192")
    recipe = from_dict(Config, data)
    assert (recipe.inference.backend, recipe.inference.max_model_len) == ("vllm", 8192)
    with pytest.raises(ConfigError, match="inference.backend"):
        InferenceConfig(backend="sglang")
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        InferenceConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        InferenceConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="http_base_url"):
        InferenceConfig(backend="http")


def test_make_engine_local_and_vllm(tiny, vllm_stand_in):
    model, tokenizer = tiny
    local = make_engine(Config(), model, tokenizer, policy_version=4, copy_model=True)
    assert isinstance(local, LocalEngine) and local.policy_version == 4 and local.model is not model
    assert make_engine(InferenceConfig(), model, tokenizer).model is model
    assert local.prefix_cache is None  # off unless inference.prefix_cache_tokens asks for it
    cached = make_engine(InferenceConfig(prefix_cache_tokens=4096), model, tokenizer)
    assert cached.prefix_cache is not None and cached.prefix_cache.max_tokens == 4096
    engine = make_engine(_vllm_config(), model, tokenizer, policy_version=2, for_training=True)
    assert engine is vllm_stand_in[-1] and engine.policy_version == 2 and engine.config.backend == "vllm"
    with pytest.raises(TypeError, match="Config or an InferenceConfig"):
        make_engine(object(), model, tokenizer)


def test_vllm_refuses_converted_numerics(tiny, vllm_stand_in):
    from opencomposer.config import NumericsConfig

    config = Config(inference=InferenceConfig(backend="vllm"), numerics=NumericsConfig(recipe="mxfp8"))
    with pytest.raises(ConfigError, match="numerics.recipe"):
        make_engine(config, *tiny)


def test_http_is_refused_for_training_and_built_otherwise(tiny):
    from opencomposer.inference.vllm import HttpEngine

    config = Config(inference=InferenceConfig(backend="http", http_base_url="http://127.0.0.1:9/v1", http_model="m"))
    with pytest.raises(ConfigError, match="cannot sample for RL"):
        make_engine(config, *tiny, for_training=True)
    engine = make_engine(config, *tiny)
    assert isinstance(engine, HttpEngine) and engine.model == "m" and engine.base_url == "http://127.0.0.1:9/v1"


def test_rl_loop_sampler_goes_through_the_factory(tiny, vllm_stand_in):
    from opencomposer.inference.batching import BatchingEngine
    from opencomposer.rl.rollouts import make_sampler

    model, tokenizer = tiny
    sampler = make_sampler(_vllm_config(), model, tokenizer, 7)
    assert isinstance(sampler, BatchingEngine) and sampler.engine is vllm_stand_in[-1]
    assert sampler.engine.policy_version == 7
    assert isinstance(make_sampler(Config(), model, tokenizer, 7).engine, LocalEngine)


def test_inference_and_evaluation_services_go_through_the_factory(tiny, vllm_stand_in):
    from opencomposer.services.async_rl import EmbeddedServices
    from opencomposer.services.evaluation import EvaluationService
    from opencomposer.services.inference import InferenceService

    model, tokenizer = tiny
    weights = lambda: (model.state_dict(), 0)  # noqa: E731
    service = InferenceService(model, tokenizer, 3, weights, inference=_vllm_config())
    assert service.batcher.engine is vllm_stand_in[-1] and service.policy_version == 3
    assert isinstance(InferenceService(model, tokenizer, 0, weights).batcher.engine, LocalEngine)
    run = types.SimpleNamespace(config=_vllm_config(), tokenizer=tokenizer, state=types.SimpleNamespace(step=1),
                                heldout=[])
    services = EmbeddedServices(types.SimpleNamespace(run=run, published_weights=weights, faults=None), model)
    assert services.inference.batcher.engine is vllm_stand_in[-1]
    evaluation = EvaluationService(model, tokenizer, _vllm_config(), [], lambda version: model.state_dict(), None)
    try:
        assert evaluation.engine is vllm_stand_in[-1]
    finally:
        evaluation.close()


def test_local_policy_and_serve_go_through_the_factory(tiny, vllm_stand_in, tmp_path):
    from opencomposer.agent.policies.local import local_policy
    from opencomposer.model.loading import save_checkpoint
    from opencomposer.serve.server import ChatModel, ServerConfig

    model, tokenizer = tiny
    save_checkpoint(model, tokenizer, tmp_path)
    policy = local_policy(str(tmp_path), _vllm_config())
    assert policy.engine is vllm_stand_in[-1]
    chat = ChatModel.load(ServerConfig(model=str(tmp_path), device="cpu", inference=InferenceConfig(backend="vllm")))
    assert chat.engine.engine is vllm_stand_in[-1]
    assert isinstance(ChatModel.load(ServerConfig(model=str(tmp_path), device="cpu")).engine.engine, LocalEngine)


# Where an engine may still be built without the factory: the factory itself, and the quickstart,
# which prints samples of the model it just pretrained on the laptop (no [inference] choice there).
DIRECT_OK = {"inference/factory.py", "commands/quickstart.py"}


def test_no_engine_is_built_behind_the_factory():
    """Every ``LocalEngine(...)`` / ``VLLMEngine(...)`` / ``HttpEngine(...)`` call in the package is
    in the factory (or an allowed exception above), so a new caller cannot skip ``[inference]``."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in DIRECT_OK or rel in ("inference/local.py", "inference/vllm.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("LocalEngine", "VLLMEngine", "HttpEngine", "from_model"):
                    offenders.append(f"{rel}:{node.lineno} {name}(...)")
    assert not offenders, f"engines built without inference.factory.make_engine: {offenders}"
