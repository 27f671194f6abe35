"""The engine reports a route for every input position it ran: the prompt's prefill
(``Completion.prompt_routed_experts``) and each generated token, for every decoder."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from opencomposer.config import ModelConfig
from opencomposer.inference.batching import BatchingEngine
from opencomposer.inference.local import LocalEngine
from opencomposer.model.routing import RouteRecorder
from opencomposer.types import SamplingParams

SIZES = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4, top_k=2,
             moe_intermediate_size=64)


@functools.cache
def _model(kind: str, tokenizer):
    from opencomposer.model.loading import load_model

    return load_model(ModelConfig(kind=kind, **SIZES), tokenizer, seed=3)


@pytest.fixture(params=["tiny_moe", "tiny_deepseek_v3"])
def moe(request, tiny_tokenizer):
    return _model(request.param, tiny_tokenizer)


def full_forward_routes(model, ids: list[int]) -> np.ndarray:
    """[len(ids), moe_layers, top_k]: the routes of one plain forward over ``ids``."""
    with RouteRecorder(model) as recorder, torch.no_grad():
        model(torch.tensor([ids]))
        return recorder.take(1, len(ids))[0].numpy()


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_prompt_and_token_routes_cover_every_input_position_like_a_fresh_forward(moe, batch_invariant):
    model, tokenizer = moe
    engine = LocalEngine(model, tokenizer, batch_invariant=batch_invariant)
    prompts = [tokenizer.encode("def add(a, b):\n    return a + b\n"), tokenizer.encode("x = 1")]
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=10, seed=4, ignore_eos=True), n=2)
    layers = 2 if model.config.model_type == "qwen3_moe" else 1  # DeepSeek-V3's first layer is dense
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        routes = completion.prompt_routed_experts
        assert routes.dtype == np.uint8 and routes.shape == (len(prompt), layers, 2)
        context = np.concatenate([routes, completion.routed_experts])
        expected = full_forward_routes(model, prompt + completion.token_ids)
        assert np.array_equal(context, expected)
    # the n samples of a prompt share its prefill
    assert np.array_equal(completions[0].prompt_routed_experts, completions[1].prompt_routed_experts)


def test_prompt_routes_do_not_depend_on_the_batch(tiny_tokenizer):
    """Batch-invariant decoding (Llama/Qwen-style models) prefills each prompt on its own."""
    model, tokenizer = _model("tiny_moe", tiny_tokenizer)
    engine = LocalEngine(model, tokenizer)
    prompt = tokenizer.encode("for i in range(3):\n    print(i)\n")
    others = [tokenizer.encode("import os"), tokenizer.encode("while True:\n    break\n" * 3)]
    params = SamplingParams(max_new_tokens=4, seed=0)
    alone = engine.generate([prompt], params)[0].prompt_routed_experts
    batched = engine.generate([others[0], prompt, others[1]], params)[1].prompt_routed_experts
    assert alone.tobytes() == batched.tobytes()


def test_batching_front_end_keeps_prompt_routes_when_it_cuts_a_completion(moe):
    model, tokenizer = moe
    batcher = BatchingEngine(LocalEngine(model, tokenizer), max_wait_s=0.0)
    prompt = tokenizer.encode("return None")
    with batcher.session() as session:
        [short] = session.generate([prompt], SamplingParams(max_new_tokens=3, seed=1, ignore_eos=True))
    expected = full_forward_routes(model, prompt + short.token_ids)
    assert np.array_equal(np.concatenate([short.prompt_routed_experts, short.routed_experts]), expected)


def test_an_empty_call_reports_no_prompt_routes(moe):
    model, tokenizer = moe
    engine = LocalEngine(model, tokenizer)
    [empty] = engine.generate([tokenizer.encode("pass")], SamplingParams(max_new_tokens=0))
    assert empty.prompt_routed_experts is None  # nothing ran
