"""The RL learning test (issue 4): ``opencomposer rl`` makes a model better, on CPU, in minutes.

Everything is real: SFT records its demonstrations through the harness and the sandbox, RL samples
with the local engine, grades every episode with the hidden test in a sandbox, and trains the
tiny MoE with the composer loss. ``recipes/rl-tiny.toml`` is the setup (docs/rl.md, "Learning
test"): an imperfect teacher makes the SFT model write the decoy word "code" instead of "node"
about half of the time, whatever the phrasing; RL sees only the test's verdict and must raise the
pass rate on held-out phrasings, ones it never trains on. The evaluation uses a fixed seed set
(the same 32 held-out tasks × 4 samples, the same sampling seeds, before and after).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl-tiny.toml"
MARGIN = 0.15  # held-out pass@1 after RL minus before; measured gains are listed in docs/rl.md

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def decoy_share(rollouts: Path) -> float:
    """Share of a step's training rollouts that wrote the decoy word."""
    episodes = [json.loads(line) for line in rollouts.read_text().splitlines()]
    return sum('"content": "code' in e["final_turn"] for e in episodes) / len(episodes)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_rl_raises_the_heldout_pass_rate_of_an_imperfectly_taught_model(tmp_path: Path, seed: int):
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl

    sft_dir = tmp_path / "sft"
    config = load_recipe(RECIPE, [f"run.out_dir={tmp_path}", f"run.seed={seed}", f"sft.out={sft_dir}",
                                  f"model.path={sft_dir}"])
    run_sft(config, progress=False)
    summary = run_rl(config, progress=False)

    first, last = summary.first_eval, summary.last_eval
    assert first["step"] == 0 and last["step"] == config.rl.steps
    assert first["episodes_infra_error"] == last["episodes_infra_error"] == 0
    # the start is a partial solver: the teacher's coin flip, on phrasings SFT never showed
    assert 0.25 <= first["pass_at_1"] <= 0.75, first
    # RL raised the held-out pass rate by the margin
    assert last["pass_at_1"] >= first["pass_at_1"] + MARGIN, summary.evaluations
    # by learning what the teacher got wrong: fewer training rollouts write the decoy in the last
    # four steps than in the first four (128 rollouts each; measured 0.42-0.50 -> 0.16-0.36)
    rollouts = summary.run_dir / "rollouts"
    early = sum(decoy_share(rollouts / f"step-{s:06d}.jsonl") for s in range(1, 5)) / 4
    late = sum(decoy_share(rollouts / f"step-{s:06d}.jsonl") for s in range(config.rl.steps - 3, config.rl.steps + 1)) / 4
    assert late < early, (early, late)
