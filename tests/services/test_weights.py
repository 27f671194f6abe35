"""The weight store (``services.weights``): every published version rebuilds bit for bit, through
full snapshots and deltas, for a subscriber that keeps up or joins late; corruption, a missing
link, an out-of-order publish and a crash between the data file and the manifest are caught."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from opencomposer.services.weights import PublishRecord, Subscriber, WeightStore, WeightStoreError

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(INT_VIEW[tensor.element_size()])


def assert_same_bits(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert got[name].device.type == "cpu", name
        assert torch.equal(bits(got[name]), bits(want[name])), name


def master_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small model's float32 master weights (and one integer buffer)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 32, generator=g) * 0.02,
        "layers.0.proj.weight": torch.randn(64, 32, generator=g) * 0.02,
        "layers.0.proj.bias": torch.zeros(64),
        "norm.weight": torch.ones(32),
        "steps": torch.zeros((), dtype=torch.int64),
    }


def adam_like_step(master: dict[str, torch.Tensor], g: torch.Generator) -> None:
    """In place, like an optimizer: every touched row (30%, the tokens a batch saw) moves by
    about ``lr`` per element (Adam's normalised step), lr log-uniform in 1e-6 .. 1e-4."""
    lr = 10 ** (-6 + 2 * torch.rand((), generator=g).item())
    for p in master.values():
        if not p.is_floating_point():
            p.add_(1)
            continue
        touched = (torch.rand(p.shape[0], generator=g) < 0.3).float().view(-1, *[1] * (p.dim() - 1))
        direction = torch.randn(p.shape, generator=g).sign() * (0.5 + torch.rand(p.shape, generator=g))
        p.add_(lr * direction * touched)


def published(master: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What the trainer publishes: the master weights cast to ``dtype`` (for float32 the master
    tensors themselves, which the next step mutates in place after ``publish`` returned)."""
    return {name: p.to(dtype) if p.is_floating_point() else p for name, p in master.items()}


def snapshot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in state.items()}


def publish_steps(store: WeightStore, versions: list[int], dtype: torch.dtype = torch.float32, seed: int = 0):
    """Publish one Adam-like step per version; returns what each version held."""
    master, g, history = master_weights(seed), torch.Generator().manual_seed(seed), {}
    for version in versions:
        adam_like_step(master, g)
        state = published(master, dtype)
        store.publish(state, version)
        history[version] = snapshot(state)
    return history


def manifest(root: Path, version: int) -> dict:
    return json.loads((root / f"v{version:012d}.json").read_text())


# ----------------------------------------------------------------------------------------------
# Reconstruction


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fifty_adam_like_updates_rebuild_bit_for_bit(tmp_path: Path, dtype: torch.dtype):
    store = WeightStore(tmp_path)
    live = store.subscribe()
    master, g = master_weights(), torch.Generator().manual_seed(1)
    history, records = {}, []
    for version in range(50):
        adam_like_step(master, g)
        state = published(master, dtype)
        records.append(store.publish(state, version))
        history[version] = snapshot(state)
        assert_same_bits(live.update(), history[version])
        assert live.version == version and live.applied == [version]
    assert [r.kind for r in records] == ["full" if v % 10 == 0 else "delta" for v in range(50)]
    assert all(isinstance(r, PublishRecord) and r.full_bytes == records[0].full_bytes for r in records)
    reader = WeightStore(tmp_path)  # another process: nothing in memory
    for version in range(50):
        assert_same_bits(reader.load(version), history[version])
    deltas = [r for r in records if r.kind == "delta"]
    ratio = sum(r.bytes_written for r in deltas) / sum(r.full_bytes for r in deltas)
    # bf16 moves by whole ulps only now and then: the delta is a few percent of a snapshot; f32
    # moves every touched element, but only in its low mantissa bytes
    assert ratio < (0.2 if dtype == torch.bfloat16 else 0.6), ratio


def test_full_snapshot_every_full_every_publishes_and_each_delta_on_the_previous(tmp_path: Path):
    store = WeightStore(tmp_path, full_every=3)
    versions = [0, 2, 3, 7, 8, 9, 10, 20]  # publishes are counted, not version numbers
    publish_steps(store, versions)
    kinds = [manifest(tmp_path, v)["kind"] for v in versions]
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full", "delta"]
    bases = [manifest(tmp_path, v)["base"] for v in versions]
    assert bases == [None, 0, 2, None, 7, 8, None, 10]
    assert store.versions() == versions and store.latest() == 20
    assert {r.kind for r in (WeightStore(tmp_path / "f1", full_every=1).publish({"x": torch.ones(2)}, v)
                             for v in range(3))} == {"full"}


def test_delta_picks_sparse_for_few_changes_and_xor_for_many(tmp_path: Path):
    base = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 0.02
    few = base.bfloat16()
    many = base.clone()
    one_ulp = bits(many) + 1  # every float32 element one ulp up: all change, in the low bits only
    store = WeightStore(tmp_path)
    store.publish({"few": few, "many": base}, 0)
    moved = few.clone()
    moved[123] = moved[123] * 2
    record = store.publish({"few": moved, "many": one_ulp.view(torch.float32)}, 1)
    entries = {e["name"]: e for e in manifest(tmp_path, 1)["tensors"]}
    assert entries["few"]["encoding"] == "sparse" and entries["few"]["changed"] == 1
    assert entries["many"]["encoding"] == "xor" and entries["many"]["changed"] == 4096
    assert record.changed_elements == 4097 and record.bytes_written < record.full_bytes / 5
    assert_same_bits(store.load(1), {"few": moved, "many": one_ulp.view(torch.float32)})


def test_new_removed_reshaped_and_retyped_tensors_travel_whole_inside_a_delta(tmp_path: Path):
    store = WeightStore(tmp_path)
    v0 = {"kept": torch.ones(4, 4), "dropped": torch.ones(3), "reshaped": torch.ones(6),
          "retyped": torch.ones(5), "flags": torch.tensor([True, False]), "scalar": torch.tensor(2.0),
          "empty": torch.empty(0, 3)}
    v1 = {"kept": torch.ones(4, 4) * 1.5, "reshaped": torch.ones(2, 3), "retyped": torch.ones(5, dtype=torch.float16),
          "flags": torch.tensor([False, False]), "scalar": torch.tensor(-0.0), "empty": torch.empty(0, 3),
          "added": torch.arange(10, dtype=torch.int32)}
    store.publish(v0, 0)
    store.publish(v1, 1)
    entries = {e["name"]: e["encoding"] for e in manifest(tmp_path, 1)["tensors"]}
    assert manifest(tmp_path, 1)["kind"] == "delta"
    assert entries["reshaped"] == entries["retyped"] == entries["added"] == "raw" and "dropped" not in entries
    assert entries["kept"] in ("xor", "sparse")
    assert_same_bits(store.load(1), v1)
    assert_same_bits(store.load(0), v0)


# ----------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("damage", ["data_byte", "checksum"])
def test_a_corrupted_delta_is_detected_naming_version_and_tensor(tmp_path: Path, damage: str):
    store = WeightStore(tmp_path)
    history = publish_steps(store, [0, 1, 2, 3])
    entry = next(e for e in manifest(tmp_path, 2)["tensors"] if e["name"] == "layers.0.proj.weight")
    if damage == "data_byte":
        path = tmp_path / "v000000000002.delta.bin"
        data = bytearray(path.read_bytes())
        data[entry["offset"] + entry["bytes"] // 2] ^= 0x40
        path.write_bytes(bytes(data))
    else:  # the frame decodes, the tensor it gives is not the one published
        path = tmp_path / "v000000000002.json"
        path.write_text(path.read_text().replace(entry["xxh3_64"], "0" * 16))
    for version in (2, 3):
        with pytest.raises(WeightStoreError, match=r"version 2: tensor 'layers.0.proj.weight'"):
            store.load(version)
    with pytest.raises(WeightStoreError, match="version 2"):
        store.subscribe().update()
    assert_same_bits(store.load(1), history[1])


def test_a_missing_delta_is_detected(tmp_path: Path):
    store = WeightStore(tmp_path)
    publish_steps(store, [0, 1, 2, 3])
    (tmp_path / "v000000000002.delta.bin").unlink()
    with pytest.raises(WeightStoreError, match=r"version 2: data file v000000000002.delta.bin is missing"):
        store.load(3)
    (tmp_path / "v000000000002.json").unlink()
    assert store.versions() == [0, 1, 3]
    with pytest.raises(WeightStoreError, match=r"version 3: missing link, delta 3 applies to version 2"):
        store.load(3)
    with pytest.raises(WeightStoreError, match=r"version 2 is not published"):
        store.load(2)


def test_versions_strictly_increase_and_an_out_of_order_chain_is_refused(tmp_path: Path):
    store = WeightStore(tmp_path)
    publish_steps(store, [5, 6])
    for stale in (6, 3):
        with pytest.raises(ValueError, match=rf"version {stale}: versions must strictly increase, and 6"):
            store.publish(master_weights(), stale)
    with pytest.raises(ValueError, match="expected an int >= 0"):
        WeightStore(tmp_path / "other").publish(master_weights(), -1)
    assert store.versions() == [5, 6]
    path = tmp_path / "v000000000006.json"
    path.write_text(path.read_text().replace('"base": 5', '"base": 6'))
    with pytest.raises(WeightStoreError, match="version 6: out-of-order chain, delta 6 applies to version 6"):
        store.load(6)


# ----------------------------------------------------------------------------------------------
# Subscribers


def test_a_late_subscriber_replays_from_the_last_full_snapshot(tmp_path: Path):
    store = WeightStore(tmp_path, full_every=5)
    history = publish_steps(store, list(range(13)))  # fulls at 0, 5, 10
    late = Subscriber(store)
    assert_same_bits(late.update(), history[12])
    assert late.version == 12 and late.applied == [10, 11, 12]
    assert_same_bits(late.update(7), history[7])  # backwards: a replay, never a reverse delta
    assert late.applied == [5, 6, 7]
    assert_same_bits(late.update(9), history[9])
    assert late.applied == [8, 9]
    assert_same_bits(late.update(9), history[9]) and late.applied == []


def test_a_live_subscriber_applies_one_delta_per_version_and_feeds_its_sink(tmp_path: Path):
    class Sink:
        def __init__(self):
            self.loaded: list[int] = []

        def load_weights(self, state_dict, version):
            self.loaded.append(version)

    store, sink = WeightStore(tmp_path, full_every=4), Sink()
    live = store.subscribe()
    master, g = master_weights(), torch.Generator().manual_seed(3)
    previous = None
    for version in range(9):
        adam_like_step(master, g)
        store.publish(published(master, torch.bfloat16), version)
        assert live.load_into(sink) == version and live.applied == [version]
        assert live.load_into(sink) == version and live.applied == []  # nothing new, no reload
        if previous is not None:  # the last state dict handed out is never written to
            assert_same_bits(previous[0], previous[1])
        previous = (live.state_dict, snapshot(live.state_dict))
    assert sink.loaded == list(range(9))
    with pytest.raises(WeightStoreError, match="no version is published yet"):
        WeightStore(tmp_path / "empty").subscribe().update()


# ----------------------------------------------------------------------------------------------
# Crashes, other file systems, pruning


def test_a_crash_between_data_and_manifest_leaves_the_version_invisible(tmp_path: Path, monkeypatch):
    store = WeightStore(tmp_path)
    history = publish_steps(store, [0, 1])
    write = store._write

    def killed_before_the_manifest(name: str, data: bytes) -> None:
        if name.endswith(".json"):
            raise KeyboardInterrupt("killed")
        write(name, data)

    monkeypatch.setattr(store, "_write", killed_before_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        store.publish(master_weights(7), 2)
    assert (tmp_path / "v000000000002.delta.bin").is_file()
    assert store.versions() == [0, 1] and store.latest() == 1
    reader = store.subscribe()
    assert_same_bits(reader.update(), history[1])
    with pytest.raises(WeightStoreError, match="version 2 is not published"):
        store.load(2)

    restarted = WeightStore(tmp_path)  # the trainer's next life, without version 1 in memory
    record = restarted.publish(master_weights(8), 3)
    assert record.kind == "full"
    assert not (tmp_path / "v000000000002.delta.bin").exists()  # the leftover is removed
    assert restarted.versions() == [0, 1, 3]
    assert_same_bits(reader.update(), master_weights(8))
    assert_same_bits(restarted.load(1), history[1])


def test_a_memory_url_works_like_a_folder():
    url = f"memory://weights-{uuid.uuid4().hex}"
    try:
        store = WeightStore(url, full_every=3)
        history = publish_steps(store, list(range(7)), torch.bfloat16)
        assert store.versions() == list(range(7))
        fs, root = fsspec.core.url_to_fs(url)
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))[:3] == [
            "v000000000000.full.bin", "v000000000000.json", "v000000000001.delta.bin"]
        assert_same_bits(WeightStore(url).subscribe().update(), history[6])
        for version in range(7):
            assert_same_bits(store.load(version), history[version])
    finally:
        fsspec.filesystem("memory").rm(url, recursive=True)


def test_pruning_keeps_every_kept_version_and_its_chain(tmp_path: Path):
    store = WeightStore(tmp_path, full_every=4, keep_versions=3)
    master, g, history = master_weights(), torch.Generator().manual_seed(5), {}
    for version in range(14):  # fulls at 0, 4, 8, 12
        adam_like_step(master, g)
        store.publish(published(master, torch.bfloat16), version)
        history[version] = snapshot(published(master, torch.bfloat16))
        for kept in store.versions()[-3:]:
            assert_same_bits(store.load(kept), history[kept])
    # the oldest kept version, 11, is rebuilt from the full snapshot 8: 8..10 stay, 0..7 go
    assert store.versions() == list(range(8, 14))
    assert sorted(p.name for p in tmp_path.glob("*.bin"))[0] == "v000000000008.full.bin"
    assert len(list(tmp_path.iterdir())) == 12


def test_truncate_unpublishes_later_versions_and_publishing_continues(tmp_path):
    store = WeightStore(tmp_path / "store", full_every=3)
    states = []
    for version in range(5):
        states.append({"w": torch.randn(8, 8)})
        store.publish(states[-1], version)
    assert store.truncate(2) == [3, 4]
    assert store.versions() == [0, 1, 2]
    assert torch.equal(store.load(2)["w"], states[2]["w"])
    replacement = {"w": torch.randn(8, 8)}
    store.publish(replacement, 3)
    assert torch.equal(WeightStore(tmp_path / "store").load(3)["w"], replacement["w"])


def test_a_live_subscriber_reloads_a_version_republished_with_other_bytes(tmp_path: Path):
    """A truncate and a republish under the same number: the subscriber knows a version by its
    content digest as well as its number, so it reloads (and feeds its sink) instead of keeping
    the bytes of the version that was unpublished; the same content republished is no reload."""

    class Sink:
        def __init__(self):
            self.loaded: list[int] = []

        def load_weights(self, state_dict, version):
            self.loaded.append(version)

    store, sink = WeightStore(tmp_path), Sink()
    first = publish_steps(store, [0, 1])
    live = store.subscribe()
    assert live.load_into(sink) == 1
    store.truncate(0)
    other = {name: t + 1 if t.is_floating_point() else t for name, t in first[1].items()}
    store.publish(other, 1)  # a full snapshot: truncate forgot the previous version
    assert live.load_into(sink) == 1 and live.applied == [1]
    assert_same_bits(live.state_dict, other) and sink.loaded == [1, 1]
    store.truncate(0)
    store.publish(other, 1)  # the same content again: nothing to reload
    assert live.load_into(sink) == 1 and live.applied == [] and sink.loaded == [1, 1]

    # a delta on a republished base: the chain is replayed from the new full snapshot
    behind = store.subscribe()
    behind.update(1)
    store.truncate(0)
    newer = {name: t * 2 if t.is_floating_point() else t for name, t in first[1].items()}
    store.publish(newer, 1)
    store.publish(first[1], 2)  # a delta on the new version 1
    assert_same_bits(behind.update(2), first[1])
    assert behind.applied == [1, 2]
