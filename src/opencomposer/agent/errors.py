"""The exceptions that steer the agent loop (mini-swe-agent style).

A step of the loop either returns normally or raises one of these. ``NonTerminating`` errors
become a message back to the model and the episode goes on; ``Terminating`` ones end it.
Infrastructure failures are not here: they are ``SandboxError`` (sandbox.workspace) and
``PolicyError`` (agent.policies), and the loop records them as ``EpisodeStatus.INFRA_ERROR``.
"""

from __future__ import annotations

from opencomposer.types import EndReason


class NonTerminating(Exception):
    """The model did something unusable; its message is shown to the model, which tries again."""


class FormatError(NonTerminating):
    """The model's turn could not be parsed into tool calls."""


class Terminating(Exception):
    """The episode ends here."""


class Submitted(Terminating):
    """The agent called ``finish``; the message is its final answer to the user."""


class LimitsExceeded(Terminating):
    """A budget (turns, tokens, wall time, cost, context window) ran out: a scored timeout.
    ``budget`` says which, for the reports' end reasons (``Episode.end_reason``)."""

    def __init__(self, message: str, *, budget: EndReason):
        super().__init__(message)
        self.budget = budget


class TranscriptError(Terminating):
    """The chat template renders the conversation so far differently once the model's turn or the
    next messages are added (it is not prefix-stable for what the model wrote), so the recorded
    token ids would no longer be the prompt the policy sees. The episode ends as a scored format
    error: the policy wrote it, the rest of the step goes on."""
