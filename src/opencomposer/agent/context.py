"""Context policies: what the agent loop does when a segment's context fills up.

Chosen by ``agent.context_policy`` (docs/recipe.md §5; report §4.1; blog "Training Composer for longer
horizons"). The trigger is ``agent.summary_trigger_tokens`` tokens of context in the current
segment (``trigger_tokens``); each policy may act ``agent.max_summaries`` times per episode, after
which reaching the context window ends the episode as a budget stop, as with ``off``.

- ``self_summary``: when the context after a tool output reaches the trigger, a short summary
  request (``SUMMARY_REQUEST``) is appended to the live context, in the same environment turn as
  the tool output, so an engine with a prefix cache reuses the whole context for it: only the
  request is new prefill. The model's next turn is its summary (``<think>`` blocks are its scratch
  space and are dropped; tool calls in it are not run). That turn closes the segment; its tokens
  are ``TokenKind.SUMMARY`` and are trained with the episode's advantage like every other model
  token of the chain. The next segment starts from the system prompt, the task, and one user
  message holding the summary and the state block (``state_block``).
- ``compaction``: the baseline. A separate call on a fresh context, a long fixed prompt
  (``COMPACTION_PROMPT``) over the segment's transcript rendered as text, writes the summary
  (up to ``agent.compaction_max_tokens``). Its tokens are counted in the metrics but are no
  segment's turn, so they are never trained on. The next segment starts as above.
- ``truncate``: drop the oldest tool outputs of the segment (their content becomes
  ``DROPPED_OUTPUT``) until its context is at most half the trigger, and go on in a new segment
  from those messages (the earlier segment keeps what was sampled in it, for training).
- ``off``: nothing; the context window ends the episode.

The state block is explicit: the number of summaries so far, turns used and left, model tokens
used so far, and the files the workspace has changed (from the sandbox's ``git`` status), so the
model resumes knowing where the episode stands even when its summary forgot it.

The functions and policies here that take a ``loop`` take the running ``agent.loop.AgentLoop``,
typed ``Any`` as in ``protocols.Summarizer``: that module imports this one.

Chain metrics (``Episode.metrics``): ``segments``, ``summaries``, ``summary_tokens`` (model tokens
written as summaries or compactions), ``compaction_tokens`` and ``compaction_prompt_tokens`` (output
and prefill of the compaction calls, which no turn holds), ``summary_prefill_reused`` (context tokens a prefix cache holds for the summary call:
everything but the request), ``context_tokens_saved`` (context tokens a closed segment held that
the next one does not start with).
"""

from __future__ import annotations

from typing import Any

from opencomposer.agent.protocol import TokenTranscript, message_dicts, split_reasoning
from opencomposer.model.tokenizer import TOOL_CALL_OPEN
from opencomposer.types import Message

SUMMARY_REQUEST = (
    "Your context is nearly full. Summarise the work so far so that you can continue from the summary "
    "alone: the facts you found (file names, values, errors), what you changed, your plan and the "
    "steps that remain. You may think first; then write only the summary, with no tool calls."
)
SUMMARY_MARGIN = 512  # tokens the default trigger leaves below the window besides the summary itself
DROPPED_OUTPUT = "[tool output dropped to free context]"

COMPACTION_PROMPT = """\
You compact the transcript of a software engineering agent whose context window is full. The \
agent will continue the task from your summary alone: it will not see the transcript again. Write \
a thorough, structured summary, following every section below, in this order:

1. Task: restate the user's request completely, with every requirement, file name, value and \
constraint it names.
2. Findings: every fact the agent learned from tool outputs that may matter later: file names and \
their roles, the exact values, identifiers, function signatures, error messages and test names it \
saw. Quote values exactly; do not paraphrase numbers, names or strings.
3. Changes: every change the agent made to the workspace (file, what changed, why), and whether \
it was checked (tests run and their results).
4. Attempts that failed: what was tried and did not work, and why, so the agent does not repeat it.
5. Plan: the steps that remain, in order, each concrete enough to act on.
6. Open questions: anything still unknown and how to find it out.

Be complete rather than brief: a lost fact cannot be recovered. Do not call tools. Do not invent \
facts that are not in the transcript. Write plain text."""


