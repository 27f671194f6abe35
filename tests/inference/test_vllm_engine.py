"""``inference.vllm``: the adapter's translation logic, and the real thing (vLLM installed).

The CPU tests inject a tiny stand-in ``vllm`` module into ``sys.modules``. It mirrors only the API
surface the adapter uses (``LLM``'s ``llm_engine.add_request`` / ``step`` / ``abort_request``,
``collective_rpc``, ``reset_prefix_cache``; ``SamplingParams``; ``EngineArgs``' field names;
``RequestOutputKind``) with a made-up "model" whose tokens are a function of the seed, the step
and the loaded weights. **These tests check the adapter, not vLLM**: how our ``SamplingParams``
become vLLM's, how deltas become ``Completion``s (logprobs, finish reasons, per-token versions,
routes), when weights are handed to the workers and under which names, on which thread, and the
errors. Whether vLLM's processed logprobs match the trainer's and whether in-flight updates behave
in real vLLM is for the tests at the bottom, marked ``gpu`` and ``vllm``: on a GPU with the gpu
extra (``scripts/gpu_check.sh``) or on vLLM's CPU build (``scripts/vllm_cpu_check.sh``); skipped
where vLLM is not installed.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import threading
import types

import numpy as np
import pytest
import torch

from opencomposer.config import InferenceConfig
from opencomposer.inference import vllm as adapter
from opencomposer.types import SamplingParams

VOCAB = 50


# ----------------------------------------------------------------------------------------------
# The stand-in


class _Kind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass
class _EngineArgs:
    model: str = ""
    logprobs_mode: str = "raw_logprobs"
    async_scheduling: bool = False
    enable_return_routed_experts: bool = False


class _SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class _Logprob:
    def __init__(self, logprob: float):
        self.logprob = logprob


class _Model:
    """The workers' model: ``offset`` (from ``model.norm.weight[0]``) shifts every token."""

    def __init__(self):
        self.offset = 0
        self.loads: list[list[str]] = []
        self.reloads = 0  # loads that came through the runner's in-place reload

    def load_weights(self, weights):
        weights = list(weights)
        self.loads.append([name for name, _ in weights])
        for name, tensor in weights:
            if name == "model.norm.weight":
                self.offset = int(tensor[0])


class _Engine:
    """One token per running request per ``step``: ``(seed + position + offset) % VOCAB``."""

    def __init__(self, model: _Model, routes: bool, layers: int = 2, top_k: int = 2):
        self.model, self.routes, self.layers, self.top_k = model, routes, layers, top_k
        self.requests: dict[str, dict] = {}
        self.steps = 0
        self.on_step = None  # called before each step (tests use it to publish weights mid-call)
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params):
        assert params.output_kind is _Kind.DELTA and params.n == 1
        _LLM.threads.add(threading.get_ident())
        prompt = list(prompt["prompt_token_ids"])
        # the prefix cache, as vLLM reports it: a prompt seen before is served whole but for its last token
        cached = len(prompt) - 1 if any(r["prompt"] == prompt for r in self.requests.values()) else 0
        self.requests[request_id] = {"prompt": prompt, "params": params, "tokens": [], "cached": cached}

    def has_unfinished_requests(self):
        return any("done" not in r for r in self.requests.values())

    def abort_request(self, ids):
        self.aborted += list(ids)
        for i in ids:
            self.requests[i]["done"] = "abort"

    def step(self):
        _LLM.threads.add(threading.get_ident())
        if self.on_step is not None:
            self.on_step(self.steps)
        self.steps += 1
        outputs = []
        for request_id, r in self.requests.items():
            if "done" in r:
                continue
            p = r["params"]
            token = (p.seed + len(r["tokens"]) + self.model.offset) % VOCAB
            r["tokens"].append(token)
            finish = None
            if token in p.stop_token_ids:
                finish = "stop"
            elif len(r["tokens"]) >= p.max_tokens:
                finish = "length"
            routes = None
            if finish:
                r["done"] = finish
                if self.routes:  # every position but the last sampled token, as vLLM may report them
                    length = len(r["prompt"]) + len(r["tokens"]) - 1
                    routes = np.arange(length * self.layers * self.top_k).reshape(length, self.layers, self.top_k) % 8
            completion = types.SimpleNamespace(token_ids=[token], logprobs=[{token: _Logprob(-0.01 * token)}],
                                               finish_reason=finish, routed_experts=routes)
            outputs.append(types.SimpleNamespace(request_id=request_id, outputs=[completion],
                                                 finished=finish is not None, num_cached_tokens=r["cached"]))
        return outputs


