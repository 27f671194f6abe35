"""``[basecheck]``: ``opencomposer basecheck``, the base-model checks (``opencomposer.bench.basecheck``).

Every field is also a flag of the command (``--window 256`` is ``--set basecheck.window=256``; a
list field takes its singular, repeatable: ``--nll-repo DIR``), its help text this docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class BasecheckConfig(Section):
    """Sizes and data of the three checks; the modules of ``bench.basecheck`` say what each measures."""

    section = "basecheck"

    window: int = 0
    """Tokens per codebase-NLL window; 0 takes the model's context (max_position_embeddings)."""
    stride: int = 0
    """Tokens between codebase-NLL window starts; 0 takes window // 2."""
    nll_repos: list[str] = field(default_factory=list)
    """Repository folders whose codebase NLL is measured; empty: the held-out source projects
    (tasks.heldout_projects: ledger and scheduler)."""
    nll_bytes: int = 0
    """Score only the first N bytes of each repository's text (cut at a line end); 0: all of it."""
    history_repos: list[str] = field(default_factory=list)
    """Git repositories whose file histories join the generated state-tracking ones."""
    histories: int = 8
    """Generated state-tracking histories (from the held-out source projects)."""
    repo_histories: int = 4
    """State-tracking histories taken from each of history_repos."""
    edits: int = 3
    """Edits after the creation of a generated history (so edits + 1 diffs)."""
    questions: int = 48
    """FreshBench-like questions, a quarter of each kind."""
    candidates: int = 4
    """Choices per FreshBench-like question: the answer and candidates - 1 distractors."""
    packages: list[str] = field(default_factory=list)
    """Installed distributions the questions are about; empty: opencomposer's own dependencies."""
    seed: int = 0
    """Seed of the generated histories and questions."""
    max_prompt_chars: int = 1600
    """Longest state-tracking prompt (about 400-600 tokens); FreshBench-like prompts get 1200."""
    max_final_chars: int = 600
    """Longest final file of a history (the model writes it, greedy, token by token)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the models run."""
    threads: int = 0
    """torch CPU threads while the models run; 0 keeps torch's default. On a shared CPU, 1 can be
    several times faster than two threads that wait on each other."""

    def validate(self) -> None:
        for name in ("window", "stride", "nll_bytes", "histories", "repo_histories", "edits", "questions", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"basecheck.{name}: must be >= 0, got {getattr(self, name)}")
        if self.window == 1:
            raise ConfigError("basecheck.window: a window of 1 token has no context; use >= 2 (or 0: the model's)")
        if self.window and self.stride >= self.window:
            raise ConfigError(f"basecheck.stride: {self.stride} must be smaller than basecheck.window = {self.window}")
        if self.candidates < 2:
            raise ConfigError(f"basecheck.candidates: a question needs >= 2 choices, got {self.candidates}")
        if self.histories and not self.edits:
            raise ConfigError("basecheck.edits: generated histories need >= 1 edit")
        if self.max_prompt_chars < 200 or self.max_final_chars < 20:
            raise ConfigError("basecheck.max_prompt_chars and basecheck.max_final_chars: too small to hold a "
                              "history (need >= 200 and >= 20)")
        if not (self.histories or self.history_repos and self.repo_histories):
            raise ConfigError("basecheck.histories: no state-tracking histories; set it >= 1, or name "
                              "basecheck.history_repos with basecheck.repo_histories >= 1")
        if not self.questions:
            raise ConfigError("basecheck.questions: at least one question is needed")
