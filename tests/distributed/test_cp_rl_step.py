"""Context-parallel RL training equals the single process: one ``Trainer.train`` step with
``parallel.cp = 2`` (gloo, CPU processes, FSDP2 over every rank) gives the same loss, metrics,
updated weights and Adam state as one process on the same rows, at world size 2 (one data-parallel
share, each row split over the two ranks) and 4 (two shares of the rows, each split over two
ranks). The model is a tiny Qwen3-MoE; the rows are RL rows of several episodes with different
advantages, in several micro-batches."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch

from opencomposer.config import Config, ConfigError
from opencomposer.distributed.runtime import World, context_parallel_groups, free_port, launch
from opencomposer.rl.trainer import ScoredStep, Trainer
from tests.distributed.test_dp_rl_step import TOKENIZER, config, make_rows

CP = 2


def _rank(rank: int, size: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=size)
    try:
        torch.set_num_threads(1)
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            model, state, rows = pickle.load(f)
        world = World(rank, size, cp=CP, cp_group=context_parallel_groups(size, CP, rank))
        trainer = Trainer(model, TOKENIZER, config(), world=world)
        if rank:
            trainer.follow()
            return
        trainer.load_state_dict(state)
        loss, metrics = trainer.train(ScoredStep(rows=rows))
        out = {"loss": loss, "metrics": metrics, "state": trainer.state_dict(),
               "weights": {k: v.clone() for k, v in trainer.full_model().state_dict().items()}}
        trainer.stop()
        with open(os.path.join(folder, "out.pkl"), "wb") as f:
            pickle.dump(out, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def small_model(tiny_tokenizer):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    return load_model(SMALL, tiny_tokenizer, seed=5)[0]


@pytest.mark.parametrize("size", [2, 4])
def test_rl_train_step_with_context_parallelism_equals_one_process(small_model, tmp_path, size):
    first = make_rows(1, [0.5, -0.5, 0.25, -0.25])
    second = make_rows(2, [0.7, -0.3, -0.4, 0.6, -0.2, -0.4])
    single = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    single.train(ScoredStep(rows=copy.deepcopy(first)))  # Adam state to start the compared step from
    start_model, start_state = copy.deepcopy(single.model), copy.deepcopy(single.state_dict())
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((start_model, start_state, second), f)
    torch.multiprocessing.spawn(_rank, args=(size, free_port(), str(tmp_path)), nprocs=size, join=True)
    out = pickle.loads((tmp_path / "out.pkl").read_bytes())

    loss, metrics = single.train(ScoredStep(rows=copy.deepcopy(second)))
    assert metrics["grad_norm"] > config().rl.grad_clip  # clipping was active
    assert out["loss"] == pytest.approx(loss, rel=1e-5)
    for name in ("tokens", "grad_norm", "neg_logprob", "entropy", "ratio_mean", "mismatch_kl", "ratio_max"):
        assert out["metrics"][name] == pytest.approx(metrics[name], rel=1e-4), name
    if size == CP:  # one data-parallel share: rank 0 ran every micro-batch (on half of each row)
        assert out["metrics"]["micro_batches"] == metrics["micro_batches"]
    else:
        assert out["metrics"]["micro_batches"] < metrics["micro_batches"]
    moved = 0.0
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(out["weights"][name], value, rtol=1e-4, atol=1e-6, msg=name)
        moved = max(moved, float((value - start_model.state_dict()[name]).abs().max()))
    assert moved > 1e-4  # the step changed the weights, so equality is not vacuous
    got, want = out["state"]["optimizer"], single.state_dict()["optimizer"]
    assert got["param_groups"] == want["param_groups"]
    for index, slots in want["state"].items():
        for slot, value in slots.items():
            torch.testing.assert_close(got["state"][index][slot], value, rtol=1e-4, atol=1e-7)


def test_context_parallel_settings_are_checked():
    cfg = Config()
    cfg.parallel.cp = 2
    with pytest.raises(ConfigError, match="set trainer.world_size to a multiple of it"):
        launch(lambda world, config: None, cfg)
    cfg.trainer.world_size = 3
    with pytest.raises(ConfigError, match="trainer.world_size = 3 is not a multiple of it"):
        cfg.validate()
    with pytest.raises(ConfigError, match="parallel.cp: must be >= 1"):
        type(cfg.parallel)(cp=0)
    with pytest.raises(ValueError, match="cannot form cp groups of 2"):
        World(0, 3, cp=2, cp_group=object())
    with pytest.raises(ValueError, match="needs this rank's cp group"):
        World(0, 2, cp=2)


def test_the_collective_timeout_is_checked():
    from opencomposer.config import TrainerConfig

    assert TrainerConfig().timeout_s == 3600.0
    with pytest.raises(ConfigError, match="trainer.timeout_s"):
        TrainerConfig(timeout_s=0)
