"""Expert parallelism equals the single process (``opencomposer.distributed.expert``; gloo, two CPU
processes, ep = 2): each rank keeps 2 of the 4 experts of every MoE layer and half of the batch's
rows, and one forward + backward + Adam step gives the same logits, loss, gradients (replicated
ones after ``sync_gradients``; expert ones gathered from both ranks) and updated weights as one
process on the whole batch. Each rank sees only half of the tokens, so an expert gradient equal to
the one-process gradient means the other rank's tokens did reach it through the all-to-alls.

Scenarios, all in one spawn (starting two interpreters costs more than the models): a tiny
Qwen3-MoE (3 layers, 4 experts, top-2, float32); the same with router replay of routes recorded
once (random, unlike the model's own choice) and replayed on both ranks; the same converted to
``numerics.recipe = "mxfp8"`` with ``quantize_dispatch`` (both sides quantise the dispatched tokens
and run MXFP8 expert matmuls); a tiny DeepSeek-V3 (same fused expert layout, shared expert).

The batch has 32 tokens, so no expert receives more than 32 rows: the MXFP8 weight gradient
quantises along the token dimension in blocks of 32, and with one block per expert the blocks hold
the same rows on both sides (EP receives them in another order, which a block does not see)."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch
import torch.nn.functional as F

from tests.distributed.ranks import run_world

BATCH, SEQ, VOCAB, RANKS = 4, 8, 128, 2
LR = 1e-2
KINDS = ("qwen", "replay", "mxfp8", "deepseek")


def tiny_qwen(seed: int = 0, experts: int = 4):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=experts, num_experts_per_tok=2, max_position_embeddings=64)
    return Qwen3MoeForCausalLM(config).float()


def models() -> dict[str, torch.nn.Module]:
    from opencomposer.config import NumericsConfig
    from opencomposer.numerics.convert import convert_model
    from tests.numerics.conftest import tiny_deepseek_v3

    quantised = tiny_qwen(3)
    convert_model(quantised, NumericsConfig(recipe="mxfp8", quantize_dispatch=True))
    return {"qwen": tiny_qwen(1), "replay": tiny_qwen(2), "mxfp8": quantised,
            "deepseek": tiny_deepseek_v3(4, vocab_size=VOCAB).float()}


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[4, 8]`` and random routes ``[4, 8, 3 layers, 2]`` (two distinct experts)."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    routes = torch.rand(BATCH, SEQ, 3, 4, generator=generator).argsort(-1)[..., :2]
    return ids, routes


def step(model, ids: torch.Tensor, routes: torch.Tensor | None, sync=None):
    """Forward, backward (loss: the summed next-token cross-entropy over the *whole* batch's
    positions, so the ranks' losses add up to the one-process loss), optional gradient sync, one
    Adam step. Returns logits, loss and the gradients before the step."""
    from contextlib import nullcontext

    from opencomposer.model.routing import RouterReplay

    model.train()
    replay = RouterReplay(model).routes(routes) if routes is not None else nullcontext()
    with replay:
        logits = model(input_ids=ids).logits
    positions = BATCH * (SEQ - 1)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="sum") / positions
    loss.backward()
    if sync is not None:
        sync(model)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    torch.optim.Adam(model.parameters(), lr=LR, eps=1e-3).step()  # eps: robust to 1e-8 gradients
    return logits.detach(), loss.detach(), grads


def autocast_dispatch(rank: int, shard_experts) -> list[str]:
    """One forward and backward under bf16 autocast with float32 weights, 8 experts (4 a rank)
    and few tokens, so that in some layer a rank's local expert gets no rows; returns the dtypes
    this rank sent through the all-to-alls."""
    import opencomposer.distributed.expert as expert_module

    sent, original = [], expert_module._a2a

    def spy(output, rows, *rest):
        sent.append(str(rows.dtype))
        return original(output, rows, *rest)

    expert_module._a2a = spy
    try:
        model = tiny_qwen(5, experts=8)
        shard_experts(model)
        ids = torch.randint(0, VOCAB, (1, 6 if rank == 0 else 1), generator=torch.Generator().manual_seed(rank))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        logits.float().sum().backward()
    finally:
        expert_module._a2a = original
    return sent


def ep_step(rank: int, folder: str) -> dict:
    """This rank's half of every scenario (module doc)."""
    from opencomposer.distributed.expert import (
        expert_parameters,
        full_state_dict,
        gather_experts,
        shard_experts,
        sync_gradients,
    )

    with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
        built, ids, routes = pickle.load(f)
    rows = slice(rank * BATCH // RANKS, (rank + 1) * BATCH // RANKS)
    out: dict = {}
    for kind in KINDS:
        model = built[kind]
        replaced = shard_experts(model)
        local = {name: tuple(p.shape) for name, p in expert_parameters(model)}
        logits, loss, grads = step(model, ids[rows], routes[rows] if kind == "replay" else None,
                                   sync=sync_gradients)
        experts = {name for name, _ in expert_parameters(model)}
        for name, p in model.named_parameters():
            if name in experts:
                grads[name] = gather_experts(p.grad)
        total = loss.clone()
        torch.distributed.all_reduce(total)
        out[kind] = {"replaced": replaced, "local": local, "logits": logits, "loss": float(total),
                     "grads": grads, "weights": full_state_dict(model)}
    out["autocast_sent"] = autocast_dispatch(rank, shard_experts)
    try:
        shard_experts(tiny_qwen(0, experts=3))
    except ValueError as error:
        out["refused"] = str(error)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(inputs, the one-process results, each rank's EP results)."""
    folder = tmp_path_factory.mktemp("ep")
    built = models()
    ids, routes = batch()
    with open(folder / "inputs.pkl", "wb") as f:
        pickle.dump((built, ids, routes), f)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ranks = run_world([ep_step], RANKS, folder)["ep_step"]
        single = {}
        for kind in KINDS:
            model = copy.deepcopy(built[kind])
            logits, loss, grads = step(model, ids, routes if kind == "replay" else None)
            single[kind] = {"logits": logits, "loss": float(loss), "grads": grads, "start": built[kind].state_dict(),
                            "weights": {k: v.detach() for k, v in model.state_dict().items()}}
    finally:
        torch.set_num_threads(threads)
    return single, ranks


def compare(kind: str, runs, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    single, ranks = runs
    one = single[kind]
    logits = torch.cat([r[kind]["logits"] for r in ranks])
    torch.testing.assert_close(logits, one["logits"], atol=atol, rtol=rtol)
    for r in ranks:
        assert r[kind]["loss"] == pytest.approx(one["loss"], rel=1e-6)
        assert r[kind]["grads"].keys() == one["grads"].keys()
        for name, grad in one["grads"].items():
            torch.testing.assert_close(r[kind]["grads"][name], grad, atol=atol, rtol=rtol, msg=name)
        assert r[kind]["weights"].keys() == one["weights"].keys()
        for name, value in one["weights"].items():
            torch.testing.assert_close(r[kind]["weights"][name], value, atol=atol, rtol=rtol, msg=name)
    moved = max(float((one["weights"][k] - one["start"][k]).abs().max()) for k in one["weights"])
    assert moved > LR / 2  # the Adam step changed the weights: equality is not vacuous


def test_each_rank_keeps_its_block_of_experts(runs):
    _, ranks = runs
    for kind, layers in (("qwen", 3), ("deepseek", 1)):  # DeepSeek-V3's first layer is dense
        for r in ranks:
            assert len(r[kind]["replaced"]) == layers
            assert {shape[0] for shape in r[kind]["local"].values()} == {2}  # 2 of 4 experts per rank
            assert all(r[kind]["weights"][name].shape[0] == 4 for name in r[kind]["local"])  # gathered back
    single, _ = runs
    shard = ranks[1]["qwen"]["weights"]["model.layers.0.mlp.experts.gate_up_proj"]
    torch.testing.assert_close(shard, single["qwen"]["weights"]["model.layers.0.mlp.experts.gate_up_proj"],
                               atol=1e-5, rtol=1e-4)


def test_ep_forward_backward_and_adam_step_equal_one_process(runs):
    compare("qwen", runs)


def test_ep_with_router_replay_equals_one_process(runs):
    compare("replay", runs)
    single, _ = runs
    # the random routes are not the model's own choice: replay changed the forward
    model = tiny_qwen(2)
    with torch.no_grad():
        own = model(input_ids=batch()[0]).logits
    assert (own - single["replay"]["logits"]).abs().max() > 1e-3


def test_ep_with_mxfp8_dispatch_equals_one_process_with_it(runs):
    compare("mxfp8", runs)
    single, _ = runs
    # the quantisation is on: the plain float32 forward of the same weights differs
    plain = tiny_qwen(3)
    with torch.no_grad():
        unquantised = plain(input_ids=batch()[0]).logits
    assert (unquantised - single["mxfp8"]["logits"]).abs().max() > 1e-4


def test_ep_deepseek_v3_equals_one_process(runs):
    compare("deepseek", runs)


def test_ep_under_bf16_autocast_sends_one_dtype_from_every_rank(runs):
    """Under autocast an expert returns bf16 rows, and one that got no rows an empty float32
    chunk: the return all-to-all goes in the dispatched rows' dtype on every rank, or ranks would
    exchange buffers of different element sizes (a hang, or garbage, under NCCL)."""
    _, ranks = runs
    for r in ranks:
        assert len(r["autocast_sent"]) == 2 * 3  # dispatch and return, 3 MoE layers
        assert set(r["autocast_sent"]) == {"torch.float32"}, r["autocast_sent"]


def test_bad_settings_are_refused(runs):
    from opencomposer.config import ConfigError, ParallelConfig
    from opencomposer.distributed.expert import check_expert_parallel, expert_block

    _, ranks = runs
    assert "3 experts cannot be split over an expert-parallel group of 2 ranks" in ranks[0]["refused"]
    assert ParallelConfig(ep=2).ep == 2
    with pytest.raises(ConfigError, match="parallel.ep: must be a positive integer"):
        ParallelConfig(ep=0)
    assert ParallelConfig(cp=2).cp == 2  # context parallelism runs in opencomposer rl
    with pytest.raises(ConfigError, match="does not divide trainer.world_size = 6"):
        check_expert_parallel(6, 4, 8)
    with pytest.raises(ConfigError, match="does not divide the model's 6 experts"):
        check_expert_parallel(8, 4, 6)
    check_expert_parallel(8, 4, 8)
    assert expert_block(8, 4, 3) == range(6, 8)
