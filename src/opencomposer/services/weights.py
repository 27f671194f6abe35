"""The weight store: every policy version the trainer publishes, kept as full snapshots and
lossless deltas, from which inference workers rebuild any version bit for bit.

The trainer calls ``WeightStore(url).publish(state_dict, version)`` after each update; an inference
worker holds a ``Subscriber`` and calls ``update()`` to move to the newest version, applying only the
deltas it has not applied yet. ``load(version)`` rebuilds one version from scratch (evaluation, an
engine restarted after a crash). Not here: when the trainer publishes or when an engine switches
versions (``services.inference``); the store only keeps the bytes and proves them whole.

**Why deltas.** Between two RL steps at RL learning rates (1e-6 .. 1e-5) almost no weight moves by
a whole bf16 ulp: Fireworks report that ~98-99% of bf16 weights are bit-identical from one RL step
to the next (arXiv 2602.03839), so shipping a full snapshot per step moves ~50-100x more bytes than
the information that changed. ``benchmarks/weight_sync.py`` measures it on our models. Float32
weights change almost everywhere (every Adam step moves a float32 weight by many of its ulps), but
only in the low mantissa bits, which the XOR below exposes as high bytes of zeros.

**Layout.** One folder (a local path or any fsspec URL), two files per version::

    v000000000040.full.bin    every tensor's bytes, one zstd frame per tensor, concatenated
    v000000000040.json        its manifest; the commit point
    v000000000041.delta.bin   every tensor's change against version 40, one zstd frame each
    v000000000041.json

A manifest holds the version, ``kind`` (``full`` / ``delta``), ``base`` (the version a delta applies
to: the previously published one), the data file's name and size, the raw size of all tensors, and
per tensor: name, dtype, shape, ``encoding``, the frame's offset and size in the data file, for a
delta the number of elements whose bits changed, and ``xxh3_64``, the xxHash3 of the raw bytes of
the whole tensor *after* reconstruction. The first version published is a full snapshot, and so is
every ``full_every``-th after the last full one; the versions in between are deltas on the version
before them, so rebuilding version v replays at most ``full_every - 1`` deltas.

**Delta encoding.** Per tensor, on the raw bits viewed as an integer of the tensor's own width
(float32 → int32, bfloat16/float16 → int16, int and bool tensors as themselves), so a delta is
exact for every dtype, NaN payloads and signed zeros included. Two candidates, zstd-compressed,
the smaller one wins:

- ``xor``: ``new ^ old`` element by element; unchanged elements are zeros, small moves leave the
  sign and exponent bytes zero. Best when most elements change (float32).
- ``sparse``: the positions of the changed elements (as gaps between positions, in the narrowest
  unsigned integer that holds the largest gap) followed by their new bits. Best when few change
  (bfloat16). Tried only when its uncompressed size is below the dense XOR's, where it can win.

A tensor that is new, or whose dtype or shape changed, is stored whole (``raw``) inside the delta
rather than forcing a full snapshot; a tensor that disappeared is simply absent from the manifest.
A full snapshot stores every tensor ``raw``. Tensors wider than 8 bytes (complex128) have no
integer view and are always ``raw``. Every array goes to zstd (level 1, with its frame checksum) as
byte planes, byte 0 of every element then byte 1 ... (the "shuffle" of Blosc): the sign/exponent
bytes of weights and the high bytes of an XOR become long runs, and the frames come out ~15%
smaller than from the interleaved bytes, and faster to compress.

**Atomicity.** The data file is written first under a hidden temporary name and renamed into place
(``io.atomic_write_bytes`` on a local disk, with fsyncs; ``fs.mv`` elsewhere); the manifest is
written the same way, last. A version is published when, and only when, its manifest exists:
``versions()`` lists manifests only, so a publisher killed between the two writes leaves a data
file nobody reads, removed by the next publisher's first publish. Pruning removes manifests before
data files, so a listed version never points at deleted bytes.

**Reading.** ``load`` walks the ``base`` links back to a full snapshot, applies the chain in
order and checks every tensor's checksum at every link; a version that is not published, a link
whose manifest is missing, a link that is not older than the version it serves, a truncated data
file, an undecodable frame or a checksum mismatch raises ``WeightStoreError`` naming the version
(and the tensor). Results are CPU tensors with the published dtypes and shapes. A version's
identity is its number and its content digest (``digest``: the hash of its tensors' names, dtypes,
shapes and checksums): a ``Subscriber`` that holds version v rebuilds it when the store's v has
another digest (truncated and published again with other bytes), rather than keeping the old ones.

**Concurrency.** One publisher per store; any number of readers, in threads or other processes.
A reader racing a pruning publisher may find the chain it walks deleted under it (it gets a
``WeightStoreError`` and can rebuild the newest version instead); with ``keep_versions = 0``
nothing is ever deleted. A fresh ``WeightStore`` (a restarted trainer) does not hold the previous
version's tensors, so its first publish is a full snapshot.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch
import xxhash
import zstandard
from fsspec.implementations.local import LocalFileSystem

from opencomposer.io import atomic_write_bytes
from opencomposer.protocols import WeightSink

FORMAT = 1
ZSTD_LEVEL = 1  # on weight bits levels 3..6 gain 1-3% in size and cost 2-4x the time (measured)
_MANIFEST = re.compile(r"^v(\d{12})\.json$")
_DATA = re.compile(r"^v(\d{12})\.(full|delta)\.bin$")
# the integer of each element width that a tensor's bits are viewed as
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INDEX_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)


class WeightStoreError(RuntimeError):
    """A version that cannot be rebuilt exactly: not published, a missing or out-of-order link of
    its chain, or bytes that fail to decode or to match their checksum."""


@dataclass(frozen=True)
class PublishRecord:
    """What one ``publish`` wrote."""

    version: int
    kind: str  # "full" or "delta"
    bytes_written: int  # data file + manifest
    full_bytes: int  # raw bytes of every tensor: an uncompressed full snapshot
    elements: int  # elements of every tensor
    changed_elements: int | None  # elements whose bits differ from the base version; None for "full"
    seconds: float


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """The raw bits of a contiguous CPU tensor as a flat integer array of its element width (a view,
    no copy); widths without an integer are viewed as bytes."""
    return tensor.reshape(-1).view(_BITS.get(tensor.element_size(), torch.uint8)).numpy()


def _bits_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype ``_bits`` returns for a tensor of ``dtype``."""
    return np.dtype({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}.get(dtype.itemsize, np.uint8))


