"""A code corpus gathered from the local Python installation.

Nothing is downloaded: the corpus is the ``.py`` files of the standard library and of the
installed site-packages (or any folders the recipe names). ``corpus.packages`` (default: torch,
which the install pins) narrows site-packages to named packages, so that the corpus does not move
when something else is installed. File order and sampling are
deterministic: candidates are sorted by (source, relative path), then a seeded sample is drawn, and
the held-out split is decided by a hash of the relative path so it does not move when the sample
size changes. Files that are not UTF-8, are empty, too large, or look generated (very long lines)
are skipped.

Two options that phased pretraining (``pretrain.phases``) turns on, and that stay off by default so
that the quickstart's corpus and the tokenizer trained on it do not move:

- ``dedup``: exact copies (same text) and near-duplicates (estimated Jaccard similarity of
  5-word shingles at or above a threshold, by MinHash LSH from ``datasketch``) are dropped before
  the split, the first file in the sampled order kept. Vendored copies and forks of one module
  across packages are common in site-packages; left in, they inflate the data and, when one copy
  lands in the held-out split, leak it into training.
- ``heldout_by="project"``: the split is decided per source project (``project_of``: the top-level
  package or module a file belongs to) rather than per file, so the held-out loss measures a
  codebase the model never saw any file of, not a sibling file of a package it trained on.

``Corpus.mix`` reports files and bytes by source (the data mix of a run is reported from it).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import site
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from opencomposer.config import ConfigError, CorpusConfig

MAX_LINE_CHARS = 400  # longer lines mean minified or generated code, not what we want to learn


@dataclass(frozen=True)
class CodeFile:
    source: str  # the source label ("stdlib", "site-packages" or a folder path)
    path: str  # relative to the source root, POSIX separators
    text: str

    @property
    def name(self) -> str:
        return f"{self.source}:{self.path}"

    @property
    def project(self) -> str:
        return f"{self.source}:{project_of(self.path)}"


def project_of(path: str) -> str:
    """The source project of a file at ``path`` (relative to its source root): its top-level
    package folder (``numpy/core/x.py`` → ``numpy``), or the module itself for a top-level file
    (``os.py`` → ``os``). In a folder source holding several repositories, each repository."""
    first = path.split("/", 1)[0]
    return first.removesuffix(".py") if "/" not in path else first


@dataclass
class Corpus:
    train: list[CodeFile]
    heldout: list[CodeFile]
    dropped: dict[str, int] = field(default_factory=dict)
    """Files removed by deduplication: ``{"exact": n, "near": m}`` (empty without ``dedup``)."""

    def fingerprint(self) -> str:
        """SHA-256 of the files in order (name and text), training files then held-out ones: equal
        fingerprints mean the same data, the tokenizer trained on it and the batches drawn from it."""
        digest = hashlib.sha256()
        for split in (self.train, self.heldout):
            for f in split:
                digest.update(f"{f.name}\0{hashlib.sha256(f.text.encode()).hexdigest()}\n".encode())
            digest.update(b"--\n")
        return digest.hexdigest()

    @property
    def num_bytes(self) -> int:
        return sum(len(f.text.encode()) for f in self.train + self.heldout)

    def mix(self) -> dict[str, dict[str, int]]:
        """Per source: train and held-out files, train bytes, and projects in each split."""
        report: dict[str, dict[str, int]] = {}
        for split, files in (("train", self.train), ("heldout", self.heldout)):
            for f in files:
                row = report.setdefault(f.source, {"train_files": 0, "train_bytes": 0, "heldout_files": 0,
                                                   "train_projects": 0, "heldout_projects": 0})
                row[f"{split}_files"] += 1
                if split == "train":
                    row["train_bytes"] += len(f.text.encode())
        for split, files in (("train", self.train), ("heldout", self.heldout)):
            for source, row in report.items():
                row[f"{split}_projects"] = len({f.project for f in files if f.source == source})
        return report


def source_roots(sources: list[str]) -> list[tuple[str, Path]]:
    """Resolve source labels to folders."""
    roots: list[tuple[str, Path]] = []
    for source in sources:
        if source == "stdlib":
            roots.append((source, Path(sysconfig.get_paths()["stdlib"])))
        elif source == "site-packages":
            seen = set()
            for p in [sysconfig.get_paths()["purelib"], *site.getsitepackages()]:
                if Path(p).is_dir() and Path(p).resolve() not in seen:
                    seen.add(Path(p).resolve())
                    roots.append((source, Path(p)))
        else:
            path = Path(source).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"corpus.sources: {source!r} is neither 'stdlib', 'site-packages' nor a folder"
                )
            roots.append((source, path))
    return roots


def _candidates(roots: list[tuple[str, Path]], config: CorpusConfig) -> list[tuple[str, Path, str]]:
    found = _scan(tuple(roots), config.min_file_bytes, config.max_file_bytes)
    if not config.packages or "site-packages" not in config.sources:
        return found
    wanted = set(config.packages)
    kept = [c for c in found if c[0] != "site-packages" or project_of(c[2]) in wanted]
    present = {project_of(rel) for label, _, rel in kept if label == "site-packages"}
    if missing := sorted(wanted - present):
        folders = ", ".join(str(root) for label, root in roots if label == "site-packages")
        raise ConfigError(f"corpus.packages: no usable .py files of {', '.join(map(repr, missing))} in "
                          f"site-packages ({folders})")
    return kept


def corpus_versions(config: CorpusConfig) -> dict[str, str]:
    """What the corpus is a function of, for its record: the Python version (the standard library)
    and, per package named in ``corpus.packages``, its installed distribution and version."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()} if "stdlib" in config.sources else {}
    distributions = metadata.packages_distributions()
    for name in config.packages:
        for dist in distributions.get(name, []):
            try:
                version = metadata.version(dist)
                versions[name] = version if dist.lower() == name.lower() else f"{dist} {version}"
            except metadata.PackageNotFoundError:
                continue
            break
    return versions


