"""Checkpoints: atomic, complete, pruned, and a resumed trainer continues bit for bit."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import Config
from opencomposer.rl.checkpoint import (
    RunState,
    TaskRecord,
    latest_checkpoint,
    list_checkpoints,
    load_training_checkpoint,
    remove_partial,
    save_training_checkpoint,
)
from opencomposer.rl.trainer import Trainer
from opencomposer.types import Group, Task

from .test_trainer import episode


@pytest.fixture(scope="module")
def small(tiny_tokenizer):
    from opencomposer.model.loading import load_model
    from tests.training.test_forward import SMALL

    return load_model(SMALL, tiny_tokenizer, seed=11)


def config() -> Config:
    cfg = Config()
    cfg.rl.lr = 1e-3
    cfg.rl.kl.reference = "none"
    cfg.rl.kl.coef = 0.0
    return cfg


def groups(seed: int) -> list[Group]:
    rng = np.random.default_rng(seed)
    task = Task(id="t", instruction="x", repo=Path("."))
    return [Group(task, [episode(rng, r) for r in (1.0, 0.0, 0.0, 1.0)])]


def train(trainer: Trainer, seed: int) -> None:
    trainer.train(trainer.score(groups(seed)))


def load_model_folder(path: Path):
    from opencomposer.model.loading import load_model

    return load_model(str(path))


@pytest.mark.parametrize("optimizer_format", ["full", "sharded"])
def test_resumed_trainer_continues_bit_for_bit(small, tmp_path, optimizer_format):
    """Adam's state in ``trainer.pt`` or, ``trainer.optimizer_checkpoint = "sharded"``, in the
    checkpoint's ``optimizer/`` (torch.distributed.checkpoint; other world sizes:
    tests/distributed/test_sharded_checkpoint.py)."""
    model, tokenizer = small
    cfg = config()
    cfg.trainer.optimizer_checkpoint = optimizer_format
    straight = Trainer(copy.deepcopy(model), tokenizer, cfg)
    train(straight, 0)
    train(straight, 1)

    first = Trainer(copy.deepcopy(model), tokenizer, cfg)
    train(first, 0)
    state = RunState(step=1, cursor=4, trained=[TaskRecord(i, f"t{i}", 1) for i in range(3)]
                     + [TaskRecord(3, "t3", 1, "dropped", "group dropped: 1 of 2 episodes scored")])
    sharded = optimizer_format == "sharded"
    path = save_training_checkpoint(tmp_path, state, first.model, tokenizer, first.state_dict(), keep=2,
                                    write_optimizer=first.save_optimizer if sharded else None)
    assert (path / "optimizer" / ".metadata").is_file() == sharded
    torch.manual_seed(123)
    expected_draw = torch.rand(3)

    torch.manual_seed(999)  # disturb the RNG; loading must restore it
    loaded_state, trainer_state = load_training_checkpoint(path)
    resumed_model, resumed_tokenizer = load_model_folder(path / "model")
    resumed = Trainer(resumed_model, resumed_tokenizer, cfg)
    resumed.load_state_dict(trainer_state, path / "optimizer")
    assert loaded_state == state
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), expected_draw)
    train(resumed, 1)
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_rng_states_round_trip(small, tmp_path):
    model, tokenizer = small
    trainer = Trainer(copy.deepcopy(model), tokenizer, config())
    torch.manual_seed(5)
    np.random.seed(6)
    random.seed(7)
    path = save_training_checkpoint(tmp_path, RunState(step=2), trainer.model, tokenizer, trainer.state_dict(), keep=1)
    draws = (torch.rand(2).tolist(), np.random.rand(2).tolist(), [random.random() for _ in range(2)])
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    load_training_checkpoint(path)
    assert (torch.rand(2).tolist(), np.random.rand(2).tolist(), [random.random() for _ in range(2)]) == draws


def test_partial_checkpoints_are_never_listed_and_are_cleaned_up(small, tmp_path):
    model, tokenizer = small
    trainer = Trainer(copy.deepcopy(model), tokenizer, config())
    save_training_checkpoint(tmp_path, RunState(step=3), trainer.model, tokenizer, trainer.state_dict(), keep=2)
    # what a SIGKILL during the next save leaves behind: a hidden, half-written folder
    partial = tmp_path / "checkpoints" / ".step-000004.tmp4242"
    (partial / "model").mkdir(parents=True)
    (partial / "state.json").write_text('{"step": 4, "cur')
    trash = tmp_path / "checkpoints" / ".trash-step-000001-4242"
    trash.mkdir()
    assert latest_checkpoint(tmp_path).name == "step-000003"
    removed = remove_partial(tmp_path)
    assert sorted(p.name for p in removed) == sorted([partial.name, trash.name])
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000003"]


def test_only_the_newest_checkpoints_are_kept(small, tmp_path):
    model, tokenizer = small
    trainer = Trainer(copy.deepcopy(model), tokenizer, config())
    for step in range(1, 5):
        save_training_checkpoint(tmp_path, RunState(step=step), trainer.model, tokenizer, trainer.state_dict(), keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]
    assert sorted((tmp_path / "checkpoints" / "step-000004").iterdir()) == [
        tmp_path / "checkpoints" / "step-000004" / name for name in ("model", "state.json", "trainer.pt")
    ]


def test_task_records_say_trained_or_dropped_with_a_reason():
    old = RunState.from_json('{"step": 1, "cursor": 1, "trained": [{"index": 0, "task_id": "a", "step": 1}]}')
    assert old.trained == [TaskRecord(0, "a", 1, "trained", "")]  # checkpoints written before statuses
    dropped = TaskRecord(1, "b", 2, "dropped", "step skipped: no gradient")
    assert RunState.from_json(RunState(2, 2, [*old.trained, dropped]).to_json()).trained == [*old.trained, dropped]
    with pytest.raises(ValueError, match="reason"):
        TaskRecord(1, "b", 2, "dropped")
    with pytest.raises(ValueError, match="reason"):
        TaskRecord(1, "b", 2, "trained", "why")
    with pytest.raises(ValueError, match="status"):
        TaskRecord(1, "b", 2, "skipped", "x")
