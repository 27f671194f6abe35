"""The progress display of every trainer loop: a rich bar on a terminal, plain lines in a log.

A live bar redraws one line in place, which a log file (``opencomposer rl ... > run.log``, a
batch job, a subprocess in a test) records as nothing useful or as escape codes. So when stdout
is not a terminal the same updates become one plain line each, after every ``every`` finished
items and after the last one::

    sft 10/40  loss 1.234  12 s

``status`` is a ``str.format`` template over the values passed to ``update`` (``"loss
{loss:.3f}"``). ``enabled=False`` shows nothing at all (tests, callers with a display of their
own). Rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class ProgressBar:
    """``with ProgressBar("sft", total, status="loss {loss:.3f}") as bar: ... bar.update(step, loss=x)``."""

    def __init__(self, description: str, total: int, *, status: str = "", completed: int = 0,
                 enabled: bool = True, every: int = 1):
        if every < 1:
            raise ValueError(f"every: expected a count >= 1, got {every}")
        self.description, self.total, self.status, self.every = description, total, status, every
        self.plain = enabled and not sys.stdout.isatty()
        self.started = time.perf_counter()
        self._rich = None
        if enabled and not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[status]}", markup=False), TimeElapsedColumn())
            self._task = self._rich.add_task(description, total=total, completed=completed, status="")

    def __enter__(self) -> ProgressBar:
        self.started = time.perf_counter()
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._rich is not None:
            self._rich.stop()

    def update(self, completed: int, **values: float | str) -> None:
        """``completed`` items are done; ``values`` fill the status template."""
        text = self.status.format(**values) if values else ""
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, status=text)
        elif self.plain and (completed % self.every == 0 or completed == self.total):
            elapsed = time.perf_counter() - self.started
            fields = [f"{self.description} {completed}/{self.total}", text, f"{elapsed:.0f} s"]
            print("  ".join(f for f in fields if f), flush=True)
