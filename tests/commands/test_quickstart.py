"""``opencomposer quickstart`` end to end, shrunk: pretrain → SFT → RL → report, every stage real
(corpus, tokenizer, trainer, sandboxed harness, grader), each only a few steps long."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"

SHRUNK = {
    "run.threads": 1,
    # the standard library only: the eight steps' data, and whether their loss falls, fixed by the
    # Python version alone (the default corpus adds torch's files)
    "corpus.sources": '["stdlib"]',
    "corpus.max_files": 1000,
    "model.hidden_size": 32, "model.num_layers": 1, "model.head_dim": 8, "model.num_experts": 4,
    "model.moe_intermediate_size": 32,
    "pretrain.max_steps": 24, "pretrain.warmup_steps": 4, "pretrain.eval_every": 12, "pretrain.seq_len": 64,
    "sft.steps": 2, "sft.num_tasks": 2, "sft.batch_size": 2, "sft.warmup_steps": 1,
    "rl.steps": 1, "rl.batch_tasks": 1, "rl.group_size": 2, "rl.lr_warmup_steps": 0, "rl.eval_every": 1,
    "rl.eval_tasks": 1, "rl.eval_samples": 1, "rl.checkpoint_every": 1,
}


@pytest.mark.integration
@pytest.mark.bwrap
def test_quickstart_runs_every_stage_and_leaves_its_outputs(tmp_path, capsys):
    from opencomposer.cli import main

    overrides = [f"run.out_dir={tmp_path}", *(f"{k}={v}" for k, v in SHRUNK.items())]
    argv = ["quickstart", "--recipe", str(RECIPE)]
    for override in overrides:
        argv += ["--set", override]
    assert main(argv) == 0  # 0: the pretraining loss fell and every stage finished
    run = tmp_path / "quickstart"
    for path in ("checkpoint/config.json", "loss.png", "sft/config.json", "sft/recipe.toml", "sft-loss.png",
                 "rl/initial/config.json", "rl/summary.json", "rl/report.png", "report.html"):
        assert (run / path).is_file(), path
    rows = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("eval", 1)]
    assert all(r["episodes_infra_error"] == 0 for r in rows if r["kind"] == "eval")
    assert rows[1]["engine_rows"] == 2 and rows[1]["groups"] == 1  # one task, two rollouts, batched
    out, err = capsys.readouterr()
    assert "held-out pass@1" in out and f"report:  {run / 'report.html'}" in out
    # not a terminal: the trainers print plain progress lines, not bars
    assert "pretraining 24/24" in out and "sft 2/2" in out and "rl 1/1" in out

    page = (run / "report.html").read_text()
    for section in ("pretrain", "samples", "sft", "rl", "heldout", "cost", "recipe"):
        assert f'<section id="{section}">' in page, section
    for stage in ("pretraining", "SFT", "RL"):  # each stage's cost.json, its table on the page
        assert f"{stage} (" in page and "device-hours" in page, stage
    # self-contained: every image inline, every link an anchor of the page itself
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)  # pretrain, SFT, RL
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert "<link" not in page and "<script" not in page and "url(" not in page
    assert "held-out pass@1" in page
    # transformers' per-checkpoint bars and torchao's import complaints are silenced (model.loading)
    assert "Loading weights" not in out + err and "Writing model shards" not in out + err
    assert "Failed to load" not in out + err
