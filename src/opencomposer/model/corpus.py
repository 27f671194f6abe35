"""A code corpus gathered from the local Python installation.

Nothing is downloaded: the corpus is the ``.py`` files of the standard library and of the
installed site-packages (or any folders the recipe names). File order and sampling are
deterministic: candidates are sorted by (source, relative path), then a seeded sample is drawn, and
the held-out split is decided by a hash of the relative path so it does not move when the sample
size changes. Files that are not UTF-8, are empty, too large, or look generated (very long lines)
are skipped.
"""

from __future__ import annotations

import functools
import hashlib
import random
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class Corpus:
    train: list[CodeFile]
    heldout: list[CodeFile]

    @property
    def num_bytes(self) -> int:
        return sum(len(f.text.encode()) for f in self.train + self.heldout)


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
    return _scan(tuple(roots), config.min_file_bytes, config.max_file_bytes)


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


def build_corpus(config: CorpusConfig, seed: int = 0) -> Corpus:
    """Collect, sample and split the corpus. Raises ConfigError if nothing usable is found."""
    candidates = _candidates(source_roots(config.sources), config)
    rng = random.Random(seed)
    order = list(range(len(candidates)))
    rng.shuffle(order)
    train: list[CodeFile] = []
    heldout: list[CodeFile] = []
    for index in order:
        if len(train) + len(heldout) >= config.max_files:
            break
        label, path, rel = candidates[index]
        text = _read(path)
        if text is None or not text.strip():
            continue
        code_file = CodeFile(label, rel, text)
        (heldout if is_heldout(code_file.name, config.heldout_fraction) else train).append(code_file)
    if not train:
        raise ConfigError(f"corpus.sources: no usable .py files found in {config.sources}")
    return Corpus(train=train, heldout=heldout)
