"""SFT (``opencomposer sft``): the imperfect teacher, the loss against a plain forward, and a checkpoint
that lands whole with its metrics (the schedule is ``tests/training/test_schedule.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import ConfigError, ModelConfig, SFTConfig, load_recipe


def test_wrong_share_makes_that_many_demonstrations_write_the_decoy(tmp_path: Path):
    from opencomposer.pretrain.sft import demonstration_tasks

    config = load_recipe(None, ["sft.task_family=tiny-composed", "sft.num_tasks=16", "sft.wrong_share=0.25"])
    tasks = demonstration_tasks(config, tmp_path)
    wrote = ["+code" in t.gold_patch.splitlines() for t in tasks]
    assert sum(wrote) == 4  # a quarter of 16
    assert all('"node"' in t.instruction for t in tasks)  # every request still asks for "node"
    assert all("+node" in t.gold_patch.splitlines() for t, w in zip(tasks, wrote, strict=True) if not w)
    again = demonstration_tasks(config, tmp_path / "again")
    assert wrote == ["+code" in t.gold_patch.splitlines() for t in again]  # the same demonstrations per seed
    honest = demonstration_tasks(load_recipe(None, ["sft.task_family=tiny-composed", "sft.num_tasks=16"]), tmp_path / "h")
    assert not any("+code" in t.gold_patch.splitlines() for t in honest)


@pytest.mark.parametrize(("overrides", "message"), [
    (["sft.task_family=tiny", "sft.wrong_share=1.0"], "wrong_share"),
    (["sft.task_family=tiny", "sft.wrong_share=-0.1"], "wrong_share"),
    (["sft.tasks=somewhere", "sft.wrong_share=0.5"], "tiny families only"),
    (["sft.task_family=tiny", "sft.wrong_share=0.5", "sft.decoy_word=two words"], "decoy_word"),
])
def test_bad_wrong_share_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, overrides)


def test_a_decoy_the_family_asks_for_is_refused(tmp_path: Path):
    from opencomposer.pretrain.sft import demonstration_tasks

    config = load_recipe(None, ["sft.task_family=tiny-words", "sft.num_tasks=40", "sft.wrong_share=0.5",
                                "sft.decoy_word=tree"])
    with pytest.raises(ConfigError, match="decoy_word"):
        demonstration_tasks(config, tmp_path)


@pytest.fixture(scope="module")
def tiny_demonstrations(tmp_path_factory, tiny_tokenizer):
    """Four oracle demonstrations of the tiny family, their longest row, and a small fresh model
    (recorded once for the module's tests)."""
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.sft import demonstration_tasks, record_demonstrations
    from opencomposer.training.packing import episode_rows
    from tests.training.test_forward import SMALL

    config = load_recipe(None, ["sft.task_family=tiny", "sft.num_tasks=4"])
    episodes = record_demonstrations(demonstration_tasks(config, tmp_path_factory.mktemp("demos")), tiny_tokenizer,
                                     config)
    longest = max(len(row) for row in episode_rows(episodes))
    model, tokenizer = load_model(SMALL, tiny_tokenizer, seed=1)
    return episodes, longest, model, tokenizer


@pytest.mark.bwrap
def test_sft_loss_is_the_mean_over_model_tokens_and_falls(tiny_demonstrations):
    import copy

    from opencomposer.pretrain.sft import sft
    from opencomposer.training.packing import episode_rows

    episodes, _, fresh, tokenizer = tiny_demonstrations
    model = copy.deepcopy(fresh)
    before = copy.deepcopy(model)
    # independent: a plain forward per demonstration, −log p of each model-written token, averaged
    total, count = 0.0, 0
    for row in episode_rows(episodes):
        with torch.no_grad():
            logits = before(input_ids=torch.from_numpy(row.input_ids)[None]).logits[0].double()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(row.target_ids)[:, None])[:, 0]
        total -= float(logp[torch.from_numpy(row.loss_mask)].sum())
        count += int(row.loss_mask.sum())
    result = sft(model, tokenizer, episodes, SFTConfig(steps=30, batch_size=4, lr=5e-3, warmup_steps=2), progress=False)
    assert result.history[0]["loss"] == pytest.approx(total / count, rel=1e-4)  # the first batch is every row
    assert result.history[0]["sft_tokens"] == count
    assert result.last_loss < 0.5 * result.first_loss
    assert np.isfinite([h["loss"] for h in result.history]).all()


