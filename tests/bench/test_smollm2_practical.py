"""``benchmarks/smollm2_practical.py`` (issue 17): the script's ``--quick`` mode end to end.

SmolLM2-135M on two oracle episodes of real bug tasks (the sandbox plays them), one repeat of
every measurement at tiny sizes: the JSON has all six, each with two positive times and a
finite speed-up; bf16 autocast changes the SFT loss by well under 5% (the accuracy it trades is
small, whatever the speed); the shared-prefix forward computes the same loss up to bf16 rounding
(the two bf16 forwards round differently: on this CPU the full-sequence one lands further from
fp32), and counts the same FLOPs in either precision and fewer with the prefix computed once; the
turn-cap share is a share; the RL step ran the loop's rollouts and update on both sides. Speed-ups are not asserted: at these sizes, on a shared machine, they are noise (the
full run's numbers go to docs/LOG.md).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.bench import load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.bwrap]


def _script():
    return load_benchmark("smollm2_practical")


def test_quick_run_measures_every_speedup_side_by_side(tmp_path, smollm2, capsys):
    script = _script()
    out = tmp_path / "results" / "smollm2_practical.json"
    results = script.main(["--quick", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))

    measurements = results["measurements"]
    assert list(measurements) == list(script.MEASUREMENTS)
    for name, row in measurements.items():
        assert len(row["settings"]) == 2 and len(row["seconds"]) == 2, name
        assert all(seconds > 0 for seconds in row["seconds"]), (name, row["seconds"])
        assert math.isfinite(row["speedup"]) and row["speedup"] > 0, (name, row["speedup"])
    table = capsys.readouterr().out
    assert all(name in table for name in script.MEASUREMENTS) and "speed-up" in table

    bf16 = measurements["bf16"]
    assert all(math.isfinite(loss) and loss > 0 for loss in bf16["loss"])
    assert bf16["loss_rel_diff"] < 0.05, bf16["loss"]
    assert bf16["grad_norm_rel_diff"] < 0.25, bf16["grad_norm"]
    assert bf16["batch"]["shared_prefix_tokens"] > 1000  # the system prompt and tool list
    assert measurements["shared_prefix"]["loss_rel_diff"] < 0.05  # the same function, computed once
    # the FLOPs each step computes: the same products in either precision; the prefix once computes fewer
    assert bf16["flops"][0] == bf16["flops"][1] > 0
    assert measurements["shared_prefix"]["flops"][1] < measurements["shared_prefix"]["flops"][0]
    assert set(bf16["matmul_peak_tflops"]) == {"fp32", "bf16"} and all(v > 0 for v in bf16["matmul_peak_tflops"].values())
    assert all(0 < f < 10 for f in bf16["fraction_of_peak"])  # against the product's rate, not a bound

    kv = measurements["kv_cache"]
    assert kv["turns"] == 5 and kv["context_tokens"] == sorted(kv["context_tokens"])
    assert kv["prefill_tokens"][1] < kv["prefill_tokens"][0]  # the cache reuses each turn's prefix

    cap = measurements["turn_cap"]
    assert cap["caps"] == [32, 16]
    assert all(0.0 <= share <= 1.0 for share in cap["cap_hit_share"])
    assert all(0 < tokens <= limit for tokens, limit in zip(cap["tokens_per_turn"], cap["caps"]))

    step = measurements["rl_step"]
    assert step["episodes"] == 2 and step["target_s"] == 120.0  # --quick: one task x --group 2
    assert all(r > 0 for r in step["rollout_s"]) and all(t > 0 for t in step["train_s"])
    assert 0 < step["episode_tokens"] <= 2 * 8  # model tokens: --quick's two turns of 8 at most