def _planes(values: np.ndarray) -> np.ndarray:
    """The bytes of ``values`` as byte planes: byte 0 of every element, then byte 1, ... (a new
    array). Sign and exponent bytes, and the high bytes of an XOR, become long runs zstd shrinks."""
    raw, width = values.view(np.uint8), values.itemsize
    planes = np.empty(raw.size, np.uint8)
    for byte in range(width):
        planes[byte * values.size : (byte + 1) * values.size] = raw[byte::width]
    return planes


def _unplanes(planes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``_planes`` undone: a new array of ``dtype``."""
    width = dtype.itemsize
    if planes.size % width:
        raise ValueError(f"{planes.size} bytes are not a whole number of {width}-byte elements")
    count = planes.size // width
    raw = np.empty(planes.size, np.uint8)
    for byte in range(width):
        raw[byte::width] = planes[byte * count : (byte + 1) * count]
    return raw.view(dtype)


def _dtype(name: str, version: int, tensor: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightStoreError(f"version {version}: tensor {tensor!r} has unknown dtype {name!r}")
    return dtype


def _checksum(bits: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(bits)


def _manifest_text(manifest: dict[str, Any]) -> str:
    """JSON with one line per tensor: readable with ``less``, a few hundred bytes per tensor."""
    head = {key: value for key, value in manifest.items() if key != "tensors"}
    lines = ",\n".join(f"  {json.dumps(entry)}" for entry in manifest["tensors"])
    tensors = f"[\n{lines}\n ]" if lines else "[]"
    return json.dumps(head, indent=1)[:-2] + f',\n "tensors": {tensors}\n}}\n'


def _cpu_copy(name: Any, value: Any) -> torch.Tensor:
    """A contiguous CPU copy the trainer's next update cannot touch (one copy, from any device)."""
    if not isinstance(name, str) or not isinstance(value, torch.Tensor):
        raise TypeError(f"state_dict entry {name!r}: expected str -> torch.Tensor, got {type(value).__name__}")
    return torch.empty(value.shape, dtype=value.dtype).copy_(value.detach())


class WeightStore:
    """See module doc. ``url``: a folder or any fsspec URL (``memory://``, ``s3://``, ...);
    ``full_every``: a full snapshot every N versions; ``keep_versions``: after each publish, prune
    versions older than the newest N (never a link a kept version needs); 0 keeps them all."""

    def __init__(self, url: str | Path, *, full_every: int = 10, keep_versions: int = 0):
        if full_every < 1:
            raise ValueError(f"full_every: must be >= 1, got {full_every}")
        if keep_versions < 0:
            raise ValueError(f"keep_versions: must be >= 0 (0 keeps every version), got {keep_versions}")
        self.url, self.full_every, self.keep_versions = str(url), full_every, keep_versions
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.fs.makedirs(self.root, exist_ok=True)
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        self._previous: tuple[int, dict[str, torch.Tensor]] | None = None  # the last version this object published
        self._since_full = 0  # versions published since the last full snapshot, that one included
        self._cleaned = False  # the uncommitted leftovers of a crashed publisher are removed

    # ------------------------------------------------------------------------------------------
    # Listing

    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def _names(self) -> list[str]:
        try:
            return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []

    def versions(self) -> list[int]:
        """Published (committed) versions, oldest first."""
        return sorted(int(m[1]) for name in self._names() if (m := _MANIFEST.match(name)))

    def latest(self) -> int | None:
        """The newest published version; None while nothing is published."""
        versions = self.versions()
        return versions[-1] if versions else None

    def subscribe(self) -> Subscriber:
        return Subscriber(self)

    # ------------------------------------------------------------------------------------------
    # Publishing

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> PublishRecord:
        """Publish ``state_dict`` as ``version`` (strictly above every published version): a full
        snapshot or a delta on the previous version (module doc), committed by its manifest."""
        started = time.perf_counter()
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version: expected an int >= 0, got {version!r}")
        latest = self.latest()
        if latest is not None and version <= latest:
            raise ValueError(f"version {version}: versions must strictly increase, and {latest} is already published")
        if not self._cleaned:
            self._remove_uncommitted()
            self._cleaned = True
        tensors = {name: _cpu_copy(name, value) for name, value in state_dict.items()}
        previous = self._previous[1] if self._previous is not None and self._previous[0] == latest else None
        full = previous is None or self._since_full >= self.full_every
        kind = "full" if full else "delta"

        entries, frames, offset, changed = [], [], 0, 0
        for name, tensor in tensors.items():
            entry, frame = self._encode(name, tensor, None if full else previous.get(name))
            entry.update(offset=offset, bytes=len(frame))
            entries.append(entry)
            frames.append(frame)
            offset += len(frame)
            changed += entry.get("changed", tensor.numel())
        data_name = f"v{version:012d}.{kind}.bin"
        full_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        manifest = {
            "format": FORMAT,
            "version": version,
            "kind": kind,
            "base": None if full else latest,
            "data": data_name,
            "data_bytes": offset,
            "raw_bytes": full_bytes,
            "tensors": entries,
        }
        manifest_bytes = _manifest_text(manifest).encode()
        self._write(data_name, b"".join(frames))
        self._write(f"v{version:012d}.json", manifest_bytes)  # the commit point
        self._previous = (version, tensors)
        self._since_full = 1 if full else self._since_full + 1
        if self.keep_versions:
            self._prune()
        return PublishRecord(
            version=version,
            kind=kind,
            bytes_written=offset + len(manifest_bytes),
            full_bytes=full_bytes,
            elements=sum(t.numel() for t in tensors.values()),
            changed_elements=None if full else changed,
            seconds=time.perf_counter() - started,
        )

    def _encode(self, name: str, tensor: torch.Tensor, previous: torch.Tensor | None) -> tuple[dict[str, Any], bytes]:
        """The manifest entry and the zstd frame of one tensor: ``raw`` without a comparable previous
        tensor, else the smaller of ``xor`` and ``sparse``."""
        bits = _bits(tensor)
        entry: dict[str, Any] = {
            "name": name,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "xxh3_64": _checksum(bits),
        }
        comparable = (
            previous is not None
            and previous.dtype == tensor.dtype
            and previous.shape == tensor.shape
            and tensor.element_size() in _BITS
        )
        if not comparable:
            return entry | {"encoding": "raw"}, self._compressor.compress(_planes(bits))
        old = _bits(previous)
        xor = np.bitwise_xor(bits, old)
        changed = int(np.count_nonzero(xor))
        entry["changed"] = changed
        entry["encoding"], frame = "xor", self._compressor.compress(_planes(xor))
        if changed * (bits.itemsize + 1) >= bits.nbytes:  # sparse, even uncompressed, is larger
            return entry, frame
        positions = np.flatnonzero(xor)
        gaps = np.diff(positions, prepend=0)
        largest = int(gaps.max()) if gaps.size else 0
        index_dtype = next(np.dtype(d) for d in _INDEX_DTYPES if largest <= np.iinfo(d).max)
        if changed * (bits.itemsize + index_dtype.itemsize) < bits.nbytes:
            sparse = self._compressor.compress(
                np.concatenate([_planes(gaps.astype(index_dtype)), _planes(bits[positions])])
            )
            if len(sparse) < len(frame):
                entry.update(encoding="sparse", index_dtype=index_dtype.name)
                frame = sparse
        return entry, frame

    def _write(self, name: str, data: bytes) -> None:
        """Whole or absent: a temporary name, then a rename."""
        path = self._path(name)
        if isinstance(self.fs, LocalFileSystem):
            atomic_write_bytes(Path(path), data)
            return
        tmp = self._path(f".{name}.tmp-{uuid.uuid4().hex}")
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def _remove_uncommitted(self) -> None:
        """Data files without a manifest and temporary files: what a publisher killed mid-publish left."""
        names = self._names()
        committed = {int(m[1]) for name in names if (m := _MANIFEST.match(name))}
        for name in names:
            data = _DATA.match(name)
            if (data and int(data[1]) not in committed) or (name.startswith(".") and ".tmp" in name):
                self.fs.rm(self._path(name))

    def truncate(self, version: int) -> list[int]:
        """Unpublish every version above ``version`` (-1: every version) and return them. A resumed
        run drops its checkpoint's version and those after it, then publishes that version again
        whole from the checkpoint (``services.async_rl``). Manifests go first, newest first, so a
        crash part-way leaves a shorter chain that is still whole. A version published again under
        a dropped number gets its own content digest, by which subscribers tell it apart."""
        dropped = [v for v in self.versions() if v > version][::-1]
        for v in dropped:
            self.fs.rm(self._path(f"v{v:012d}.json"))
        self._remove_uncommitted()
        self._previous = None  # the next publish is a full snapshot
        return dropped[::-1]

    def _prune(self) -> None:
        """Drop the versions older than the full snapshot that the oldest kept version's chain starts
        from: manifests first (the versions disappear), then their data."""
        versions = self.versions()
        if len(versions) <= self.keep_versions:
            return
        first_needed = self._chain(versions[-self.keep_versions])[0]["version"]
        names = self._names()
        for pattern in (_MANIFEST, _DATA):
            for name in names:
                match = pattern.match(name)
                if match and int(match[1]) < first_needed:
                    self.fs.rm(self._path(name))

    # ------------------------------------------------------------------------------------------
    # Reading

    def load(self, version: int | None = None) -> dict[str, torch.Tensor]:
        """Rebuild ``version`` (the latest when None) from its full snapshot and deltas, every
        checksum verified; CPU tensors, bit-identical to what was published."""
        version = self._target(version)
        state: dict[str, torch.Tensor] = {}
        for manifest in self._chain(version):
            state = self._apply(manifest, state)
        return state

    def _target(self, version: int | None) -> int:
        if version is not None:
            return version
        latest = self.latest()
        if latest is None:
            raise WeightStoreError(f"{self.url}: no version is published yet")
        return latest

    def _manifest(self, version: int) -> dict[str, Any]:
        try:
            text = self.fs.cat_file(self._path(f"v{version:012d}.json"))
        except FileNotFoundError:
            raise WeightStoreError(f"version {version} is not published in {self.url}") from None
        try:
            manifest = json.loads(text)
        except ValueError as e:
            raise WeightStoreError(f"version {version}: unreadable manifest ({e})") from None
        if manifest.get("version") != version or manifest.get("kind") not in ("full", "delta"):
            raise WeightStoreError(
                f"version {version}: manifest says version {manifest.get('version')!r}, kind {manifest.get('kind')!r}"
            )
        if manifest.get("format") != FORMAT:
            raise WeightStoreError(f"version {version}: manifest format {manifest.get('format')!r}, expected {FORMAT}")
        return manifest

    def _chain(self, version: int, have: tuple[int, str] | None = None) -> list[dict[str, Any]]:
        """The manifests to apply, oldest first, to rebuild ``version``: from the last full snapshot
        at or before it or, when ``have`` (the number and content digest of a version already
        rebuilt) is a link of its chain, from the link after it (empty when it is ``version``). A
        link with ``have``'s number and another digest was republished since: not a match."""
        chain = [self._manifest(version)]
        while not _matches(chain[-1], have) and chain[-1]["kind"] == "delta":
            here, base = chain[-1]["version"], chain[-1]["base"]
            if isinstance(base, bool) or not isinstance(base, int) or base >= here:
                raise WeightStoreError(
                    f"version {version}: out-of-order chain, delta {here} applies to version {base!r}, "
                    "expected an older one"
                )
            try:
                chain.append(self._manifest(base))
            except WeightStoreError as e:
                raise WeightStoreError(
                    f"version {version}: missing link, delta {here} applies to version {base}: {e}"
                ) from None
        if _matches(chain[-1], have):
            chain.pop()
        return chain[::-1]

    def _apply(self, manifest: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state dict of ``manifest``'s version: its full snapshot, or its delta applied to
        ``state`` (the base version's tensors, left untouched)."""
        version = manifest["version"]
        try:
            data = self.fs.cat_file(self._path(manifest["data"]))
        except FileNotFoundError:
            raise WeightStoreError(f"version {version}: data file {manifest['data']} is missing") from None
        if len(data) != manifest["data_bytes"]:
            raise WeightStoreError(
                f"version {version}: data file {manifest['data']} has {len(data)} bytes, manifest says {manifest['data_bytes']}"
            )
        decompressor = zstandard.ZstdDecompressor()
        out = {}
        for entry in manifest["tensors"]:
            name = entry.get("name")
            try:
                frame = data[entry["offset"] : entry["offset"] + entry["bytes"]]
                out[name] = _decode(entry, decompressor.decompress(frame), state.get(name), version)
            except (zstandard.ZstdError, ValueError, IndexError, KeyError, TypeError) as e:
                raise WeightStoreError(f"version {version}: tensor {name!r} does not decode ({e})") from None
        return out


def digest(manifest: dict[str, Any]) -> str:
    """The content digest of a version: the xxHash3 of every tensor's name, dtype, shape and
    checksum, in order. Two manifests with the same digest rebuild the same tensors, whichever
    way (full or delta) they are stored; a version truncated and published again under its
    number with other bytes gets another digest."""
    lines = [f"{e['name']}\t{e['dtype']}\t{e['shape']}\t{e['xxh3_64']}" for e in manifest["tensors"]]
    return xxhash.xxh3_64_hexdigest("\n".join(lines).encode())


def _matches(manifest: dict[str, Any], have: tuple[int, str] | None) -> bool:
    """Whether ``manifest`` is the version ``have`` names: the same number and content digest."""
    return have is not None and manifest["version"] == have[0] and digest(manifest) == have[1]


def _decode(entry: dict[str, Any], payload: bytes, previous: torch.Tensor | None, version: int) -> torch.Tensor:
    """One tensor of a version from its decompressed frame (and, for a delta, the base version's
    tensor), checked against its checksum."""
    name, shape, encoding = entry["name"], entry["shape"], entry["encoding"]
    dtype = _dtype(entry["dtype"], version, name)
    bits_dtype = _bits_dtype(dtype)
    if encoding == "raw":
        bits = _unplanes(np.frombuffer(payload, np.uint8), bits_dtype)
    elif encoding in ("xor", "sparse"):
        if previous is None or previous.dtype != dtype or list(previous.shape) != shape:
            found = "no tensor" if previous is None else f"{previous.dtype} {list(previous.shape)}"
            raise WeightStoreError(
                f"version {version}: tensor {name!r} is a delta on a {entry['dtype']} {shape} tensor of the base "
                f"version, which has {found}"
            )
        old = _bits(previous)
        if encoding == "xor":
            bits = np.bitwise_xor(old, _unplanes(np.frombuffer(payload, np.uint8), bits_dtype))
        else:
            index_dtype = np.dtype(entry["index_dtype"])
            changed = entry["changed"]
            split = changed * index_dtype.itemsize
            gaps = _unplanes(np.frombuffer(payload, np.uint8, count=split), index_dtype)
            values = _unplanes(np.frombuffer(payload, np.uint8, offset=split), bits_dtype)
            bits = old.copy()
            bits[np.cumsum(gaps, dtype=np.int64)] = values
    else:
        raise WeightStoreError(f"version {version}: tensor {name!r} has unknown encoding {encoding!r}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // bits_dtype.itemsize
    if bits.size != expected:
        raise WeightStoreError(f"version {version}: tensor {name!r} decodes to {bits.size} elements, expected {expected}")
    if _checksum(bits) != entry["xxh3_64"]:
        raise WeightStoreError(f"version {version}: tensor {name!r} fails its xxh3_64 checksum (corrupt data)")
    return torch.from_numpy(bits).view(dtype).reshape(shape)


class Subscriber:
    """An inference worker's copy of the policy: ``state_dict`` at ``version``, whose content
    digest (``digest``) is ``digest``.

    ``update(version=None)`` moves it to ``version`` (the latest when None) and returns the new state
    dict. When its current version is a link of the target's chain it applies only the deltas
    after it (one per version for a worker that keeps up); otherwise (a late joiner, a worker that
    fell behind a full snapshot, or a move backwards) it replays the chain from the full snapshot.
    A version is known by its number and its digest: one truncated and published again under the
    same number with other bytes (``WeightStore.truncate``) is not the one it holds, so it is
    rebuilt, never kept. A failed update raises ``WeightStoreError`` and leaves the subscriber where
    it was. ``applied`` lists the versions the last update applied, oldest first.
    """

    def __init__(self, store: WeightStore):
        self.store = store
        self.version: int | None = None
        self.digest: str | None = None
        self.state_dict: dict[str, torch.Tensor] = {}
        self.applied: list[int] = []

    def update(self, version: int | None = None) -> dict[str, torch.Tensor]:
        target = self.store._target(version)
        have = None if self.version is None else (self.version, self.digest)
        chain = self.store._chain(target, have=have)
        # the chain starts after our version, or from a full snapshot that needs nothing before it
        state = {} if chain and chain[0]["kind"] == "full" else self.state_dict
        for manifest in chain:
            state = self.store._apply(manifest, state)
        if chain:
            self.digest = digest(chain[-1])
        self.state_dict, self.version, self.applied = state, target, [m["version"] for m in chain]
        return state

    def load_into(self, sink: WeightSink, version: int | None = None) -> int:
        """``update(version)``, then hand the state dict to ``sink.load_weights`` when the version
        moved or was republished with other bytes; returns the version the subscriber is at."""
        self.update(version)
        if self.applied:
            sink.load_weights(self.state_dict, self.version)
        return self.version
