"""Sharded optimizer checkpoints (``trainer.optimizer_checkpoint = "sharded"``): Adam's state written
by every rank with ``torch.distributed.checkpoint`` resumes at another world size as if the run had
never stopped. Two ranks (FSDP2, gloo) write what one process reads back equal to its own state,
and one process writes what two ranks resume from, training the next step as one process does."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

from opencomposer.config import ConfigError, load_recipe
from opencomposer.distributed.runtime import World
from opencomposer.rl.trainer import ScoredStep, Trainer
from tests.distributed.ranks import run_world
from tests.distributed.test_dp_rl_step import TOKENIZER, make_rows
from tests.distributed.test_dp_rl_step import config as base_config

FIRST = make_rows(1, [0.5, -0.5, 0.25, -0.25])
SECOND = make_rows(2, [0.7, -0.3, -0.4, 0.6, -0.2, -0.4])


def config():
    cfg = base_config()
    cfg.trainer.optimizer_checkpoint = "sharded"
    return cfg


def _train(rank: int, folder: Path) -> dict | None:
    """Rank 0 trains a step from ``folder``'s inputs (after resuming from its ``optimizer`` shards
    when the inputs carry a trainer state), rank 1 follows; rank 0's state and weights."""
    model, state, rows = pickle.loads((folder / "inputs.pkl").read_bytes())
    trainer = Trainer(model, TOKENIZER, config(), world=World(rank, 2))
    if rank:
        trainer.follow()
        return None
    if state is not None:
        trainer.load_state_dict(state, folder / "optimizer")
    loss, _ = trainer.train(ScoredStep(rows=rows))
    if state is None:
        trainer.save_optimizer(folder / "optimizer")
    out = {"loss": loss, "state": trainer.state_dict(),
           "weights": {k: v.clone() for k, v in trainer.full_model().state_dict().items()}}
    trainer.stop()
    return out


def write_shards(rank: int, folder: str) -> dict | None:
    return _train(rank, Path(folder) / "write")


def resume_from_shards(rank: int, folder: str) -> dict | None:
    return _train(rank, Path(folder) / "resume")


@pytest.fixture(scope="module")
def small_model(tiny_tokenizer):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    return load_model(SMALL, tiny_tokenizer, seed=5)[0]


def inputs(folder: Path, model, state, rows) -> None:
    folder.mkdir()
    (folder / "inputs.pkl").write_bytes(pickle.dumps((copy.deepcopy(model), state, rows)))


@pytest.fixture(scope="module")
def world(small_model, tmp_path_factory):
    """One world of two ranks for both directions: ``write_shards`` trains the first step from the
    start and writes its shards; ``resume_from_shards`` resumes from shards one process wrote after
    that step and trains the second. (folder, the one process after the first step, results)."""
    folder = tmp_path_factory.mktemp("sharded")
    inputs(folder / "write", small_model, None, FIRST)
    single = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    single.train(ScoredStep(rows=copy.deepcopy(FIRST)))
    inputs(folder / "resume", single.model, single.state_dict(), SECOND)
    single.save_optimizer(folder / "resume" / "optimizer")
    return folder, single, run_world([write_shards, resume_from_shards], 2, folder)


def adam_state(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    return {names[id(p)]: dict(s) for p, s in trainer.optimizer.state.items()}


def test_two_ranks_write_shards_that_one_process_resumes_from(small_model, world):
    folder, single, results = world
    out, written = results["write_shards"][0], folder / "write" / "optimizer"
    assert out["state"] == {"optimizer_format": "sharded", "updates": 1}
    assert (written / ".metadata").is_file()
    assert len(list(written.glob("*.distcp"))) == 2  # one file per rank

    resumed = Trainer(copy.deepcopy(small_model), TOKENIZER, config())
    resumed.model.load_state_dict(out["weights"])
    resumed.load_state_dict(out["state"], written)
    assert resumed.updates == 1
    want, got = adam_state(single), adam_state(resumed)
    assert want.keys() == got.keys() and want
    for name, slots in want.items():
        for slot, value in slots.items():
            torch.testing.assert_close(got[name][slot], value, rtol=1e-4, atol=1e-7, msg=f"{name}.{slot}")


def test_one_process_writes_shards_that_two_ranks_resume_from(world):
    _, single, results = world
    out = results["resume_from_shards"][0]
    single = copy.deepcopy(single)
    loss, _ = single.train(ScoredStep(rows=copy.deepcopy(SECOND)))
    assert out["loss"] == pytest.approx(loss, rel=1e-5) and out["state"]["updates"] == 2
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
