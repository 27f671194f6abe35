"""What the phases train on: packed corpus rows by source, and batches of demonstrations.

Rows are packed from whole documents, each opened by ``<|endoftext|>``, with position ids that
restart at 0 at every document start (and at every row start), so the training forward attends
inside each document only (``pretrain.losses``). Each row is drawn from one source, chosen by the
phase's weights with a seeded generator; each source's rows come from its own seeded file order,
and the generated sources (``pretrain.recall``) join the corpus's where a phase lists them.
Demonstrations (recorded tool episodes) are drawn in seeded epochs. Every stream is a pure
function of its seed, so ``skip(n)`` replays the first n draws and a resumed run trains on exactly
the batches an uninterrupted one would.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from opencomposer.config import ConfigError
from opencomposer.config.pretrain import PhaseConfig, PretrainConfig
from opencomposer.model.corpus import CodeFile, Corpus
from opencomposer.pretrain.plan import Phase
from opencomposer.pretrain.recall import SOURCES as GENERATED_SOURCES
from opencomposer.pretrain.recall import with_recall_sources


def seed_of(*parts: Any) -> list[int]:
    """A numpy seed made of ``parts`` (a stream's name, the run's seed, the phase)."""
    return [zlib.crc32(str(part).encode()) for part in parts]


def documents(files: list[CodeFile], tokenizer: Any, batch_files: int = 32) -> Iterator[list[int]]:
    """Token ids of each file in order (tokenised in batches)."""
    for start in range(0, len(files), batch_files):
        yield from tokenizer([f.text for f in files[start : start + batch_files]], add_special_tokens=False)["input_ids"]


def pack_documents(docs: Iterator[list[int]], separator: int, seq_len: int) -> Iterator[tuple[list[int], list[int]]]:
    """Rows of ``seq_len + 1`` token ids and their position ids. Each document is ``[separator,
    *ids]``; positions count from 0 at every document start and at every row start, so a forward
    with these position ids attends within documents only (module doc)."""
    window = seq_len + 1
    ids: list[int] = []
    positions: list[int] = []
    for doc in docs:
        doc = [separator, *doc]
        while doc:
            take = doc[: window - len(ids)]
            doc = doc[len(take):]
            positions += range(len(take))
            ids += take
            if len(ids) == window:
                yield ids, positions
                ids, positions = [], []


def source_rows(files: list[CodeFile], tokenizer: Any, separator: int, seq_len: int, seed: list[int]
                ) -> Iterator[tuple[list[int], list[int]]]:
    """Endless packed rows of ``files``, each epoch in a fresh seeded order."""
    epoch = 0
    while True:
        order = np.random.default_rng([*seed, epoch]).permutation(len(files))
        yield from pack_documents(documents([files[i] for i in order], tokenizer), separator, seq_len)
        epoch += 1


class MixedBatches:
    """``[batch, seq_len + 1]`` ids and positions, each row from one source drawn by weight.

    Deterministic in (seed, phase): the source of every row comes from one seeded generator, and
    each source's rows from its own seeded file order, so ``skip(n)`` followed by ``next()`` gives
    what the n+1-th ``next()`` of a fresh instance gives (resume)."""

    def __init__(self, files: list[CodeFile], phase: Phase, tokenizer: Any, separator: int, seed: int):
        c = phase.config
        by_source: dict[str, list[CodeFile]] = {}
        for f in files:
            by_source.setdefault(f.source, []).append(f)
        if c.sources:
            missing = [s for s in c.sources if s not in by_source]
            if missing:
                raise ConfigError(f"{phase.key('sources')}: {missing} has no training files; the "
                                  f"corpus has {sorted(by_source)}")
            self.sources = list(c.sources)
            weights = np.array(c.weights, dtype=float)
        else:  # the natural mix: every corpus source in proportion to its text (generated ones only when listed)
            self.sources = sorted(s for s in by_source if s not in GENERATED_SOURCES)
            weights = np.array([sum(len(f.text) for f in by_source[s]) for s in self.sources], dtype=float)
        self.weights = weights / weights.sum()
        self.batch_size = c.batch_size
        self.rng = np.random.default_rng(seed_of(seed, "mix", phase.index))
        self.streams = {s: source_rows(by_source[s], tokenizer, separator, c.seq_len, seed_of(seed, s, phase.index))
                        for s in self.sources}
        self.tokens = dict.fromkeys(self.sources, 0)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = self.rng.choice(len(self.sources), size=self.batch_size, p=self.weights)
        rows = [next(self.streams[self.sources[i]]) for i in chosen]
        for i, (ids, _) in zip(chosen, rows, strict=True):
            self.tokens[self.sources[i]] += len(ids) - 1
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])

    def skip(self, batches: int) -> None:
        for _ in range(batches):
            self.next()


def packed_batches(files: list[CodeFile], tokenizer: Any, separator: int, batch_size: int, seq_len: int,
                   repeat: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``[batch_size, seq_len + 1]`` ids and position ids of ``files`` packed in order; once
    through, or cycling when ``repeat``."""
    while True:
        rows = pack_documents(documents(files, tokenizer), separator, seq_len)
        while len(chunk := [row for _, row in zip(range(batch_size), rows, strict=False)]) == batch_size:
            yield torch.tensor([ids for ids, _ in chunk]), torch.tensor([pos for _, pos in chunk])
        if not repeat:
            return


def fixed_batches(files: list[CodeFile], tokenizer: Any, separator: int, seq_len: int, batch_size: int,
                  count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` packed batches of ``files`` in order (held-out evaluation sets)."""
    return list(itertools.islice(packed_batches(files, tokenizer, separator, batch_size, seq_len), count))



class DemonstrationBatches:
    """Seeded epochs over the rows of recorded episodes, ``batch_size`` rows a step; ``skip``
    replays the draws for a resume."""

    def __init__(self, episodes: list, batch_size: int, seed: int, phase_index: int):
        from opencomposer.training.packing import episode_rows

        self.rows = episode_rows(episodes)
        if not self.rows:
            raise ValueError("sft: the demonstrations hold no model tokens")
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed_of(seed, "sft", phase_index))
        self.order: list[int] = []

    def next_rows(self) -> list:
        """The next batch's rows, uncollated (a data-parallel rank collates its share)."""
        while len(self.order) < self.batch_size:
            self.order += self.rng.permutation(len(self.rows)).tolist()
        chosen, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
        return [self.rows[i] for i in chosen]

    def skip(self, batches: int) -> None:
        for _ in range(batches):
            self.next_rows()


def phase_gaps(phase: PhaseConfig, pc: PretrainConfig) -> tuple[int, int]:
    """The (recall, append) gaps of the generated documents ``phase`` draws."""
    recall = phase.recall_gap_chars or pc.recall_gap_chars
    return recall, phase.append_gap_chars or recall


def generated_corpora(corpus: Corpus, tokenizer: Any, pc: PretrainConfig, seed: int) -> dict[tuple[int, int], Corpus]:
    """``corpus`` with the generated sources its phases list (``pretrain.recall``), one per pair of
    gaps in use (``phase_gaps``): a phase draws the documents made with its ``recall_gap_chars``
    and ``append_gap_chars``. The held-out files and the natural training files are the same in all."""
    by_gaps: dict[tuple[int, int], set[str]] = {}
    for phase in pc.phases:
        by_gaps.setdefault(phase_gaps(phase, pc), set()).update(phase.sources)
    return {gaps: with_recall_sources(corpus, tokenizer, names, pc.recall_documents, seed, *gaps)
            for gaps, names in by_gaps.items()}
