"""The agent loop: a linear history, a policy, tools in a sandbox, budgets, and an ``Episode``.

Modelled on mini-swe-agent: ``run()`` repeats ``step()`` (check budgets, ask the policy for a
turn, parse its tool calls, run them, append their results) and control flow goes through a small
exception hierarchy (``agent.errors``): a ``FormatError`` becomes a message to the model and the
loop goes on; ``Submitted`` (the ``finish`` tool) and ``LimitsExceeded`` end the episode; a
``TranscriptError`` (the chat template re-renders what the model wrote differently, so the token
record would no longer be the prompt) ends it as ``FORMAT_ERROR``, a scored failure of the policy
graded as it stands; ``SandboxError`` and ``PolicyError`` end it as an infrastructure error,
never a scored zero. A token-level policy that returns ids without logprobs is a ``PolicyError``.

The wall-time budget (``max_wall_s``) counts the policy's own time: its turns and its tool calls,
less what it reports waiting for others (``PolicyOutput.wait_s``: a batching queue, an engine
lock) and what the sandbox reports waiting for a command slot (``slot_wait_s``). Load from other
episodes therefore never turns into a timeout scored against the policy; ``metrics`` keep both
numbers (``policy_s``, ``waited_s``) beside the plain ``wall_s``.

The history is the prompt: for token-in/token-out policies a ``TokenTranscript`` keeps the exact
ids (sampled ids, their logprobs, routes and kinds, then the tool-output ids the environment
appended) in the current ``Segment``, whose routes cover the prompt and tool outputs too (from the
prefill routes of the next turn's call, ``Segment.record_context_routes``); for text policies the
chat messages are the record.

Context policies (``agent.context_policy``, ``agent.context``): with ``self_summary`` the loop
appends the summary request to the tool output that brought the segment to the trigger, takes the
model's next turn as its summary (``Turn.summary``, tokens of kind ``SUMMARY``, trained like the
rest of the chain) and opens a fresh segment from the system prompt, the task, the summary and a
state block. ``compaction`` and ``truncate`` are ``Summarizer``s: before each turn the loop asks
whether to close the segment, and opens the next from the messages they return (a caller may pass
its own ``Summarizer``). Summary turns do not count against the turn budget. Without a policy (or
once ``agent.max_summaries`` is spent) reaching the context window ends the episode as a budget stop.
"""

from __future__ import annotations

import time
from typing import Any

from opencomposer.agent.context import (
    SUMMARY_REQUEST,
    context_summarizer,
    resume_messages,
    summary_text,
    trigger_tokens,
)
from opencomposer.agent.errors import FormatError, LimitsExceeded, NonTerminating, Submitted, TranscriptError
from opencomposer.agent.policy import PolicyError
from opencomposer.agent.protocol import (
    TokenTranscript,
    encode,
    initial_messages,
    parse_turn,
    token_kinds,
    truncate_middle,
)
from opencomposer.agent.tools import Toolbox, ToolError, tool_schemas
from opencomposer.config import AgentConfig
from opencomposer.model.tokenizer import THINK_CLOSE, THINK_OPEN
from opencomposer.protocols import Policy, Summarizer
from opencomposer.sandbox.patch import DiffRoundTripError, PatchError, parse_patch
from opencomposer.sandbox.workspace import Sandbox, SandboxError
from opencomposer.types import (
    Context,
    EndReason,
    Episode,
    EpisodeStatus,
    Message,
    PolicyOutput,
    Segment,
    Task,
    TokenKind,
    ToolCall,
    Turn,
)