class _Runner:
    """A worker's model runner; ``reload`` gives it newer vLLM's in-place ``reload_weights``."""

    def __init__(self, model: _Model, reload: bool):
        self.model = model
        if reload:
            self.reload_weights = self._reload

    def _reload(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        assert is_checkpoint_format and weights_path is None
        self.model.reloads += 1
        self.model.load_weights(weights_iterator)


class _Worker:
    def __init__(self, runner: _Runner):
        self.model_runner = runner
        if hasattr(runner, "reload_weights"):
            self.reload_weights = lambda *args, **kwargs: runner.reload_weights(*args, **kwargs)


class _LLM:
    instances: list[_LLM] = []
    threads: set[int] = set()  # the threads that called into "vLLM"
    reload = True  # workers have reload_weights (newer vLLM); False: only the model's load_weights
    # newer vLLM: routes only from the V2 model runner; v2 False: a build without it (vLLM's CPU build)
    routes_need_v2, v2 = False, True

    def __init__(self, **kwargs):
        if kwargs.get("enable_return_routed_experts") and self.routes_need_v2:
            if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "1":
                raise ValueError("1 validation error for VllmConfig\n  Value error, AuxOutput Connector requires "
                                 "Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1. [type=value_error]")
            if not self.v2:
                raise ValueError("1 validation error for VllmConfig\n  Value error, Model Runner V2 requires "
                                 "Triton. [type=value_error]")
        self.kwargs = kwargs
        _LLM.threads.add(threading.get_ident())
        self.model = _Model()
        self.llm_engine = _Engine(self.model, routes=kwargs.get("enable_return_routed_experts", False))
        self.resets = 0
        _LLM.instances.append(self)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        _LLM.threads.add(threading.get_ident())
        return [method(_Worker(_Runner(self.model, self.reload)), *args, **(kwargs or {}))]

    def reset_prefix_cache(self):
        _LLM.threads.add(threading.get_ident())
        if self.llm_engine.has_unfinished_requests():
            return False
        self.resets += 1
        return True


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{i}" for i in ids)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = _LLM
    module.SamplingParams = _SamplingParams
    module.EngineArgs = _EngineArgs
    module.sampling_params = types.SimpleNamespace(RequestOutputKind=_Kind)
    monkeypatch.setitem(sys.modules, "vllm", module)
    for variable in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER"):  # the adapter may set them:
        monkeypatch.setenv(variable, "")  # recorded, so the test's end puts back what was there
        monkeypatch.delenv(variable)
    _LLM.instances.clear()
    _LLM.threads.clear()
    return module


def _engine(is_moe=False, eos=(49,), **config) -> adapter.VLLMEngine:
    return adapter.VLLMEngine("/nowhere", _Tokenizer(), InferenceConfig(**config), eos_ids=eos, is_moe=is_moe,
                              num_experts=8, max_positions=1000)


# ----------------------------------------------------------------------------------------------
# Without vLLM


def test_asking_for_vllm_without_it_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vllm now fails
    with pytest.raises(adapter.VLLMUnavailable, match=r"separate virtual environment.*make gpu-setup.*\.\[gpu"):
        adapter.import_vllm()
    with pytest.raises(adapter.VLLMUnavailable):
        _engine()


# ----------------------------------------------------------------------------------------------
# The adapter over the stand-in


def test_llm_is_built_with_the_recipe_knobs_and_processed_logprobs(fake_vllm, monkeypatch):
    engine = _engine(is_moe=True, gpu_memory_utilization=0.7, tensor_parallel_size=2, max_model_len=512,
                     dtype="bfloat16")
    kwargs = engine.llm.kwargs
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert (kwargs["gpu_memory_utilization"], kwargs["tensor_parallel_size"], kwargs["enable_prefix_caching"],
            kwargs["max_model_len"], kwargs["dtype"]) == (0.7, 2, True, 512, "bfloat16")
    assert _engine(enable_prefix_caching=False).llm.kwargs["enable_prefix_caching"] is False
    assert kwargs["async_scheduling"] is False and kwargs["enable_return_routed_experts"] is True
    assert kwargs["generation_config"] == "vllm"  # the checkpoint's sampling defaults never apply
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert engine.max_positions == 512
    dense = _engine()
    assert "enable_return_routed_experts" not in dense.llm.kwargs and "max_model_len" not in dense.llm.kwargs
    assert "enforce_eager" not in dense.llm.kwargs and _engine(enforce_eager=True).llm.kwargs["enforce_eager"] is True


def test_routes_turn_on_the_v2_runner_or_are_left_out_with_a_warning(fake_vllm, monkeypatch):
    """Newer vLLM returns routes only from its V2 model runner: the engine turns it on where vLLM
    asks; a build without it (vLLM's CPU build) runs without routes and says so."""
    monkeypatch.setattr(_LLM, "routes_need_v2", True)
    engine = _engine(is_moe=True)
    assert engine.returns_routes and engine.llm.kwargs["enable_return_routed_experts"] is True
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    [c] = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2), row_seeds=[0])
    assert c.prompt_routed_experts.shape == (3, 2, 2)

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    monkeypatch.setattr(_LLM, "v2", False)
    with pytest.warns(UserWarning, match="returns no routed experts .Model Runner V2 requires Triton"):
        engine = _engine(is_moe=True)
    assert not engine.returns_routes and "enable_return_routed_experts" not in engine.llm.kwargs
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ  # put back as it was
    [c] = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2), row_seeds=[0])
    assert c.prompt_routed_experts is None and c.routed_experts is None and len(c.token_ids) == 2

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the caller's choice is not overridden
    with pytest.raises(ValueError, match="requires Model Runner V2"):
        _engine(is_moe=True)

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    monkeypatch.setattr(_LLM, "v2", True)
    real_init = _LLM.__init__

    def out_of_memory_on_the_retry(self, **kwargs):
        if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
            raise RuntimeError("CUDA out of memory")
        real_init(self, **kwargs)

    monkeypatch.setattr(_LLM, "__init__", out_of_memory_on_the_retry)
    with pytest.raises(RuntimeError, match="out of memory"):
        _engine(is_moe=True)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ  # put back on any failure, not only vLLM's refusal

    monkeypatch.setattr(_LLM, "__init__", real_init)  # vLLM refuses routes without its prefix cache
    with pytest.warns(UserWarning, match="enable_prefix_caching = false: vLLM returns routed experts only"):
        engine = _engine(is_moe=True, enable_prefix_caching=False)
    assert not engine.returns_routes and "enable_return_routed_experts" not in engine.llm.kwargs


