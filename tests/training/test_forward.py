"""The trainer's forward: computing the shared prefix once gives the plain forward's numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opencomposer.config import ModelConfig
from opencomposer.training.forward import shared_prefix_length, token_logprobs
from opencomposer.training.packing import SequenceRow, collate

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
                    top_k=2, moe_intermediate_size=64)


@pytest.fixture(scope="module")
def small_model(tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, _ = load_model(SMALL, tiny_tokenizer, seed=3)
    return model


def rows_with_common_prefix(prefix_len: int, suffix_lens: list[int], first_model: int, seed: int = 0):
    """Rows that share ``prefix_len`` ids, then differ; model tokens start ``first_model`` after it."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 4000, prefix_len)
    rows = []
    for i, n in enumerate(suffix_lens):
        ids = np.concatenate([prefix, rng.integers(0, 4000, n)])
        mask = np.zeros(len(ids), dtype=bool)
        mask[prefix_len + first_model :] = True
        mask[prefix_len + first_model + 3 : prefix_len + first_model + 5] = False  # a tool output in between
        rows.append(SequenceRow(i, ids[:-1], ids[1:], mask[1:], np.zeros(len(ids) - 1, np.float32), 0.5))
    return rows


def test_shared_prefix_length_stops_at_the_first_difference_and_the_first_loss_target():
    batch = collate(rows_with_common_prefix(40, [12, 9, 15], first_model=4), pad_id=0)
    assert shared_prefix_length(batch) == 40  # rows differ from position 40 on
    early = collate(rows_with_common_prefix(40, [12, 9], first_model=-10), pad_id=0)
    assert shared_prefix_length(early) == 29  # input 29 predicts target 29 = ids[30], the first model token
    assert shared_prefix_length(collate(rows_with_common_prefix(40, [12], first_model=4), pad_id=0)) == 0  # one row


def test_shared_prefix_forward_equals_the_plain_forward_in_values_and_gradients(small_model):
    batch = collate(rows_with_common_prefix(200, [30, 18, 25, 7], first_model=3, seed=1), pad_id=0)
    assert shared_prefix_length(batch) == 200
    mask = batch.loss_mask
    results = {}
    for share in (True, False):
        small_model.zero_grad(set_to_none=True)
        small_model.train()
        logprobs, entropy = token_logprobs(small_model, batch, share_prefix=share)
        (torch.where(mask, logprobs, 0.0) * batch.advantages).sum().backward()
        grads = {n: p.grad.clone() for n, p in small_model.named_parameters() if p.grad is not None}
        results[share] = (logprobs.detach(), entropy, grads)
    small_model.eval()
    (lp_shared, ent_shared, g_shared), (lp_plain, ent_plain, g_plain) = results[True], results[False]
    torch.testing.assert_close(lp_shared[mask], lp_plain[mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(ent_shared[mask], ent_plain[mask], rtol=0, atol=2e-5)
    assert set(g_shared) == set(g_plain) and len(g_plain) > 10
    for name in g_plain:
        scale = float(g_plain[name].abs().max()) + 1e-12
        assert float((g_shared[name] - g_plain[name]).abs().max()) / scale < 1e-4, name
    # and both equal an independent log-softmax of a full forward
    with torch.no_grad():
        logits = small_model(input_ids=batch.input_ids).logits.double()
    reference = torch.log_softmax(logits, -1).gather(-1, batch.target_ids[..., None])[..., 0]
    torch.testing.assert_close(lp_shared[mask].double(), reference[mask], rtol=0, atol=3e-5)


@pytest.mark.parametrize("share", [True, False])
def test_the_vocabulary_projection_runs_on_the_scored_positions_only(small_model, share: bool):
    """With or without the shared prefix, the output head sees the loss-carrying positions and no
    others (the projection and log-softmax over the vocabulary dominate a long row's cost)."""
    from opencomposer.training.forward import per_row_logits

    if not per_row_logits():
        pytest.skip("this transformers has no per-row logits_to_keep")
    batch = collate(rows_with_common_prefix(120, [30, 18, 25], first_model=3, seed=2), pad_id=0)
    assert shared_prefix_length(batch) == 120  # share=True takes the prefix path
    seen = []
    hook = small_model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    try:
        with torch.no_grad():
            token_logprobs(small_model, batch, share_prefix=share, with_entropy=False)
    finally:
        hook.remove()
    # with the prefix the head runs twice: once on the prefix's last position, then on the suffixes
    assert [int(np.prod(shape[:-1])) for shape in seen] == [1] * share + [int(batch.loss_mask.sum())]


def test_bf16_logits_are_divided_by_the_temperature_in_float32(small_model):
    """A bf16 model's logits are upcast before the temperature divides them: dividing in bf16
    would round each scaled logit to 8 bits of mantissa, a sampler/trainer mismatch of its own."""
    import copy

    from opencomposer.training.forward import token_logprobs

    model = copy.deepcopy(small_model).to(torch.bfloat16)
    batch = collate(rows_with_common_prefix(8, [12, 9], first_model=2), pad_id=0)
    temperature = 0.7
    got, _ = token_logprobs(model, batch, temperature=temperature, share_prefix=False, with_entropy=False)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.double() / temperature
    want = torch.log_softmax(logits, -1).gather(-1, batch.target_ids[..., None])[..., 0]
    mask = batch.loss_mask
    assert got.dtype == torch.float32
    assert float((got.detach().double() - want)[mask].abs().max()) < 1e-4
