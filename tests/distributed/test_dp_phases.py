"""``[[pretrain.phases]]`` at world size 2 equal one process: four phases (a short ``lm`` phase that
ends at its first evaluation, its ``until`` decided by rank 0 for every rank, a longer one with a new RoPE base and ``mtp``, an ``sft`` + ``mtp`` phase on the oracle's episodes,
and ``mtp`` alone, whose trunk gets no gradient: its experts must not move under EP either)
run data-parallel (rows split over the ranks), context-parallel (``parallel.cp = 2``: each row's
positions split, and the run stopped after step 2 and resumed from its checkpoint) and
expert-parallel (``parallel.ep = 2``: each MoE layer's experts split) give the same
losses, gradient norms, evaluations, checkpoint files and final weights as one process. The MoE
load-balancing term is off: it is per rank by design."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from opencomposer.distributed.runtime import World, context_parallel_groups, expert_parallel_groups
from tests.distributed.ranks import spawn_ranks
from tests.pretrain.test_phases import _config, _corpus

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]

THREE = ('{name="short", seq_len=32, steps=3, batch_size=4, warmup_steps=1, until="heldout_loss <= 1000"}, '
         '{name="long", seq_len=64, steps=2, batch_size=2, warmup_steps=1, rope_theta=1e5, losses=["lm", "mtp"]}, '
         '{name="sft", losses=["sft", "mtp"], steps=2, sft_batch_size=4, lr=1e-3, warmup_steps=1}')
DRAFT = '{name="draft", seq_len=32, steps=2, batch_size=2, losses=["mtp"], warmup_steps=1}'


def phases(ep: int) -> str:
    """The three phases, and under EP a fourth of ``mtp`` alone (refused under FSDP: its trunk
    forward has no gradient, so FSDP's backward hooks never run to reduce the MTP layers')."""
    return f"pretrain.phases=[{THREE}{', ' + DRAFT if ep > 1 else ''}]"

EXTRA = ["sft.task_family=tiny", "sft.num_tasks=3", "model.num_mtp_layers=1", "pretrain.eval_every=1",
         "pretrain.checkpoint_every=1"]


STOP_AT = 2  # the short phase ends at its first evaluation (step 1, its until): inside the long phase


class _Stopped(Exception):
    """Raised from ``on_step`` on every rank to stop the first run after its checkpoint."""


def _no_aux(phases) -> None:
    build = phases._build_model

    def without_aux(*args, **kwargs):
        model, tokenizer = build(*args, **kwargs)
        model.config.router_aux_loss_coef = 0.0
        return model, tokenizer

    phases._build_model = without_aux


def _rank(rank: int, port: int, cp: int, ep: int, folder: str) -> None:
    from opencomposer.pretrain import phases

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
            config, corpus, tokenizer = pickle.load(f)
        _no_aux(phases)
        ep_group, _ = expert_parallel_groups(2, ep, rank)
        world = World(rank, 2, cp=cp, cp_group=context_parallel_groups(2, cp, rank), ep=ep, ep_group=ep_group)
        if cp > 1:  # stopped after step 2 (inside the second phase) on every rank, then rerun
            def stop(step: int) -> None:
                if step == STOP_AT:
                    raise _Stopped

            with contextlib.suppress(_Stopped):
                phases.run_phases(config, corpus, tokenizer, progress=False, probes=2, world=world, on_step=stop)
        model, _, result = phases.run_phases(config, corpus, tokenizer, progress=False, probes=2, world=world)
        if rank == 0:
            with open(os.path.join(folder, "out.pkl"), "wb") as f:
                pickle.dump((result.history, {k: v.clone() for k, v in model.state_dict().items()}), f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_tokenizer):
    """The one-process run of a phase list (cached: the variants share the three-phase run)."""
    from opencomposer.pretrain import phases as module

    runs = {}

    def run(plan: str):
        if plan not in runs:
            folder = tmp_path_factory.mktemp("single")
            build = module._build_model
            try:
                _no_aux(module)
                model, _, result = module.run_phases(_config(folder, "run", plan, *EXTRA), _corpus(), tiny_tokenizer,
                                                     progress=False, probes=2)
            finally:
                module._build_model = build
            runs[plan] = folder / "run", result.history, model.state_dict()
        return runs[plan]

    return run


def files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and "tb" not in p.parts)


# The phased trainer at two ranks runs in the default selection through test_dp_sft.py (an SFT phase,
# data and context parallel); experts split over ranks through test_dp_rl_step.py. This file's three
# layouts are in the slow set.
@pytest.mark.parametrize(("cp", "ep"), [
    pytest.param(1, 1, marks=pytest.mark.slow, id="data"),
    pytest.param(2, 1, marks=pytest.mark.slow, id="context"),
    pytest.param(1, 2, marks=pytest.mark.slow, id="expert"),
])
def test_phases_at_world_size_2_equal_one_process(single, tmp_path, tiny_tokenizer, cp, ep):
    run_dir, history, weights = single(phases(ep))
    config = _config(tmp_path, "run", phases(ep), *EXTRA)
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump((config, _corpus(), tiny_tokenizer), f)
    spawn_ranks(_rank, 2, cp, ep, str(tmp_path))
    got_history, got_weights = pickle.loads((tmp_path / "out.pkl").read_bytes())

    assert files(tmp_path / "run") == files(run_dir)  # checkpoints, metrics, plots: the same layout
    logged = [[{k: v for k, v in json.loads(line).items() if k not in ("seconds", "time")}
               for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (tmp_path / "run", run_dir)]
    assert [(r["kind"], r["step"]) for r in logged[0]] == [(r["kind"], r["step"]) for r in logged[1]]
    if cp > 1:  # the rerun's own rows: those after the checkpoint it resumed from
        history = [r for r in history if r["step"] > STOP_AT]
    assert [(r["kind"], r["step"]) for r in got_history] == [(r["kind"], r["step"]) for r in history]
    compared = 0
    for got, want in zip(got_history, history, strict=True):
        for name, value in want.items():
            if name == "seconds":
                continue
            if not isinstance(value, float):
                assert got[name] == value, name
                continue
            assert got[name] == pytest.approx(value, rel=2e-4, abs=1e-6), (got["step"], name)
            compared += 1
    if cp == 1:  # the short phase took one of its three steps, on every rank alike
        assert [r["step"] for r in got_history if r["kind"] == "train" and r["phase"] == 0] == [1]
    phases_seen = {r["phase"] for r in history if r["kind"] == "train"}
    every = set(range(4 if ep > 1 else 3))
    assert phases_seen == (every if cp == 1 else every - {0}) and compared > 20
    assert any("sft_loss" in r for r in history) and any("mtp_kl" in r and "lm_loss" in r for r in history)
    # Adam divides by sqrt(v): an element whose gradient is rounding noise moves by up to lr either
    # way, whichever rounding the attention and reduction order gave (at Adam's first step every
    # element moves by lr·sign(g)). Data-parallel: every tensor within tolerance but for a few
    # embedding rows. Under CP (a dense masked attention instead of the single process's kernel,
    # and the MTP block's own) the MTP layers, trained from scratch in phase 2, differ in up to 8%
    # of their elements, up to 0.4 lr, and the trunk in about 1% (measured); under EP a few
    # elements of the MTP block (0.3% of one projection in one run, depending on the corpus the
    # package's files make) take the other sign. The losses, gradient norms and evaluations above
    # agree to 2e-4 at every step. So: most elements equal, none further than 2 lr per step.
    share = 0.9 if cp > 1 else 0.99 if ep > 1 else 0.999
    bound = 2 * 3e-3 * sum(r["kind"] == "train" for r in history)
    for name, value in weights.items():
        close = torch.isclose(got_weights[name], value, rtol=1e-4, atol=1e-5)
        assert close.float().mean() > share, (name, int((~close).sum()), close.numel())
        assert (got_weights[name] - value).abs().max() <= bound, name


def test_mtp_alone_is_refused_under_fsdp_before_training():
    from opencomposer.config import ConfigError, SFTConfig, load_recipe
    from opencomposer.pretrain.phases import check_world
    from opencomposer.pretrain.plan import plan_phases

    plan, sft = plan_phases(load_recipe(None, [phases(2)]).pretrain.phases), SFTConfig()
    with pytest.raises(ConfigError, match="draft.*mtp.*alone.*FSDP"):
        check_world(plan, World(0, 2), sft)
    with pytest.raises(ConfigError, match="draft.*mtp.*alone.*FSDP"):  # FSDP of the non-expert weights
        check_world(plan, World(0, 2, ep=2, ep_group=object(), ep_fsdp=True), sft)
    check_world(plan, World(0, 2, ep=2, ep_group=object()), sft)  # expert parallelism alone: fine
    check_world(plan, World(0, 1), sft)  # one process: fine