@functools.lru_cache(maxsize=8)
def _scan(roots: tuple[tuple[str, Path], ...], min_bytes: int, max_bytes: int) -> list[tuple[str, Path, str]]:
    """Every candidate file, sorted by (source, relative path); cached per process."""
    found: dict[tuple[str, str], Path] = {}
    for label, root in roots:
        stdlib_site = root / "site-packages"
        for path in root.rglob("*.py"):
            if "__pycache__" in path.parts or stdlib_site in path.parents:
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if min_bytes <= size <= max_bytes:
                found.setdefault((label, path.relative_to(root).as_posix()), path)
    return [(label, path, rel) for (label, rel), path in sorted(found.items())]


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text or max((len(line) for line in text.splitlines()), default=0) > MAX_LINE_CHARS:
        return None
    return text


def is_heldout(name: str, fraction: float) -> bool:
    """Stable split: the first 8 bytes of the name's SHA-256 as a number in [0, 1)."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


SHINGLE_WORDS = 5  # near-duplicate shingles: runs of 5 words (identifiers, numbers, punctuation)
MINHASH_PERMUTATIONS = 128
_WORD = re.compile(r"\w+|[^\w\s]")


def _shingles(text: str) -> set[bytes]:
    words = _WORD.findall(text)
    if len(words) <= SHINGLE_WORDS:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + SHINGLE_WORDS]).encode() for i in range(len(words) - SHINGLE_WORDS + 1)}


def deduplicate(files: list[CodeFile], threshold: float = 0.8) -> tuple[list[CodeFile], dict[str, int]]:
    """``files`` without exact copies and near-duplicates, in their order (the first of a group is
    kept), and how many of each were dropped. Exact: identical text. Near: MinHash LSH at
    ``threshold`` estimated Jaccard similarity of 5-word shingles (``threshold >= 1``: exact only).
    Deterministic: the hash functions are seeded and files are visited in order."""
    from datasketch import MinHash, MinHashLSH

    seen: set[bytes] = set()
    kept: list[CodeFile] = []
    dropped = {"exact": 0, "near": 0}
    lsh = MinHashLSH(threshold=threshold, num_perm=MINHASH_PERMUTATIONS) if threshold < 1.0 else None
    for index, f in enumerate(files):
        digest = hashlib.sha256(f.text.encode()).digest()
        if digest in seen:
            dropped["exact"] += 1
            continue
        seen.add(digest)
        if lsh is not None:
            signature = MinHash(num_perm=MINHASH_PERMUTATIONS, seed=1)
            signature.update_batch(list(_shingles(f.text)))
            if lsh.query(signature):
                dropped["near"] += 1
                continue
            lsh.insert(str(index), signature)
        kept.append(f)
    return kept, dropped


def heldout_projects(files: list[CodeFile], fraction: float) -> set[str]:
    """The projects to hold out: visited in the order of their names' SHA-256 (stable, unrelated
    to size), each taken while the held-out files stay within ``fraction`` of all files, so one
    huge project (the standard library's ``test`` package) cannot take the split over. At least
    one project is held out when ``fraction > 0`` and there are two or more (the smallest, if none
    fits)."""
    sizes: dict[str, int] = {}
    for f in files:
        sizes[f.project] = sizes.get(f.project, 0) + 1
    if fraction <= 0 or len(sizes) < 2:
        return set()
    target = fraction * len(files)
    held: set[str] = set()
    count = 0
    for project in sorted(sizes, key=lambda p: hashlib.sha256(p.encode()).digest()):
        if count + sizes[project] <= target:
            held.add(project)
            count += sizes[project]
    return held or {min(sizes, key=lambda p: (sizes[p], p))}


def build_corpus(
    config: CorpusConfig,
    seed: int = 0,
    *,
    dedup: bool = False,
    near_duplicate_threshold: float = 0.8,
    heldout_by: Literal["file", "project"] = "file",
) -> Corpus:
    """Collect, sample and split the corpus. Raises ConfigError if nothing usable is found.

    ``dedup`` and ``heldout_by="project"``: see the module doc and ``heldout_projects``."""
    candidates = _candidates(source_roots(config.sources), config)
    rng = random.Random(seed)
    order = list(range(len(candidates)))
    rng.shuffle(order)
    sampled: list[CodeFile] = []
    for index in order:
        if len(sampled) >= config.max_files:
            break
        label, path, rel = candidates[index]
        text = _read(path)
        if text is None or not text.strip():
            continue
        sampled.append(CodeFile(label, rel, text))
    dropped: dict[str, int] = {}
    if dedup:
        sampled, dropped = deduplicate(sampled, near_duplicate_threshold)
    if heldout_by == "project":
        held = heldout_projects(sampled, config.heldout_fraction)
        train = [f for f in sampled if f.project not in held]
        heldout = [f for f in sampled if f.project in held]
    else:
        train = [f for f in sampled if not is_heldout(f.name, config.heldout_fraction)]
        heldout = [f for f in sampled if is_heldout(f.name, config.heldout_fraction)]
    if not train:
        raise ConfigError(f"corpus.sources: no usable .py files found in {config.sources}")
    return Corpus(train=train, heldout=heldout, dropped=dropped)
