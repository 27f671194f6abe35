"""LocalEngine: exact against transformers generate and fresh full forward passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.inference.local import row_seed
from opencomposer.inference.sampling import kept_tokens, truncated_logprobs
from opencomposer.model.routing import RouteRecorder

CODE_PROMPTS = [
    "def binary_search(items, target):\n",
    "import json\n\n\ndef load(path):\n    with open(path) as f:\n",
    "class LinkedList:\n    def __init__(self):\n        self.head = None\n\n    def",
]


GREEDY_TOKENS = 12  # enough for a cached decode to diverge from transformers' if it were wrong


def _chat(tokenizer, text):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=False)


@pytest.fixture(params=["tiny_moe", "tiny_deepseek", "smollm2"])
def model_and_prompts(request):
    model, tokenizer = request.getfixturevalue(request.param)
    if request.param == "smollm2":
        texts = [_chat(tokenizer, t) for t in ("Write a Python function that reverses a string.",
                                               "What does `git rebase` do?",
                                               "Fix: def add(a, b): return a - b")]
    else:
        texts = CODE_PROMPTS
    return model, tokenizer, [tokenizer.encode(t) for t in texts]


def test_greedy_equals_transformers_generate(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    engine = LocalEngine(model, tokenizer)
    ours = engine.generate(prompts, SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0))
    for prompt, completion in zip(prompts, ours):
        reference = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=engine.pad_id)
        theirs = reference[0, len(prompt):].tolist()
        assert completion.token_ids == theirs
        assert completion.finish_reason == ("stop" if len(theirs) < GREEDY_TOKENS else "length")


def _full_forward(model, ids):
    with RouteRecorder(model) as recorder, torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
        routes = recorder.take(1, len(ids))
    return torch.log_softmax(logits, dim=-1), None if routes is None else routes[0]


def test_logprobs_and_routes_match_a_fresh_forward(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    engine = LocalEngine(model, tokenizer)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    completions = engine.generate(prompts, params, n=2)
    assert len(completions) == 6  # 3 prompts x 2 samples, each checked against a full forward
    worst = 0.0
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        logp, routes = _full_forward(model, prompt + completion.token_ids)
        targets = torch.tensor(completion.token_ids)
        scaled = logp[len(prompt) - 1 : -1]  # temperature 1; the top-p cut is renormalised over what it keeps
        expected = truncated_logprobs(scaled, kept_tokens(scaled, params.top_p)).gather(1, targets[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(completion.logprobs)).abs().max().item())
        if routes is None:
            assert completion.routed_experts is None
            continue
        got = completion.routed_experts
        assert got.dtype == np.uint8 and got.shape == (len(targets), *routes.shape[1:])
        assert np.array_equal(got, routes[len(prompt):].numpy())
    # float32 rounding of a cached decode against one full forward; the renormalisation over the
    # top-p set adds the rounding of a log-sum-exp (DeepSeek's cached path measured 1.2e-4)
    assert worst <= 2e-4


def test_same_seed_same_samples_other_seed_other_samples(tiny_moe):
    model, tokenizer = tiny_moe
    engine = LocalEngine(model, tokenizer)
    prompts = [tokenizer.encode(p) for p in CODE_PROMPTS]
    a = engine.generate(prompts, SamplingParams(max_new_tokens=20, seed=1), n=4)
    b = engine.generate(prompts, SamplingParams(max_new_tokens=20, seed=1), n=4)
    c = engine.generate(prompts, SamplingParams(max_new_tokens=20, seed=2), n=4)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    # samples of one prompt differ from each other (independent per-sample streams)
    assert len({tuple(x.token_ids) for x in a[:4]}) > 1
    # a sample does not depend on which other prompts share its batch: prompt 1 alone, given the
    # seeds its samples had in the batch, samples the same tokens, logprobs and routes
    seeds = [row_seed(1, 1, j) for j in range(4)]
    alone = engine.generate(prompts[1:2], SamplingParams(max_new_tokens=20, seed=1), n=4, row_seeds=seeds)
    assert alone[0].prompt_index == 0
    for x, y in zip(alone, a[4:8]):
        assert x.token_ids == y.token_ids and x.logprobs == y.logprobs
        assert np.array_equal(x.routed_experts, y.routed_experts)


def test_samples_follow_the_truncated_distribution(tiny_moe):
    model, tokenizer = tiny_moe
    engine = LocalEngine(model, tokenizer)
    prompt = tokenizer.encode(CODE_PROMPTS[0])
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top = probs.topk(3)
    out = engine.generate([prompt], SamplingParams(max_new_tokens=1, top_k=3, seed=0), n=400)
    counts = {t: sum(o.token_ids[0] == t for o in out) for t in top.indices.tolist()}
    assert sum(counts.values()) == 400  # nothing outside the top 3
    expected = top.values / top.values.sum()
    for (_token, count), p in zip(counts.items(), expected.tolist()):
        assert abs(count / 400 - p) < 4 * (p * (1 - p) / 400) ** 0.5 + 0.01


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_n_samples_share_one_prefill(tiny_moe, batch_invariant):
    model, tokenizer = tiny_moe
    engine = LocalEngine(model, tokenizer, batch_invariant=batch_invariant)
    rows_seen = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, a, out: rows_seen.append(tuple(a[0].shape)))
    try:
        prompts = [tokenizer.encode(p) for p in CODE_PROMPTS[:2]]
        engine.generate(prompts, SamplingParams(max_new_tokens=3, seed=0), n=8)
    finally:
        handle.remove()
    if batch_invariant:  # each prompt alone, once for its 8 samples
        prefills, steps = rows_seen[:2], rows_seen[2:]
        assert prefills == [(1, len(p)) for p in prompts]
    else:  # the prompts left-padded into one batch of 2 rows, not 16
        prefills, steps = rows_seen[:1], rows_seen[1:]
        assert prefills == [(2, max(len(p) for p in prompts))]
    assert steps and all(shape[1] == 1 and shape[0] <= 16 for shape in steps)


def test_stop_strings_stop_ids_and_lengths(tiny_moe):
    model, tokenizer = tiny_moe
    engine = LocalEngine(model, tokenizer)
    prompt = tokenizer.encode(CODE_PROMPTS[1])
    free = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=0))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 40
    # stop at the first occurrence of a string the greedy continuation contains
    text = free.text
    stop = text[10:13]
    stopped = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=0, stop=[stop]))[0]
    assert stopped.finish_reason == "stop" and stop in stopped.text
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert stop not in tokenizer.decode(stopped.token_ids[:-1])
    # a stop token id ends the completion and is included
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    by_id = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=0, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == free.token_ids[: first + 1] and by_id.finish_reason == "stop"
    assert by_id.routed_experts.shape[0] == len(by_id.token_ids)
    empty = engine.generate([prompt], SamplingParams(max_new_tokens=0))[0]
    assert empty.token_ids == [] and empty.routed_experts.shape == (0, 4, 2)


def test_batches_larger_than_max_batch_size_are_chunked(tiny_moe):
    model, tokenizer = tiny_moe
    prompts = [tokenizer.encode(p) for p in CODE_PROMPTS]
    small = LocalEngine(model, tokenizer, max_batch_size=4)
    big = LocalEngine(model, tokenizer, max_batch_size=64)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    a = small.generate(prompts, params, n=3)
    b = big.generate(prompts, params, n=3)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [(x.prompt_index, x.sample_index) for x in a] == [(i, j) for i in range(3) for j in range(3)]


def test_load_weights_swaps_in_place_and_sets_version(tiny_tokenizer, tiny_moe):
    from opencomposer.model.loading import load_model

    trained, tokenizer = tiny_moe
    fresh, _ = load_model("tiny_moe", tiny_tokenizer, seed=5)
    engine = LocalEngine(fresh, tokenizer)
    prompt = [tokenizer.encode(CODE_PROMPTS[0])]
    params = SamplingParams(max_new_tokens=10, temperature=0)
    before = engine.generate(prompt, params)[0].token_ids
    engine.load_weights(trained.state_dict(), version=3)
    after = engine.generate(prompt, params)[0]
    assert after.policy_version == 3 and engine.policy_version == 3
    assert after.token_ids == LocalEngine(trained, tokenizer).generate(prompt, params)[0].token_ids
    assert after.token_ids != before
    with pytest.raises(ValueError, match="unexpected keys"):
        engine.load_weights({"not.a.weight": torch.zeros(1)}, version=4)


def test_bad_requests_are_rejected(tiny_moe):
    model, tokenizer = tiny_moe
    engine = LocalEngine(model, tokenizer)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 10**9]], SamplingParams())
    with pytest.raises(ValueError, match="n must be >= 1"):
        engine.generate([[1]], SamplingParams(), n=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


@pytest.mark.parametrize("fixture", ["tiny_moe", "smollm2"])
def test_lean_decoder_matches_the_transformers_forward(fixture, request):
    from opencomposer.inference.decoders import HFDecoder, LeanDecoder, lean_supported

    model, tokenizer = request.getfixturevalue(fixture)
    assert lean_supported(model)
    prompts = [tokenizer.encode(p) for p in CODE_PROMPTS]
    width = max(map(len, prompts))
    ids = torch.full((3, width), 0)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lean, hf = LeanDecoder(model), HFDecoder(model)
    with torch.no_grad():
        a, b = lean.prefill(ids, mask, positions), hf.prefill(ids, mask, positions)
        assert (a - b).abs().max() < 1e-4
        lean.repeat(2), hf.repeat(2)
        keep = torch.tensor([0, 3, 4, 5])
        lean.select(keep), hf.select(keep)
        step = torch.tensor([[5], [6], [7], [8]])
        pos = positions[:, -1:].repeat_interleave(2, 0)[keep] + 1
        a, b = lean.step(step, pos), hf.step(step, pos)
        assert (a - b).abs().max() < 1e-4


def test_generic_path_gives_the_same_samples(tiny_moe):
    model, tokenizer = tiny_moe
    prompts = [tokenizer.encode(p) for p in CODE_PROMPTS]
    params = SamplingParams(max_new_tokens=16, seed=11)
    lean = LocalEngine(model, tokenizer)
    generic = LocalEngine(model, tokenizer, batch_invariant=False)
    generic.lean = False
    a, b = lean.generate(prompts, params, n=2), generic.generate(prompts, params, n=2)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    assert all(np.array_equal(x.routed_experts, y.routed_experts) for x, y in zip(a, b))