def test_a_vllm_without_logprobs_mode_is_refused(fake_vllm, monkeypatch):
    @dataclasses.dataclass
    class Old:
        model: str = ""

    monkeypatch.setattr(fake_vllm, "EngineArgs", Old)
    with pytest.raises(adapter.EngineError, match="logprobs_mode"):
        _engine()


def test_sampling_params_map_one_to_one(fake_vllm):
    engine = _engine(eos=(49, 48))
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_p=0.9, top_k=20, stop=["\n\n"], stop_token_ids=[3])
    sp = engine.sampling_params(params, seed=1234)
    assert (sp.n, sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed) == (1, 7, 0.8, 0.9, 20, 1234)
    assert sp.logprobs == 0 and sp.min_p == 0.0 and sp.output_kind is _Kind.DELTA
    assert sp.stop == ["\n\n"] and sp.include_stop_str_in_output and sp.detokenize
    assert sp.stop_token_ids == [3, 48, 49] and sp.ignore_eos is False and sp.skip_special_tokens is False
    bare = engine.sampling_params(SamplingParams(ignore_eos=True, stop_token_ids=[3]), seed=1)
    assert bare.stop_token_ids == [3] and bare.ignore_eos and bare.stop is None and not bare.detokenize


def test_generate_fans_out_rows_with_local_engine_row_seeds(fake_vllm):
    from opencomposer.inference.local import row_seed

    engine = _engine()
    prompts = [[1, 2, 3], [4, 5]]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4, seed=7), n=3)
    assert [(c.prompt_index, c.sample_index) for c in out] == [(i, j) for i in range(2) for j in range(3)]
    requests = list(engine.llm.llm_engine.requests.values())
    assert [r["params"].seed for r in requests] == [row_seed(7, i, j) for i in range(2) for j in range(3)]
    assert [r["prompt"] for r in requests] == [prompts[0]] * 3 + [prompts[1]] * 3
    for c, r in zip(out, requests):
        assert c.token_ids == r["tokens"]
        assert c.logprobs == pytest.approx([-0.01 * t for t in c.token_ids])
        assert c.finish_reason == r["done"]
        assert c.text == _Tokenizer().decode(c.token_ids)
        assert c.token_versions == [0] * len(c.token_ids) and c.policy_version == 0
        assert c.routed_experts is None and c.prompt_routed_experts is None
    # the stand-in's prefix cache serves a repeated prompt but its last token
    assert engine.prompt_tokens == 3 * 3 + 3 * 2 and engine.cached_prompt_tokens == 2 * 2 + 2 * 1
    seeds = [11, 12, 13, 14]
    engine.generate([[1], [2]], SamplingParams(max_new_tokens=2), n=2, row_seeds=seeds)
    assert [r["params"].seed for r in list(engine.llm.llm_engine.requests.values())[-4:]] == seeds


