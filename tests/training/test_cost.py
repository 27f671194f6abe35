"""What every run cost (``training.cost``): the FLOP formula against torch's own count on the tiny
MoE, the sampler's accounting on a hand-made episode, the prices, the table, and the ``cost.json``
and ``report.html`` each kind of run leaves (pretraining, SFT, RL; evaluation through the meter it
will call)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opencomposer.config import ConfigError, load_recipe
from opencomposer.config.run import RunConfig
from opencomposer.training.cost import (
    COST_FILE,
    CostMeter,
    ModelShape,
    cost_table_html,
    finish,
    model_shape,
    price_per_hour,
    resolve_device_name,
)
from opencomposer.types import Episode, Segment, TokenKind, Turn

SMALL_MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
               "model.head_dim=16", "model.num_experts=4", "model.top_k=2", "model.moe_intermediate_size=32"]


@pytest.fixture(scope="module")
def tiny_moe_model():
    from opencomposer.model.loading import load_model

    model, _ = load_model(load_recipe(None, SMALL_MODEL).model, seed=0)
    # every matrix product as an op FlopCounterMode sees: eager attention, experts one by one
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model


def test_active_parameters_count_top_k_of_the_experts_and_the_tied_head(tiny_moe_model):
    shape = model_shape(tiny_moe_model)
    config = tiny_moe_model.config
    h, v, e, k, f = config.hidden_size, config.vocab_size, 4, 2, 32
    attention = h * 4 * 16 + 2 * (h * 2 * 16) + 4 * 16 * h  # q, k, v, o
    experts = k * (h * 2 * f + f * h)  # top_k of gate_up and down
    assert shape == ModelShape(2 * (attention + experts + e * h) + v * h, 2, 4 * 16)


@pytest.mark.parametrize("backward", [False, True])
def test_flop_formula_matches_torchs_count_on_the_tiny_moe(tiny_moe_model, backward):
    from torch.utils.flop_counter import FlopCounterMode

    rows, length = 2, 48
    ids = torch.randint(0, tiny_moe_model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
    meter = CostMeter("rl", RunConfig(), tiny_moe_model)
    with FlopCounterMode(display=False) as counter:
        logits = tiny_moe_model(input_ids=ids).logits
        if backward:
            logits.float().sum().backward()
    (meter.train_rows if backward else meter.forward_rows)("trained" if backward else "reference", [length] * rows)
    predicted = meter.flops["trained" if backward else "reference"]
    assert predicted == pytest.approx(counter.get_total_flops(), rel=0.01)
    tiny_moe_model.zero_grad(set_to_none=True)


def _turn(sampled: int, observation: int) -> Turn:
    return Turn(token_ids=[1] * sampled, logprobs=[0.0] * sampled, token_kinds=[TokenKind.TOOL_CALL] * sampled,
                observation_ids=[2] * observation)


def test_sampler_accounting_of_an_episode_golden(tmp_path):
    """Prompt 10; turn 1 samples 5 and gets a tool output of 3; turn 2 samples 4. With N = 100, L = 1,
    W = 1: turn 1 prefills 10 (2·100·10 + 4·10·10), samples 5 after 10 (2·100·5 + 4·(5·10 + 15));
    turn 2 prefills the 3 after 15 cached (2·100·3 + 4·3·18), samples 4 after 18 (2·100·4 + 4·(4·18 + 10))."""
    meter = CostMeter("eval", RunConfig())
    meter.shape = ModelShape(100, 1, 1)
    meter.episode(Episode(task_id="t", segments=[Segment(prompt_ids=[0] * 10, turns=[_turn(5, 3), _turn(4, 0)])]))
    assert {s: meter.tokens[s] for s in ("prefilled", "cached", "sampled")} == {"prefilled": 13, "cached": 15,
                                                                                "sampled": 9}
    assert meter.flops["prefilled"] == (2000 + 400) + (600 + 216)
    assert meter.flops["sampled"] == (1000 + 4 * 65) + (800 + 4 * 82)
    assert meter.flops["cached"] == 0
    # what an evaluation run calls (bench.eval): its cost.json, and the fragment for its page
    written = json.loads(json.dumps(meter.write(tmp_path)))
    assert json.loads((tmp_path / COST_FILE).read_text()) == written and written["kind"] == "eval"
    assert "tokens: sampled</td><td>9" in cost_table_html(written)


def test_prices_devices_and_their_checks():
    assert price_per_hour(RunConfig(cost_device="H100"), "H100") == 2.5
    assert price_per_hour(RunConfig(cost_device="TPU", cost_per_hour=4.0), "TPU") == 4.0
    assert resolve_device_name(RunConfig(device="cpu")) == "cpu"
    with pytest.raises(ConfigError, match="has no known price"):
        RunConfig(cost_device="TPU")
    with pytest.raises(ConfigError, match="run.cost_per_hour: must be >= 0"):
        RunConfig(cost_per_hour=-1.0)


def test_cost_json_adds_up_over_a_resume_and_the_table_shows_dollars(tmp_path):
    run = RunConfig(device="cpu", cost_device="H100")
    meter = CostMeter("rl", run, devices=2)
    meter.train_rows("trained", [10, 20])
    first = meter.write(tmp_path)
    resumed = CostMeter("rl", run, devices=2)
    resumed.resume(tmp_path)
    resumed.train_rows("trained", [5])
    cost = finish(resumed, tmp_path, "a run")
    assert cost["tokens"]["trained"] == 35 and cost["processes"] == 2 and cost["flops"] is None
    assert cost["device_s"] >= first["device_s"] and cost["dollars"] == pytest.approx(cost["device_hours"] * 2.5)
    assert json.loads((tmp_path / COST_FILE).read_text()) == cost
    page = (tmp_path / "report.html").read_text()
    assert "dollars" in page and "$2.50" in page and "6·N·T + 12·L·W·T²" in page
    assert "tokens: trained" in cost_table_html(cost)


def _check_cost(folder: Path, kind: str, stages: set[str]) -> dict:
    cost = json.loads((folder / COST_FILE).read_text())
    assert cost["kind"] == kind and {s for s, n in cost["tokens"].items() if n} == stages
    assert cost["flops"]["total"] > 0 and cost["wall_s"] > 0 and cost["peak_memory_bytes"] > 2**20
    assert cost["device"] == "cpu" and cost["dollars"] == pytest.approx(cost["device_s"] / 3600 * 0.10)
    assert "Cost" in (folder / "report.html").read_text()
    return cost


def test_pretraining_writes_its_cost(tmp_path, tiny_tokenizer):
    from opencomposer.pretrain.phases import run_phases
    from tests.pretrain.test_phases import _corpus

    phases = 'pretrain.phases=[{name="lm", seq_len=32, steps=2, batch_size=2, warmup_steps=1, lr=3e-3}]'
    config = load_recipe(None, [*SMALL_MODEL, phases, f"run.out_dir={tmp_path}", "run.name=pre", "run.device=cpu",
                                "run.threads=1", "pretrain.eval_every=100", "pretrain.eval_batches=1",
                                "pretrain.checkpoint_every=0"])
    run_phases(config, _corpus(), tiny_tokenizer, progress=False, probes=0)
    cost = _check_cost(tmp_path / "pre", "pretrain", {"pretraining"})
    assert cost["tokens"]["pretraining"] == 2 * 2 * 32


@pytest.mark.bwrap
def test_sft_writes_its_cost(tmp_path):
    from opencomposer.pretrain.sft import run_sft

    config = load_recipe(None, [*SMALL_MODEL, "run.device=cpu", "sft.task_family=tiny", "sft.num_tasks=2",
                                "sft.steps=2", "sft.batch_size=2", "sft.warmup_steps=1", f"sft.out={tmp_path / 'sft'}"])
    run_sft(config, progress=False)
    _check_cost(tmp_path / "sft", "sft", {"sft"})


@pytest.mark.integration
@pytest.mark.bwrap
def test_rl_writes_its_cost(tmp_path):
    from opencomposer.rl.loop import run_rl

    config = load_recipe(None, [*SMALL_MODEL, "run.threads=1", "run.device=cpu", "sampling.max_new_tokens=12",
                                "grading.lint=false", "rl.task_family=tiny", "rl.batch_tasks=2", "rl.group_size=2",
                                "rl.steps=1", "rl.eval_every=0", f"run.out_dir={tmp_path}", "run.name=rl"])
    run_rl(config, progress=False)
    cost = _check_cost(tmp_path / "rl", "rl", {"prefilled", "sampled", "reference", "trained"})
    assert "Hack monitor" in (tmp_path / "rl" / "report.html").read_text()
    assert cost["tokens"]["trained"] == cost["tokens"]["reference"] >= cost["tokens"]["sampled"] > 0
