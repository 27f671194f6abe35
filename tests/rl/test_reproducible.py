"""Reproducibility: one recipe and seed give the same RL run, bit for bit, whatever the timing.

The batching front-end gathers whichever episodes are waiting into one engine call, so which
rows share a batch follows thread timing and the number of rollout workers. The sampler's rows
are batch-invariant (``inference.invariant``), the trainer's batches follow the task stream, so
two runs of ``recipes/rl-tiny.toml`` (shrunk, from a random-init model: near-uniform logits, the
hardest case for a sampler) must write the same rollouts and end with the same weights, one run
with every episode of a step at once and one with three at a time; with the sampler and trainer
in NVFP4 too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opencomposer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl-tiny.toml"
STEPS = 2
SHRUNK = [
    "model.path=", f"rl.steps={STEPS}", "rl.batch_tasks=2", "rl.group_size=4", "rl.eval_every=0",
    f"rl.checkpoint_every={STEPS}", "sampling.max_new_tokens=24",
]

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


NUMERICS = {
    "bf16": [],
    # the report's split with the sampler in the trainer's format (inference.invariant follows the
    # converted modules); per-token activation scales keep every row on its own
    "nvfp4": ["numerics.recipe=nvfp4_fwd_mxfp8_bwd", "numerics.quantize_dispatch=true"],
}


@pytest.mark.parametrize("numerics", list(NUMERICS))
def test_two_runs_of_one_recipe_give_the_same_rollouts_and_weights(tmp_path: Path, numerics: str):
    from safetensors.torch import load_file

    from opencomposer.rl.loop import run_rl

    runs = {}
    for name, workers in (("all-at-once", 0), ("three-at-a-time", 3)):
        config = load_recipe(RECIPE, [*SHRUNK, *NUMERICS[numerics], f"run.out_dir={tmp_path / name}",
                                      f"rl.rollout_workers={workers}"])
        runs[name] = run_rl(config, progress=False).run_dir
    first, second = runs.values()

    for step in range(1, STEPS + 1):
        path = Path("rollouts") / f"step-{step:06d}.jsonl"
        assert (first / path).read_text() == (second / path).read_text(), f"step {step}"
    a = load_file(first / f"checkpoints/step-{STEPS:06d}/model/model.safetensors")
    b = load_file(second / f"checkpoints/step-{STEPS:06d}/model/model.safetensors")
    assert a.keys() == b.keys()
    assert [name for name in a if not torch.equal(a[name], b[name])] == []
    initial = load_file(first / "initial/model.safetensors")
    assert any(not torch.equal(a[name], initial[name]) for name in a)  # the run did train