def trigger_tokens(config: Any, window: int) -> int:
    """Context tokens of a segment at which the policy acts: ``agent.summary_trigger_tokens``, or
    the window less the summary budget and a margin; 0 (never) without either."""
    if config.summary_trigger_tokens:
        return int(config.summary_trigger_tokens)
    if not window:
        return 0
    return max(window - config.summary_max_tokens - SUMMARY_MARGIN, window // 2)


def summary_text(turn_text: str) -> str:
    """What a summary turn hands to the next segment: the text outside ``<think>`` blocks, cut
    before any tool call (a summary's tool calls are not run)."""
    _, rest = split_reasoning(turn_text)
    cut = rest.find(TOOL_CALL_OPEN)
    return (rest if cut < 0 else rest[:cut]).strip()


def state_block(loop: Any, summaries: int) -> str:
    """Where the episode stands, for the first message of a fresh segment."""
    budgets = loop.task.budgets
    turns = len(loop.episode.turns)
    turns_text = f"{turns} of {budgets.max_turns}" if budgets.max_turns is not None else str(turns)
    changed = loop.changed_files()
    files = ", ".join(changed) if changed else "none"
    model_tokens = sum(len(t.token_ids) for t in loop.episode.turns)
    return (f"State: summaries so far: {summaries}; turns used: {turns_text}; model tokens used: {model_tokens}; "
            f"files changed in the workspace: {files}.")


def resume_messages(loop: Any, summary: str, summaries: int) -> list[Message]:
    """The messages a fresh segment starts from: system prompt, task, then summary and state."""
    head = loop.initial_messages()
    body = (f"Your context was reset; this is your summary of the work so far.\n<summary>\n{summary}\n</summary>\n"
            f"{state_block(loop, summaries)}\nContinue the task from here.")
    return [*head, Message("user", body)]


def transcript_text(messages: list[Message]) -> str:
    """A segment's messages as plain text, for the compaction prompt."""
    parts = []
    for m in message_dicts(messages):
        if m["role"] == "system":
            continue
        calls = "".join(f"\n[call {c['function']['name']} {c['function']['arguments']}]" for c in m.get("tool_calls", []))
        parts.append(f"### {m['role']}\n{m['content']}{calls}")
    return "\n\n".join(parts)


def compaction_messages(messages: list[Message]) -> list[Message]:
    return [Message("system", COMPACTION_PROMPT),
            Message("user", "Transcript to compact:\n\n" + transcript_text(messages) + "\n\nWrite the summary now.")]


def compaction_prompt_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The compaction call's context ids: its messages rendered by the chat template, no tools."""
    return list(TokenTranscript(tokenizer, [], messages).prompt_ids)


def droppable(messages: list[Message]) -> list[int]:
    """Indices of the tool outputs truncation may drop: all but those after the last model turn
    (the model has not read them yet) and those already dropped."""
    last_model = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return [i for i, m in enumerate(messages[:last_model]) if m.role == "tool" and m.content != DROPPED_OUTPUT]


def truncated(messages: list[Message], fits: Any) -> tuple[list[Message], int]:
    """``messages`` with the oldest droppable tool outputs (``droppable``) replaced by
    ``DROPPED_OUTPUT`` until ``fits(messages)``; returns them and how many were dropped."""
    out = list(messages)
    dropped = 0
    for i in droppable(out):
        if fits(out):
            break
        m = out[i]
        out[i] = Message("tool", DROPPED_OUTPUT, tool_call_id=m.tool_call_id, name=m.name)
        dropped += 1
    return out, dropped


class Compaction:
    """The prompt-based baseline as a ``Summarizer``: a separate call writes the summary."""

    name = "compaction"

    def should_summarize(self, loop: Any) -> bool:
        return loop.context_full()

    def summarize(self, loop: Any) -> list[Message]:
        messages = compaction_messages(loop.messages)
        ids = compaction_prompt_ids(loop.tokenizer, messages) if loop.transcript is not None else None
        output = loop.side_call(messages, ids, loop.config.compaction_max_tokens)
        text = output.text
        if not text and output.token_ids:
            from opencomposer.agent.protocol import decode

            text = decode(loop.tokenizer, output.token_ids)
        written = len(output.token_ids) if output.token_ids else output.completion_tokens
        loop.counters["summary_tokens"] += written
        loop.counters["compaction_tokens"] += written
        loop.counters["compaction_prompt_tokens"] += len(ids) if ids is not None else output.prompt_tokens
        summary = summary_text(text)
        loop.summary_texts.append(summary)
        return resume_messages(loop, summary, loop.summaries + 1)


class Truncate:
    """Drop the oldest tool outputs as a ``Summarizer``, down to half the trigger."""

    name = "truncate"

    def should_summarize(self, loop: Any) -> bool:
        return loop.context_full() and bool(droppable(loop.messages))

    def summarize(self, loop: Any) -> list[Message]:
        target = loop.trigger // 2
        messages, _ = truncated(loop.messages, lambda m: loop.count_tokens(m) <= target)
        return messages


def context_summarizer(name: str) -> Compaction | Truncate | None:
    """The ``Summarizer`` of a context policy that closes segments before a turn (compaction,
    truncate); None for ``self_summary`` (the loop runs it) and ``off``."""
    return {"compaction": Compaction, "truncate": Truncate}.get(name, lambda: None)()


def chain_metrics(episodes: list[Any]) -> dict[str, float]:
    """Means over scored ``episodes`` of the chain metrics (``segments``, ``summaries``,
    ``summary_tokens``, ``context_tokens_saved``) and ``resolved_after_summaries_N``: the resolved
    rate of the episodes that made exactly N summaries (N = 0, 1, 2; ``3plus`` for more), for the
    counts that occur. Empty when no episode made a summary (a run without a context policy)."""
    scored = [e for e in episodes if e.scored and e.grade is not None]
    if not any(e.summaries or len(e.segments) > 1 for e in scored):
        return {}
    out = {f"chain_{name}": float(sum(e.metrics.get(name, 0.0) for e in scored) / len(scored))
           for name in ("segments", "summaries", "summary_tokens", "context_tokens_saved")}
    by_count: dict[str, list[float]] = {}
    for e in scored:
        n = len(e.segments) - 1
        by_count.setdefault(str(n) if n < 3 else "3plus", []).append(float(e.grade.resolved))
    for key, values in sorted(by_count.items()):
        out[f"resolved_after_summaries_{key}"] = sum(values) / len(values)
    return out