def test_stop_tokens_end_with_stop_and_zero_tokens_runs_nothing(fake_vllm):
    engine = _engine(eos=(45,))
    # seed 40: tokens 40, 41, ... reach the EOS id 45 at the sixth
    [c] = engine.generate([[1]], SamplingParams(max_new_tokens=20), row_seeds=[40])
    assert c.token_ids == [40, 41, 42, 43, 44, 45] and c.finish_reason == "stop"
    steps = engine.llm.llm_engine.steps
    [empty] = engine.generate([[1]], SamplingParams(max_new_tokens=0))
    assert empty.token_ids == [] and empty.finish_reason == "length" and engine.llm.llm_engine.steps == steps


def test_bad_requests_are_refused(fake_vllm):
    engine = _engine()
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="limit"):
        engine.generate([list(range(1000))], SamplingParams())
    with pytest.raises(ValueError, match="row_seeds"):
        engine.generate([[1]], SamplingParams(), n=2, row_seeds=[1])


def test_moe_routes_are_split_into_prompt_and_completion(fake_vllm):
    engine = _engine(is_moe=True)
    [c] = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4), row_seeds=[0])
    # the stand-in, like vLLM may, covers every position but the last sampled token
    assert c.prompt_routed_experts.shape == (3, 2, 2) and c.prompt_routed_experts.dtype == np.uint8
    assert c.routed_experts is None
    full = np.zeros((7, 2, 2), dtype=np.int64)
    prompt, completion = adapter.split_routes(full, 3, 4, np.dtype(np.uint8))
    assert prompt.shape == (3, 2, 2) and completion.shape == (4, 2, 2) and completion.dtype == np.uint8
    assert adapter.split_routes(None, 3, 4, np.dtype(np.uint8)) == (None, None)
    with pytest.raises(adapter.EngineError, match="covers 5 positions"):
        adapter.split_routes(np.zeros((5, 2, 2)), 3, 4, np.dtype(np.uint8))


def test_weights_go_to_the_workers_under_checkpoint_names(fake_vllm, monkeypatch):
    engine = _engine()
    state = {"model.norm.weight": torch.tensor([5.0, 0.0]),
             "model.layers.0.mlp.experts.gate_up_proj": torch.zeros(2, 6, 4),
             "model.layers.0.mlp.experts.down_proj": torch.zeros(2, 4, 3)}
    engine.load_weights(state, 3)
    assert engine.policy_version == 3 and engine.llm.model.offset == 5
    assert engine.llm.model.reloads == 1  # through the worker's in-place reload, where vLLM has one
    assert sorted(engine.llm.model.loads[-1]) == sorted([
        "model.norm.weight",
        "model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.0.up_proj.weight",
        "model.layers.0.mlp.experts.1.gate_proj.weight", "model.layers.0.mlp.experts.1.up_proj.weight",
        "model.layers.0.mlp.experts.0.down_proj.weight", "model.layers.0.mlp.experts.1.down_proj.weight"])
    assert engine.llm.resets == 1  # the prefix cache of the replaced weights is dropped at once
    [c] = engine.generate([[1]], SamplingParams(max_new_tokens=1), row_seeds=[0])
    assert c.token_ids == [5] and c.policy_version == 3
    def reload_without_format_flag(self, weights_iterator=None, weights_path=None):  # a vLLM between the two
        self.model.reloads += 1
        self.model.load_weights(weights_iterator)

    monkeypatch.setattr(_Runner, "_reload", reload_without_format_flag)
    between = _engine()
    between.load_weights(state, 1)
    assert between.llm.model.offset == 5 and between.llm.model.reloads == 1
    monkeypatch.setattr(_LLM, "reload", False)  # older vLLM: the model's own load_weights
    old = _engine()
    old.load_weights(state, 1)
    assert old.llm.model.offset == 5 and old.llm.model.reloads == 0 and len(old.llm.model.loads[-1]) == 7


def test_weights_published_mid_call_land_between_two_steps(fake_vllm):
    engine = _engine()
    vllm_engine = engine.llm.llm_engine

    def publish(step):
        if step == 2:  # from a trainer thread, while the call runs
            trainer = threading.Thread(target=engine.load_weights, args=({"model.norm.weight": torch.tensor([10.0])}, 1))
            trainer.start()
            trainer.join()
            assert engine.policy_version == 0, "staged, not applied, while a step may be running"

    vllm_engine.on_step = publish
    out = engine.generate([[1], [2]], SamplingParams(max_new_tokens=5), row_seeds=[0, 20])
    for c, seed in zip(out, (0, 20)):
        assert c.token_versions == [0, 0, 0, 1, 1] and c.policy_version == 0
        assert c.token_ids == [seed, seed + 1, seed + 2, seed + 13, seed + 14]
    assert engine.policy_version == 1
    assert engine.llm.resets == 1  # reset once nothing ran any more


