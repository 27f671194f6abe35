"""Data- and context-parallel SFT equal the single process: three ``sft`` steps at world size 2
(gloo, two CPU processes, FSDP2), with each batch's rows split over the ranks or (``parallel.cp =
2``) each row's positions split over them, give the same losses, token counts and weights as one
process on the same demonstrations (a tiny Qwen3-MoE, rows of different lengths, clipping on)."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from opencomposer.config import ConfigError, SFTConfig
from opencomposer.distributed.runtime import World, context_parallel_groups
from opencomposer.pretrain.sft import sft
from tests.distributed.ranks import spawn_ranks

SFT = SFTConfig(steps=3, batch_size=4, lr=3e-3, warmup_steps=0, grad_clip=0.05)
TOKENIZER = SimpleNamespace(pad_token_id=0, eos_token_id=0)


def demonstrations() -> list:
    from tests.rl.test_trainer import episode

    rng = np.random.default_rng(3)
    return [episode(rng, 1.0, n_model=int(rng.integers(3, 14))) for _ in range(6)]


def _rank(rank: int, port: int, cp: int, folder: str, config: SFTConfig = SFT) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            model, episodes = pickle.load(f)
        world = World(rank, 2, cp=cp, cp_group=context_parallel_groups(2, cp, rank))
        result = sft(model, TOKENIZER, episodes, config, seed=1, progress=False, world=world)
        from opencomposer.distributed.fsdp import full_model_state

        weights = full_model_state(model, world)
        if rank == 0:
            with open(os.path.join(folder, "out.pkl"), "wb") as f:
                pickle.dump((result.history, weights), f)
    finally:
        torch.distributed.destroy_process_group()


# cp = 2 in the slow set: context parallelism at two ranks stays in make test through the RL step and
# the asynchronous run (tests/distributed/test_dp_rl_step.py, test_dp_rl_run.py)
@pytest.mark.parametrize(("cp", "micro"), [(1, 0), pytest.param(2, 0, marks=pytest.mark.slow),
                                           pytest.param(1, 64, marks=pytest.mark.slow)],
                         ids=["dp2", "cp2", "dp2-micro"])  # micro-batches on ranks: test_dp_rl_step.py too
def test_sft_steps_at_world_size_2_equal_one_process(tiny_tokenizer, tmp_path, cp, micro):
    """``dp2-micro``: each rank's rows in micro-batches of at most 64 padded positions (gradient
    accumulation; a rank with fewer runs empty forwards for FSDP)."""
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    model = load_model(SMALL, tiny_tokenizer, seed=9)[0]
    episodes = demonstrations()
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((copy.deepcopy(model), episodes), f)
    config = dataclasses.replace(SFT, micro_batch_tokens=micro)
    spawn_ranks(_rank, 2, cp, str(tmp_path), config)
    history, weights = pickle.loads((tmp_path / "out.pkl").read_bytes())

    start = copy.deepcopy(model.state_dict())
    single = sft(model, TOKENIZER, episodes, SFT, seed=1, progress=False)  # the whole step at once
    assert len(history) == len(single.history) == SFT.steps
    for got, want in zip(history, single.history, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["sft_tokens"] == want["sft_tokens"]
    # Adam divides by sqrt(v): an element whose gradient is rounding noise moves by up to lr either
    # way, whichever rounding the reduction (and, under CP, the chunked attention) gave. So: nearly
    # every element equal to float tolerance, none further than 2 lr a step.
    moved, bound = 0.0, 2 * SFT.lr * SFT.steps
    for name, value in model.state_dict().items():
        close = torch.isclose(weights[name], value, rtol=1e-4, atol=1e-5)
        assert close.float().mean() > 0.99, (name, int((~close).sum()), close.numel())
        assert (weights[name] - value).abs().max() <= bound, name
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-3  # the steps changed the weights


def test_every_data_parallel_rank_needs_a_row():
    world = World(0, 4, cp=1)
    with pytest.raises(ConfigError, match="sft.batch_size = 2 gives some of the 4 data-parallel ranks no rows"):
        sft(torch.nn.Linear(1, 1), TOKENIZER, demonstrations(), SFTConfig(batch_size=2), world=world)