@pytest.mark.bwrap
def test_packed_sft_steps_equal_the_padded_ones(tiny_demonstrations):
    """``sft.pack_tokens``: the demonstrations of a step share rows, each attending to itself only;
    every step's loss is that of one padded row each."""
    import copy

    from opencomposer.pretrain.sft import sft

    episodes, longest, model, tokenizer = tiny_demonstrations
    import opencomposer.training.packing as packing

    packed_rows = []
    original = packing.pack_rows

    def spy(rows, max_tokens):
        out = original(rows, max_tokens)
        packed_rows.extend(len(row.parts) for row in out)
        return out

    results = {}
    for pack in (0, 2 * longest):
        trained = copy.deepcopy(model)
        packing.pack_rows = spy
        try:
            result = sft(trained, tokenizer, episodes, SFTConfig(steps=3, batch_size=4, lr=5e-3, warmup_steps=0,
                                                                  pack_tokens=pack), progress=False)
        finally:
            packing.pack_rows = original
        results[pack] = [h["loss"] for h in result.history]
    assert packed_rows and max(packed_rows) > 1  # the packed run did share rows
    # the later losses are of the updated weights (Adam's first steps move each weight by about
    # ±lr, so the weights themselves differ where a gradient is near 0 and rounding flips its sign)
    assert results[2 * longest] == pytest.approx(results[0], rel=1e-4)
    assert results[0][-1] < results[0][0]


@pytest.mark.bwrap
def test_micro_batched_sft_steps_equal_the_whole_step(tiny_demonstrations):
    """``sft.micro_batch_tokens``: the step's rows in several forwards and backwards, each divided
    by the whole step's tokens, give the step's loss and gradient (the same Adam update), also
    with packed rows."""
    import copy

    from opencomposer.pretrain.sft import sft

    episodes, longest, model, tokenizer = tiny_demonstrations
    import opencomposer.pretrain.losses as losses

    forwards = []
    original = losses.model_token_nll

    def counting(*args, **kwargs):
        forwards.append(args[1].input_ids.shape[0])
        return original(*args, **kwargs)

    results = {}
    for name, micro, pack in (("whole", 0, 0), ("micro", longest, 0), ("packed-micro", 2 * longest, 2 * longest)):
        trained = copy.deepcopy(model)
        forwards.clear()
        losses.model_token_nll = counting
        try:
            result = sft(trained, tokenizer, episodes, SFTConfig(steps=2, batch_size=4, lr=5e-3, warmup_steps=0,
                                                                  micro_batch_tokens=micro, pack_tokens=pack),
                         progress=False)
        finally:
            losses.model_token_nll = original
        results[name] = [h["loss"] for h in result.history]
        if name == "whole":
            assert forwards == [4, 4]
        else:
            assert len(forwards) > 2 and max(forwards) < 4, (name, forwards)  # the steps ran in parts
    # the second step's loss is of the updated weights (weights themselves are not compared: Adam's
    # first steps move each by about ±lr, and a gradient near 0 can flip sign with the summation order)
    for name in ("micro", "packed-micro"):
        assert results[name] == pytest.approx(results["whole"], rel=1e-4)


def test_bad_micro_batch_tokens_are_refused():
    with pytest.raises(ConfigError, match="sft.micro_batch_tokens"):
        load_recipe(None, ["sft.micro_batch_tokens=10"])


@pytest.mark.bwrap
def test_run_sft_writes_a_loadable_checkpoint_whole(tmp_path: Path):
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.sft import run_sft

    out = tmp_path / "sft-out"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")  # replaced as a whole, not merged into
    config = load_recipe(None, [
        "model.hidden_size=32", "model.num_layers=1", "model.head_dim=8", "model.num_experts=4",
        "model.moe_intermediate_size=32", "sft.task_family=tiny", "sft.num_tasks=2", "sft.steps=2",
        "sft.batch_size=2", "sft.warmup_steps=1", f"sft.out={out}",
    ])
    trained, _, result, path = run_sft(config, progress=False)
    assert path == out and result.steps == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft-out"]  # no temporary folder left beside it
    assert not (out / "stale.txt").exists() and (out / "recipe.toml").is_file()
    from opencomposer.training.metrics import read_metrics

    rows = read_metrics(out)  # the loss of every step, moved in with the weights
    assert [(r["kind"], r["step"]) for r in rows] == [("train", 1), ("train", 2)]
    assert [r["loss"] for r in rows] == [h["loss"] for h in result.history]
    assert list((out / "tb").glob("events.out.tfevents.*"))
    model, _ = load_model(ModelConfig(kind="hf", path=str(out)))
    loaded, expected = model.state_dict(), trained.state_dict()
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():  # the checkpoint holds the trained weights, bit for bit
        assert torch.equal(loaded[name], tensor), name