def test_failures_are_reported_not_hidden(fake_vllm):
    engine = _engine()
    vllm_engine = engine.llm.llm_engine

    def boom(step):
        if step == 1:
            raise RuntimeError("CUDA out of memory")

    vllm_engine.on_step = boom
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.generate([[1]], SamplingParams(max_new_tokens=5), row_seeds=[0])
    assert len(vllm_engine.aborted) == 1  # its request does not linger in vLLM
    with pytest.raises(adapter.EngineError, match="no logprob"):
        adapter.sampled_logprobs([{3: _Logprob(-1.0)}], [4])
    with pytest.raises(adapter.EngineError, match="logprob positions"):
        adapter.sampled_logprobs(None, [4])
    row = adapter._Row(0, 0)
    aborted = types.SimpleNamespace(request_id="r", finished=True, outputs=[types.SimpleNamespace(
        token_ids=[], logprobs=[], finish_reason="abort")])
    with pytest.raises(adapter.EngineError, match="abort"):
        engine._take(row, aborted, 0)


def test_every_call_into_vllm_runs_on_the_engines_one_thread(fake_vllm):
    """Rollout workers call ``generate`` and a trainer thread ``load_weights`` from anywhere; vLLM
    sees one thread (its CPU build fails a step from a thread other than the one that built it)."""
    engine = _engine()
    errors: list[BaseException] = []

    def episode(seed: int) -> None:
        try:
            for _ in range(3):
                engine.generate([[1, 2]], SamplingParams(max_new_tokens=3), row_seeds=[seed])
                engine.load_weights({"model.norm.weight": torch.tensor([float(seed)])}, seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=episode, args=(seed,)) for seed in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors and len(engine.llm.llm_engine.requests) == 12
    assert _LLM.threads == {engine._thread_id} and engine._thread_id != threading.get_ident()


def test_close_shuts_vllm_down_once_and_a_closed_engine_refuses_work(fake_vllm):
    engine = _engine()
    shutdowns = []
    engine.llm.llm_engine.engine_core = types.SimpleNamespace(shutdown=lambda: shutdowns.append(1))
    engine.close()
    engine.close()
    assert shutdowns == [1] and engine.llm is None
    with pytest.raises(adapter.EngineError, match="closed"):
        engine.generate([[1]], SamplingParams(max_new_tokens=2))
    engine.load_weights({"model.norm.weight": torch.tensor([1.0])}, 7)  # a publish racing a restart: ignored
    assert engine.policy_version == 0


def test_checkpoint_names_match_the_saved_checkpoint(tmp_path, tiny_tokenizer):
    """What vLLM loads at start (the folder ``save_checkpoint`` writes) and what ``load_weights``
    hands it later name and hold the same tensors."""
    from safetensors.torch import load_file

    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model, save_checkpoint

    model, tokenizer = load_model(ModelConfig(kind="tiny_moe"), tiny_tokenizer, seed=0)
    save_checkpoint(model, tokenizer, tmp_path)
    saved = {}
    for path in tmp_path.glob("*.safetensors"):
        saved.update(load_file(path))
    names = adapter.checkpoint_names(model.state_dict())
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(names) - tied == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(names[name], tensor), name


# ----------------------------------------------------------------------------------------------
# HttpEngine


