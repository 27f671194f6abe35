"""The weight store of an asynchronous run never serves another run's, or a lost step's, weights:
a fresh run refuses a store that already holds versions (``services.weight_store_overwrite``
clears it instead), and a resume republishes its checkpoint's version whole from the checkpoint,
so a damaged or missing delta at that version is repaired rather than met on every resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.services.test_async_rl import RECIPE, SHRUNK, config_for, run_async

pytestmark = [pytest.mark.integration, pytest.mark.bwrap]


def foreign_store(url: Path) -> list[int]:
    """A store holding versions 0..2 of some other run's weights; returns them."""
    from opencomposer.services.weights import WeightStore

    store = WeightStore(url)
    for version in range(3):
        store.publish({"embed.weight": torch.full((4, 4), float(version))}, version)
    return store.versions()


def same_bits(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ (dtype, shape or bits), or that only one side has."""
    differ = sorted(set(got) ^ set(want))
    return differ + [name for name in sorted(set(got) & set(want))
                     if got[name].dtype != want[name].dtype or not torch.equal(got[name].cpu(), want[name].cpu())]


def test_a_fresh_run_refuses_a_store_that_holds_versions(tmp_path: Path, capsys):
    from opencomposer.cli import main
    from opencomposer.services.weights import WeightStore

    store = tmp_path / "shared-weights"
    before = foreign_store(store)
    settings = [*SHRUNK, f"run.out_dir={tmp_path}", "run.name=fresh", "rl.steps=1", "rl.mode=async",
                f"services.weight_store={store}"]
    argv = ["rl", "--recipe", str(RECIPE), *[arg for s in settings for arg in ("--set", s)]]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert str(store) in error and "services.weight_store_overwrite" in error, error
    assert WeightStore(store).versions() == before  # untouched


def test_overwrite_clears_the_store_and_publishes_the_runs_own_version_zero(tmp_path: Path):
    """With ``services.weight_store_overwrite``, the versions of the other run are gone and
    version 0 is this run's starting policy, bit for bit, for every reader of the store."""
    from opencomposer.rl.loop import RLRun
    from opencomposer.services.async_rl import AsyncRollouts
    from opencomposer.services.weights import WeightStore

    store = tmp_path / "shared-weights"
    foreign_store(store)
    config = config_for(tmp_path, "over", "rl.steps=1", "rl.mode=async", f"services.weight_store={store}",
                        "services.weight_store_overwrite=true")
    run = RLRun(config, AsyncRollouts())
    try:
        assert WeightStore(store).versions() == [0]
        assert same_bits(WeightStore(store).load(0), run.model.state_dict()) == []
    finally:
        run.source.close()
        run.log.close()
        run._lock.close()


def test_a_fresh_run_reuses_its_own_folders_store(tmp_path: Path):
    """The default store, ``{run}/weights``, belongs to its run folder: a fresh start there (an
    attempt that stopped before its first checkpoint) clears it without asking."""
    from opencomposer.rl.loop import RLRun
    from opencomposer.services.async_rl import AsyncRollouts
    from opencomposer.services.weights import WeightStore

    config = config_for(tmp_path, "own", "rl.steps=1", "rl.mode=async")
    foreign_store(config.run.path / "weights")
    run = RLRun(config, AsyncRollouts())
    try:
        assert WeightStore(config.run.path / "weights").versions() == [0]
        assert same_bits(WeightStore(config.run.path / "weights").load(0), run.model.state_dict()) == []
    finally:
        run.source.close()
        run.log.close()
        run._lock.close()


# a missing delta in make test; a corrupt one (the same repair, found by its checksum) in the slow set
@pytest.mark.parametrize("damage", [pytest.param("corrupt", marks=pytest.mark.slow), "missing"])
def test_a_resume_republishes_its_checkpoints_version_whole(tmp_path: Path, damage: str):
    """Version 1 (a delta, the checkpoint's) damaged after the run: the resume truncates the store
    to the versions before it and republishes version 1 as a full snapshot from the checkpoint, so
    the sampler, a process of its own that loads its version from the store, starts from the
    checkpoint's weights bit for bit, and the run goes on."""
    from opencomposer.services.weights import WeightStore

    overrides = ["rl.mode=async", "rl.max_staleness=0", "services.inference_process=true"]
    config = config_for(tmp_path, "resume", "rl.steps=1", *overrides)
    run_dir = run_async(config).run_dir
    delta = run_dir / "weights" / "v000000000001.delta.bin"
    assert WeightStore(run_dir / "weights").versions() == [0, 1] and delta.is_file()
    if damage == "corrupt":
        data = bytearray(delta.read_bytes())
        data[len(data) // 2] ^= 0x40
        delta.write_bytes(bytes(data))
    else:
        delta.unlink()

    seen = {}

    def on_run(run) -> None:
        store = WeightStore(run_dir / "weights")
        seen["versions"] = store.versions()
        seen["kind"] = sorted(p.name for p in (run_dir / "weights").glob("v000000000001.*.bin"))
        seen["differ"] = same_bits(store.load(1), run.model.state_dict())  # the checkpoint's weights

    run = run_async(config_for(tmp_path, "resume", "rl.steps=2", *overrides), on_run=on_run)
    assert run.steps == 2
    assert seen == {"versions": [0, 1], "kind": ["v000000000001.full.bin"], "differ": []}
    assert WeightStore(run_dir / "weights").versions() == [0, 1, 2]
