"""Data-, context- and expert-parallel pretraining equal the single process: two ``pretrain`` steps
at world size 2 (gloo, two CPU processes), with the rows split over the ranks (FSDP2), each row's
positions split over them (``parallel.cp = 2``) or each MoE layer's experts split over them
(``parallel.ep = 2``, in place of FSDP or with FSDP of the other weights, ``parallel.ep_fsdp``), give
the same losses, gradient norms and weights as world size 1.
The model's load-balancing loss is switched off: it is computed per rank (``pretrain.losses``),
the one term that is not the single-process one by design."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch

from opencomposer.config import PretrainConfig
from opencomposer.distributed.runtime import World, context_parallel_groups, expert_parallel_groups
from opencomposer.pretrain.cpt import pretrain
from tests.distributed.ranks import spawn_ranks

PRETRAIN = PretrainConfig(batch_size=3, seq_len=32, max_steps=2, lr=3e-3, warmup_steps=0, eval_batches=0,
                          log_every=1, grad_clip=0.5)


def _rank(rank: int, port: int, cp: int, ep: int, ep_fsdp: bool, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            model, tokenizer, files = pickle.load(f)
        ep_group, _ = expert_parallel_groups(2, ep, rank)
        world = World(rank, 2, cp=cp, cp_group=context_parallel_groups(2, cp, rank), ep=ep, ep_group=ep_group,
                      ep_fsdp=ep_fsdp)
        result = pretrain(model, tokenizer, files, [], PRETRAIN, progress=False, world=world)
        from opencomposer.distributed.fsdp import full_model_state

        weights = full_model_state(model, world)
        if rank == 0:
            with open(os.path.join(folder, "out.pkl"), "wb") as f:
                pickle.dump((result.history, weights), f)
    finally:
        torch.distributed.destroy_process_group()


# Plain pretraining and [[pretrain.phases]] are one trainer: tests/distributed/test_dp_phases.py runs
# the data, context and expert layouts in the default selection, so here only expert-fsdp does.
@pytest.mark.parametrize(("cp", "ep", "ep_fsdp"), [
    pytest.param(1, 1, False, marks=pytest.mark.slow, id="data"),
    pytest.param(2, 1, False, marks=pytest.mark.slow, id="context"),
    pytest.param(1, 2, False, marks=pytest.mark.slow, id="expert"),
    pytest.param(1, 2, True, id="expert-fsdp"),
])
def test_pretrain_steps_at_world_size_2_equal_world_size_1(tiny_tokenizer, code_corpus, tmp_path, cp, ep, ep_fsdp):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    model = load_model(SMALL, tiny_tokenizer, seed=7)[0]
    model.config.router_aux_loss_coef = 0.0
    files = code_corpus.train[:20]
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((copy.deepcopy(model), tiny_tokenizer, files), f)
    spawn_ranks(_rank, 2, cp, ep, ep_fsdp, str(tmp_path))
    history, weights = pickle.loads((tmp_path / "out.pkl").read_bytes())

    single = pretrain(model, tiny_tokenizer, files, [], PRETRAIN, progress=False)
    assert len(history) == len(single.history) == 2  # no held-out files: training rows only
    for got, want in zip(history, single.history, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert got["tokens"] == want["tokens"]
    assert single.history[0]["grad_norm"] > PRETRAIN.grad_clip  # clipping was active
    # Adam divides by sqrt(v): an element whose gradient is rounding noise (an expert that got
    # almost no tokens) moves by up to lr in either direction whichever rounding the reduction
    # order gave. So: nearly every element equal to float tolerance, and none further than 2 lr a step.
    bound = 2 * PRETRAIN.lr * len(single.history)
    for name, value in model.state_dict().items():
        close = torch.isclose(weights[name], value, rtol=1e-4, atol=1e-6)
        assert close.float().mean() > 0.999, (name, int((~close).sum()), close.numel())
        assert (weights[name] - value).abs().max() <= bound, name


def test_context_parallel_pretraining_needs_whole_chunks(tiny_tokenizer, code_corpus):
    from dataclasses import replace

    from opencomposer.config import ConfigError

    world = World(0, 2, cp=2, cp_group=object())
    with pytest.raises(ConfigError, match="use a multiple of 4"):
        pretrain(None, tiny_tokenizer, code_corpus.train[:2], [], replace(PRETRAIN, seq_len=30), world=world)
