"""``[eval]``: ``opencomposer eval``, a policy on a suite of tasks (``opencomposer.bench``)."""

from __future__ import annotations

from dataclasses import dataclass

from opencomposer.config.agent import POLICY_NAMES
from opencomposer.config.section import ConfigError, Section


@dataclass
class EvalConfig(Section):
    """``opencomposer eval`` (``opencomposer.bench.eval``); command-line flags override these."""

    section = "eval"

    suite: str = ""
    """Folder of task folders (docs/task-format.md)."""
    policy: str = "oracle"
    """Policy spec: ``oracle``, ``noop``, ``local`` (the recipe's model), ``local:CHECKPOINT``, or
    ``openai:MODEL`` (``agent.http`` says where)."""
    passes: int = 1
    """Episodes per task; scores are averaged over passes."""
    workers: int = 1
    """Episodes run in parallel, each in its own sandbox."""
    limit: int = 0
    """Run only the first N tasks (sorted by id); 0 runs all."""
    out_dir: str = ""
    """Where results go; empty uses ``{run.out_dir}/{run.name}/eval``."""

    def validate(self) -> None:
        name = self.policy.partition(":")[0]
        if name not in POLICY_NAMES:
            raise ConfigError(f"eval.policy: {self.policy!r} names no policy; expected one of "
                              f"{', '.join(POLICY_NAMES)}, optionally followed by ':ARGUMENT'")
        if self.passes < 1 or self.workers < 1:
            raise ConfigError(f"eval.passes and eval.workers must be >= 1, got {self.passes} and {self.workers}")
        if self.limit < 0:
            raise ConfigError(f"eval.limit: must be >= 0, got {self.limit}")
