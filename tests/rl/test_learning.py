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
ASYNC_MARGIN = 0.08  # the same with one version of staleness: +0.10 to +0.20 over five runs of seed 0 (below)

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def decoy_share(rollouts: Path) -> float:
    """Share of a step's training rollouts that wrote the decoy word."""
    episodes = [json.loads(line) for line in rollouts.read_text().splitlines()]
    return sum('"content": "code' in e["final_turn"] for e in episodes) / len(episodes)


# The default selection's run: two thirds of the recipe's steps at twice its learning rate, evaluated
# before and after only (docs/rl.md, "Learning test"); the recipe itself runs in the slow set.
SHORT = ("rl.steps=16", "rl.lr=6e-4", "rl.lr_warmup_steps=3", "rl.eval_every=16", "rl.checkpoint_every=16")


@pytest.mark.parametrize(("seed", "rl_only"), [
    pytest.param(0, SHORT, id="short-0"),
    pytest.param(0, (), marks=pytest.mark.slow, id="recipe-0"),
    pytest.param(1, (), marks=pytest.mark.slow, id="recipe-1"),
    pytest.param(2, (), marks=pytest.mark.slow, id="recipe-2"),
])
def test_rl_raises_the_heldout_pass_rate_of_an_imperfectly_taught_model(tmp_path: Path, seed: int, rl_only: tuple):
    check_learning(tmp_path, seed, rl_only=rl_only)


@pytest.mark.slow
def test_async_rl_with_staleness_one_raises_the_heldout_pass_rate(tmp_path: Path):
    """The same recipe on the asynchronous services (sampling one version ahead of training).

    It learns, by less than the synchronous margin on this seed, and by an amount that varies from
    run to run (which version each group is sampled with follows the threads' timing): held-out
    pass@1 from 0.617 rose by +0.125 twice with the recipe's loss, +0.117 with a 10-step warm-up,
    +0.203 and +0.102 with the update clipped to the sampling policy (``ppo_clip``); the step at the
    end of the warm-up broke the turn's format in most rollouts of one run (training reward 0.01 at
    step 7) and the run recovered (docs/LOG.md, 2026-12-07). It passed +0.15 once (0.625 -> 0.797,
    2026-12-03), so the margin here is ``ASYNC_MARGIN``, below every gain measured since, and the
    decoy share must still fall."""
    summary = check_learning(tmp_path, 0, "rl.mode=async", "rl.max_staleness=1", margin=ASYNC_MARGIN)
    rows = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["kind"] == "train"]
    assert max(row["staleness_max"] for row in train) == 1  # it did sample ahead
    from opencomposer.rl.report import draw_report

    assert (summary.run_dir / "report" / "staleness.png") in draw_report(summary.run_dir)


def check_learning(tmp_path: Path, seed: int, *overrides: str, rl_only: tuple[str, ...] = (), margin: float = MARGIN):
    """SFT then RL on the recipe with ``overrides`` (``rl_only``: for the RL stage alone), and the
    learning test's assertions; returns the RL summary."""
    from opencomposer.commands.rl import rollout_source
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl

    sft_dir = tmp_path / "sft"
    common = [f"run.out_dir={tmp_path}", f"run.seed={seed}", f"sft.out={sft_dir}", f"model.path={sft_dir}", *overrides]
    run_sft(load_recipe(RECIPE, common), progress=False)
    config = load_recipe(RECIPE, [*common, *rl_only])
    summary = run_rl(config, progress=False, source=rollout_source(config))

    first, last = summary.first_eval, summary.last_eval
    assert first["step"] == 0 and last["step"] == config.rl.steps
    assert first["episodes_infra_error"] == last["episodes_infra_error"] == 0
    # the start is a partial solver: the teacher's coin flip, on phrasings SFT never showed
    assert 0.25 <= first["pass_at_1"] <= 0.75, first
    # RL raised the held-out pass rate by the margin
    assert last["pass_at_1"] >= first["pass_at_1"] + margin, summary.evaluations
    # by learning what the teacher got wrong: fewer training rollouts write the decoy in the last
    # four steps than in the first four (128 rollouts each; measured 0.42-0.50 -> 0.16-0.36 over the
    # recipe's 24 steps)
    rollouts = summary.run_dir / "rollouts"
    early = sum(decoy_share(rollouts / f"step-{s:06d}.jsonl") for s in range(1, 5)) / 4
    late = sum(decoy_share(rollouts / f"step-{s:06d}.jsonl") for s in range(config.rl.steps - 3, config.rl.steps + 1)) / 4
    assert late < early, (early, late)
    return summary
