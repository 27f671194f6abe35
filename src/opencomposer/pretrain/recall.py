"""Synthetic recall sources: documents that teach a small model to copy from its own context.

A model reads a long file usefully only if it can fetch what it saw earlier: a name defined at
the top, a value set two screens up. In a transformer that skill is an *induction circuit* (one
head marks each position with the token before it, a later head finds the earlier position whose
predecessor matches the current token and copies what followed). A large model forms it early
in natural text; the tiny MoE of the CPU recipes does not form it from code in any budget a CPU
run allows (docs/LOG.md, 2026-12-05: the retrieval probe stays at chance after 6,000 steps on a
code mix, while the same model trained on repeated token spans forms it in 1,000-2,000 steps).
So a phase may list two generated sources beside the corpus's:

- ``copy``: a span of 4-12 random word pieces of the tokenizer's vocabulary (glued, or joined by
  separators such as ``_``), a newline, the same span again. The first half is noise; the second
  half is predictable only by copying, so these rows carry almost nothing but the copying signal.
  A document fits a 64-token row, so the circuit forms in a short first phase.
- ``recall``: half *planted facts*, ``NAME = "VALUE"``, held-in code, ``assert NAME == "VALUE"``
  (names and values joined from identifiers of the training code), half a random span, held-in
  code, the same span again. The code between is a log-uniform 10 to ``pretrain.recall_gap_chars``
  (default ``RECALL_GAP_CHARS``) characters of a training file, so the distance to copy across ranges from a few tokens to a few
  hundred: at a short first phase most long documents are cut (a row continued from the previous
  one starts its own attention), at the long-context extension they fit, and the model learns to
  fetch across the new lengths. A model that must copy across a whole agent context (the
  ``tiny-long`` family's 2,560-token window: a word read 400-700 tokens before it is written) needs
  a longer gap (``pretrain.recall_gap_chars``) and a phase at that length (docs/LOG.md,
  2026-12-05: 4,000 characters, about 1,200 tokens, at 2,560 tokens a row).

- ``append``: a chain of list updates. A name is assigned a list of 0-4 words (``NAME = "w1
  w2"``); then, ``APPEND_STEPS`` times (1-4), held-in code, a line ``LABEL: WORD`` (``LABEL`` one
  of ``APPEND_LABELS``), more code, and the name assigned the list with ``WORD`` appended
  (``NAME = "w1 w2 WORD"``). The last word of each update is where plain copying fails: the
  previous assignment goes on with the closing quote, so the model must stop copying and fetch the
  labelled word instead. This is the step that carrying facts through summaries needs (a running
  list of findings, each summary adds the newest), and the one the tiny model does not learn from
  agent demonstrations alone (docs/LOG.md, 2026-12-05, issue 14). A chain has the shape of an
  agent's run of summaries (each update copies the one before it and adds what was read since)
  and puts several updates in a document, so a row carries more of this signal than one update
  would.

None of the sources uses the retrieval probe's words (``PROBE_WORDS``) or its names, nor any
held-out file: the probe stays a held-out measurement. Documents are a pure function of the
training files, the tokenizer and the seed, so every rank and every resumed run draws the same
ones. ``pretrain.recall_documents`` sets how many each source holds (rows are drawn from a
seeded, reshuffled stream over them, like any source's files).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from opencomposer.model.corpus import CodeFile, Corpus

SOURCES = ("copy", "recall", "append")
"""The generated sources a phase may list in ``sources``."""
PROBE_WORDS = ("amber", "basil", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
               "kelp", "lotus", "maple", "nickel", "onyx", "pepper", "quartz", "raven", "saffron", "tundra",
               "umber", "violet", "walnut", "yarrow", "zephyr")
"""The values of the held-out probes (``pretrain.evaluation``); no generated document uses them."""
SPAN_PIECES = (4, 12)  # a span is this many word pieces (inclusive bounds): a document fits 64 tokens
SEPARATORS = ("", "", "", "_", "_", " ", ".", '"', ", ", " = ")  # between two pieces (glued most often)
RECALL_GAP_CHARS = 900  # default longest stretch of code between what is said and where it is recalled
IDENTIFIER_FILES = 500  # training files whose identifiers name planted facts
APPEND_LABELS = ("key", "item", "next", "add", "new")  # what an append document's new word is marked with
APPEND_ITEMS = (0, 4)  # an append chain's first list holds this many words (inclusive bounds)
APPEND_STEPS = (1, 4)  # and it is updated this many times, one word each (inclusive bounds)
_IDENTIFIER = re.compile(r"\b[a-z][a-z]{2,9}\b")


def _excluded(word: str) -> bool:
    return "probe" in word or any(w in word for w in PROBE_WORDS)


def word_pieces(tokenizer: Any) -> list[str]:
    """The vocabulary's alphabetic ASCII pieces without a leading space: what spans are made of
    (a span of them, written twice after the same character, tokenizes the same twice)."""
    pieces = set()
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if text.isascii() and text.isalpha() and not _excluded(text.lower()):
            pieces.add(text)
    if not pieces:
        raise ValueError("recall sources: the tokenizer has no alphabetic word pieces to build spans from")
    return sorted(pieces)


def identifiers(files: list[CodeFile]) -> list[str]:
    """Lowercase words of 3-10 letters in the first ``IDENTIFIER_FILES`` training files."""
    words = {w for f in files[:IDENTIFIER_FILES] for w in _IDENTIFIER.findall(f.text)}
    return sorted(w for w in words if not _excluded(w))


def _code(files: list[CodeFile], rng: np.random.Generator, gap_chars: int) -> str:
    """A log-uniform 10 to ``gap_chars`` characters of whole lines of a training file (fewer where
    the file ends first)."""
    lines = files[int(rng.integers(len(files)))].text.splitlines()
    budget = math.exp(rng.uniform(math.log(10), math.log(gap_chars)))
    start = int(rng.integers(len(lines))) if lines else 0
    out: list[str] = []
    size = 0
    for line in lines[start:]:
        if size >= budget:
            break
        out.append(line + "\n")
        size += len(line) + 1
    return "".join(out)


def _span(pieces: list[str], rng: np.random.Generator) -> str:
    """Word pieces, glued or joined by the separators code is full of. A common token inside the
    span (``_``, a space, a quote) is what makes copying hard: the token after it cannot be found
    by matching that one token, so the model must match on more of what precedes it."""
    while True:  # glued pieces can spell a probe word; draw again (rare)
        count = int(rng.integers(SPAN_PIECES[0], SPAN_PIECES[1] + 1))
        words = rng.choice(pieces, size=count)
        joins = rng.choice(SEPARATORS, size=count - 1)
        span = words[0] + "".join(j + w for j, w in zip(joins, words[1:], strict=True))
        if not _excluded(span.lower()):
            return span


def copy_documents(pieces: list[str], count: int, seed: int) -> list[CodeFile]:
    """``count`` documents ``SPAN\\nSPAN\\n`` (source ``copy``)."""
    rng = np.random.default_rng([seed, 0xC0B1])
    return [CodeFile("copy", f"copy/{i}.txt", f"{span}\n{span}\n")
            for i, span in enumerate(_span(pieces, rng) for _ in range(count))]


def recall_documents(files: list[CodeFile], pieces: list[str], count: int, seed: int,
                     gap_chars: int = RECALL_GAP_CHARS) -> list[CodeFile]:
    """``count`` documents (source ``recall``): planted facts and spans repeated across up to
    ``gap_chars`` characters of code."""
    if gap_chars < 10:
        raise ValueError(f"recall sources: the gap must allow at least 10 characters of code, got {gap_chars}")
    if not files:
        raise ValueError("recall sources: no training files to take code and identifiers from")
    words = identifiers(files)
    if len(words) < 2:
        raise ValueError("recall sources: the training files hold too few identifiers to name facts")
    rng = np.random.default_rng([seed, 0x4EC1])
    out = []
    for i in range(count):
        if i % 2 == 0:
            name = "_".join(rng.choice(words, size=2, replace=False))
            value = "_".join(rng.choice(words, size=2, replace=False))
            text = f'{name} = "{value}"\n{_code(files, rng, gap_chars)}assert {name} == "{value}"\n'
        else:
            span = _span(pieces, rng)
            text = f"{span}\n{_code(files, rng, gap_chars)}{span}\n"
        out.append(CodeFile("recall", f"recall/{i}.py", text))
    return out


def append_documents(files: list[CodeFile], count: int, seed: int, gap_chars: int = RECALL_GAP_CHARS) -> list[CodeFile]:
    """``count`` documents (source ``append``, module doc): a list, then updates, each held-in
    code, a labelled word, code (up to a third of ``gap_chars``), the list with the word appended."""
    if gap_chars < 10:
        raise ValueError(f"append sources: the gap must allow at least 10 characters of code, got {gap_chars}")
    if not files:
        raise ValueError("append sources: no training files to take code and identifiers from")
    words = identifiers(files)
    most = APPEND_ITEMS[1] + APPEND_STEPS[1]
    if len(words) < most + 2:
        raise ValueError("append sources: the training files hold too few identifiers to make lists of")
    rng = np.random.default_rng([seed, 0xA99E])
    out = []
    for i in range(count):
        name = "_".join(rng.choice(words, size=2, replace=False))
        first = int(rng.integers(APPEND_ITEMS[0], APPEND_ITEMS[1] + 1))
        steps = int(rng.integers(APPEND_STEPS[0], APPEND_STEPS[1] + 1))
        items = [str(w) for w in rng.choice(words, size=first + steps, replace=False)]
        parts = [f'{name} = "{" ".join(items[:first])}"\n']
        for n in range(first + 1, first + steps + 1):
            label = APPEND_LABELS[int(rng.integers(len(APPEND_LABELS)))]
            parts += [_code(files, rng, gap_chars), f"{label}: {items[n - 1]}\n",
                      _code(files, rng, max(10, gap_chars // 3)), f'{name} = "{" ".join(items[:n])}"\n']
        out.append(CodeFile("append", f"append/{i}.py", "".join(parts)))
    return out


def with_recall_sources(corpus: Corpus, tokenizer: Any, names: set[str], count: int, seed: int,
                        gap_chars: int = RECALL_GAP_CHARS, append_gap_chars: int = 0) -> Corpus:
    """``corpus`` with the generated sources among ``names`` added to its training files
    (``gap_chars``: ``recall_documents``; ``append_gap_chars``: ``append_documents``, 0: the same)."""
    wanted = [s for s in SOURCES if s in names]
    if not wanted:
        return corpus
    pieces = word_pieces(tokenizer)
    extra: list[CodeFile] = []
    if "copy" in wanted:
        extra += copy_documents(pieces, count, seed)
    if "recall" in wanted:
        extra += recall_documents(corpus.train, pieces, count, seed, gap_chars)
    if "append" in wanted:
        extra += append_documents(corpus.train, count, seed, append_gap_chars or gap_chars)
    return Corpus(train=corpus.train + extra, heldout=corpus.heldout, dropped=corpus.dropped)
