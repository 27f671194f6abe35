"""Sharded optimizer checkpoints (``trainer.optimizer_checkpoint = "sharded"``): Adam's state written
by every rank with ``torch.distributed.checkpoint`` resumes at another world size as if the run had
never stopped. Two ranks (FSDP2, gloo) write what one process reads back equal to its own state,
and one process writes what two ranks resume from, training the next step as one process does."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest
import torch

from opencomposer.config import ConfigError, load_recipe
from opencomposer.distributed.runtime import World
from opencomposer.rl.trainer import ScoredStep, Trainer
from tests.distributed.ranks import spawn_ranks
from tests.distributed.test_dp_rl_step import TOKENIZER, make_rows
from tests.distributed.test_dp_rl_step import config as base_config


def config():
    cfg = base_config()
    cfg.trainer.optimizer_checkpoint = "sharded"
    return cfg


def _rank(rank: int, port: int, mode: str, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            model, state, rows = pickle.load(f)
        trainer = Trainer(model, TOKENIZER, config(), world=World(rank, 2))
        if rank:
            trainer.follow()
            return
        if mode == "write":  # train a step, write the shards
            trainer.train(ScoredStep(rows=rows))
            trainer.save_optimizer(Path(folder) / "optimizer")
            out = {"state": trainer.state_dict()}
        else:  # resume from one process's shards, train the next step
            trainer.load_state_dict(state, Path(folder) / "optimizer")
            loss, _ = trainer.train(ScoredStep(rows=rows))
            out = {"loss": loss, "updates": trainer.updates}
        out["weights"] = {k: v.clone() for k, v in trainer.full_model().state_dict().items()}
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


def adam_state(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    return {names[id(p)]: dict(s) for p, s in trainer.optimizer.state.items()}


def test_two_ranks_write_shards_that_one_process_resumes_from(small_model, tmp_path):
    first = make_rows(1, [0.5, -0.5, 0.25, -0.25])
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((copy.deepcopy(small_model), None, first), f)
    spawn_ranks(_rank, 2, "write", str(tmp_path))
    out = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert out["state"] == {"optimizer_format": "sharded", "updates": 1}
    assert (tmp_path / "optimizer" / ".metadata").is_file()
    assert len(list((tmp_path / "optimizer").glob("*.distcp"))) == 2  # one file per rank

    single = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    single.train(ScoredStep(rows=copy.deepcopy(first)))
    resumed = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    resumed.model.load_state_dict(out["weights"])
    resumed.load_state_dict(out["state"], tmp_path / "optimizer")
    assert resumed.updates == 1
    want, got = adam_state(single), adam_state(resumed)
    assert want.keys() == got.keys() and want
    for name, slots in want.items():
        for slot, value in slots.items():
            torch.testing.assert_close(got[name][slot], value, rtol=1e-4, atol=1e-7, msg=f"{name}.{slot}")


def test_one_process_writes_shards_that_two_ranks_resume_from(small_model, tmp_path):
    first = make_rows(1, [0.5, -0.5, 0.25, -0.25])
    second = make_rows(2, [0.7, -0.3, -0.4, 0.6, -0.2, -0.4])
    single = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    single.train(ScoredStep(rows=copy.deepcopy(first)))
    state = single.state_dict()
    single.save_optimizer(tmp_path / "optimizer")
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((copy.deepcopy(single.model), state, second), f)
    spawn_ranks(_rank, 2, "resume", str(tmp_path))
    out = pickle.loads((tmp_path / "out.pkl").read_bytes())

    loss, _ = single.train(ScoredStep(rows=copy.deepcopy(second)))
    assert out["loss"] == pytest.approx(loss, rel=1e-5) and out["updates"] == 2
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(out["weights"][name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_a_sharded_state_needs_its_folder_and_no_expert_parallelism(small_model, tmp_path):
    trainer = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    with pytest.raises(ValueError, match="needs its folder"):
        trainer.load_state_dict({"optimizer_format": "sharded", "updates": 1})
    with pytest.raises(FileNotFoundError, match="no sharded optimizer checkpoint"):
        trainer.load_state_dict({"optimizer_format": "sharded", "updates": 1}, tmp_path)
    with pytest.raises(ConfigError, match="optimizer_checkpoint"):
        load_recipe(None, ["trainer.optimizer_checkpoint=sharded", "trainer.world_size=2", "parallel.ep=2"])


def test_weights_adam_never_updated_stay_without_state_across_a_sharded_resume(small_model, tmp_path):
    """RL does not train the MTP layers: Adam holds no state for them, and a resume must neither
    fail on their absence nor invent a state (a step count) for them."""
    from opencomposer.model.mtp import attach_mtp

    model = attach_mtp(copy.deepcopy(small_model), 1)
    trainer = Trainer(copy.deepcopy(model), TOKENIZER, config())
    trainer.train(ScoredStep(rows=make_rows(1, [0.5, -0.5, 0.25, -0.25])))
    untrained = {n for n, p in trainer.model.named_parameters() if p not in trainer.optimizer.state}
    assert untrained and all(n.startswith("mtp.") for n in untrained)
    trainer.save_optimizer(tmp_path / "optimizer")
    resumed = Trainer(copy.deepcopy(trainer.model), TOKENIZER, config())
    resumed.load_state_dict(trainer.state_dict(), tmp_path / "optimizer")
    assert {n for n, p in resumed.model.named_parameters() if p not in resumed.optimizer.state} == untrained
    want, got = adam_state(trainer), adam_state(resumed)
    assert want.keys() == got.keys()
    for name, slots in want.items():
        for slot, value in slots.items():
            torch.testing.assert_close(got[name][slot], value, rtol=0, atol=0, msg=f"{name}.{slot}")


def test_a_checkpoint_before_any_update_leaves_adam_untouched(small_model, tmp_path):
    """Saving (and loading) an optimizer that has taken no step takes none either: the first real
    update is Adam's first, bias correction included."""
    rows = make_rows(1, [0.5, -0.5, 0.25, -0.25])
    trainer = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    trainer.save_optimizer(tmp_path / "optimizer")
    assert not trainer.optimizer.state
    assert (tmp_path / "optimizer" / "EMPTY").is_file() and not (tmp_path / "optimizer" / ".metadata").exists()
    resumed = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    resumed.load_state_dict(trainer.state_dict(), tmp_path / "optimizer")
    assert not resumed.optimizer.state
    fresh = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    for t in (trainer, resumed, fresh):
        t.train(ScoredStep(rows=copy.deepcopy(rows)))
    for name, value in fresh.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], value) and torch.equal(resumed.model.state_dict()[name], value)
