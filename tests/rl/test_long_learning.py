"""The self-summary learning test (issue 14, slow): ``recipes/tiny-long.toml``'s three stages.

Pretraining (copy, code, a 256-token extension, append chains, the agent's window), SFT on the
oracle's self-summary episodes of the ``tiny-long`` family, then RL rewarded by the hidden test
alone, every model token of an episode's chain (its summaries included) carrying the episode's
advantage. Held-out tasks ask for word combinations training never shows; a task's K reads do not
fit the 2,560-token window, so an episode resolves only if its summaries carry the words found
so far. The pipeline runs once (a module fixture); the tests read its results.

Measured (docs/LOG.md, 2026-12-06, "the tiny model carries the words"): the SFT stage alone
resolves 127 of 128 held-out episodes (summary retention 0.996), so RL has no room to raise
pass@1 at the recipe's window; shorter SFT runs (700 and 1,100 steps) resolve none, and at a
trigger after two reads the SFT policy resolves none either, so a starting point where RL has
both room and signal is not found yet. The RL test states that goal and is expected to fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny-long.toml"

pytestmark = [pytest.mark.integration, pytest.mark.bwrap, pytest.mark.slow]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Pretraining, SFT and RL of the recipe in one folder (~50 + 30 + 25 minutes on two cores)."""
    from opencomposer.pretrain.phases import run_phases
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl

    root = tmp_path_factory.mktemp("tiny-long")
    base, sft = root / "tiny-long-base", root / "tiny-long-sft"
    common = [f"run.out_dir={root}"]
    run_phases(load_recipe(RECIPE, [*common, "run.name=tiny-long-base", "model.path="]), progress=False)
    run_sft(load_recipe(RECIPE, [*common, f"sft.init={base / 'checkpoint'}", f"sft.out={sft}"]), progress=False)
    config = load_recipe(RECIPE, [*common, f"model.path={sft}"])
    return config, run_rl(config, progress=False)


@pytest.mark.timeout(3 * 3600)
def test_the_sft_policy_resolves_heldout_tasks_through_its_own_summaries(pipeline):
    _, summary = pipeline
    first = summary.first_eval  # before the first RL step: the SFT policy
    assert first["step"] == 0 and first["episodes_infra_error"] == 0
    assert first["pass_at_1"] >= 0.8, first
    assert first["summary_retention"] >= 0.9 and first["summary_spurious"] <= 0.05, first
    assert first["chain_summaries"] >= 3  # K = 3 to 6 notes: a summary after every read
    # the chains are real: the training rollouts summarised, several times an episode
    rows = [json.loads(line) for line in (summary.run_dir / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert min(r["summaries"] for r in rows if r["status"] != "infra_error") >= 1
    assert max(r["segments"] for r in rows) >= 3


@pytest.mark.timeout(3 * 3600)
@pytest.mark.xfail(reason="the SFT policy already resolves ~99% of held-out tasks: no room for RL to raise "
                          "pass@1 (docs/LOG.md, 2026-12-06)", strict=False)
def test_rl_through_self_summaries_raises_heldout_pass_at_1(pipeline):
    config, summary = pipeline
    first, last = summary.first_eval, summary.last_eval
    assert last["step"] == config.rl.steps and last["episodes_infra_error"] == 0
    assert last["pass_at_1"] > first["pass_at_1"], summary.evaluations
    assert last["summary_retention"] > first["summary_retention"], summary.evaluations
