"""``opencomposer rl`` at ``trainer.world_size = 2`` end to end (gloo, 2 processes, the tiny recipe),
data-, context- (``parallel.cp = 2``) and expert-parallel (``parallel.ep = 2``, alone and with FSDP of the
other weights): the same run folder layout, the same
exactly-once record and the same weights as world size 1; and the async services
(``rl.mode = "async"``, staleness 0, which trains what the synchronous loop trains) on two
ranks, data- or context-parallel: the same record and weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# the data-parallel run is the default selection's world-size-2 RL run; the other layouts, the
# async run on two ranks and the sharded resume are slow (their pieces have tests of their own:
# tests/distributed/test_dp_rl_step.py for every layout's step, tests/services for async)
pytestmark = [pytest.mark.integration, pytest.mark.bwrap]
SLOW = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl-tiny.toml"
SHRUNK = ["model.path=", "rl.steps=2", "rl.batch_tasks=2", "rl.group_size=4", "rl.eval_every=0",
          "rl.checkpoint_every=2", "sampling.max_new_tokens=24"]


def run(tmp_path: Path, world_size: int, cp: int = 1, *extra: str) -> Path:
    name = f"ws{world_size}-cp{cp}"
    sets = [a for s in [*SHRUNK, f"run.out_dir={tmp_path}", f"run.name={name}", f"trainer.world_size={world_size}",
                        f"parallel.cp={cp}", *extra]
            for a in ("--set", s)]
    subprocess.run([sys.executable, "-m", "opencomposer.cli", "rl", "--recipe", str(RECIPE), *sets], check=True,
                   timeout=900)
    return tmp_path / name


def files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and "tb" not in p.parts)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("single"), 1)


@pytest.mark.parametrize(("cp", "extra"), [(1, ()), pytest.param(2, (), marks=SLOW),
                                           pytest.param(1, ("parallel.ep=2",), marks=SLOW),
                                           pytest.param(1, ("parallel.ep=2", "parallel.ep_fsdp=true"), marks=SLOW)],
                         ids=["data", "context", "expert", "expert-fsdp"])
def test_an_rl_run_at_world_size_2_equals_world_size_1(single: Path, tmp_path: Path, cp: int, extra: tuple):
    from safetensors.torch import load_file

    one, two = single, run(tmp_path, 2, cp, *extra)
    assert files(one) == files(two)
    a = load_file(one / "checkpoints/step-000002/model/model.safetensors")
    b = load_file(two / "checkpoints/step-000002/model/model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-6 for k in a)
    record = [json.loads((d / "checkpoints/step-000002/state.json").read_text())["trained"] for d in (one, two)]
    assert record[0] == record[1] and len(record[0]) == 4


@SLOW
@pytest.mark.parametrize("cp", [1, 2])
def test_an_async_run_at_world_size_2_equals_the_synchronous_single_process(single: Path, tmp_path: Path, cp: int):
    from safetensors.torch import load_file

    two = run(tmp_path, 2, cp, "rl.mode=async", "rl.max_staleness=0")
    a = load_file(single / "checkpoints/step-000002/model/model.safetensors")
    b = load_file(two / "checkpoints/step-000002/model/model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-6 for k in a)
    record = [json.loads((d / "checkpoints/step-000002/state.json").read_text())["trained"] for d in (single, two)]
    assert record[0] == record[1] and len(record[0]) == 4
    assert json.loads((two / "summary.json").read_text())["mode"] == "async"


@SLOW
def test_a_sharded_checkpoint_of_two_ranks_resumes_in_one_process(tmp_path: Path):
    """``trainer.optimizer_checkpoint = "sharded"``: two ranks write Adam's state shard by shard;
    one process resumes from it (the format read is the checkpoint's) and trains a third step as a
    run that never stopped does: the same record and weights."""
    from safetensors.torch import load_file

    straight = run(tmp_path / "straight", 1, 1, "rl.steps=3")
    folder = tmp_path / "stopped"
    run(folder, 2, 1, "trainer.optimizer_checkpoint=sharded", "run.name=run")
    stopped = folder / "run"
    assert (stopped / "checkpoints/step-000002/optimizer/.metadata").is_file()
    run(folder, 1, 1, "rl.steps=3", "rl.checkpoint_every=1", "run.name=run")
    a = load_file(straight / "checkpoints/step-000003/model/model.safetensors")
    b = load_file(stopped / "checkpoints/step-000003/model/model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-5 for k in a)
    record = [json.loads((d / "checkpoints/step-000003/state.json").read_text())["trained"] for d in (straight, stopped)]
    assert record[0] == record[1] and len(record[0]) == 6
