"""In-flight weight updates: ``load_weights`` from another thread while ``generate`` decodes.

The switch is placed deterministically: a hook in the decoder's step parks the decoding thread at
a chosen step while the test thread calls ``load_weights``, so the position at which the version
changes is known and the tokens after it can be checked against an independent decode that keeps
the old cache and swaps the weights by hand.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from opencomposer.inference import LocalEngine, SamplingParams
from opencomposer.inference.batching import BatchingEngine
from opencomposer.inference.invariant import InvariantDecoder
from opencomposer.inference.local import sample_tokens
from opencomposer.types import Completion

PROMPT = list(range(300, 340))
GREEDY = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def two_models(tiny_tokenizer):
    """Two random tiny MoEs with different weights (versions 0 and 1)."""
    from opencomposer.model.loading import load_model

    old, tokenizer = load_model("tiny_moe", tiny_tokenizer, seed=0)
    new, _ = load_model("tiny_moe", tiny_tokenizer, seed=5)
    return old.eval(), new.eval(), tokenizer


def generate_with_update(engine, prompts, params, at_step, state_dict, version, monkeypatch, n=1):
    """Run ``engine.generate`` in a thread, park it inside decode step ``at_step`` (1-based), call
    ``load_weights`` from this thread meanwhile, then let it finish. Returns (completions, the
    engine's version seen while parked)."""
    reached, resume = threading.Event(), threading.Event()
    steps = [0]
    step = InvariantDecoder.step

    def parked_step(self, ids, positions):
        steps[0] += 1
        if steps[0] == at_step:
            reached.set()
            assert resume.wait(timeout=60)
        return step(self, ids, positions)

    monkeypatch.setattr(InvariantDecoder, "step", parked_step)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(result=engine.generate(prompts, params, n=n)))
    thread.start()
    assert reached.wait(timeout=120), "generation never reached the step"
    engine.load_weights(state_dict, version)
    seen = engine.policy_version
    for tensor in state_dict.values():  # the engine staged a copy: the caller may reuse its tensors
        tensor.zero_()
    resume.set()
    thread.join(timeout=120)
    monkeypatch.setattr(InvariantDecoder, "step", step)
    return out["result"], seen


