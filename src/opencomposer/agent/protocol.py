"""The tool-call text protocol: what the model reads and writes, token for token.

The model speaks ChatML with Hermes tool calls (``opencomposer.model.tokenizer.CHAT_TEMPLATE``):
the system turn lists the tools, the model calls them with one or more
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in one turn (several blocks are
parallel tool calls), and results come back in one user turn as ``<tool_response>`` blocks.
Reasoning may sit in ``<think>...</think>``; tool-call markers inside it are not calls.

- ``parse_turn`` reads a model turn into tool calls; it never raises: malformed output yields an
  ``error`` text that the loop sends back as a ``FormatError`` message.
- ``TokenTranscript`` keeps one segment's messages and exact token ids in step: the prompt is the
  chat template's rendering, tokenised; after each model turn it appends exactly the text the
  template would put between that turn and the next generation prompt (the turn's closing that the
  model did not sample, the tool responses, the next ``<|im_start|>assistant\\n``), tokenised on
  its own. Those pieces start and end at special tokens, so prompt + turns + observations is the
  context the engine saw, and its text is the template's rendering of the messages.
- ``token_kinds`` labels each sampled token (thinking, tool call, final message) for the length
  penalty.
- ``split_reasoning`` separates ``<think>`` blocks from the rest of a turn (the OpenAI-compatible
  server's ``reasoning_content``); ``text_protocol_messages`` writes a transcript for servers that
  have no tool-call parser: tools in the system prompt, calls and results as plain text, exactly
  as the chat template renders them from ``tools`` and tool messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from opencomposer.agent.errors import FormatError, TranscriptError
from opencomposer.model.tokenizer import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    tool_responses_text,
    tools_system_text,
)
from opencomposer.types import Message, TokenKind, ToolCall

SYSTEM_PROMPT = """\
You are a software engineering agent. You work in a code repository, the workspace, through the \
tools below, and you solve the user's request by reading and changing its files.

How to work:
- Explore before you change: list folders, read files, search with grep.
- Make the change with edit or write_file, then check it with run (for example run the tests).
- Several tool calls in one message run together; use that for independent steps.
- Commands have no network access and each `run` starts a fresh shell in the workspace root.
- When the request is done, call finish with a short message for the user. Do not leave to-do \
notes or unfinished work behind."""

CALL_FORMAT_HINT = (
    'Write each tool call as <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>, '
    "and call finish(message) when the task is done."
)
NO_CALL_MESSAGE = "Your message contains no tool call. " + CALL_FORMAT_HINT


SEARCH_TOOLS_LINE = ("- Explore before you change: list folders, find files by name with find_files, search the "
                     "code by what it does with codebase_search or by text with grep, and read files.")


def system_prompt_for(tools: tuple[str, ...] | list[str] | None = None) -> str:
    """The built-in system prompt for the enabled ``tools``: the exploring line names the search
    tools when one is enabled; with the default tools it is ``SYSTEM_PROMPT`` exactly."""
    enabled = [name for name in ("find_files", "codebase_search") if name in (tools or ())]
    if not enabled:
        return SYSTEM_PROMPT
    line = SEARCH_TOOLS_LINE
    if enabled == ["find_files"]:
        line = "- Explore before you change: list folders, find files by name with find_files, read files, search with grep."
    elif enabled == ["codebase_search"]:
        line = ("- Explore before you change: list folders, read files, search the code by what it does with "
                "codebase_search or by text with grep.")
    return SYSTEM_PROMPT.replace("- Explore before you change: list folders, read files, search with grep.", line)


def initial_messages(instruction: str, system_prompt: str | None = None,
                     tools: tuple[str, ...] | list[str] | None = None) -> list[Message]:
    return [Message("system", system_prompt or system_prompt_for(tools)), Message("user", instruction)]


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call written exactly as the chat template renders assistant tool calls."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"


def truncate_middle(text: str, limit: int) -> str:
    """Keep the first and last halves of ``text`` when it is longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[... {omitted} characters omitted ...]\n{text[-half:]}"


# ----------------------------------------------------------------------------------------------
# Parsing


@dataclass
class ParsedTurn:
    """The tool calls of one model turn. ``spans`` are (start, end, tool name) character ranges of
    each ``<tool_call>`` block, markers included (name "" when the block is malformed)."""

    calls: list[ToolCall] = field(default_factory=list)
    spans: list[tuple[int, int, str]] = field(default_factory=list)
    error: str | None = None