class AgentLoop:
    """Runs one episode of ``policy`` on ``task`` inside ``sandbox``."""

    def __init__(
        self,
        policy: Policy,
        task: Task,
        sandbox: Sandbox,
        config: AgentConfig | None = None,
        *,
        seed: int = 0,
        sample_index: int = 0,
        summarizer: Summarizer | None = None,
    ):
        self.policy = policy
        self.task = task
        self.sandbox = sandbox
        self.config = config or AgentConfig()
        self.seed = seed
        self.summarizer = summarizer if summarizer is not None else context_summarizer(self.config.context_policy)
        self.toolbox = Toolbox(sandbox, config=self.config)
        self.tools = tool_schemas(self.config.tools)
        self.tokenizer = getattr(policy, "tokenizer", None)
        self.episode = Episode(task_id=task.id, sample_index=sample_index)
        self.transcript: TokenTranscript | None = None
        self.segment: Segment | None = None
        self.cost = 0.0
        self.context_tokens = 0  # text policies: prompt + completion tokens of the last call
        self.started = time.monotonic()
        self.policy_s = 0.0  # what the wall-time budget counts: the policy's own turns and tool calls
        self.waited_s = 0.0  # what it does not: queues for other episodes' batches, sandbox slots
        self.counters = {"format_errors": 0, "rejected_tool_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                         "cached_tokens": 0,
                         "summary_tokens": 0, "compaction_tokens": 0, "compaction_prompt_tokens": 0, "summary_prefill_reused": 0,
                         "context_tokens_saved": 0}
        self.summaries = 0  # segments closed by the context policy
        self.summary_texts: list[str] = []  # what each summary (or compaction) handed on
        self.summary_pending = False  # the request is in the context: the next turn is the summary
        self._request_tokens = 0  # tokens the pending request added to the context

    # ------------------------------------------------------------------------------------------
    def run(self) -> Episode:
        self.started = time.monotonic()
        try:
            self.open_segment(self.initial_messages())
            while True:
                try:
                    self.step()
                except NonTerminating as e:
                    self.add_observation([Message("user", str(e))])
        except Submitted as e:
            self.episode.status = EpisodeStatus.OK
            self.episode.final_message = str(e)
        except LimitsExceeded as e:
            self.episode.status = EpisodeStatus.TIMEOUT
            self.episode.error = str(e)
            self.episode.limit = e.budget
        except TranscriptError as e:
            self.episode.status = EpisodeStatus.FORMAT_ERROR
            self.episode.error = str(e)
            self.counters["format_errors"] += 1
            if self.episode.turns:  # the turn whose text broke the record counts as a broken turn
                last = self.episode.turns[-1]
                last.format_error = last.format_error or str(e)
        except (SandboxError, PolicyError) as e:
            self.episode.status = EpisodeStatus.INFRA_ERROR
            self.episode.error = f"{type(e).__name__}: {e}"
        finally:
            self._finish_metrics()
        return self.episode

    def step(self) -> None:
        if self.summary_pending:
            self.summary_turn()
            return
        if (self.summarizer is not None and self.summaries < self.config.max_summaries
                and self.summarizer.should_summarize(self)):
            started = time.monotonic()
            messages = self.summarizer.summarize(self)
            self.summaries += 1
            self.open_segment(messages)
            self.charge(time.monotonic() - started)
        self.check_limits()
        started = time.monotonic()
        output = self.policy.act(self.context(self.tokens_left()))
        self.charge(time.monotonic() - started, waited=output.wait_s)
        turn = self.record_turn(output)
        if output.format_error:
            self.counters["format_errors"] += 1
            turn.format_error = output.format_error
            raise FormatError(output.format_error)
        calls = output.tool_calls
        if calls is None:
            parsed = parse_turn(turn.text, len(self.episode.turns))
            if parsed.error:
                self.counters["format_errors"] += 1
                turn.format_error = parsed.error
                raise FormatError(parsed.error)
            calls = parsed.calls
        turn.tool_calls = calls
        started, slot_wait = time.monotonic(), self.sandbox.slot_wait_s
        try:
            results = self.execute(calls, turn)
        finally:
            self.charge(time.monotonic() - started, waited=self.sandbox.slot_wait_s - slot_wait)
        self.add_observation(results)

    def summary_turn(self) -> None:
        """The model's summary, asked for by the request at the end of the context; it closes the
        segment and the next one starts from it (``agent.context``)."""
        self.check_limits()
        started = time.monotonic()
        reused = len(self.segment.token_ids()) - self._request_tokens if self.transcript is not None else 0
        output = self.policy.act(self.context(min(self.config.summary_max_tokens, self.tokens_left()), summary=True))
        self.charge(time.monotonic() - started, waited=output.wait_s)
        turn = self.record_turn(output)
        turn.summary = True
        if self.transcript is not None:
            turn.token_kinds = [TokenKind.SUMMARY] * len(turn.token_ids)
        self.summary_pending = False
        self.summaries += 1
        self.counters["summary_tokens"] += len(turn.token_ids) or output.completion_tokens
        self.counters["summary_prefill_reused"] += max(reused, 0)
        summary = summary_text(turn.text)
        self.summary_texts.append(summary)
        self.open_segment(resume_messages(self, summary, self.summaries))

    def side_call(self, messages: list[Message], token_ids: list[int] | None, max_new_tokens: int) -> PolicyOutput:
        """A policy call outside the episode's segments (the compaction baseline): charged to the
        budgets and the cost, never recorded as a turn, so never trained on."""
        room = max_new_tokens
        window = self.context_window()
        if window and token_ids is not None:
            room = min(room, window - len(token_ids))
        if room <= 0:
            raise LimitsExceeded(f"the compaction prompt ({len(token_ids or [])} tokens) fills the context window "
                                 f"({window})", budget=EndReason.TOKEN_BUDGET)
        started = time.monotonic()
        output = self.policy.act(Context(task=self.task, messages=messages, token_ids=token_ids,
                                         turn_index=len(self.episode.turns), max_new_tokens=room, seed=self.seed,
                                         summary=True, summaries=len(self.episode.turns) - self.work_turns(),
                                         tools=self.tools))
        self.charge(time.monotonic() - started, waited=output.wait_s)
        self.cost += output.cost
        return output

    def context(self, max_new_tokens: int, summary: bool = False) -> Context:
        return Context(
            task=self.task,
            messages=list(self.messages),
            token_ids=self.segment.token_ids() if self.transcript else None,
            turn_index=len(self.episode.turns),
            max_new_tokens=max_new_tokens,
            seed=self.seed,
            summary=summary,
            summaries=len(self.episode.turns) - self.work_turns(),
            tools=self.tools,
        )

    # ------------------------------------------------------------------------------------------
    def initial_messages(self) -> list[Message]:
        return initial_messages(self.task.instruction, self.config.system_prompt or None, self.config.tools)

    def open_segment(self, messages: list[Message]) -> None:
        """Start a new context window from ``messages`` (the first one, or after a summary)."""
        closed = len(self.segment.token_ids()) if self.segment is not None and self.transcript is not None else 0
        if self.tokenizer is not None:
            self.transcript = TokenTranscript(self.tokenizer, self.tools, messages)
            self.segment = Segment(prompt_ids=list(self.transcript.prompt_ids), messages=self.transcript.messages)
        else:
            self.segment = Segment(prompt_ids=[], messages=list(messages))
        self.episode.segments.append(self.segment)
        if closed:
            self.counters["context_tokens_saved"] += max(closed - len(self.segment.prompt_ids), 0)

    @property
    def messages(self) -> list[Message]:
        return self.segment.messages

    def record_turn(self, output: PolicyOutput) -> Turn:
        self.cost += output.cost
        self.counters["prompt_tokens"] += output.prompt_tokens
        self.counters["completion_tokens"] += output.completion_tokens
        self.counters["cached_tokens"] += output.cached_tokens
        self.context_tokens = output.prompt_tokens + output.completion_tokens
        if self.transcript is not None:
            if output.token_ids is None:
                raise PolicyError(f"policy {self.policy.name!r} has a tokenizer but returned no token ids")
            ids = list(output.token_ids)
            if output.logprobs is None:  # zeros would pass for certainty and corrupt the ratio and the KL
                raise PolicyError(f"policy {self.policy.name!r} returned {len(ids)} token ids without their logprobs")
            logprobs = list(output.logprobs)
            if len(logprobs) != len(ids):
                raise PolicyError(f"policy returned {len(ids)} token ids but {len(logprobs)} logprobs")
            if output.prompt_routes is not None:  # routes of the context so far: fill the positions without
                try:
                    self.segment.record_context_routes(output.prompt_routes)
                except ValueError as e:
                    raise PolicyError(f"policy {self.policy.name!r}: {e}") from e
            content = self.transcript.model_turn(ids, output.finish_reason)
            turn = Turn(token_ids=ids, logprobs=logprobs, token_kinds=token_kinds(self.tokenizer, ids),
                        text=content, routes=output.routes)
        else:
            self.messages.append(Message("assistant", output.text, tool_calls=list(output.tool_calls or [])))
            # the turn keeps a server's separate thinking in the shape a sampled turn has it
            text = f"{THINK_OPEN}{output.reasoning}{THINK_CLOSE}\n{output.text}" if output.reasoning else output.text
            turn = Turn(token_ids=[], logprobs=[], token_kinds=[], text=text)
        turn.finish_reason = output.finish_reason
        turn.policy_version = output.policy_version
        turn.token_versions = list(output.token_versions or [])
        self.segment.turns.append(turn)
        return turn

    def execute(self, calls: list[ToolCall], turn: Turn) -> list[Message]:
        """Run the calls of one turn in order; ``finish`` ends the episode after the calls before it."""
        results = []
        for call in calls:
            try:
                content = self.toolbox.execute(call)
            except ToolError as e:
                turn.rejected_tool_calls += 1
                self.counters["rejected_tool_calls"] += 1
                content = f"Error: {e}"
            results.append(
                Message("tool", truncate_middle(content, self.config.max_observation_chars),
                        tool_call_id=call.id, name=call.name)
            )
        return results

    def add_observation(self, messages: list[Message]) -> None:
        """Append what the environment says after the last turn (tool results or an error), and
        with ``self_summary``, the summary request when the context reaches the trigger."""
        turn = self.segment.turns[-1]
        if self.self_summary_armed():
            plain = len(self.count_observation(messages))
            if self.segment_tokens() + plain >= self.trigger:
                messages = [*messages, Message("user", SUMMARY_REQUEST)]
                self.summary_pending = True
                self._request_tokens = len(self.count_observation(messages)) - plain if self.transcript else 0
        if self.transcript is not None:
            _, ids = self.transcript.environment_turn(messages)
            turn.observation_ids = ids
            turn.observation_kinds = [TokenKind.TOOL_OUTPUT] * len(ids)
        else:
            self.messages.extend(messages)

    # ------------------------------------------------------------------------------------------
    @property
    def trigger(self) -> int:
        """Context tokens of a segment at which the context policy acts (0: never)."""
        return trigger_tokens(self.config, self.context_window())

    def segment_tokens(self) -> int:
        """Context tokens of the current segment (text policies: prompt + completion of the last call)."""
        return len(self.segment.token_ids()) if self.transcript is not None else self.context_tokens

    def context_full(self) -> bool:
        return bool(self.trigger) and self.segment_tokens() >= self.trigger

    def self_summary_armed(self) -> bool:
        """Whether a tool output that brings the context to the trigger gets the summary request."""
        return (self.config.context_policy == "self_summary" and self.summaries < self.config.max_summaries
                and bool(self.trigger))

    def count_observation(self, observation: list[Message]) -> list[int]:
        """The ids ``observation`` would append to the token transcript (text policies: none)."""
        if self.transcript is None:
            return []
        return encode(self.tokenizer, self.transcript.environment_text(observation))

    def count_tokens(self, messages: list[Message]) -> int:
        """Context tokens a segment opened from ``messages`` would start with (text policies: an
        estimate, four characters a token)."""
        if self.tokenizer is None:
            return sum(len(m.content) for m in messages) // 4
        return len(TokenTranscript(self.tokenizer, self.tools, messages).prompt_ids)

    def changed_files(self) -> list[str]:
        """Files the episode has changed so far (for the state block); empty if the diff fails."""
        try:
            return sorted({fp.path for fp in parse_patch(self.sandbox.diff())})
        except (DiffRoundTripError, PatchError, OSError):  # a state hint, never worth ending the episode over
            return []

    def work_turns(self) -> int:
        """Turns that count against ``max_turns``: every turn but the summaries."""
        return sum(not turn.summary for turn in self.episode.turns)

    def tokens_used(self) -> int:
        """Tokens charged to ``max_tokens``: every segment's context, and what compaction calls
        wrote (no segment holds it, but the model spent it)."""
        if self.transcript is None:
            return self.context_tokens + self.counters["compaction_tokens"]
        return sum(len(segment.token_ids()) for segment in self.episode.segments) + self.counters["compaction_tokens"]

    def context_window(self) -> int:
        return self.config.context_window or int(getattr(self.policy, "max_context", 0) or 0)

    def tokens_left(self) -> int:
        """New tokens this turn may sample: the smaller of the token budget and the context room."""
        left = []
        if self.task.budgets.max_tokens is not None:
            left.append(self.task.budgets.max_tokens - self.tokens_used())
        window = self.context_window()
        if window and self.transcript is not None:
            left.append(window - len(self.segment.token_ids()))
        return min(left) if left else 1 << 30

    def check_limits(self) -> None:
        budgets = self.task.budgets
        if budgets.max_turns is not None and self.work_turns() >= budgets.max_turns:
            raise LimitsExceeded(f"turn budget used up ({budgets.max_turns} turns)", budget=EndReason.TURN_BUDGET)
        if budgets.max_wall_s is not None and self.policy_s >= budgets.max_wall_s:
            raise LimitsExceeded(
                f"wall-time budget used up ({self.policy_s:.1f} s of {budgets.max_wall_s:g} s in turns and tool "
                f"calls; another {self.waited_s:.1f} s spent waiting for batches and sandbox slots is not counted)",
                budget=EndReason.WALL_BUDGET,
            )
        if budgets.max_cost is not None and self.cost >= budgets.max_cost:
            raise LimitsExceeded(f"cost budget used up ({self.cost:.4f} of {budgets.max_cost:g})",
                                 budget=EndReason.COST_BUDGET)
        if self.tokens_left() <= 0:
            raise LimitsExceeded(
                f"token budget used up ({self.tokens_used()} tokens; max_tokens={budgets.max_tokens}, "
                f"context window={self.context_window() or 'unlimited'})",
                budget=EndReason.TOKEN_BUDGET,
            )

    def charge(self, seconds: float, waited: float = 0.0) -> None:
        """Book ``seconds`` of a policy call, summary or tool call, of which ``waited`` went to
        waiting for others (a batching queue, a sandbox slot): only the rest counts against
        ``max_wall_s``, so load on the machine is not scored as the policy being slow."""
        waited = min(max(waited, 0.0), seconds)
        self.policy_s += seconds - waited
        self.waited_s += waited

    def _finish_metrics(self) -> None:
        metrics: dict[str, Any] = {
            "wall_s": time.monotonic() - self.started,
            "policy_s": self.policy_s,
            "waited_s": self.waited_s,
            "cost": self.cost,
            "turns": len(self.episode.turns),
            "tool_calls": sum(len(t.tool_calls) for t in self.episode.turns),
            "segments": len(self.episode.segments),
            "summaries": self.summaries,
            **self.counters,
        }
        self.episode.summaries = list(self.summary_texts)
        self.episode.metrics.update({k: float(v) for k, v in metrics.items()})
