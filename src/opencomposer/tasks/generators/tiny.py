"""Tiny task families: one-word, one-file tasks for the tiny CPU MoE, the demo and the RL tests.

Each task asks the agent to write one word into one file ('Write the word "node" to the file
"out.txt".'); the hidden test reads the file. A solution is a single turn of two tool calls
(``write_file``, then ``finish``), about sixty tokens, and the budget is that one turn
(``max_turns = 1``). Word and file name are single tokens of the project's code tokenizer, quoted
in the instruction exactly as they appear inside the tool call's JSON arguments.

Four families:

- ``tiny``: the word and the file are always ``node`` and ``out.txt``; only the phrasing of the
  request changes (28 phrasings; the ``heldout`` split uses eight that training never shows, which
  leaves 20 for training).
  What a model has to learn is the harness's tool-call turn, token for token, and to keep doing it
  whatever the phrasing. A randomly initialised tiny MoE learns it in 145-160 SFT steps of 16
  episodes (recipes/rl-tiny.toml; docs/LOG.md has what RL then does with it).
- ``tiny-composed``: the same word and file, but 160 phrasings composed from parts (eight verbs,
  two ways each to name the word and the file, five closings); one combination in four is held
  out (48, leaving 112 for training), so a held-out phrasing is a new combination of parts that
  training shows. Built so that what RL fixes on training phrasings can carry over to held-out
  ones (docs/LOG.md).
- ``tiny-words``: sixteen words × four files × three phrasings; the splits are disjoint
  combinations. Here the model must copy the word and the file name out of the instruction. We
  measured that a randomly initialised tiny MoE does not learn that copy in minutes behind the
  harness's ~1,300-token system prompt and tool list: after 500 SFT steps (batch 32) its loss sat
  at 0.0655 nats/token, exactly the entropy of guessing word and file, (ln 16 + ln 4)/63
  (docs/LOG.md). It is the family for a pretrained model.
- ``tiny-long`` (``generators.long``): K notes to read, one word in each, the K words to write into
  one file; the reads together overrun the context window, so the obstacle is the window (a
  context policy that summarises), not the difficulty. Its tasks have their own spec
  (``LongSpec``); the functions below dispatch to ``generators.long`` for it, so ``rl.task_family``
  and ``sft.task_family`` take it like the others.

Task ``i`` of a split is a pure function of (family, seed, split, i): the same seed gives the same
tasks on every machine; each round through a split's combinations is a fresh seeded permutation.
The first round (``split_size`` tasks) holds every combination once: it is all that RL's single
epoch may take (``rl.tasks``); later rounds repeat prompts and serve only SFT's demonstrations.
``write_tiny_suite`` verifies every task it writes through the real grader (the gold change
resolves it, the untouched workspace does not).

Not here: the realistic generators of issue 5 (bug injection, feature deletion, refactors).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from opencomposer.config import GradingConfig, SandboxConfig
from opencomposer.sandbox.patch import file_diff
from opencomposer.tasks.format import load_task, write_task
from opencomposer.tasks.generators.long import FAMILIES as LONG_FAMILIES
from opencomposer.tasks.generators.long import LongFamily, LongSpec, long_spec, write_long_task
from opencomposer.types import Task

Split = Literal["train", "heldout"]

PHRASINGS = (
    'Write the word "{word}" to the file "{file}".',
    'Create the file "{file}" containing the word "{word}".',
    'Put the word "{word}" in the file "{file}".',
    'Save "{word}" into "{file}".',
    'Make a file "{file}" whose content is "{word}".',
    'Store the word "{word}" in a new file called "{file}".',
    'Please write "{word}" into "{file}".',
    'The file "{file}" should contain "{word}".',
    'Add a file "{file}" with the text "{word}".',
    'I need "{word}" written to "{file}".',
    'Fill "{file}" with the word "{word}".',
    'Record "{word}" in "{file}".',
    'Write "{word}" in "{file}".',
    'Create "{file}" with "{word}" as its only content.',
    'Place the word "{word}" into a file named "{file}".',
    'Your task: write "{word}" to "{file}".',
    'Put "{word}" into the file "{file}".',
    'Create a new file "{file}" that contains "{word}".',
    'Write a file called "{file}" containing "{word}".',
    'Make "{file}" contain the word "{word}".',
    'Save the word "{word}" in "{file}".',
    'Could you write "{word}" to "{file}"?',
    'The word "{word}" belongs in the file "{file}".',
    'Set the content of "{file}" to "{word}".',
    'Write the text "{word}" into "{file}".',
    'Store "{word}" in "{file}".',
    'Please put the word "{word}" in "{file}".',
    'Create "{file}" and write "{word}" in it.',
)


def _composed_phrasings() -> tuple[str, ...]:
    """Requests built from parts (verb, how the word and the file are named, closing): every part
    appears in many phrasings, so a held-out phrasing is a new combination of familiar parts."""
    verbs = (("Write", "to"), ("Put", "in"), ("Save", "into"), ("Store", "in"), ("Place", "in"), ("Record", "in"),
             ("Add", "to"), ("Insert", "into"))
    words = ('the word "{word}"', '"{word}"')
    files = ('the file "{file}"', '"{file}"')
    closings = (".", ", please.", " now.", " for me.", ", thanks.")
    return tuple(f"{verb} {w} {prep} {f}{c}" for verb, prep in verbs for w in words for f in files for c in closings)


COMPOSED = _composed_phrasings()


@dataclass(frozen=True)
class TinyFamily:
    """Which words, files and phrasings a family draws from, and which combinations it holds out."""

    name: str
    words: tuple[str, ...]
    files: tuple[str, ...]
    phrasings: tuple[int, ...]  # indices into PHRASINGS
    heldout_phrasings: tuple[int, ...] = ()  # these phrasings are held out, whatever the word
    heldout_share: int = 0  # else: one combination in ``heldout_share`` (by hash) is held out
    templates: tuple[str, ...] = PHRASINGS  # what the ``phrasings`` indices point into

    def held_out(self, word: str, file: str, phrasing: int) -> bool:
        if self.heldout_phrasings:
            return phrasing in self.heldout_phrasings
        digest = hashlib.sha256(f"{word}/{file}/{phrasing}".encode()).digest()
        return digest[0] % self.heldout_share == 0

    def combinations(self, split: Split) -> list[tuple[str, str, int]]:
        """The (word, file, phrasing) combinations of ``split``; the two splits are disjoint."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split: expected 'train' or 'heldout', got {split!r}")
        combos = itertools.product(self.words, self.files, self.phrasings)
        return [c for c in combos if self.held_out(*c) == (split == "heldout")]


