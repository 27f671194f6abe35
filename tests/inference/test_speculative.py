"""Speculative decoding with MTP drafts (inference.speculative): lossless, exact at temperature 0,
batch-invariant, and it records what plain decoding records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats

from opencomposer.config import ModelConfig
from opencomposer.inference.local import LocalEngine
from opencomposer.inference.speculative import draw, sampling_logprobs, verify_drafts
from opencomposer.model.loading import load_model
from opencomposer.model.mtp import main_hidden, mtp_distillation_loss
from opencomposer.types import SamplingParams

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
            moe_intermediate_size=64, num_mtp_layers=1)


def distil(model, steps: int, seed: int = 0) -> float:
    """Train the MTP layer on random token rows (the main model frozen); the last top-1 agreement."""
    optimizer = torch.optim.Adam(model.mtp.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    top1 = 0.0
    for _ in range(steps):
        ids = torch.randint(0, vocab, (8, 33), generator=generator)
        positions = torch.arange(33)[None].expand(8, -1)
        with torch.no_grad():
            logits, hidden = main_hidden(model, ids, positions)
        loss, metrics = mtp_distillation_loss(model, logits, hidden, ids, positions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        top1 = metrics["mtp_top1_1"]
    model.eval()
    return top1


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def drafted():
    """A tiny MoE whose MTP layer agrees with the main head's argmax most of the time."""
    torch.manual_seed(0)
    model, tokenizer = load_model(ModelConfig(**TINY))
    assert distil(model, 80) > 0.5
    return model, tokenizer


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer("def add(a, b):\n    return")["input_ids"], tokenizer("import os\n")["input_ids"],
            tokenizer("x")["input_ids"][:1]]


# ------------------------------------------------------------------------------------ the rule itself


def test_verified_tokens_are_distributed_as_the_target():
    """Draw from q, keep by min(1, p/q), else from max(0, p - q): the token follows p exactly,
    for a q that misses some of p's tokens and puts mass where p has none."""
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.0])
    q = torch.tensor([0.05, 0.40, 0.0, 0.15, 0.20, 0.20])
    trials = 200_000
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(trials, 3, generator=generator)
    p_log, q_log = p.log().expand(trials, -1), q.log().expand(trials, -1)
    drafts = draw(q_log.exp(), u[:, 0])
    assert (q[drafts] > 0).all()
    tokens, accepted = verify_drafts(p_log, q_log, drafts, u[:, 1], u[:, 2])
    counts = torch.bincount(tokens, minlength=6).numpy()
    assert counts[5] == 0
    expected = p[:5].double().numpy()
    _, pvalue = stats.chisquare(counts[:5], trials * expected / expected.sum())
    assert pvalue > 1e-3
    expected_acceptance = float(torch.minimum(p, q).sum())
    assert abs(float(accepted.float().mean()) - expected_acceptance) < 0.01


def test_sampling_logprobs_are_the_plain_samplers():
    from opencomposer.inference.local import sample_tokens

    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    u = torch.rand(5, generator=torch.Generator().manual_seed(2))
    for params in (SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.0, top_p=0.8),
                   SamplingParams(temperature=0.0)):
        tokens, logprobs = sample_tokens(logits, params, u)
        assert torch.equal(sampling_logprobs(logits, params).gather(1, tokens[:, None])[:, 0], logprobs)


# ------------------------------------------------------------------------------------ the engine


def test_greedy_speculative_decoding_is_plain_greedy_bit_for_bit(drafted):
    """With a trained drafter (an untrained model's greedy text is easy to guess: most drafts
    kept) and an untrained one (none kept), so both paths run."""
    trained, tokenizer = drafted
    untrained, _ = load_model(ModelConfig(**TINY))
    untrained.load_state_dict({k: v for k, v in trained.state_dict().items() if not k.startswith("mtp.")},
                              strict=False)
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    kept = []
    for model in (trained, untrained):
        engine = LocalEngine(model, tokenizer)
        plain = engine.generate(_prompts(tokenizer), params, n=2)
        fast = engine.generate(_prompts(tokenizer), dataclasses.replace(params, speculative="mtp"), n=2)
        kept.append(engine.stats.draft_accepted / engine.stats.draft_tokens)
        for a, b in zip(plain, fast, strict=True):
            assert b.token_ids == a.token_ids and b.logprobs == a.logprobs
            assert np.array_equal(b.routed_experts, a.routed_experts)
            assert np.array_equal(b.prompt_routed_experts, a.prompt_routed_experts)
            assert b.finish_reason == a.finish_reason == "length" and len(b.token_ids) == 24
    assert kept[0] > 0.5 and kept[1] < 0.5


def test_rows_finishing_at_different_forwards_ride_along_until_compaction(drafted):
    """A row that ends on an accepted draft has fed every token; it stays in the batch until enough
    rows are done, and the batch goes on without it (greedy, so the result must be plain greedy)."""
    model, tokenizer = drafted
    engine = LocalEngine(model, tokenizer, compact_fraction=0.9)
    prompts = [tokenizer(text)["input_ids"] for text in ("def f(x):", "import sys\n", "class A:", "x = [",
                                                         "for i in range(", "# comment\n", "return", "if x:")]
    for max_new in (5, 6, 7):
        params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
        plain = engine.generate(prompts, params)
        fast = engine.generate(prompts, dataclasses.replace(params, speculative="mtp"))
        assert [c.token_ids for c in fast] == [c.token_ids for c in plain]
        assert all(len(c.routed_experts) == max_new for c in fast)


