"""The self-summary learning test (issue 14, slow): ``recipes/tiny-long.toml``'s three stages.

Pretraining (copy, code, a 256-token extension, append chains, the agent's window), SFT on the
oracle's self-summary episodes of the ``tiny-long`` family, then RL rewarded by the hidden test
alone, every model token of an episode's chain (its summaries included) carrying the episode's
advantage. Held-out tasks ask for word combinations training never shows; a task's K reads do not
fit the 2,560-token window, so an episode resolves only if its summaries carry the words found
so far. The pipeline runs once (a module fixture); the tests read its results.

Measured (docs/LOG.md, 2026-12-06, "RL raises what SFT leaves"): the recipe stops SFT at 1,350
steps, where the policy carries the words (summary retention 0.99) but the plan its summaries hand
on often drops a note or names one the task lacks (``summary_plan`` 0.32); held-out pass@1 0.31.
16 RL steps raised pass@1 to 0.54 and ``summary_plan`` to 0.41 (128 episodes each). 1,600 SFT
steps resolve ~99% (nothing left for RL to raise), 700 and 1,100 none.

Failing since 2026-12-07 (docs/LOG.md, "a test moved off a phase transition"): rerun from scratch
in another environment, the SFT policy resolves none of 64 held-out episodes at 1,350 or 1,600
steps, so the first assertion fails. Its corpus, and the tokenizer trained on it, were then a
sample of every installed package, which moves with the environment ("the corpus moved with the
environment"); the recipe now takes the standard library and torch. On that corpus the fixed
2,000-step copy phase ended before copying formed (seed 0), and nothing later formed it; the copy
phase now runs until the copy probe passes (``pretrain.phases.until``), and the three stages are
being rerun on it (issue 35).
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
    """Pretraining, SFT and RL of the recipe in one folder (~50 + 27 + 42 minutes on two cores)."""
    from opencomposer.pretrain.phases import run_phases
    from opencomposer.pretrain.sft import run_sft
    from opencomposer.rl.loop import run_rl

    root = tmp_path_factory.mktemp("tiny-long")
    base, sft = root / "tiny-long-base", root / "tiny-long-sft"
    common = [f"run.out_dir={root}"]
    run_phases(load_recipe(RECIPE, [*common, "run.name=tiny-long-base", "model.path="]), progress=False)
    # SFT and RL on two threads, as measured (docs/LOG.md); pretraining on the recipe's one
    two = [*common, "run.threads=2"]
    run_sft(load_recipe(RECIPE, [*two, f"sft.init={base / 'checkpoint'}", f"sft.out={sft}"]), progress=False)
    config = load_recipe(RECIPE, [*two, f"model.path={sft}"])
    return config, run_rl(config, progress=False)


@pytest.mark.timeout(3 * 3600)
def test_the_sft_policy_resolves_heldout_tasks_through_its_own_summaries(pipeline):
    _, summary = pipeline
    first = summary.first_eval  # before the first RL step: the SFT policy
    assert first["step"] == 0 and first["episodes_infra_error"] == 0
    assert 0.15 <= first["pass_at_1"] < first["best_of_k"], first  # resolves some, room and signal left
    assert first["summary_retention"] >= 0.9 and first["summary_spurious"] <= 0.05, first
    assert first["chain_summaries"] >= 3  # K = 3 to 6 notes: a summary after every read
    # the chains are real: the training rollouts summarised, several times an episode
    rows = [json.loads(line) for line in (summary.run_dir / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert min(r["summaries"] for r in rows if r["status"] != "infra_error") >= 1
    assert max(r["segments"] for r in rows) >= 3


@pytest.mark.timeout(3 * 3600)
def test_rl_through_self_summaries_raises_heldout_pass_at_1(pipeline):
    config, summary = pipeline
    first, last = summary.first_eval, summary.last_eval
    assert last["step"] == config.rl.steps and last["episodes_infra_error"] == 0
    assert last["pass_at_1"] >= first["pass_at_1"] + 0.1, summary.evaluations
    assert last["summary_plan"] > first["summary_plan"], summary.evaluations  # the summaries hand on a better plan
    assert last["summary_retention"] >= 0.9, summary.evaluations  # and still carry the words
