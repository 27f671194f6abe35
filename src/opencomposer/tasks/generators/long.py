"""The ``tiny-long`` family: long-horizon tasks whose obstacle is the context window, not difficulty.

A task's workspace holds K notes, ``notes/part1.txt`` .. ``notes/partK.txt`` (K from ``LENGTHS``,
3 to 6). Each note is a seeded log of ``FILLER_LINES`` lines (timestamps, levels, components,
numbers; deterministic from the task) with exactly one line ``key: WORD`` at a seeded position.
The instruction asks the agent to read the notes one at a time and write the K words, in file
order and separated by single spaces, to ``out.txt``; the hidden test compares that file (trailing
whitespace and newline stripped) with the K words. Each step is trivial; what makes the task hard
is that the K reads do not fit in one context window of ``CONTEXT_WINDOW`` tokens:

- one ``read_file`` of a note returns 370-440 tokens of the project's code tokenizer (about 400:
  its output, line numbers included); with the call that asks for it and the tool-response
  wrapping, a read adds about 450 tokens to the context;
- the system prompt with the tool list is about 1,300 tokens and the instruction about 100, so the
  full read-through of even a K = 3 task (about 2,800 tokens; K = 6: about 4,200) overruns a
  window of ``CONTEXT_WINDOW`` = 2,560 tokens (``agent.context_window = 2560``). Without a context
  policy the agent runs out of window before it has read every note (the episode ends as a token
  budget stop); with one (summarise what the notes said, continue from the summary), a window
  holds the prompt, the previous summary, one read, the summary request and the new summary: at
  most about 2,300 tokens with the oracle's summaries, which leaves the summary room to be longer.
  At this window the default trigger of ``self_summary`` (``agent.context.trigger_tokens``) asks
  for a summary after every tool output, K + 1 per episode at most (the default
  ``agent.max_summaries`` of 8 covers K = 6).

``tests/rl/test_long_family.py`` measures these numbers with the project's tokenizer and the real
harness, and checks that the oracle's unsummarised read-through overruns the window.

Words are the sixteen words of ``tiny-words`` (``tiny.FAMILIES``), each a single token of the code
tokenizer (after a space, usually one too: the tokenizer is trained on the environment's installed
source, so that can vary), and never appear in the filler (neither does ``key``),
so ``key: WORD`` is the only line of a note that names one. A task's words are distinct.

Splits: a seed-independent catalogue of ``SEQUENCES_PER_LENGTH`` word sequences for each K; one
sequence in ``HELDOUT_SHARE`` (by hash) is held out, so the ``heldout`` split asks for word
combinations that training never shows, at the same lengths (the skill under test is carrying
facts across summaries, not a new vocabulary). Task ``i`` of a split is a pure function of (family,
seed, split, i), as in ``tiny``: each round through a split's sequences is a fresh seeded
permutation, and the notes' filler and key positions come from a hash of the same four values.

Budgets (``LongSpec.budgets``): ``max_turns = 2K + 6``: the work is K + 2 turns (K reads, the
write, ``finish``), which leaves K + 4 spare: a summary after every tool output where a loop counts
summary turns against the budget, and room for a few mistakes where it does not.
``max_tokens = (K + 3) × CONTEXT_WINDOW`` over all segments: a full window for each of the K + 2
segments that a summary after every tool output makes, and one spare. ``max_wall_s = 120 + 30 K``.

The oracle's walkthrough is ``solution/script.json`` (``agent.policies.scripted.oracle_script``):
one ``read_file`` per note, one per turn, then ``write_file out.txt``, then ``finish``. Each read's
``note``, which the oracle's summaries repeat, is the write as it would be with the words read so
far: ``pending write_file: {"path": "out.txt", "content": "list node"}``. A later note with the
same label replaces it in a summary (``script_summary``), so a summary carries one running list,
and the final write repeats the last note's arguments token for token. That form is chosen for a
small model: it copies text it sees again in the same form, while gathering words from one line
per note into a list is a step it does not learn from demonstrations (docs/LOG.md, 2026-12-05).
What it must still learn is to add the newest word to the list (the ``append`` pretraining
source, ``pretrain.recall``). Each read also has a ``scratch``, ``key: WORD`` as the note has it:
the oracle's summary after that read opens with it in a ``<think>`` block (the scratch space of
the report's summary turn, which the loop drops from what the summary hands on), so the newest
word is written once, looked up from the note's output alone (no earlier summary holds a
``key:`` line to copy instead), a few tokens before the list it is added to.
``solution/gold.patch`` holds the same change, for the grader and ``verify_task``.

Summary quality (``summary_retention``): over the segments after the first, the share of the key
words of the notes read in earlier segments that the segment opens with (its summary, or the tool
outputs truncation kept); ``summary_spurious`` is the same share for the words the task does not
use, so that a summary listing every word does not pass for a good one. ``summary_plan`` is the
share of those segments whose opening names exactly the notes still to read (the plan a summary
hands on: a plan that drops a note can end the episode a word short, one that names a note the
task lacks can end it on a missing file).
Held-out evaluation during RL reports the three means for the family's tasks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from opencomposer.sandbox.patch import file_diff
from opencomposer.tasks.format import write_task
from opencomposer.types import Task

Split = Literal["train", "heldout"]

NAME = "tiny-long"
WORDS = ("tree", "list", "text", "node", "user", "time", "line", "code",
         "value", "index", "event", "model", "table", "color", "state", "point")
LENGTHS = (3, 4, 5, 6)  # K, the number of notes
SEQUENCES_PER_LENGTH = 400  # catalogue size for each K (before the split)
HELDOUT_SHARE = 5  # one sequence in five is held out
FILLER_LINES = 10  # log lines per note besides the key line: the knob for a read's size in tokens
CONTEXT_WINDOW = 2560  # the window (agent.context_window) the family is sized against; see the module doc
OUT_FILE = "out.txt"
KEY_LABEL = "key"  # a note's one line that names its word: "key: WORD"
TEST_PATH = "tests/test_answer.py"
TEST_ID = f"{TEST_PATH}::test_answer"
CATALOGUE_SEED = 0x10E6  # fixed: the catalogue and the split do not depend on the run seed

INSTRUCTION = (
    'The folder "notes" holds {k} files, "notes/part1.txt" to "notes/part{k}.txt". Each is a log '
    'with exactly one line of the form "key: WORD". Read the files one at a time, in order, then '
    'write their {k} words, in file order and separated by single spaces, to the file "{out}" and '
    "call finish."
)

_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN")
_COMPONENTS = ("scheduler", "fetcher", "worker", "cache", "uploader", "gateway", "storage", "auth")
_MESSAGES = (
    "flushed {a} records to disk in {b} ms",
    "accepted connection from 10.0.{c}.{d}:{p}",
    "retrying request {h} after {b} ms",
    "cache hit ratio {e}% over {a} lookups",
    "finished batch {a} with {c} items",
    "rotated log segment {a} ({b} KiB)",
    "heartbeat ok, lag {b} ms",
    "queue depth {c}, {d} pending",
    "checkpoint {h} written",
    "dropped {c} stale sessions",
)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@dataclass(frozen=True)
class LongFamily:
    """Which words and lengths a long family draws from, and how it holds sequences out."""

    name: str
    words: tuple[str, ...] = WORDS
    lengths: tuple[int, ...] = LENGTHS
    per_length: int = SEQUENCES_PER_LENGTH
    heldout_share: int = HELDOUT_SHARE

    def held_out(self, words: tuple[str, ...]) -> bool:
        return hashlib.sha256("/".join(words).encode()).digest()[0] % self.heldout_share == 0

    def combinations(self, split: Split) -> list[tuple[str, ...]]:
        """The word sequences of ``split`` (catalogue order); the two splits are disjoint."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split: expected 'train' or 'heldout', got {split!r}")
        return list(_combinations(self, split))


