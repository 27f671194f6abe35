"""``[numerics]`` in pretraining and SFT: the model trains with its matmuls in the recipe's format
and its checkpoint holds plain high-precision weights (issue 13, part 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opencomposer.config import ModelConfig, load_recipe

SOURCES = Path(__file__).resolve().parents[2] / "src" / "opencomposer"
SMALL_MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.head_dim=8", "model.num_experts=4",
               "model.moe_intermediate_size=32"]


def _corpus():
    from opencomposer.model.corpus import CodeFile, Corpus

    files = [CodeFile("test", str(p.relative_to(SOURCES)), p.read_text()) for p in sorted(SOURCES.glob("rl/*.py"))]
    return Corpus(train=files[:-2], heldout=files[-2:])


def _assert_plain_checkpoint(folder: Path, trained: torch.nn.Module) -> None:
    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import is_converted

    loaded = load_model(ModelConfig(kind="hf", path=str(folder)))[0]
    assert not is_converted(loaded)
    expected = trained.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in expected.items())


@pytest.mark.parametrize("kind", ["tiny_moe", "tiny_deepseek_v3"])
def test_pretraining_trains_in_the_recipes_format(tmp_path: Path, tiny_tokenizer, kind: str):
    from opencomposer.numerics.convert import QuantizedExperts, QuantizedLinear
    from opencomposer.numerics.qlinear import matmul_recipe
    from opencomposer.pretrain.cpt import run_pretraining

    common = [f"model.kind={kind}", *SMALL_MODEL, "pretrain.max_steps=2", "pretrain.seq_len=32",
              "pretrain.batch_size=2", "pretrain.eval_batches=1", "pretrain.log_every=1", "pretrain.warmup_steps=1"]
    losses = {}
    for recipe in ("bf16", "mxfp8"):
        extra = [] if recipe == "bf16" else [f"numerics.recipe={recipe}", "numerics.quantize_linears=true"]
        config = load_recipe(None, [*common, *extra, f"run.out_dir={tmp_path}", f"run.name={recipe}"])
        model, _, result, checkpoint = run_pretraining(config, _corpus(), tiny_tokenizer, progress=False)
        losses[recipe] = result.first_loss
        assert all(torch.isfinite(torch.tensor(row["loss"])) for row in result.history if row["kind"] == "train")
        _assert_plain_checkpoint(checkpoint, model)
        experts = [m for m in model.modules() if isinstance(m, QuantizedExperts)]
        linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        if recipe == "bf16":
            assert not experts and not linears
        else:
            assert experts and linears
            assert all(m.recipe == matmul_recipe(config.numerics) for m in [*experts, *linears])
    # same initial weights, same first batch: only the format of the forward differs
    assert losses["mxfp8"] != losses["bf16"]
    assert losses["mxfp8"] == pytest.approx(losses["bf16"], abs=0.05)


@pytest.mark.bwrap
def test_sft_trains_in_the_recipes_format(tmp_path: Path):
    from opencomposer.numerics.convert import QuantizedExperts
    from opencomposer.numerics.qlinear import NVFP4Spec
    from opencomposer.pretrain.sft import run_sft

    common = [*SMALL_MODEL, "sft.task_family=tiny", "sft.num_tasks=2", "sft.steps=2", "sft.batch_size=2",
              "sft.warmup_steps=1"]
    losses = {}
    for recipe in ("bf16", "nvfp4_fwd_mxfp8_bwd"):
        config = load_recipe(None, [*common, f"numerics.recipe={recipe}", f"sft.out={tmp_path / recipe}"])
        model, _, result, out = run_sft(config, progress=False)
        losses[recipe] = result.first_loss
        _assert_plain_checkpoint(out, model)
        experts = [m for m in model.modules() if isinstance(m, QuantizedExperts)]
        assert len(experts) == (0 if recipe == "bf16" else 2)
        assert all(m.recipe.forward_input == NVFP4Spec("token", "exact", 0) for m in experts)
    assert losses["nvfp4_fwd_mxfp8_bwd"] != losses["bf16"]
    assert losses["nvfp4_fwd_mxfp8_bwd"] == pytest.approx(losses["bf16"], abs=0.1)