def _exact_sequence_probabilities(model, prompt: list[int], params: SamplingParams, length: int) -> dict:
    """p(x1..xL | prompt) of every sequence in the top-k support, from full forwards."""
    out: dict[tuple[int, ...], float] = {}

    def expand(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            out[prefix] = prob
            return
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1].float()
        logp = sampling_logprobs(logits[None], params)[0]
        for token in torch.nonzero(logp > float("-inf"))[:, 0].tolist():
            expand((*prefix, token), prob * float(logp[token].exp()))

    expand((), 1.0)
    return out


def test_sampled_sequences_follow_the_models_distribution(drafted):
    """Temperature 1, top-k 3: 3-token continuations sampled speculatively match the exact
    sequence probabilities (chi-square), with drafts both kept and rejected along the way."""
    model, tokenizer = drafted
    engine = LocalEngine(model, tokenizer, max_batch_size=512)
    prompt = tokenizer("def add(a, b):\n    return")["input_ids"]
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, ignore_eos=True, seed=7, speculative="mtp")
    before = dataclasses.replace(engine.stats)
    samples = engine.generate([prompt], params, n=3000)
    acceptance = (engine.stats.draft_accepted - before.draft_accepted) / (engine.stats.draft_tokens - before.draft_tokens)
    assert 0.1 < acceptance < 0.95
    exact = _exact_sequence_probabilities(model, prompt, params, 3)
    counts = {seq: 0 for seq in exact}
    for completion in samples:
        counts[tuple(completion.token_ids)] += 1  # a KeyError would be a sequence outside the support
    # pool rare sequences so every expected count is at least 5
    expected = np.array([exact[s] * len(samples) for s in exact])
    observed = np.array([counts[s] for s in exact])
    rare = expected < 5
    if rare.any():
        expected = np.append(expected[~rare], expected[rare].sum())
        observed = np.append(observed[~rare], observed[rare].sum())
    _, pvalue = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    assert pvalue > 1e-3
    for completion in samples[:20]:  # logprobs are those of the target distribution
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1 : -1]
        truth = sampling_logprobs(logits.float(), params).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        assert np.allclose(completion.logprobs, truth.numpy(), atol=1e-4)


def test_a_speculative_row_does_not_depend_on_its_batch(drafted):
    model, tokenizer = drafted
    engine = LocalEngine(model, tokenizer)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=11, ignore_eos=True, speculative="mtp")
    prompts = _prompts(tokenizer)
    together = engine.generate(prompts, params, n=3)
    for i, prompt in enumerate(prompts):
        for j in range(3):
            from opencomposer.inference.local import row_seed

            alone = engine.generate([prompt], params, n=1, row_seeds=[row_seed(11, i, j)])[0]
            mine = together[i * 3 + j]
            assert alone.token_ids == mine.token_ids and alone.logprobs == mine.logprobs
            assert np.array_equal(alone.routed_experts, mine.routed_experts)


def test_stops_lengths_and_routes_are_kept(drafted):
    model, tokenizer = drafted
    engine = LocalEngine(model, tokenizer)
    plain = engine.generate(_prompts(tokenizer), SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))
    stop = plain[0].token_ids[5]  # a token greedy decoding emits: speculative decoding stops at it too
    for max_new in (1, 2, 7):
        params = SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=3, stop_token_ids=[stop],
                                speculative="mtp")
        for completion in engine.generate(_prompts(tokenizer), params, n=4):
            assert 1 <= len(completion.token_ids) <= max_new
            assert len(completion.routed_experts) == len(completion.token_ids) == len(completion.logprobs)
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == stop and stop not in completion.token_ids[:-1]
            else:
                assert len(completion.token_ids) == max_new
    greedy = engine.generate(_prompts(tokenizer)[:1], SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                      stop_token_ids=[stop], speculative="mtp"))[0]
    assert greedy.token_ids == plain[0].token_ids[: plain[0].token_ids.index(stop) + 1]


def test_what_cannot_draft_is_refused():
    model, tokenizer = load_model(ModelConfig(**{**TINY, "num_mtp_layers": 0}))
    params = SamplingParams(max_new_tokens=4, speculative="mtp")
    with pytest.raises(ValueError, match="no MTP layers"):
        LocalEngine(model, tokenizer).generate([[1, 2, 3]], params)
    model, tokenizer = load_model(ModelConfig(**TINY))
    with pytest.raises(ValueError, match="batch-invariant decoder"):
        LocalEngine(model, tokenizer, batch_invariant=False).generate([[1, 2, 3]], params)
    with pytest.raises(ValueError, match='"off" or "mtp"'):
        SamplingParams(speculative="medusa")


def test_the_sampling_section_reaches_the_engine(drafted):
    from opencomposer.agent.policies.local import EnginePolicy
    from opencomposer.config import load_recipe

    config = load_recipe(None, ['sampling.speculative="mtp"', "sampling.temperature=0"])
    assert config.sampling.speculative == "mtp"
    model, tokenizer = drafted
    engine = LocalEngine(model, tokenizer)
    seen = []
    original = engine.generate

    def spy(prompts, params, n=1, row_seeds=None):
        seen.append(params.speculative)
        return original(prompts, params, n, row_seeds)

    engine.generate = spy
    policy = EnginePolicy(engine, tokenizer, config.sampling)
    from opencomposer.types import Context

    policy.act(Context(task=None, messages=[], token_ids=_prompts(tokenizer)[0], turn_index=0, max_new_tokens=4))
    assert seen == ["mtp"]

