"""``benchmarks/smollm2_bugs.py`` (issue 17) shrunk: SmolLM2-135M end to end on real bug tasks.

Every stage of the experiment at the smallest size at which SFT's effect shows (``--quick`` with
``SHOWS_SFT``: 8 demonstrations, 8 SFT steps, 2 RL steps, 2 held-out tasks x 2 samples) into
``tmp_path``: the pool is made and split, the base model
is evaluated, SFT's loss falls, the SFT model makes fewer format errors per turn than the base
model on the held-out tasks, RL steps run and are evaluated, the JSON and the plot are written,
and a rerun reuses every finished stage. Slow (about 10 minutes on two cores): the numbers of the
full run are in docs/LOG.md.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from tests.bench import load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.bwrap]


def _script():
    return load_benchmark("smollm2_bugs")


@pytest.mark.timeout(3600)  # ~10 minutes alone; 1,814 s in the slow set beside the tiny-long pipeline (2026-12-07)
def test_quick_run_end_to_end(tmp_path, smollm2):
    script = _script()
    argv = ["--quick", "--out-dir", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
            *(f"--set={override}" for override in script.SHOWS_SFT)]
    results = script.main(argv)
    assert json.loads((tmp_path / "results" / "smollm2_bugs_quick.json").read_text()) == results
    assert (tmp_path / "results" / "smollm2_bugs_quick.png").stat().st_size > 0

    pools = results["pools"]
    assert [pools[name]["tasks"] for name in ("sft", "rl", "heldout")] == [8, 2, 2]
    assert not set(pools["heldout"]["projects"]) & (set(pools["sft"]["projects"]) | set(pools["rl"]["projects"]))

    loss = [row["loss"] for row in results["sft_loss"]]
    assert len(loss) == 8 and loss[-1] < loss[0]
    base, sft = results["base"], results["rl_evals"][0]
    assert base["format_error_rate"] > sft["format_error_rate"]
    assert [row["step"] for row in results["rl_train"]] == [1, 2]
    assert [row["step"] for row in results["rl_evals"]] == [0, 2]
    for row in [base, *results["rl_evals"]]:
        assert 0.0 <= row["pass_at_1"] <= row["best_of_k"] <= 1.0 and not math.isnan(row["format_error_rate"])

    started = time.perf_counter()  # every stage is done: a rerun only reads and plots
    again = script.main(argv)
    assert time.perf_counter() - started < 60
    assert again["rl_evals"] == results["rl_evals"] and again["sft_loss"] == results["sft_loss"]
