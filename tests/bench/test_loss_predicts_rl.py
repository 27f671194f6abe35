"""``benchmarks/loss_predicts_rl.py`` (issue 15 part 4): the script's ``--quick`` mode end to end.

Three tiny pretraining budgets, each followed by SFT, the held-out loss and a two-step RL run in
the real harness, into ``tmp_path``: the JSON has every field the LOG entry reads, the budgets'
pretraining tokens increase, the losses are finite, the plot is written, and a rerun reuses every
finished stage instead of training again. The ordering itself is measured by the full run
(docs/LOG.md), not asserted: at quick sizes it is noise.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.bench import load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def _script():
    return load_benchmark("loss_predicts_rl")


def test_spearman_against_known_rankings():
    lpr = _script()
    assert lpr.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert lpr.spearman([1, 2, 3], [10, 30, 20]) == pytest.approx(0.5)
    assert lpr.spearman([1, 2, 3, 4], [1, 1, 2, 2]) == pytest.approx(2 / math.sqrt(5))
    assert math.isnan(lpr.spearman([1, 2, 3], [5, 5, 5]))


def test_ordering_counts_lower_loss_higher_outcome_pairs():
    lpr = _script()
    budgets = [{"heldout_loss_after_sft": loss, "heldout_loss_after_pretrain": loss + 1,
                "pass_at_1": {"0": v, "8": v}, **dict.fromkeys(lpr.OUTCOMES, v)}
               for loss, v in ((6.0, 0.1), (5.5, 0.3), (5.0, 0.2))]
    check = lpr.ordering(budgets)
    for key in [*lpr.OUTCOMES, "pass_at_1_step_0", "pass_at_1_step_8"]:
        assert check[key]["pairs"] == 3 and check[key]["pairs_in_order"] == 2
        assert check[key]["report_ordering_holds"] is False
        assert check[key]["spearman_rho"] == pytest.approx(-0.5)
    assert check["loss_after_sft_falls_with_budget"] is True


@pytest.mark.slow  # the script's whole path; its resume is what this adds to test_benchmarks_quick.py's run
def test_quick_run_writes_the_table_json_and_plot_and_resumes(tmp_path, capsys):
    lpr = _script()
    argv = ["--quick", "--out-dir", str(tmp_path / "work"), "--results", str(tmp_path / "results")]
    result = lpr.main(argv)
    saved = json.loads((tmp_path / "results" / "loss_predicts_rl.json").read_text())
    assert (tmp_path / "results" / "loss_predicts_rl.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "| pretrain steps |" in out and "Spearman rho" in out

    budgets = saved["budgets"]
    assert [b["pretrain_steps"] for b in budgets] == lpr.QUICK_STEPS
    tokens = [b["pretrain_tokens"] for b in budgets]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3 and tokens[0] > 0
    rl = saved["rl"]
    eval_steps = [str(s) for s in range(0, rl["steps"] + 1, rl["eval_every"])]
    for b in budgets:
        for key in ("heldout_loss_after_pretrain", "heldout_loss_after_sft"):
            assert math.isfinite(b[key]) and 0 < b[key] < 20
        assert math.isfinite(b["sft"]["loss_last"]) and b["heldout_tokens"] > 0
        assert len(b["reward_per_step"]) == rl["steps"] and all(math.isfinite(r) for r in b["reward_per_step"])
        assert list(b["pass_at_1"]) == eval_steps
        assert all(0 <= p <= 1 for p in b["pass_at_1"].values())
        assert b["pass_at_1_before_rl"] == b["pass_at_1"]["0"]
        assert list(b["rl"]) == ["0"] and len(b["rl"]["0"]["reward"]) == rl["steps"]
    for key in [*lpr.OUTCOMES, *(f"pass_at_1_step_{s}" for s in eval_steps)]:
        check = saved["ordering"][key]
        assert check["pairs"] <= 3 and isinstance(check["report_ordering_holds"], bool)
        assert math.isnan(check["spearman_rho"]) or -1 <= check["spearman_rho"] <= 1

    # a rerun finds every stage done: same numbers, nothing trained again
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "work").rglob("model.safetensors")}
    again = lpr.main(argv)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "work").rglob("model.safetensors")} == before
    assert again["budgets"][2]["heldout_loss_after_sft"] == result["budgets"][2]["heldout_loss_after_sft"]
    assert again["budgets"][1]["reward_per_step"] == result["budgets"][1]["reward_per_step"]
    assert "pretraining cached" in capsys.readouterr().out