def _think_end(text: str, start: int) -> int:
    """End of the ``<think>`` block opened at ``start`` (the text's end when it is never closed)."""
    end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
    return len(text) if end == -1 else end + len(THINK_CLOSE)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def parse_turn(text: str, turn_index: int = 0) -> ParsedTurn:
    """Find the tool calls in a model turn. Never raises; problems go to ``ParsedTurn.error``."""
    parsed = ParsedTurn()
    problems: list[str] = []
    decoder = json.JSONDecoder()
    pos = 0
    number = 0
    while True:
        opened = text.find(TOOL_CALL_OPEN, pos)
        closed = text.find(TOOL_CALL_CLOSE, pos)
        first = min((x for x in (opened, closed) if x != -1), default=-1)
        if first == -1:
            break
        think = text.find(THINK_OPEN, pos)
        if think != -1 and think < first:  # markers inside <think> are thoughts, not calls
            pos = _think_end(text, think)
            continue
        if first == closed:
            problems.append(f"a {TOOL_CALL_CLOSE} has no matching {TOOL_CALL_OPEN}")
            pos = closed + len(TOOL_CALL_CLOSE)
            continue
        number += 1
        body = _skip_ws(text, opened + len(TOOL_CALL_OPEN))
        try:
            obj, end = decoder.raw_decode(text, body)
        except (ValueError, RecursionError) as e:
            reason = f"{e.msg} at character {e.pos - body}" if isinstance(e, json.JSONDecodeError) else str(e)[:80]
            problems.append(f"tool call {number} is not valid JSON ({reason})")
            nxt = text.find(TOOL_CALL_CLOSE, body)
            if nxt == -1:
                problems.append(f"tool call {number} is not closed with {TOOL_CALL_CLOSE}")
                parsed.spans.append((opened, len(text), ""))
                break
            parsed.spans.append((opened, nxt + len(TOOL_CALL_CLOSE), ""))
            pos = nxt + len(TOOL_CALL_CLOSE)
            continue
        after = _skip_ws(text, end)
        if not text.startswith(TOOL_CALL_CLOSE, after):
            nxt = text.find(TOOL_CALL_CLOSE, after)
            problems.append(
                f"tool call {number} is not closed with {TOOL_CALL_CLOSE} right after its JSON object"
            )
            span_end = len(text) if nxt == -1 else nxt + len(TOOL_CALL_CLOSE)
            parsed.spans.append((opened, span_end, ""))
            pos = span_end
            continue
        span_end = after + len(TOOL_CALL_CLOSE)
        problem = _check_call_object(obj, number)
        if problem:
            problems.append(problem)
            parsed.spans.append((opened, span_end, ""))
        else:
            parsed.calls.append(ToolCall(obj["name"], obj["arguments"], id=f"call_{turn_index}_{number}"))
            parsed.spans.append((opened, span_end, obj["name"]))
        pos = span_end
    if problems:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        parsed.error = f"Your tool calls could not be read: {shown}. Nothing was run. {CALL_FORMAT_HINT}"
    elif not parsed.calls:
        parsed.error = NO_CALL_MESSAGE
    return parsed