@functools.cache
def _catalogue(family: LongFamily) -> tuple[tuple[str, ...], ...]:
    """``per_length`` distinct sequences of distinct words for each K, from a fixed seed."""
    sequences: list[tuple[str, ...]] = []
    for k in family.lengths:
        if not 1 <= k <= len(family.words):
            raise ValueError(f"{family.name}: length {k} needs 1 to {len(family.words)} distinct words")
        rng = np.random.default_rng([CATALOGUE_SEED, k])
        seen: set[tuple[str, ...]] = set()
        while len(seen) < family.per_length:
            words = tuple(family.words[int(j)] for j in rng.permutation(len(family.words))[:k])
            if words not in seen:
                seen.add(words)
                sequences.append(words)
    return tuple(sequences)


@functools.cache
def _combinations(family: LongFamily, split: Split) -> tuple[tuple[str, ...], ...]:
    return tuple(s for s in _catalogue(family) if family.held_out(s) == (split == "heldout"))


FAMILIES = {NAME: LongFamily(NAME)}


def family(name: str = NAME) -> LongFamily:
    if name not in FAMILIES:
        raise ValueError(f"unknown long family {name!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


@dataclass(frozen=True)
class LongSpec:
    """One task: the words of its notes, in order, and the seed of their filler and key positions."""

    family: str
    split: str
    index: int
    words: tuple[str, ...]
    layout: int  # seeds each note's filler lines and where its key line sits

    @property
    def k(self) -> int:
        return len(self.words)

    @property
    def task_id(self) -> str:
        return f"{self.family}-{self.split}-{self.index:05d}-k{self.k}-{'-'.join(self.words)}"

    @property
    def instruction(self) -> str:
        return INSTRUCTION.format(k=self.k, out=OUT_FILE)

    @property
    def budgets(self) -> dict[str, int]:
        """Turns, tokens and seconds for K reads plus summaries (module doc)."""
        return {"max_turns": 2 * self.k + 6, "max_tokens": (self.k + 3) * CONTEXT_WINDOW,
                "max_wall_s": 120 + 30 * self.k}

    @property
    def mistake_position(self) -> int:
        """Which word a wrong demonstration (``write_long_task(answer=...)``) replaces."""
        return _hash(self.task_id) % self.k

    def note_path(self, part: int) -> str:
        return f"notes/part{part}.txt"

    def notes(self) -> dict[str, str]:
        """The workspace's notes: path -> text."""
        return {self.note_path(part): _note(self.layout, part, word) for part, word in enumerate(self.words, 1)}


def _note(layout: int, part: int, word: str) -> str:
    """Seeded log lines (increasing timestamps) with ``key: word`` at a seeded position."""
    rng = np.random.default_rng([layout, part])
    second = int(rng.integers(0, 86_400 - 600))
    day = 1 + int(rng.integers(0, 28))
    lines = []
    for _ in range(FILLER_LINES):
        second += 1 + int(rng.integers(0, 90))
        clock = f"{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        level = _LEVELS[int(rng.integers(len(_LEVELS)))]
        component = _COMPONENTS[int(rng.integers(len(_COMPONENTS)))]
        template = _MESSAGES[int(rng.integers(len(_MESSAGES)))]
        message = template.format(a=int(rng.integers(10, 5000)), b=int(rng.integers(1, 900)),
                                  c=int(rng.integers(0, 256)), d=int(rng.integers(0, 256)),
                                  e=int(rng.integers(50, 100)), p=int(rng.integers(1024, 65536)),
                                  h=f"{int(rng.integers(1 << 32)):08x}")
        lines.append(f"2024-03-{day:02d} {clock} {level:<5} {component}[{int(rng.integers(100, 1000))}]: {message}")
    lines.insert(int(rng.integers(0, FILLER_LINES + 1)), f"{KEY_LABEL}: {word}")
    return "\n".join(lines) + "\n"


def split_size(split: Split, family_name: str = NAME) -> int:
    """Distinct tasks of ``split``: tasks ``0 .. split_size - 1`` are its word sequences, each once."""
    return len(family(family_name).combinations(split))


def long_spec(seed: int, split: Split, index: int, family_name: str = NAME) -> LongSpec:
    """Task ``index`` of ``split``: a pure function of its arguments."""
    if index < 0:
        raise ValueError(f"index: expected a task position >= 0, got {index}")
    combos = family(family_name).combinations(split)
    key = _hash(f"{family_name}/{seed}/{split}")
    round_order = np.random.default_rng([key, index // len(combos)]).permutation(len(combos))
    words = combos[int(round_order[index % len(combos)])]
    return LongSpec(family=family_name, split=split, index=index, words=words,
                    layout=_hash(f"{family_name}/{seed}/{split}/{index}"))


def mentions(text: str, word: str) -> bool:
    """``text`` names ``word`` as a whole word (any case)."""
    return re.search(rf"\b{re.escape(word)}\b", text, flags=re.IGNORECASE) is not None


def message_facts(messages: list[Any]) -> str:
    """The facts ``messages`` show: a resume message's summary alone (its state block's fixed
    wording holds words such as "model" and "state") and whole tool outputs; the agent's own turns
    are left out."""
    parts = []
    for m in messages:
        if m.role == "tool":
            parts.append(m.content)
        elif m.role == "user":
            found = re.search(r"<summary>\n(.*)\n</summary>", m.content, flags=re.DOTALL)
            parts.append(found.group(1) if found else "")
    return "\n".join(parts)


def opening_facts(segment: Any) -> str:
    """What a segment opens with beyond the system prompt and the task (``message_facts``): its
    summary, or the tool outputs truncation kept."""
    return message_facts(segment.messages[2:])


_NOTE = re.compile(r"notes/part(\d+)\.txt")


def notes_read(segment: Any) -> set[int]:
    """The parts whose note a segment's work turns read (``read_file`` of ``notes/partN.txt``)."""
    parts = set()
    for turn in segment.turns:
        if turn.summary:
            continue
        for c in turn.tool_calls:
            found = _NOTE.fullmatch(str(c.arguments.get("path", ""))) if c.name == "read_file" else None
            if found:
                parts.add(int(found.group(1)))
    return parts


def summary_retention(episode: Any, words: tuple[str, ...]) -> float:
    """Over ``episode``'s segments after the first, the share of the words of the notes read in
    earlier segments that the segment opens with (``opening_facts``); NaN when no segment follows
    a read."""
    shares = []
    read: set[int] = set()
    for i, segment in enumerate(episode.segments):
        known = [words[part - 1] for part in sorted(read) if 1 <= part <= len(words)]
        if i and known:
            text = opening_facts(segment)
            shares.append(sum(mentions(text, w) for w in known) / len(known))
        read |= notes_read(segment)
    return float(np.mean(shares)) if shares else float("nan")


def summary_spurious(episode: Any, words: tuple[str, ...]) -> float:
    """Over ``episode``'s segments after the first, the share of the family's words that the task
    does not use that the segment opens with: the floor to read ``summary_retention`` against (a
    summary that lists every word scores 1.0 on both); NaN for a single segment."""
    others = [w for w in WORDS if w not in words]
    shares = [sum(mentions(opening_facts(s), w) for w in others) / len(others) for s in episode.segments[1:]]
    return float(np.mean(shares)) if shares else float("nan")


def summary_plan(episode: Any, words: tuple[str, ...]) -> float:
    """Over ``episode``'s segments after the first, the share whose opening (``opening_facts``)
    names exactly the notes still to read: every ``notes/partN.txt`` of the task not read in
    earlier segments, and no other part (one already read, or one the task does not have). The
    other half of what a summary must carry: a plan that drops a note ends the episode a word
    short, one that adds a note reads a missing file. NaN for a single segment."""
    parts = set(range(1, len(words) + 1))
    shares = []
    read: set[int] = set()
    for i, segment in enumerate(episode.segments):
        if i:
            named = {int(n) for n in _NOTE.findall(opening_facts(segment))}
            shares.append(float(named == parts - read))
        read |= notes_read(segment)
    return float(np.mean(shares)) if shares else float("nan")


def hidden_test(words: tuple[str, ...]) -> str:
    expected = " ".join(words)
    return (
        "from pathlib import Path\n\n\n"
        "def test_answer():\n"
        f"    path = Path({OUT_FILE!r})\n"
        f"    assert path.is_file(), 'missing {OUT_FILE}'\n"
        f"    assert path.read_text().rstrip() == {expected!r}\n"
    )


PENDING_LABEL = "pending write_file"


def pending_note(words: tuple[str, ...]) -> str:
    """A read's note: the answer's write with the words found so far (module doc)."""
    return f"{PENDING_LABEL}: " + json.dumps({"path": OUT_FILE, "content": " ".join(words)})


def walkthrough(spec: LongSpec, written: tuple[str, ...]) -> list[dict[str, Any]]:
    """The oracle's turns (``solution/script.json``): each note read in its own turn, noting the
    pending write with the words so far, then the write of ``written`` and ``finish``."""
    turns: list[dict[str, Any]] = [
        {"calls": [{"name": "read_file", "arguments": {"path": spec.note_path(part)}}],
         "note": pending_note(written[:part]), "scratch": f"{KEY_LABEL}: {written[part - 1]}"}
        for part in range(1, len(written) + 1)
    ]
    answer = " ".join(written)
    turns.append({"calls": [{"name": "write_file", "arguments": {"path": OUT_FILE, "content": answer + "\n"}}],
                  "note": f"wrote {OUT_FILE}: {answer}"})
    turns.append({"calls": [{"name": "finish", "arguments": {"message": f"{OUT_FILE} holds the {spec.k} words."}}]})
    return turns


def write_long_task(folder: Path, spec: LongSpec, overwrite: bool = False, answer: str | None = None) -> Task:
    """Write one task folder (docs/task-format.md, plus ``solution/script.json``) for ``spec`` and
    load it back. ``answer`` replaces the word at ``spec.mistake_position`` in what the gold change
    and the walkthrough write, its note included (a teacher that misread one note, for
    ``sft.wrong_share``; such a task's gold change does not resolve it)."""
    written = spec.words
    if answer is not None:
        if not re.fullmatch(r"\S+", answer):
            raise ValueError(f"answer: expected one word without spaces, got {answer!r}")
        written = tuple(answer if i == spec.mistake_position else w for i, w in enumerate(spec.words))
    task = write_task(
        folder,
        task_id=spec.task_id,
        instruction=spec.instruction,
        repo={"README.md": "# scratch\n\nNotes to read.\n", **spec.notes()},
        fail_to_pass=[TEST_ID],
        pass_to_pass=[],
        hidden_tests={TEST_PATH: hidden_test(spec.words)},
        protected_paths=["tests"],
        metadata={"source": "handwritten", "family": spec.family, "difficulty": "easy", "kind": "instructions",
                  "words": list(spec.words), "file": OUT_FILE, "split": spec.split},
        budgets=spec.budgets,
        gold_patch=file_diff(OUT_FILE, None, " ".join(written) + "\n"),
        overwrite=overwrite,
    )
    script = Path(folder) / "solution" / "script.json"
    script.write_text(json.dumps(walkthrough(spec, written), indent=1) + "\n", encoding="utf-8")
    return task
