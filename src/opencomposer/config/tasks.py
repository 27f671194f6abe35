"""``[tasks]``: task generation, mining and validation (``opencomposer.tasks``), and the names of
the built-in task families that ``[rl]`` and ``[sft]`` draw from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section

BUG_STYLES = ("function", "module", "behaviour")
LAYOUTS = ("as_shipped", "flat")

TaskFamily = Literal["", "tiny", "tiny-composed", "tiny-words", "tiny-long"]
"""A built-in family of ``opencomposer.tasks.generators.tiny`` (its ``FAMILIES``, ``tiny-long``
included, which ``generators.long`` builds; a test keeps the two equal), or empty for none."""


@dataclass
class TasksConfig(Section):
    """Task generation, mining and validation (``opencomposer tasks generate|mine|validate``;
    ``opencomposer.tasks.generators``, docs/tasks.md)."""

    section = "tasks"

    train_projects: list[str] = field(default_factory=lambda: ["inventory", "textkit", "confkit"])
    """Built-in source projects (``suites/projects``) the training stream draws from."""
    heldout_projects: list[str] = field(default_factory=lambda: ["ledger", "scheduler"])
    """Projects of the held-out evaluation split; no project may be in both lists, so the two
    splits share no file of any source project."""
    bugs_weight: float = 0.4
    """Share of bug-injection tasks in a ``mixed`` stream."""
    deletion_weight: float = 0.35
    """Share of feature-deletion tasks in a ``mixed`` stream."""
    refactor_weight: float = 0.25
    """Share of multi-file refactor tasks in a ``mixed`` stream."""
    multi_bug_fraction: float = 0.35
    """Share of bug tasks that inject two or three bugs, each in a different file."""
    bug_styles: list[str] = field(default_factory=lambda: list(BUG_STYLES))
    """How a single-bug task's report points at the bug, drawn uniformly from this list:
    ``function`` (names the function and file: easy), ``module`` (the module only: medium),
    ``behaviour`` (only the broken behaviour: hard). ``["function"]`` makes the easiest pool."""
    max_turns: int = 40
    """Turn budget written into every generated task (``[budgets] max_turns``)."""
    layouts: list[str] = field(default_factory=lambda: ["as_shipped"])
    """How a project's files are laid out in its tasks, each task drawing one of these:
    ``as_shipped``, or ``flat`` (a ``src/`` project's package moved to the repository root, its
    pytest ``pythonpath`` with it; a flat project stays as it is). Both together teach a policy to
    take paths from what its tools print rather than from a habit of one layout."""
    max_attempts: int = 40
    """Candidates tried for one task index before the index is given up (and reported)."""
    test_timeout_s: float = 120.0
    """Wall-clock limit of one test run of a candidate state, in the sandbox (at most
    ``sandbox.max_timeout_s``)."""
    per_test_timeout_s: float = 10.0
    """pytest-timeout limit per test: mutated code that loops fails its test instead of hanging."""
    min_pass_to_pass: float = 0.5
    """A broken state must still pass this fraction of the tests that pass in gold (below it the
    change broke imports or half the package, and the task says little)."""
    workers: int = 2
    """Task indices generated (or tasks validated) in parallel, each in its own sandboxes."""

    def validate(self) -> None:
        both = sorted(set(self.train_projects) & set(self.heldout_projects))
        if both:
            raise ConfigError(f"tasks.train_projects and tasks.heldout_projects share {both}; the held-out "
                              "split must share no source project with the training stream")
        weights = (self.bugs_weight, self.deletion_weight, self.refactor_weight)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(f"tasks.*_weight: expected non-negative weights with a positive sum, got {weights}")
        for name in ("multi_bug_fraction", "min_pass_to_pass"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"tasks.{name}: must be in [0, 1], got {getattr(self, name)}")
        unknown = sorted(set(self.bug_styles) - set(BUG_STYLES))
        if unknown or not self.bug_styles:
            raise ConfigError(f"tasks.bug_styles: expected a non-empty list of {', '.join(BUG_STYLES)}, "
                              f"got {self.bug_styles}")
        if self.max_turns < 1:
            raise ConfigError(f"tasks.max_turns: must be >= 1, got {self.max_turns}")
        unknown = sorted(set(self.layouts) - set(LAYOUTS))
        if unknown or not self.layouts or len(set(self.layouts)) != len(self.layouts):
            raise ConfigError(f"tasks.layouts: expected a non-empty list of distinct {', '.join(LAYOUTS)}, "
                              f"got {self.layouts}")
        if self.max_attempts < 1 or self.workers < 1:
            raise ConfigError(f"tasks.max_attempts and tasks.workers must be >= 1, got {self.max_attempts} "
                              f"and {self.workers}")
        if self.test_timeout_s <= 0 or self.per_test_timeout_s <= 0:
            raise ConfigError("tasks.test_timeout_s and tasks.per_test_timeout_s must be positive")