def _check_call_object(obj: Any, number: int) -> str | None:
    if not isinstance(obj, dict):
        return f"tool call {number} must be a JSON object, got {type(obj).__name__}"
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return f"tool call {number} has unexpected key {extra[0]!r} (only 'name' and 'arguments')"
    if not isinstance(obj.get("name"), str) or not obj["name"]:
        return f"tool call {number} needs a non-empty string 'name'"
    if not isinstance(obj.get("arguments"), dict):
        return f"tool call {number} needs an 'arguments' object (use {{}} for none)"
    return None


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, rest)``: the insides of the turn's ``<think>`` blocks (an unclosed block runs
    to the end), joined and stripped, and the text around them. ``rest`` is stripped only when a
    block was taken out of it, so a turn without thinking comes back unchanged."""
    thoughts, kept, pos = [], [], 0
    while (start := text.find(THINK_OPEN, pos)) != -1:
        end = _think_end(text, start)
        closed = text.endswith(THINK_CLOSE, 0, end)
        kept.append(text[pos:start])
        thoughts.append(text[start + len(THINK_OPEN) : end - len(THINK_CLOSE) if closed else end].strip())
        pos = end
    if not thoughts:
        return "", text
    kept.append(text[pos:])
    return "\n\n".join(t for t in thoughts if t), "".join(kept).strip()


def parse_tool_calls(text: str, turn_index: int = 0) -> list[ToolCall]:
    """The tool calls of a turn, or ``FormatError`` with a message for the model."""
    parsed = parse_turn(text, turn_index)
    if parsed.error:
        raise FormatError(parsed.error)
    return parsed.calls


# ----------------------------------------------------------------------------------------------
# Tokens


def message_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as the chat template reads them."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        out.append(d)
    return out


def text_protocol_messages(messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """The transcript for a server sent no ``tools``: the schemas join the system prompt, native
    tool calls become ``<tool_call>`` text and tool results one user turn of ``<tool_response>``
    blocks. Rendered by ``CHAT_TEMPLATE`` without tools this is the text that ``messages`` with
    ``tools`` render to, so the model reads the same prompt either way."""
    out: list[Message] = []
    results: list[str] = []
    for m in messages:
        if m.role == "tool":
            results.append(m.content)
            continue
        if results:
            out.append(Message("user", tool_responses_text(results)))
            results = []
        if m.role == "system" and not out:
            out.append(Message("system", tools_system_text(m.content, tools)))
        elif m.role == "assistant" and m.tool_calls:
            calls = "".join("\n" + format_tool_call(c.name, c.arguments) for c in m.tool_calls)
            out.append(Message("assistant", m.content + calls))
        else:
            out.append(Message(m.role, m.content))
    if results:
        out.append(Message("user", tool_responses_text(results)))
    if not out or out[0].role != "system":
        out.insert(0, Message("system", tools_system_text(None, tools)))
    return out


def decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class TokenTranscript:
    """One segment's messages and token ids, kept equal to the chat template's rendering.

    ``prompt_ids`` is the tokenised prompt. For each model turn call ``model_turn(ids,
    finish_reason)`` (returns the turn's text as a message), then ``environment_turn(messages)``
    with the tool or user messages that follow; it returns the text and ids to append.
    """

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]], messages: list[Message]):
        self.tokenizer = tokenizer
        self.tools = tools
        self.messages = list(messages)
        self.prompt_text = self.render(self.messages, generation_prompt=True)
        self.prompt_ids = encode(tokenizer, self.prompt_text)
        probe = [*self.messages, Message("assistant", "x")]
        # what the template writes after an assistant turn's content, e.g. "<|im_end|>\n"
        self.turn_closing = self.render(probe, generation_prompt=False)[len(self.prompt_text) + 1 :]
        self._sampled_closing = ""  # the part of the turn's closing the model sampled itself

    def render(self, messages: list[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            message_dicts(messages), tools=self.tools, add_generation_prompt=generation_prompt, tokenize=False
        )

    def model_turn(self, ids: list[int], finish_reason: str) -> str:
        """Record a sampled turn; returns its text (the assistant message content). A final stop
        token that begins the template's closing (``<|im_end|>``) is not part of the content."""
        content = decode(self.tokenizer, ids)
        self._sampled_closing = ""
        if ids and finish_reason == "stop":
            stop_text = decode(self.tokenizer, ids[-1:])
            if stop_text and self.turn_closing.startswith(stop_text):
                content = decode(self.tokenizer, ids[:-1])
                self._sampled_closing = stop_text
        self.messages.append(Message("assistant", content))
        return content

    def environment_turn(self, new_messages: list[Message]) -> tuple[str, list[int]]:
        """Text and ids that take the context from the end of the model's turn to the next
        generation prompt, with ``new_messages`` rendered in between."""
        text = self.environment_text(new_messages)
        self.messages += new_messages
        self._sampled_closing = ""
        return text, encode(self.tokenizer, text)

    def environment_text(self, new_messages: list[Message]) -> str:
        """The text ``environment_turn(new_messages)`` would append, without appending it."""
        head = self.render(self.messages[:-1], generation_prompt=True)
        before = self.render(self.messages, generation_prompt=False)
        content = self.messages[-1].content
        if not before.startswith(head + content):
            raise TranscriptError("the chat template does not render the assistant turn as prompt + content + closing")
        closing = before[len(head) + len(content):]
        after = self.render(self.messages + new_messages, generation_prompt=True)
        if not after.startswith(before):
            raise TranscriptError("the chat template is not prefix-stable: adding messages changed earlier text")
        return closing[len(self._sampled_closing):] + after[len(before):]


def token_kinds(tokenizer: Any, ids: list[int]) -> list[TokenKind]:
    """Kind of each sampled token: inside a ``finish`` call it is FINAL_MESSAGE, inside another
    tool call TOOL_CALL, anything else (``<think>`` blocks, prose, the stop token) THINKING."""
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = "".join(pieces)
    char_kind = [TokenKind.THINKING] * (len(text) + 1)
    for start, end, name in parse_turn(text).spans:
        kind = TokenKind.FINAL_MESSAGE if name == "finish" else TokenKind.TOOL_CALL
        char_kind[start:end] = [kind] * (end - start)
    kinds, offset = [], 0
    for piece in pieces:
        kinds.append(char_kind[offset] if piece else (kinds[-1] if kinds else TokenKind.THINKING))
        offset += len(piece)
    return kinds
