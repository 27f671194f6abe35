"""Context parallelism equals the single process (``opencomposer.distributed.context``; gloo, two CPU
processes, cp = 2): each rank holds chunks r and 3 - r of every row (4 chunks of 8 positions), and

- the plain forward gives the single process's logits (gathered back to the global order), and
  ``cp_token_logprobs`` the trainer's log π and entropy (``token_logprobs``: temperature, top-p,
  router replay) on the same rows as an RL ``TrainBatch``;
- with router replay (random routes, some tokens unknown) one forward + backward + Adam step gives
  the same logits, loss (masked next-token cross-entropy over the whole batch plus the MTP
  self-distillation of 2 MTP depths on the rows with loss), gradients of every parameter (summed over the two ranks) and
  updated weights as one process on the whole rows;
- the targets, shifted on the whole rows before splitting, score a chunk's last position against
  the first token of the next chunk, which the other rank holds; ``shift_left`` brings rows over.

A tiny Qwen3-MoE (2 layers, 4 experts, top-2, float32), 2 rows of 32 positions, the second row
packed with two documents whose boundary (position 20) falls inside a chunk. All scenarios run in
one spawn (starting two interpreters costs more than the model). The layout helpers are tested
without processes."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch
import torch.nn.functional as F

from opencomposer.distributed.context import (
    attention_mask,
    cp_indices,
    cp_layout,
    document_ids,
    merge_sequence,
    pad_batch_for_cp,
    pad_for_cp,
    split_batch,
    split_sequence,
)
from tests.distributed.ranks import run_world

BATCH, SEQ, VOCAB, CP = 2, 32, 128, 2
CHUNK = SEQ // (2 * CP)
SECOND_DOC = 20  # the second row's second document starts here (inside chunk 2, held by rank 1)
LR = 1e-2


# ------------------------------------------------------------------------------- layout (no processes)


def test_cp_indices_give_rank_r_chunks_r_and_2cp_minus_1_minus_r():
    assert cp_indices(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cp_indices(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert cp_indices(8, 1, 0).tolist() == list(range(8))
    layout = cp_layout(24, 3)
    assert layout.shape == (3, 8)
    assert sorted(layout.flatten().tolist()) == list(range(24))  # every position exactly once
    assert layout[2].tolist() == [8, 9, 10, 11, 12, 13, 14, 15]  # the middle rank: chunks 2 and 3
    with pytest.raises(ValueError, match="not a multiple of 2 \\* cp = 4"):
        cp_indices(30, 2, 0)
    with pytest.raises(ValueError, match="rank 2 outside"):
        cp_indices(16, 2, 2)


def test_split_and_merge_round_trip_any_trailing_shape():
    routes = torch.arange(2 * 24 * 3 * 2).view(2, 24, 3, 2)  # [B, T, layers, k], like replayed routes
    parts = [split_sequence(routes, 3, r) for r in range(3)]
    assert all(p.shape == (2, 8, 3, 2) for p in parts)
    assert torch.equal(parts[1][:, :4], routes[:, 4:8])  # rank 1: chunks 1 and 4
    assert torch.equal(parts[1][:, 4:], routes[:, 16:20])
    assert torch.equal(merge_sequence(parts), routes)


def test_pad_for_cp_pads_values_and_continues_positions():
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]])
    assert pad_for_cp(positions, 2, positions=True).tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert pad_for_cp(torch.ones(1, 6, dtype=torch.bool), 2, value=False).tolist() == [[True] * 6 + [False] * 2]
    assert pad_for_cp(positions[:, :4], 2) is not None and pad_for_cp(positions[:, :4], 2).shape == (1, 4)


def train_batch(batch: dict[str, torch.Tensor]):
    """The rows as an RL ``TrainBatch``: one sequence per row (``collate``'s position ids), as RL
    rows are (``token_logprobs`` runs the model with a cache, where transformers does not look for
    packed documents)."""
    from opencomposer.types import TrainBatch

    mask = batch["mask"]
    return TrainBatch(input_ids=batch["ids"], target_ids=batch["targets"], loss_mask=mask,
                      advantages=torch.where(mask, 0.5, 0.0), sampler_logprobs=torch.zeros(mask.shape),
                      position_ids=torch.arange(SEQ).repeat(BATCH, 1), segment_ids=torch.zeros_like(batch["ids"]),
                      routes=batch["routes"], num_episodes=2, episode_ids=torch.zeros_like(batch["ids"]),
                      episode_tokens=torch.ones(mask.shape))


def test_pad_and_split_a_train_batch():
    full = train_batch(make_batch())
    short = split_batch(full, 1, 0)
    short = type(full)(**{**short.__dict__, **{n: getattr(short, n)[:, :SEQ - 3] for n in (
        "input_ids", "target_ids", "loss_mask", "advantages", "sampler_logprobs", "position_ids", "segment_ids",
        "routes", "episode_ids", "episode_tokens")}})
    padded = pad_batch_for_cp(short, CP, pad_id=0)
    assert padded.input_ids.shape == (BATCH, SEQ)
    assert padded.position_ids[:, -3:].tolist() == [[29, 30, 31], [29, 30, 31]]  # continuing
    assert not padded.loss_mask[:, -3:].any() and (padded.routes[:, -3:] == -1).all()
    assert (padded.episode_ids[:, -3:] == -1).all() and padded.num_episodes == 2
    parts = [split_batch(padded, CP, r) for r in range(CP)]
    assert parts[1].routes.shape == (BATCH, SEQ // CP, 2, 2)
    assert torch.equal(merge_sequence([p.target_ids for p in parts]), padded.target_ids)


def test_document_ids_and_the_attention_mask_match_a_direct_rule():
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 3, 4]])
    assert document_ids(positions).tolist() == [[0] * 8, [0, 0, 0, 1, 1, 1, 1, 1]]
    assert document_ids(positions, "zero").tolist() == [[1] * 8, [1, 1, 1, 2, 2, 2, 2, 2]]
    docs = document_ids(positions)
    keys = cp_layout(8, 2).flatten()
    for rank in range(2):
        mask = attention_mask(positions, 2, rank)
        assert mask.shape == (2, 1, 4, 8)
        for b in range(2):
            for qi, q in enumerate(cp_indices(8, 2, rank).tolist()):
                for kj, k in enumerate(keys.tolist()):
                    assert bool(mask[b, 0, qi, kj]) == (k <= q and bool(docs[b, q] == docs[b, k])), (rank, b, q, k)


# --------------------------------------------------------------------------------- two processes


def tiny_model() -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from opencomposer.model.mtp import attach_mtp

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                            attn_implementation="sdpa")
    return attach_mtp(Qwen3MoeForCausalLM(config).float(), 2, seed=1)


def make_batch() -> dict[str, torch.Tensor]:
    """Full rows ``[2, 32]``: inputs, targets shifted on the whole rows, a loss mask, the position
    ids (row 1 packs two documents) and random routes ``[2, 32, 2 layers, 2]``, unknown on a few."""
    generator = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    positions = torch.arange(SEQ).repeat(BATCH, 1)
    positions[1, SECOND_DOC:] -= SECOND_DOC
    routes = torch.rand(BATCH, SEQ, 2, 4, generator=generator).argsort(-1)[..., :2].sort(-1).values
    routes[1, 5:9] = -1
    mask = torch.rand(BATCH, SEQ, generator=generator) < 0.8
    return {"ids": tokens[:, :-1], "targets": tokens[:, 1:], "positions": positions, "routes": routes, "mask": mask}


def step_loss(logits, batch, count, mtp_loss):
    """Masked cross-entropy summed over this process's positions over the whole batch's count, plus MTP."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), reduction="none")
    return (ce * batch["mask"].flatten()).sum() / count + mtp_loss


def cp_step(rank: int, folder: str) -> dict:
    """Every scenario on this rank's chunks (module doc); what it gathered (the test reads rank 0's)."""
    from opencomposer.distributed.context import (
        cp_forward,
        cp_mtp_distillation_loss,
        gather_sequence,
        global_count,
        shift_left,
    )
    from opencomposer.model.routing import RouterReplay
    from opencomposer.training.forward import cp_token_logprobs

    with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
        state, batch = pickle.load(f)
    # built here, not unpickled: transformers registers what a model class can output (hidden
    # states) when one is constructed in the process, and an unpickled model returns none
    model = tiny_model()
    model.load_state_dict(state)
    out: dict = {}
    with torch.no_grad():
        out["plain_logits"] = gather_sequence(cp_forward(model, batch["ids"], batch["positions"]).logits)
    assert model.config._attn_implementation == "sdpa"  # restored after the CP forward
    with torch.no_grad():
        logprobs, entropy = cp_token_logprobs(model, train_batch(batch), replay=RouterReplay(model),
                                              temperature=0.7, top_p=0.9)
    out["token_logprobs"] = gather_sequence(logprobs)
    out["entropy"] = gather_sequence(entropy)
    local = {name: split_sequence(value, CP, rank) for name, value in batch.items()}
    out["local_ids"] = gather_parts(local["ids"])
    out["local_targets"] = gather_parts(local["targets"])
    out["shifted_3"] = gather_sequence(shift_left(local["ids"], 3, fill=-1))
    out["shifted_8"] = gather_sequence(shift_left(local["ids"], CHUNK, fill=-1))

    replay = RouterReplay(model)
    forward = cp_forward(model, batch["ids"], batch["positions"], routes=batch["routes"], replay=replay,
                         hidden=True)
    mtp, out["mtp_metrics"] = cp_mtp_distillation_loss(model, forward.logits, forward.hidden_states[-1],
                                                       batch["ids"], batch["positions"], targets=batch["mask"])
    count = global_count(int(local["mask"].sum())).float()
    loss = step_loss(forward.logits, local, count, mtp)
    loss.backward()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    out["loss"] = float(total)
    out["replay_logits"] = gather_sequence(forward.logits.detach())
    replayed = replay.stats.replayed.clone()
    torch.distributed.all_reduce(replayed)
    out["replayed"] = replayed.tolist()
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad)
        grads[name] = p.grad.clone()
    out["grads"] = grads
    torch.optim.Adam(model.parameters(), lr=LR).step()
    out["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def gather_parts(local: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(local) for _ in range(CP)]
    torch.distributed.all_gather(parts, local)
    return parts


def test_context_parallel_forward_backward_and_adam_step_equal_one_process(tmp_path):
    from opencomposer.model.mtp import mtp_distillation_loss
    from opencomposer.model.routing import RouterReplay
    from opencomposer.training.forward import token_logprobs

    model, batch = tiny_model(), make_batch()
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((model.state_dict(), batch), f)
    out = run_world([cp_step], CP, tmp_path)["cp_step"][0]

    # targets shifted on the whole rows: rank 0's chunk 0 ends at position 7, scored against the token
    # at position 8, the first of chunk 1, which rank 1 holds
    ids0, ids1 = out["local_ids"]
    targets0 = out["local_targets"][0]
    assert torch.equal(targets0[:, CHUNK - 1], ids1[:, 0])
    assert torch.equal(ids1[:, 0], batch["ids"][:, CHUNK])
    assert torch.equal(targets0[:, -1], batch["targets"][:, -1])  # the last chunk keeps the row's last target
    # shift_left: every position's token k ahead (-1 past the end), across chunks and ranks
    for k, got in ((3, out["shifted_3"]), (CHUNK, out["shifted_8"])):
        want = torch.cat([batch["ids"][:, k:], torch.full((BATCH, k), -1)], dim=1)
        assert torch.equal(got, want), k

    single = copy.deepcopy(model)
    with torch.no_grad():
        plain = single(input_ids=batch["ids"], position_ids=batch["positions"], use_cache=False).logits
        unpacked = single(input_ids=batch["ids"], position_ids=torch.arange(SEQ).repeat(BATCH, 1)).logits
    torch.testing.assert_close(out["plain_logits"], plain, rtol=1e-5, atol=1e-5)
    # the document boundary matters (so the CP mask's document rule is exercised) ...
    assert (plain[1, SECOND_DOC:] - unpacked[1, SECOND_DOC:]).abs().max() > 1e-3

    with torch.no_grad():  # the trainer's scoring rule (temperature, top-p) on the whole rows
        want, want_entropy = token_logprobs(single, train_batch(batch), replay=RouterReplay(single),
                                            temperature=0.7, top_p=0.9)
    scored = batch["mask"].clone()
    scored[:, :int(scored.any(0).nonzero()[0])] = False  # token_logprobs leaves 0 before the first loss target
    torch.testing.assert_close(out["token_logprobs"][scored], want[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["entropy"][scored], want_entropy[scored], rtol=1e-5, atol=1e-5)

    replay = RouterReplay(single)
    with replay.routes(batch["routes"]):
        forward = single(input_ids=batch["ids"], position_ids=batch["positions"], use_cache=False,
                         output_hidden_states=True)
    mtp, metrics = mtp_distillation_loss(single, forward.logits, forward.hidden_states[-1], batch["ids"],
                                         batch["positions"], targets=batch["mask"])
    loss = step_loss(forward.logits, batch, batch["mask"].sum().float(), mtp)
    loss.backward()
    # ... and so does replay (random routes, not the model's own choice)
    assert (forward.logits.detach() - plain).abs().max() > 1e-3
    assert out["replayed"] == replay.stats.replayed.tolist()  # per layer, both ranks' replayed entries summed
    torch.testing.assert_close(out["replay_logits"], forward.logits.detach(), rtol=1e-5, atol=1e-5)
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert 0 < metrics["mtp_kl"] and set(out["mtp_metrics"]) == set(metrics)
    for name, value in metrics.items():
        assert out["mtp_metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name

    for name, p in single.named_parameters():
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(out["grads"][name], want, rtol=1e-4, atol=1e-5, msg=name)
    assert any(float(p.grad.abs().max()) > 1e-3 for n, p in single.named_parameters() if n.startswith("mtp."))
    torch.optim.Adam(single.parameters(), lr=LR).step()
    start = model.state_dict()
    moved = 0.0
    grads = {name: p.grad for name, p in single.named_parameters()}
    for name, value in single.state_dict().items():
        # Adam's first step moves an element by lr * g / (|g| + 1e-8): insensitive to the rounding of
        # g where |g| is well above the gradients' 1e-5 tolerance, anything up to the step's bound
        # (lr each side) where g is within rounding of zero (another summation order can flip its sign).
        # So: nearly every element equal to 1e-6; those with |g| > 1e-4 within 1e-3 lr; none beyond 2 lr.
        got = out["weights"][name]
        close = torch.isclose(got, value, rtol=1e-5, atol=1e-6)
        assert close.float().mean() > 0.999, (name, int((~close).sum()), close.numel())
        grad = grads.get(name)
        firm = torch.ones_like(close) if grad is None else grad.abs() > 1e-4
        torch.testing.assert_close(got[firm], value[firm], rtol=1e-5, atol=1e-3 * LR, msg=name)
        assert float((got - value).abs().max()) <= 2 * LR + 1e-6, name
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-3  # the step moved the weights, so the equality is not vacuous