def cloned_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.inference_mode()
def manual_switch(old, new, prompt, switch_after: int, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy decode of ``prompt`` with ``old``'s weights, swapped to ``new``'s (cache kept) before
    the forward that follows the first ``switch_after`` tokens: the reference for the engine."""
    model = copy.deepcopy(old)
    decoder = InvariantDecoder(model)
    ids = torch.tensor([prompt])
    logits = decoder.prefill(ids, torch.ones_like(ids), torch.arange(len(prompt))[None])[:, -1].float()
    tokens, logprobs = [], []
    for t in range(max_new_tokens):
        token, logprob = sample_tokens(logits, GREEDY, torch.zeros(1))
        tokens.append(int(token))
        logprobs.append(float(logprob))
        if t + 1 == switch_after:
            model.load_state_dict(new.state_dict())
        if t + 1 < max_new_tokens:
            logits = decoder.step(token[:, None], torch.tensor([[len(prompt) + t]]))[:, -1].float()
    return tokens, logprobs


def test_an_update_mid_generation_switches_the_version_between_two_decode_steps(two_models, monkeypatch):
    old, new, tokenizer = two_models
    engine = LocalEngine(copy.deepcopy(old), tokenizer, policy_version=0)
    at_step = 6  # parked inside the 6th decode step: tokens 0..6 come from version 0
    [completion], seen = generate_with_update(engine, [PROMPT], GREEDY, at_step, cloned_state(new), 1, monkeypatch)
    assert seen == 0  # staged while generating, not applied under the running forward
    assert engine.policy_version == 1
    switch = at_step + 1
    assert completion.token_versions == [0] * switch + [1] * (GREEDY.max_new_tokens - switch)
    assert completion.policy_version == 0  # the first token's
    tokens, logprobs = manual_switch(old, new, PROMPT, switch, GREEDY.max_new_tokens)
    assert completion.token_ids == tokens
    assert completion.logprobs == logprobs  # bit for bit: the same decoder, the old cache, the new weights
    # and it is neither of the two single-version decodes after the switch
    only_old = LocalEngine(copy.deepcopy(old), tokenizer).generate([PROMPT], GREEDY)[0]
    assert completion.token_ids[:switch] == only_old.token_ids[:switch]
    assert completion.logprobs[switch:] != only_old.logprobs[switch:]
    # with no generation running the update is applied at once, as before
    engine.load_weights(cloned_state(old), 2)
    again = engine.generate([PROMPT], GREEDY)[0]
    assert engine.policy_version == 2 and again.token_versions == [2] * GREEDY.max_new_tokens
    assert (again.token_ids, again.logprobs) == (only_old.token_ids, only_old.logprobs)


def test_identical_weights_in_flight_change_nothing_but_the_versions(two_models, monkeypatch):
    old, _, tokenizer = two_models
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=11, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:7]]
    reference = LocalEngine(copy.deepcopy(old), tokenizer).generate(prompts, params, n=2)
    engine = LocalEngine(copy.deepcopy(old), tokenizer, policy_version=4)
    got, _ = generate_with_update(engine, prompts, params, 3, cloned_state(old), 5, monkeypatch, n=2)
    for a, b in zip(got, reference, strict=True):
        assert (a.token_ids, a.logprobs, a.routed_experts.tobytes()) == (b.token_ids, b.logprobs, b.routed_experts.tobytes())
        assert a.token_versions == [4] * 4 + [5] * 16 and a.policy_version == 4


def test_an_update_after_the_last_forward_is_applied_when_generate_returns(two_models, monkeypatch):
    old, new, tokenizer = two_models
    params = SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True)
    engine = LocalEngine(copy.deepcopy(old), tokenizer)
    # an MoE row rides along for one last forward (its last token's route): step 5 is the last one
    [completion], seen = generate_with_update(engine, [PROMPT], params, 5, cloned_state(new), 1, monkeypatch)
    assert seen == 0 and completion.token_versions == [0] * 5
    assert engine.policy_version == 1
    fresh = LocalEngine(copy.deepcopy(new), tokenizer).generate([PROMPT], params)[0]
    assert engine.generate([PROMPT], params)[0].token_ids == fresh.token_ids


def test_a_bad_update_fails_in_the_caller_and_leaves_the_engine_as_it_was(two_models):
    old, _, tokenizer = two_models
    engine = LocalEngine(copy.deepcopy(old), tokenizer, policy_version=3)
    name = "model.embed_tokens.weight"
    with pytest.raises(ValueError, match=rf"wrong shapes \['{name}: \(2, 2\)"):
        engine.load_weights({name: torch.zeros(2, 2)}, 4)
    with pytest.raises(ValueError, match="unexpected keys"):
        engine.load_weights({"not.a.weight": torch.zeros(1)}, 4)
    assert engine.policy_version == 3
    assert torch.equal(engine.model.get_input_embeddings().weight, old.get_input_embeddings().weight)


# ----------------------------------------------------------------------------------------------
# the batching front-end


class _BlockingEngine:
    """An engine whose generate blocks until released; records the weights it is given."""

    tokenizer = None
    max_positions = 0

    def __init__(self):
        self.policy_version = 0
        self.entered, self.release = threading.Event(), threading.Event()
        self.loaded: list[int] = []

    def generate(self, prompts, params, n=1, row_seeds=None):
        self.entered.set()
        assert self.release.wait(timeout=60)
        return [Completion(token_ids=[1, 2, 3], logprobs=[0.0] * 3, finish_reason="length", sample_index=j,
                           policy_version=0, token_versions=[0, 1, 1]) for _ in prompts for j in range(n)]

    def load_weights(self, state_dict, version):
        self.loaded.append(version)
        self.policy_version = version


@pytest.mark.parametrize("in_flight", [True, False])
def test_batching_load_weights_goes_in_flight_unless_asked_to_wait(in_flight):
    engine = _BlockingEngine()
    batcher = BatchingEngine(engine)
    out: dict = {}
    with batcher.session() as session:
        worker = threading.Thread(target=lambda: out.update(c=session.generate([[5]], SamplingParams(max_new_tokens=2))))
        worker.start()
        assert engine.entered.wait(timeout=60)
        loader = threading.Thread(target=batcher.load_weights, args=({}, 7), kwargs={"in_flight": in_flight})
        loader.start()
        loader.join(timeout=0.5 if not in_flight else 60)
        assert engine.loaded == ([7] if in_flight else [])  # the waiting form holds it until the batch ends
        engine.release.set()
        worker.join(timeout=60)
        loader.join(timeout=60)
    assert engine.loaded == [7]
    [completion] = out["c"]
    # the batch asked for the largest cap, each request is cut back to its own, versions included
    assert completion.token_ids == [1, 2] and completion.token_versions == [0, 1]
