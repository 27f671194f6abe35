"""Routes from the segments through packing into ``TrainBatch.routes``, and the trainer's forward
replaying them, with and without the shared prefix."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from opencomposer.model.routing import RouteRecorder, RouterReplay
from opencomposer.training.forward import shared_prefix_length, token_logprobs
from opencomposer.training.packing import collate, episode_rows
from opencomposer.types import Episode, Segment, TokenKind, Turn
from tests.training.test_forward import SMALL, rows_with_common_prefix


def _routes(values: list[int]) -> np.ndarray:
    """[len(values), 1 layer, 2]: route (v, v + 1) for each value."""
    return np.array([[[v, v + 1]] for v in values], dtype=np.uint8)


def _turn(tokens: list[int], observation: list[int], routes: np.ndarray | None) -> Turn:
    return Turn(token_ids=tokens, logprobs=[-0.5] * len(tokens), token_kinds=[TokenKind.TOOL_CALL] * len(tokens),
                routes=routes, observation_ids=observation, observation_kinds=[TokenKind.TOOL_OUTPUT] * len(observation))


def test_segment_routes_take_each_position_from_the_first_call_that_ran_it():
    segment = Segment(prompt_ids=[1, 2, 3, 4])
    segment.record_context_routes(_routes([10, 11, 12, 13]))  # the first call's prefill: the prompt
    segment.turns.append(_turn([5, 6], [7, 8, 9], _routes([20, 21])))
    # the second call re-runs the whole context: only the observation was unknown; the prompt and
    # the first turn keep the routes they had (here the second call routed them otherwise)
    segment.record_context_routes(_routes([0, 0, 0, 0, 0, 0, 30, 31, 32]))
    segment.turns.append(_turn([10], [11, 12], _routes([40])))
    routes = segment.routes()
    assert routes.dtype == np.int32 and routes.shape == (len(segment.token_ids()), 1, 2)
    assert routes[:, 0, 0].tolist() == [10, 11, 12, 13, 20, 21, 30, 31, 32, 40, -1, -1]
    assert routes[:10, 0, 1].tolist() == [11, 12, 13, 14, 21, 22, 31, 32, 33, 41]
    assert (routes[10:] == -1).all()  # the last observation: no call ran it
    assert Segment(prompt_ids=[1, 2], turns=[_turn([3], [4], None)]).routes() is None  # a dense policy


def test_segment_routes_name_the_part_whose_shape_is_wrong():
    segment = Segment(prompt_ids=[1, 2, 3], prompt_routes=_routes([1, 2, 3]),
                      turns=[_turn([4, 5], [], _routes([1]))])
    with pytest.raises(ValueError, match=r"turn 0 tokens has routes of shape \(1, 1, 2\), expected \[2, 1, 2\]"):
        segment.routes()
    segment.turns[0].routes = np.zeros((2, 3, 2), np.uint8)
    with pytest.raises(ValueError, match="turn 0 tokens .* the layers and top-k of the other parts"):
        segment.routes()
    with pytest.raises(ValueError, match=r"expected \[5, moe_layers, top_k\]"):
        segment.record_context_routes(_routes([1, 2]))


def test_packing_aligns_routes_with_the_inputs_and_pads_with_minus_one():
    long = Segment(prompt_ids=[1, 2, 3], prompt_routes=_routes([1, 2, 3]),
                   turns=[_turn([4, 5, 6], [7], _routes([4, 5, 6]))])
    short = Segment(prompt_ids=[1, 2], turns=[_turn([3, 4], [], None)])  # routes unknown: a text policy
    rows = episode_rows([Episode("a", [long]), Episode("b", [short])], [1.0, -1.0])
    assert rows[0].routes[:, 0, 0].tolist() == [1, 2, 3, 4, 5, 6]  # inputs ids[:-1]: the observation's route is not needed
    assert rows[1].routes is None
    batch = collate(rows, pad_id=0)
    assert batch.routes.dtype == torch.int32 and batch.routes.shape == (2, 6, 1, 2)
    assert batch.routes[0, :, 0, 0].tolist() == [1, 2, 3, 4, 5, 6]
    assert (batch.routes[1] == -1).all()
    other = dataclasses.replace(rows[1], routes=np.zeros((3, 2, 2), np.int32))
    with pytest.raises(ValueError, match=r"different \[moe_layers, top_k\]"):
        collate([rows[0], other], pad_id=0)


@pytest.fixture(scope="module", params=["tiny_moe", "tiny_deepseek_v3"])
def small(request, tiny_tokenizer):
    from opencomposer.model.loading import load_model

    model, _ = load_model(dataclasses.replace(SMALL, kind=request.param), tiny_tokenizer, seed=3)
    return model


def own_routes(model, batch) -> torch.Tensor:
    """[rows, seq, layers, k]: what the model routes each input to in a plain forward."""
    with RouteRecorder(model) as recorder, torch.no_grad():
        model(input_ids=batch.input_ids)
        return recorder.take(*batch.input_ids.shape).int()


def random_routes(model, batch, seed: int) -> torch.Tensor:
    """Distinct random experts per input, the same for every row on the shared prefix."""
    generator = torch.Generator().manual_seed(seed)
    rows, seq = batch.input_ids.shape
    layers = own_routes(model, batch).shape[2]
    routes = torch.rand(rows, seq, layers, 4, generator=generator).argsort(-1)[..., :2].int()
    routes[:, :40] = routes[:1, :40]
    return routes


def _logprobs_and_grads(model, batch, replay, share):
    model.zero_grad(set_to_none=True)
    model.train()
    logprobs, _ = token_logprobs(model, batch, share_prefix=share, replay=replay)
    (torch.where(batch.loss_mask, logprobs, 0.0) * batch.advantages).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.eval()
    return logprobs.detach(), grads


def test_replaying_the_models_own_routes_gives_the_plain_forward(small):
    batch = collate(rows_with_common_prefix(40, [12, 9, 15], first_model=2, seed=3), pad_id=0)
    mask = batch.loss_mask
    plain, _ = _logprobs_and_grads(small, batch, None, share=False)
    for routes in (own_routes(small, batch), torch.full_like(own_routes(small, batch), -1)):
        for share in (True, False):
            replay = RouterReplay(small, "filtered")
            replayed, _ = _logprobs_and_grads(small, dataclasses.replace(batch, routes=routes), replay, share)
            torch.testing.assert_close(replayed[mask], plain[mask], rtol=0, atol=2e-5)


def test_replay_with_the_shared_prefix_equals_replay_without_it(small):
    batch = collate(rows_with_common_prefix(40, [12, 9, 15], first_model=2, seed=4), pad_id=0)
    batch = dataclasses.replace(batch, routes=random_routes(small, batch, seed=5))
    assert shared_prefix_length(batch, by_routes=True) == 40
    mask = batch.loss_mask
    replay = RouterReplay(small, "replay")
    shared, shared_grads = _logprobs_and_grads(small, batch, replay, share=True)
    plain, plain_grads = _logprobs_and_grads(small, batch, replay, share=False)
    torch.testing.assert_close(shared[mask], plain[mask], rtol=0, atol=2e-5)
    assert set(shared_grads) == set(plain_grads)
    router_grads = [name for name in plain_grads if name.endswith("gate.weight")]
    assert router_grads and all(plain_grads[name].abs().max() > 0 for name in router_grads)
    for name, grad in plain_grads.items():
        scale = float(grad.abs().max()) + 1e-12
        assert float((shared_grads[name] - grad).abs().max()) / scale < 1e-4, name
    # the routes are applied: the model's own routing scores these tokens otherwise
    own, _ = _logprobs_and_grads(small, batch, None, share=False)
    assert float((own[mask] - plain[mask]).abs().max()) > 1e-3
    # every replayed position counted: each row's own positions, plus the prefix once
    rows, seq = batch.input_ids.shape
    layers = batch.routes.shape[2]
    assert replay.stats.replayed.tolist() == [2 * (rows * seq + rows * (seq - 40) + 40)] * layers  # top_k = 2


def test_the_shared_prefix_stops_where_the_rows_routes_differ(small):
    batch = collate(rows_with_common_prefix(40, [12, 9], first_model=2, seed=6), pad_id=0)
    routes = random_routes(small, batch, seed=7)
    routes[1, 30:] = routes[1, 30:].flip(-1)  # same experts in other columns: another route
    batch = dataclasses.replace(batch, routes=routes)
    assert shared_prefix_length(batch) == 40
    assert shared_prefix_length(batch, by_routes=True) == 30


def test_replay_on_packed_rows_equals_replay_on_padded_rows(small):
    """Routes travel with their segment into a packed row (``training.packing.pack_rows``): each
    token is computed with its own replayed experts, as in a row of its own."""
    from opencomposer.training.packing import pack_rows, unpack

    rows = rows_with_common_prefix(40, [12, 9, 15, 20], first_model=2, seed=8)
    padded = collate(rows, pad_id=0)
    routes = random_routes(small, padded, seed=9)
    for r, row in enumerate(rows):
        row.routes = routes[r, : len(row)].numpy()
    replay = RouterReplay(small, "replay")
    plain, plain_grads = _logprobs_and_grads(small, collate(rows, pad_id=0), replay, share=False)
    packed_rows = pack_rows(rows, 2 * len(rows[0]) + 10)
    assert any(len(row.parts) > 1 for row in packed_rows)
    packed, packed_grads = _logprobs_and_grads(small, collate(packed_rows, pad_id=0), replay, share=True)
    parts = [part for row in packed_rows for part in row.parts]
    for part, values in zip(parts, unpack(packed, packed_rows), strict=True):
        expected = plain[part.episode, : len(part)].numpy()
        np.testing.assert_allclose(values[part.loss_mask], expected[part.loss_mask], rtol=0, atol=2e-5)
    for name, grad in plain_grads.items():
        scale = float(grad.abs().max()) + 1e-12
        assert float((packed_grads[name] - grad).abs().max()) / scale < 1e-4, name
