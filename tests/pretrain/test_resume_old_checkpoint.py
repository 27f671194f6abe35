"""A checkpoint written before the trainers became one still resumes: ``fixtures/phases-run`` is
the run folder the phased trainer of commit aa40e40 left when stopped after step 6 of 8 (two
phases of a 1-layer MoE on the synthetic corpus below; ``checkpoints/step-0000006``: ``model/``,
``trainer.pt``, ``state.json``, the layout docs/pretraining.md documents), and ``expected.json``
holds the train rows of that trainer's uninterrupted run. Resuming it must replay the same
batches (``data_crc``), schedule and losses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from opencomposer.config import load_recipe
from opencomposer.model.corpus import CodeFile, Corpus

FIXTURE = Path(__file__).parent / "fixtures" / "phases-run"
RECIPE = ["model.hidden_size=16", "model.num_layers=1", "model.head_dim=8", "model.num_experts=4",
          "model.moe_intermediate_size=16", "run.threads=1", "pretrain.eval_every=4", "pretrain.eval_batches=1",
          "pretrain.checkpoint_every=2",
          'pretrain.phases=[{name="short", seq_len=16, steps=4, batch_size=2, warmup_steps=1}, '
          '{name="long", seq_len=32, steps=4, batch_size=2, warmup_steps=1, rope_theta=1e5}]']


def synthetic_corpus() -> Corpus:
    """The 24 generated files the fixture was trained on (20 to train, 4 held out)."""
    rng = np.random.default_rng(5)
    names = ["alpha", "beta", "gamma", "delta", "value", "count", "total", "items", "index", "result"]

    def text(i: int) -> str:
        lines = []
        for j in range(30):
            a, b = rng.choice(names, 2)
            lines.append(f"def {a}_{i}_{j}({b}):\n    return {b} * {int(rng.integers(100))} + {a}_{j}\n")
        return "".join(lines)

    files = [CodeFile("core" if i % 3 else "rest", f"pkg{i % 5}/m{i}.py", text(i)) for i in range(24)]
    return Corpus(train=files[:20], heldout=files[20:])


def test_a_checkpoint_of_the_old_trainer_resumes_with_the_same_batches_and_losses(tmp_path: Path):
    from opencomposer.pretrain.phases import run_phases
    from opencomposer.training.metrics import read_metrics

    shutil.copytree(FIXTURE, tmp_path / "old")
    config = load_recipe(None, [*RECIPE, f"run.out_dir={tmp_path}", "run.name=old"])
    model, _, result = run_phases(config, synthetic_corpus(), progress=False, probes=0)
    assert result.resumed_from == tmp_path / "old" / "checkpoints" / "step-0000006"
    assert model.config.rope_parameters["rope_theta"] == 1e5
    rows = read_metrics(tmp_path / "old", "train")
    expected = json.loads((FIXTURE / "expected.json").read_text())
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == list(range(1, 9))
    assert [r["data_crc"] for r in rows] == [r["data_crc"] for r in expected]
    assert [r["lr"] for r in rows] == pytest.approx([r["lr"] for r in expected])
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in expected], abs=1e-4)
    assert (tmp_path / "old" / "checkpoint" / "model.safetensors").is_file()