def test_http_engine_speaks_token_ids_and_refuses_what_it_cannot_do(monkeypatch):
    calls = []

    def reply(self, path, body=None):
        calls.append((path, body))
        return {"choices": [{"logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -0.25]},
                             "finish_reason": "stop", "text": "ab"}]}

    monkeypatch.setattr(adapter.HttpEngine, "_request", reply)
    engine = adapter.HttpEngine("http://server/v1/", "m", _Tokenizer())
    out = engine.generate([[1, 2], [3]], SamplingParams(max_new_tokens=8, top_k=5, stop_token_ids=[9], seed=1), n=2)
    assert [(c.prompt_index, c.sample_index) for c in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert out[0].token_ids == [5, 6] and out[0].logprobs == [-0.5, -0.25] and out[0].finish_reason == "stop"
    assert out[0].routed_experts is None
    path, body = calls[0]
    assert path == "/completions" and body["prompt"] in ([1, 2], [3]) and body["return_tokens_as_token_ids"]
    assert body["logprobs"] == 0 and body["top_k"] == 5 and body["stop_token_ids"] == [9] and body["n"] == 1
    assert body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0  # never the checkpoint's defaults
    assert body["presence_penalty"] == body["frequency_penalty"] == 0.0
    assert engine.body([1], SamplingParams(max_new_tokens=1), 0)["top_k"] == 0  # sent when off too
    assert len({b["seed"] for _, b in calls}) == 4  # one seed per row
    with pytest.raises(adapter.EngineError, match="cannot take new weights"):
        engine.load_weights({}, 1)
    with pytest.raises(adapter.EngineError, match="no token-level logprobs"):
        adapter.HttpEngine.parse({"text": "x", "finish_reason": "stop"})
    with pytest.raises(adapter.EngineError, match="return_tokens_as_token_ids"):
        adapter.HttpEngine.parse({"logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}})


# ----------------------------------------------------------------------------------------------
# The real thing: on a GPU with the gpu extra (scripts/gpu_check.sh), or on CPU with a CPU build of
# vLLM (scripts/vllm_cpu_check.sh). Marked ``gpu`` and ``vllm``: `pytest -m vllm` runs them on either.


def _real_vllm() -> str:
    """The device the installed vLLM runs on: ``cuda`` where a GPU is, ``cpu`` for vLLM's CPU build."""
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except ImportError:
        pytest.skip("needs vLLM (the gpu extra, or a CPU build: docs/gpu.md)")
    if torch.cuda.is_available() and current_platform.is_cuda():
        return "cuda"
    if current_platform.is_cpu():
        return "cpu"
    pytest.skip(f"the installed vLLM runs on {type(current_platform).__name__}, and no CUDA device is visible")


def _vllm_config(device: str, **knobs) -> InferenceConfig:
    """bfloat16 on a GPU; float32 and eager on CPU (starts in seconds, and scores to float32 rounding)."""
    if device == "cpu":
        return InferenceConfig(backend="vllm", dtype="float32", enforce_eager=True, **knobs)
    return InferenceConfig(backend="vllm", dtype="bfloat16", **knobs)


# how far vLLM's logprobs of a token may sit from the trainer's: bf16 kernels on a GPU, float32 on CPU
LOGPROB_TOLERANCE = {"cuda": 0.05, "cpu": 1e-3}


@pytest.fixture(scope="module")
def smol_vllm():
    """SmolLM2-135M in vLLM and the same model in transformers, on the device vLLM runs on."""
    device = _real_vllm()
    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model

    dtype = "bfloat16" if device == "cuda" else "float32"
    model, tokenizer = load_model(ModelConfig(kind="smollm2", dtype=dtype), device=device)
    engine = adapter.VLLMEngine.from_model(model, tokenizer, _vllm_config(
        device, gpu_memory_utilization=0.3, max_model_len=2048))
    yield model, tokenizer, engine, device
    engine.close()


def _scored(model, prompt, completion, params, device):
    """The trainer's logprob of each sampled token (``training.forward``'s rule: temperature,
    top-p cut, renormalised), from one forward of prompt + completion."""
    from opencomposer.inference.sampling import kept_tokens, truncated_logprobs

    ids = torch.tensor([prompt + completion], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
    logp = truncated_logprobs(logits, kept_tokens(logits, params.top_p))
    return logp.gather(1, torch.tensor(completion, device=device)[:, None])[:, 0].cpu()


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_logprobs_are_those_of_the_cut_distribution(smol_vllm):
    """vLLM's processed logprobs agree with the trainer's scoring of the same tokens."""
    model, tokenizer, engine, device = smol_vllm
    prompt = tokenizer.encode("def fibonacci(n):")
    params = SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, seed=3, ignore_eos=True)
    [c] = engine.generate([prompt], params)
    assert len(c.token_ids) == 32 and len(c.logprobs) == 32
    mine, ours = _scored(model, prompt, c.token_ids, params, device), torch.tensor(c.logprobs)
    finite = torch.isfinite(mine)  # a token at the top-p boundary may fall outside the trainer's cut
    assert finite.float().mean() > 0.9
    assert (mine[finite] - ours[finite]).abs().median() < LOGPROB_TOLERANCE[device]


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_takes_weights_in_flight_and_seeds_rows(smol_vllm):
    model, tokenizer, engine, device = smol_vllm
    prompt = tokenizer.encode("import numpy as np\n")
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    a = engine.generate([prompt], params, n=2)
    b = engine.generate([prompt], params, n=2)
    assert a[0].token_ids == b[0].token_ids and a[0].token_ids != a[1].token_ids  # seeds per row
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"] * 0.5
    version = engine.policy_version + 1
    engine.load_weights(state, version)
    c = engine.generate([prompt], params)[0]
    assert c.policy_version == version and c.token_versions == [version] * 16
    engine.load_weights(model.state_dict(), version + 1)  # back to the model's weights
    d = engine.generate([prompt], params)[0]
    assert d.token_ids == a[0].token_ids


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_switches_weights_between_two_steps_of_a_running_call(smol_vllm):
    """Weights published while ``generate`` runs land between two engine steps: the tokens before
    the switch carry the old version and score as the old weights' logprobs, the tokens after it
    the new ones. The change is to the final norm, which leaves every key and value as they were,
    so one fresh forward under each set of weights scores exactly what vLLM sampled from."""
    model, tokenizer, engine, device = smol_vllm
    prompt = tokenizer.encode("class Stack:\n")
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    old_version = engine.policy_version
    new = {k: v.clone() for k, v in model.state_dict().items()}
    new["model.norm.weight"] = new["model.norm.weight"] * 0.5
    vllm_engine, real_step, steps = engine.llm.llm_engine, engine.llm.llm_engine.step, []

    def step():  # the trainer's publish, from a thread of its own, after the 8th step
        out = real_step()
        steps.append(len(steps))
        if len(steps) == 8:
            trainer = threading.Thread(target=engine.load_weights, args=(new, old_version + 1))
            trainer.start()
            trainer.join()
            assert engine.policy_version == old_version, "staged, not applied, while the call runs"
        return out

    vllm_engine.step = step
    try:
        out = engine.generate([prompt], params, n=2)
    finally:
        del vllm_engine.step
    try:
        for c in out:
            switch = c.token_versions.index(old_version + 1)
            assert c.token_versions == [old_version] * switch + [old_version + 1] * (24 - switch)
            assert 1 <= switch <= 8, "the update waited for the next step, not the end of the call"
            before = _scored(model, prompt, c.token_ids, params, device)
            scaled = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(new)
            after = _scored(model, prompt, c.token_ids, params, device)
            model.load_state_dict(scaled)
            ours, tolerance = torch.tensor(c.logprobs), LOGPROB_TOLERANCE[device]
            assert (ours[:switch] - before[:switch]).abs().max() < 10 * tolerance
            assert (ours[switch:] - after[switch:]).abs().max() < 10 * tolerance
            assert (ours[switch:] - before[switch:]).abs().max() > 0.1  # the new weights, not the old
    finally:
        engine.load_weights(model.state_dict(), engine.policy_version + 1)


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_serves_a_groups_shared_prompt_from_its_prefix_cache(smol_vllm):
    """The n rows of a prompt go in as n requests in one step; vLLM finds the first row's blocks
    for the others, so they prefill only what follows the last whole block."""
    model, tokenizer, engine, device = smol_vllm
    prompt = tokenizer.encode("You are a coding agent. Tools: read_file, write_file, run, finish.\n" * 30)[:600]
    asked, cached = engine.prompt_tokens, engine.cached_prompt_tokens
    engine.generate([prompt], SamplingParams(max_new_tokens=4, seed=1, ignore_eos=True), n=4)
    assert engine.prompt_tokens - asked == 4 * 600
    assert engine.cached_prompt_tokens - cached >= 3 * 600 // 2  # three rows, at least half of it each


@pytest.fixture(scope="module")
def vllm_server(smol_vllm, tmp_path_factory):
    """vLLM's OpenAI-compatible server on SmolLM2 (a child process), as ``backend = "http"`` meets
    it: started with ``--logprobs-mode processed_logprobs``, the project's convention."""
    import socket
    import subprocess
    import time
    import urllib.request

    from opencomposer.model.loading import save_checkpoint

    model, tokenizer, _, device = smol_vllm
    folder = save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("smollm2"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # on CPU, vLLM's "gpu" memory utilization is the share of the machine's memory it reserves
    knobs = ["--gpu-memory-utilization", "0.2", *(["--dtype", "float32", "--enforce-eager"] if device == "cpu"
                                                  else ["--dtype", "bfloat16"])]
    log = open(tmp_path_factory.mktemp("server") / "vllm.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                               "--served-model-name", "smol", "--logprobs-mode", "processed_logprobs",
                               "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port), *knobs],
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"vLLM's server exited; its log: {log.name}"
            assert time.monotonic() < deadline, f"vLLM's server did not answer within 300 s; its log: {log.name}"
            try:
                urllib.request.urlopen(f"{base}/models", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        yield base, model, tokenizer, device
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_server_speaks_token_ids_with_the_cut_distributions_logprobs(vllm_server):
    """``HttpEngine`` against ``vllm serve``: ids in and out, the logprobs of the distribution
    sampled from (the server runs ``--logprobs-mode processed_logprobs``), seeds per row, stop strings."""
    base, model, tokenizer, device = vllm_server
    engine = adapter.HttpEngine(base, "", tokenizer)
    assert engine.model == "smol"  # asked of /models
    prompt = tokenizer.encode("def fibonacci(n):")
    params = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=3, ignore_eos=True)
    out = engine.generate([prompt], params, n=2)
    for c in out:
        assert len(c.token_ids) == 24 and c.finish_reason == "length"
        mine, ours = _scored(model, prompt, c.token_ids, params, device), torch.tensor(c.logprobs)
        finite = torch.isfinite(mine)
        assert finite.float().mean() > 0.9
        assert (mine[finite] - ours[finite]).abs().median() < LOGPROB_TOLERANCE[device]
    again = engine.generate([prompt], params, n=2)
    assert [c.token_ids for c in again] == [c.token_ids for c in out] and out[0].token_ids != out[1].token_ids
    [stopped] = engine.generate([prompt], SamplingParams(max_new_tokens=64, temperature=0.0, stop=["\n"]))
    assert stopped.finish_reason == "stop" and "\n" in stopped.text


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_moe_loads_fused_experts_and_returns_routes_where_supported(smol_vllm, tiny_tokenizer):
    """A Qwen3-MoE in vLLM: its logprobs agree with the trainer's; the routes come back where this
    vLLM build returns them (its CPU build does not, and the engine says so); an update of the
    router, an attention projection and the fused expert tensors (split per expert by
    ``checkpoint_names``) reaches vLLM. It starts after ``close`` of the SmolLM2 engine in this
    process: vLLM keeps one model-parallel state per process, and without the close this second
    engine fails to start."""
    import warnings

    from opencomposer.config import ModelConfig
    from opencomposer.model.loading import load_model

    smol_vllm[2].close()
    device = smol_vllm[3]
    model, tokenizer = load_model(ModelConfig(kind="tiny_moe"), tiny_tokenizer, seed=0)
    model.to(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = adapter.VLLMEngine.from_model(model, tokenizer, InferenceConfig(
            backend="vllm", gpu_memory_utilization=0.2, max_model_len=1024, dtype="float32",
            enforce_eager=device == "cpu"))
    prompt, params = [5, 6, 7, 8], SamplingParams(max_new_tokens=8, ignore_eos=True, seed=1)

    def gap() -> float:
        [c] = engine.generate([prompt], params)
        assert len(c.token_ids) == 8 and c.policy_version == engine.policy_version
        return float((torch.tensor(c.logprobs) - _scored(model, prompt, c.token_ids, params, device)).abs().max())

    try:
        [c] = engine.generate([prompt], params)
        if device == "cuda":  # the gpu extra's vLLM has enable_return_routed_experts
            assert engine.returns_routes, [str(w.message) for w in caught]
        if engine.returns_routes:  # the experts vLLM chose are the trainer's for the same tokens
            from opencomposer.model.routing import RouteRecorder

            with RouteRecorder(model) as recorder, torch.no_grad():
                model(torch.tensor([prompt + c.token_ids], device=device))
                mine = recorder.take(1, len(prompt) + 8)[0].sort(-1).values.cpu().numpy()
            assert c.prompt_routed_experts.shape == (4, 4, 2)
            assert (np.sort(c.prompt_routed_experts, -1) == mine[:4]).mean() > 0.95
            if c.routed_experts is not None:
                assert c.routed_experts.shape == (8, 4, 2)
                assert (np.sort(c.routed_experts, -1) == mine[4:]).mean() > 0.95
        else:
            assert any("returns no routed experts" in str(w.message) for w in caught)
            assert c.prompt_routed_experts is None and c.routed_experts is None
        assert gap() < 1e-3

        with torch.no_grad():  # the router, an attention projection and every expert, each its own scale
            for name, p in model.named_parameters():
                if name.endswith(".experts.down_proj") or name.endswith(".experts.gate_up_proj"):
                    p.mul_(torch.linspace(0.5, 3.0, p.shape[0], device=p.device).view(-1, 1, 1))
                elif name.endswith("mlp.gate.weight") or name.endswith("o_proj.weight"):
                    p.mul_(1.5)
        engine.load_weights(model.state_dict(), 1)
        updated_gap = gap()
        if device == "cpu" and updated_gap >= 1e-3:
            pytest.xfail(f"vLLM's CPU build prepacks a MoE's expert weights after loading and its in-place reload "
                         f"leaves them unpacked: logprobs {updated_gap:.3f} off after an update (docs/gpu.md)")
        assert updated_gap < 1e-3
    finally:
        engine.close()