TINY_FAMILIES = {
    "tiny": TinyFamily("tiny", words=("node",), files=("out.txt",), phrasings=tuple(range(len(PHRASINGS))),
                       heldout_phrasings=(4, 9, 11, 15, 19, 22, 23, 27)),
    "tiny-composed": TinyFamily("tiny-composed", words=("node",), files=("out.txt",),
                                phrasings=tuple(range(len(COMPOSED))), heldout_share=4, templates=COMPOSED),
    "tiny-words": TinyFamily(
        "tiny-words",
        words=("tree", "list", "text", "node", "user", "time", "line", "code",
               "value", "index", "event", "model", "table", "color", "state", "point"),
        files=("result.txt", "output.txt", "out.txt", "log.txt"),
        phrasings=(0, 1, 2),
        heldout_share=5,
    ),
}
FAMILIES: dict[str, TinyFamily | LongFamily] = {**TINY_FAMILIES, **LONG_FAMILIES}
"""Every built-in family by name (``config.tasks.TaskFamily`` lists the same names)."""
TEST_PATH = "tests/test_answer.py"
TEST_ID = f"{TEST_PATH}::test_answer"
BUDGETS = {"max_turns": 1, "max_wall_s": 120}


def family(name: str) -> TinyFamily | LongFamily:
    """The family called ``name``; both kinds answer ``combinations(split)``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown tiny family {name!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _tiny_family(name: str) -> TinyFamily:
    chosen = family(name)
    if not isinstance(chosen, TinyFamily):
        raise ValueError(f"family {name!r} is not a one-word family; its tasks are built by generators.long")
    return chosen


@dataclass(frozen=True)
class TinySpec:
    """One task: which word goes into which file, and how the request is phrased."""

    family: str
    split: str
    index: int
    word: str
    file: str
    phrasing: int

    @property
    def task_id(self) -> str:
        return f"{self.family}-{self.split}-{self.index:05d}-{self.word}-p{self.phrasing:02d}"

    @property
    def instruction(self) -> str:
        return _tiny_family(self.family).templates[self.phrasing].format(word=self.word, file=self.file)

    @property
    def words(self) -> tuple[str, ...]:
        """The words the task asks for (one here; ``LongSpec.words`` has K)."""
        return (self.word,)


def split_size(split: Split, family_name: str = "tiny") -> int:
    """Distinct tasks of ``split``: tasks ``0 .. split_size - 1`` are its combinations, each once
    (RL's single epoch takes no more; SFT demonstrations may go round again)."""
    return len(family(family_name).combinations(split))


def tiny_spec(seed: int, split: Split, index: int, family_name: str = "tiny") -> TinySpec | LongSpec:
    """Task ``index`` of ``split``: a pure function of its arguments (a ``LongSpec`` for
    ``tiny-long``)."""
    if family_name in LONG_FAMILIES:
        return long_spec(seed, split, index, family_name)
    combos = _tiny_family(family_name).combinations(split)
    key = int.from_bytes(hashlib.sha256(f"{family_name}/{seed}/{split}".encode()).digest()[:8], "little")
    round_order = np.random.default_rng([key, index // len(combos)]).permutation(len(combos))
    word, file, phrasing = combos[int(round_order[index % len(combos)])]
    return TinySpec(family=family_name, split=split, index=index, word=word, file=file, phrasing=phrasing)


def tiny_specs(seed: int, split: Split, start: int = 0, family_name: str = "tiny") -> Iterator[TinySpec | LongSpec]:
    """The unbounded stream of ``split``, from task ``start`` on."""
    index = start
    while True:
        yield tiny_spec(seed, split, index, family_name)
        index += 1


def hidden_test(spec: TinySpec) -> str:
    return (
        "from pathlib import Path\n\n\n"
        "def test_answer():\n"
        f"    path = Path({spec.file!r})\n"
        f"    assert path.is_file(), 'missing {spec.file}'\n"
        f"    assert path.read_text().strip() == {spec.word!r}\n"
    )


def write_tiny_task(
    folder: Path, spec: TinySpec | LongSpec, overwrite: bool = False, answer: str | None = None
) -> Task:
    """Write one task folder (docs/task-format.md) for ``spec`` and load it back. ``answer`` replaces
    the word the gold change writes (a wrong demonstration for ``sft.wrong_share``; such a task's
    gold change does not resolve it); a ``LongSpec`` goes to ``long.write_long_task``, where it
    replaces one of the K words."""
    if isinstance(spec, LongSpec):
        return write_long_task(folder, spec, overwrite=overwrite, answer=answer)
    return write_task(
        folder,
        task_id=spec.task_id,
        instruction=spec.instruction,
        repo={"README.md": "# scratch\n\nAn empty workspace.\n"},
        fail_to_pass=[TEST_ID],
        pass_to_pass=[],
        hidden_tests={TEST_PATH: hidden_test(spec)},
        protected_paths=["tests"],
        metadata={"source": "handwritten", "family": spec.family, "difficulty": "easy", "kind": "instructions",
                  "word": spec.word, "file": spec.file, "split": spec.split},
        budgets=BUDGETS,
        gold_patch=file_diff(spec.file, None, (spec.word if answer is None else answer) + "\n"),
        overwrite=overwrite,
    )


def verify_task(task: Task, sandbox: SandboxConfig | None = None, grading: GradingConfig | None = None) -> None:
    """Raise ``ValueError`` unless the gold change resolves ``task`` and no change leaves it unresolved."""
    from opencomposer.grading.grade import grade

    grading = grading or GradingConfig(lint=False)
    gold = grade(task, task.gold_patch or "", None, sandbox, grading)
    broken = grade(task, "", None, sandbox, grading)
    if not gold.resolved or broken.resolved:
        raise ValueError(
            f"task {task.id}: gold resolved = {gold.resolved}, untouched resolved = {broken.resolved}; "
            "expected True and False"
        )


def write_tiny_suite(
    out: Path,
    count: int,
    *,
    seed: int = 0,
    split: Split = "train",
    verify: bool = True,
    sandbox: SandboxConfig | None = None,
    family_name: str = "tiny",
) -> list[Task]:
    """Write tasks 0..count-1 of ``split`` as folders under ``out`` (existing folders are reused),
    verifying each new one. Returns them in stream order."""
    out = Path(out)
    tasks = []
    for spec in (tiny_spec(seed, split, i, family_name) for i in range(count)):
        folder = out / spec.task_id
        if not (folder / "task.toml").is_file():
            partial = out / f".{spec.task_id}.partial"  # hidden from load_suite until verified
            task = write_tiny_task(partial, spec, overwrite=True)
            if verify:
                verify_task(task, sandbox)
            partial.replace(folder)
        tasks.append(load_task(folder))
    return tasks
