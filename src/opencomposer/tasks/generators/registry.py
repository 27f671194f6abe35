"""Task streams: which generator makes task ``i``, from which source project, and the training /
held-out split (``opencomposer tasks generate``).

A stream is named by (kind, split, seed). Task ``i`` of it is a pure function of those and ``i``:
the kind of a ``mixed`` stream is drawn from ``rng_for(seed, "kind", i)`` with the
``tasks.*_weight`` shares, and attempt ``a`` at index ``i`` draws its source project and its
candidate from ``rng_for(kind, split, seed, i, a)``; the first attempt that verifies is the task.
The stream is unbounded (indices go on forever) and any index can be made on its own, in any
order, by any number of workers, with the same result. An index whose ``tasks.max_attempts``
candidates were all rejected yields no task and is reported.

Bug injection draws a fresh site (or two or three) for every attempt: its sites combine without
end. Feature deletion and refactors have a finite pool of candidates per split (a few dozen
features and renames per project); the stream walks a seeded permutation of the pool, index ``i``
taking position ``i`` (its retries jump ``POOL_STRIDE`` ahead), so a feature or a rename comes
back only after the whole pool went by, and then with a new prompt draw.

Splits are by source project: the training split draws from ``tasks.train_projects`` (inventory,
textkit, confkit by default), the held-out split from ``tasks.heldout_projects`` (ledger,
scheduler). The two lists may not overlap (``TasksConfig.validate``), so no file of any source
project, in any state, appears in both; ``tests/grading/test_generators_streams.py`` checks it on
generated tasks. A split by module inside one project would not do: the untouched modules of a
held-out task would be files the model trained on.

Kinds: ``bugs``, ``deletion``, ``refactor``, and ``mixed`` (all three by weight). The small
family a tiny CPU model can learn (one word into one file) lives in ``generators.tiny`` and is
reachable through the same command as ``--kind tiny``.

Not here: how each kind makes its candidates (``bugs``, ``deletion``, ``refactor``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from opencomposer.config import SandboxConfig, TasksConfig
from opencomposer.tasks.format import load_task
from opencomposer.tasks.generators.common import (
    Attempt,
    GenerationResult,
    Lab,
    Rejected,
    realize,
    rng_for,
)
from opencomposer.tasks.generators.source import SourceRepo, project, with_layouts
from opencomposer.types import Task

GENERATOR_KINDS = ("bugs", "deletion", "refactor")
KINDS = (*GENERATOR_KINDS, "mixed")
SPLITS = ("train", "heldout")
MAX_WALL_S = 900  # every generated task's wall-clock budget; its turn budget is tasks.max_turns
POOL_STRIDE = 7919  # where a rejected pool candidate's retry looks next: far from the indices around it


class Generator(Protocol):
    """``propose`` draws a candidate from a source (bug injection); pooled generators (deletion,
    refactor) also have ``pool(sources)`` and ``build(item, rng)``."""

    kind: str


def make_generator(kind: str, lab: Lab) -> Generator:
    if kind == "bugs":
        from opencomposer.tasks.generators.bugs import BugGenerator

        return BugGenerator(lab)
    if kind == "deletion":
        from opencomposer.tasks.generators.deletion import DeletionGenerator

        return DeletionGenerator(lab)
    if kind == "refactor":
        from opencomposer.tasks.generators.refactor import RefactorGenerator

        return RefactorGenerator(lab)
    raise ValueError(f"unknown generator kind {kind!r}; expected one of {', '.join(GENERATOR_KINDS)}")


def split_projects(config: TasksConfig, split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    names = config.train_projects if split == "train" else config.heldout_projects
    if not names:
        raise ValueError(f"tasks.{split if split == 'heldout' else 'train'}_projects is empty; nothing to draw from")
    return list(names)


class TaskFactory:
    """Makes task ``index`` of a stream into a folder under ``out``.

    ``sources`` overrides the split's projects (any Python repositories with tests)."""

    def __init__(self, kind: str, *, seed: int = 0, split: str = "train", config: TasksConfig | None = None,
                 sandbox: SandboxConfig | None = None, sources: list[SourceRepo] | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.seed, self.split = kind, seed, split
        self.config = config or TasksConfig()
        self.lab = Lab(self.config, sandbox)
        if sources is None:
            sources = with_layouts([project(n) for n in split_projects(self.config, split)], self.config.layouts)
        self.sources = sources
        if not self.sources:
            raise ValueError("no source repositories to generate tasks from")
        self._generators: dict[str, Generator] = {}
        self._pools: dict[str, tuple[list | None, list[int]]] = {}

    def generator(self, kind: str) -> Generator:
        if kind not in self._generators:
            self._generators[kind] = make_generator(kind, self.lab)
        return self._generators[kind]

    def pool(self, kind: str) -> tuple[list | None, list[int]]:
        """A generator's finite pool of candidates (None for bug injection, whose sites combine
        without end) and the seeded order in which the stream walks it."""
        if kind not in self._pools:
            generator = self.generator(kind)
            pool = generator.pool(self.sources) if hasattr(generator, "pool") else None
            order = list(range(len(pool or [])))
            rng_for(kind, self.split, self.seed, "order").shuffle(order)
            self._pools[kind] = (pool, order)
        return self._pools[kind]

    def kind_of(self, index: int) -> str:
        if self.kind != "mixed":
            return self.kind
        weights = (self.config.bugs_weight, self.config.deletion_weight, self.config.refactor_weight)
        return rng_for(self.seed, "kind", index).choices(GENERATOR_KINDS, weights=weights)[0]

    def task_id(self, index: int) -> str:
        return f"{self.kind_of(index)}-{self.split}-s{self.seed}-{index:05d}"

    def make(self, index: int, out: Path) -> GenerationResult:
        """Task ``index`` (reused when its folder already exists)."""
        started = time.monotonic()
        task_id = self.task_id(index)
        folder = Path(out) / task_id
        if (folder / "task.toml").is_file():
            return GenerationResult(index, load_task(folder), [Attempt("existing folder")], 0.0)
        kind = self.kind_of(index)
        generator = self.generator(kind)
        pool, order = self.pool(kind)
        attempts: list[Attempt] = []
        if pool == []:
            attempts.append(Attempt(kind, f"no {kind} candidate in {[s.name for s in self.sources]}"))
        for attempt in range(self.config.max_attempts if pool is None or pool else 0):
            rng = rng_for(kind, self.split, self.seed, index, attempt)
            if pool is None:
                source = self.sources[rng.randrange(len(self.sources))]
            else:
                item = pool[order[(index + attempt * POOL_STRIDE) % len(pool)]]
                source = item[0]
            label = source.name
            try:
                candidate = generator.propose(source, rng) if pool is None else generator.build(item, rng)
                label = f"{source.name}: {candidate.label}"
                budgets = {"max_turns": self.config.max_turns, "max_wall_s": MAX_WALL_S}
                task = realize(candidate, self.lab, folder, task_id, budgets=budgets)
            except Rejected as e:
                attempts.append(Attempt(label, str(e)))
                continue
            attempts.append(Attempt(label))
            return GenerationResult(index, task, attempts, time.monotonic() - started)
        return GenerationResult(index, None, attempts, time.monotonic() - started)


def generate(
    factory: TaskFactory,
    count: int,
    out: Path,
    *,
    start: int = 0,
    workers: int = 1,
    on_done: Callable[[GenerationResult], None] | None = None,
) -> list[GenerationResult]:
    """The first ``count`` tasks of the stream from index ``start`` on (indices that yield no task
    are skipped and reported), made ``workers`` indices at a time. Writes ``generation.json``.
    ``on_done(result)`` runs in this thread after each index (the command's progress display)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[GenerationResult] = []
    made = 0
    index = start

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        while made < count and index - start < 4 * count + 8:  # a source that yields nothing ends it
            wave = list(range(index, index + max(1, min(workers, count - made))))
            index += len(wave)
            for result in pool.map(lambda i: factory.make(i, out), wave):
                if result.task is not None and made >= count:  # a wave can overshoot; keep exactly count
                    shutil.rmtree(result.task.path, ignore_errors=True)
                    continue
                results.append(result)
                made += result.task is not None
                if on_done is not None:
                    on_done(result)
    write_report(results, out / "generation.json", factory)
    return results


def write_report(results: list[GenerationResult], path: Path, factory: TaskFactory) -> None:
    rows = [{"index": r.index, "task_id": r.task.id if r.task else None, "seconds": round(r.seconds, 2),
             "attempts": [{"candidate": a.label, "rejected": a.reason} for a in r.attempts]} for r in results]
    report = {"kind": factory.kind, "split": factory.split, "seed": factory.seed,
              "sources": [s.name for s in factory.sources], "tasks": rows}
    path.write_text(json.dumps(report, indent=1) + "\n")


def stream(factory: TaskFactory, out: Path, start: int = 0) -> Iterator[Task]:
    """Unbounded: task after task of the stream, made on demand into ``out`` (for the RL loop)."""
    index = start
    while True:
        result = factory.make(index, Path(out))
        if result.task is not None:
            yield result.task
        index += 1
