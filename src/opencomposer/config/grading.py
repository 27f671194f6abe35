"""``[grading]``: how finished episodes are graded (``opencomposer.grading.grade``)."""

from __future__ import annotations

from dataclasses import dataclass

from opencomposer.config.section import ConfigError, Section


@dataclass
class GradingConfig(Section):
    """How finished episodes are graded (``opencomposer.grading.grade``; docs/task-format.md)."""

    section = "grading"

    timeout_s: float = 600.0
    """Wall-clock limit of the test command. A run past it scores as failing tests, not as an
    infrastructure error: code that hangs is the agent's outcome. At most ``sandbox.max_timeout_s``,
    which the sandbox would cut it to."""
    per_test_timeout_s: float = 120.0
    """pytest-timeout limit per test, so a hanging test fails on its own inside the run."""
    lint: bool = True
    """Count ruff findings on touched files before and after the change (``lint_added``)."""
    cache: bool = True
    """In RL runs, grade an identical change to the same task once and reuse the grade
    (``grading.grade.GradeCache``): the rollouts of a group often end in the same diff, and every
    evaluation grades the same held-out tasks. Turn off for tasks whose tests are flaky."""
    autoload_plugins: bool = False
    """Let pytest load every installed plugin. Off, only pytest-timeout is loaded (``-p``): a large
    environment's plugins cost seconds per run (hypothesis alone about one)."""

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.per_test_timeout_s <= 0:
            raise ConfigError("grading.timeout_s and grading.per_test_timeout_s must be positive")
