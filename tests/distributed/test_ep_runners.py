"""Expert parallelism in the runners equals the single process (``parallel.ep``; gloo, CPU
processes): ``shard_model`` keeps each rank's block of every MoE layer's experts, the runners
average the gradients with ``reduce_gradients`` and clip by the norm over every shard, and the full
state dicts gather the shards back. Two pretraining steps at world size 2 give the same losses and
weights as one process (the RL step is in ``test_dp_rl_step.py``, the phases in
``test_dp_phases.py``). A tiny Qwen3-MoE with 4 experts, top-2."""

from __future__ import annotations

import copy
import os
import pickle

import pytest
import torch

from opencomposer.config import Config, ConfigError, PretrainConfig
from opencomposer.distributed.runtime import World, expert_parallel_groups, free_port

EP = 2
PRETRAIN = PretrainConfig(batch_size=4, seq_len=32, max_steps=2, lr=3e-3, warmup_steps=0, eval_batches=0,
                          log_every=1, grad_clip=0.5)


def _world(rank: int, size: int, port: int) -> World:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)
    group, replicas = expert_parallel_groups(size, EP, rank)
    return World(rank, size, ep=EP, ep_group=group, expert_replicas=replicas)


def _pretrain_rank(rank: int, size: int, port: int, folder: str) -> None:
    from opencomposer.distributed.fsdp import full_model_state
    from opencomposer.pretrain.cpt import pretrain

    world = _world(rank, size, port)
    try:
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            model, tokenizer, files = pickle.load(f)
        result = pretrain(model, tokenizer, files, [], PRETRAIN, progress=False, world=world)
        weights = full_model_state(model, world)
        if rank == 0:
            with open(os.path.join(folder, "out.pkl"), "wb") as f:
                pickle.dump((result.history, weights), f)
    finally:
        torch.distributed.destroy_process_group()


def test_pretrain_steps_with_expert_parallelism_equal_one_process(tiny_tokenizer, code_corpus, tmp_path):
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.cpt import pretrain
    from tests.training.test_forward import SMALL

    model = load_model(SMALL, tiny_tokenizer, seed=7)[0]
    model.config.router_aux_loss_coef = 0.0  # per rank by design
    files = code_corpus.train[:20]
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((copy.deepcopy(model), tiny_tokenizer, files), f)
    torch.multiprocessing.spawn(_pretrain_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    history, weights = pickle.loads((tmp_path / "out.pkl").read_bytes())

    single = pretrain(model, tiny_tokenizer, files, [], PRETRAIN, progress=False)
    for got, want in zip(history, single.history, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    assert single.history[0]["grad_norm"] > PRETRAIN.grad_clip
    bound = 2 * PRETRAIN.lr * len(single.history)  # Adam on rounding-noise gradients (test_dp_pretrain)
    for name, value in model.state_dict().items():
        close = torch.isclose(weights[name], value, rtol=1e-4, atol=1e-6)
        assert close.float().mean() > 0.999, (name, int((~close).sum()), close.numel())
        assert (weights[name] - value).abs().max() <= bound, name


def test_expert_parallel_settings_are_checked():
    cfg = Config()
    cfg.parallel.ep = 2
    from opencomposer.distributed.runtime import launch

    with pytest.raises(ConfigError, match="parallel.ep = 2 splits each MoE layer's experts"):
        launch(lambda world, config: None, cfg)
    cfg.trainer.world_size = 3
    with pytest.raises(ConfigError, match="parallel.ep = 2: trainer.world_size = 3 is not a multiple of it"):
        cfg.validate()
    with pytest.raises(ValueError, match="cannot form ep groups of 2"):
        World(0, 3, ep=2, ep_group=object())
