"""Deterministic policies that play back turns written in advance.

``ScriptedPolicy`` answers turn *i* of an episode with the *i*-th entry of its script: raw text
(parsed like a model's, so malformed text tests the parser and the ``FormatError`` path) or a list
of ``ToolCall`` (written in the Hermes format, several = parallel calls). Given a tokenizer it
returns token ids too (the text's tokens plus the end-of-turn token), so the loop's token-level
bookkeeping runs exactly as with a model. Their logprobs are honest, not placeholders: a script
emits each of its tokens with probability 1, so every logprob is log 1 = 0 (the behaviour policy
of a scripted episode is deterministic; SFT ignores them, and the loop refuses a token-level
policy that returns none). When the script runs out it calls ``finish``. Tests drive the real
loop, sandbox and grader with it instead of mocks.

Built-in scripts: ``oracle_policy`` replays a task's gold patch through the tools (one ``edit``
per hunk where the hunk's old text is unique, else ``write_file`` of the patched file, ``run rm``
for deletions), then finishes; a task without a gold patch whose folder has
``solution/answer.md`` (a question that must not edit code) is answered with that text as the
final message; ``noop_policy`` finishes at once.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opencomposer.agent.protocol import encode, format_tool_call
from opencomposer.model.tokenizer import IM_END
from opencomposer.sandbox.patch import apply_hunks, parse_patch
from opencomposer.types import Context, PolicyOutput, Task, ToolCall

ScriptTurn = str | list[ToolCall]
Script = Sequence[ScriptTurn] | Callable[[Task], Sequence[ScriptTurn]]


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name, arguments)


def render_turn(turn: ScriptTurn) -> str:
    if isinstance(turn, str):
        return turn
    return "\n".join(format_tool_call(c.name, c.arguments) for c in turn)


class ScriptedPolicy:
    """Plays ``script`` (a fixed list of turns, or a function of the task giving one)."""

    def __init__(self, script: Script, name: str = "scripted", tokenizer: Any | None = None):
        self.script = script
        self.name = name
        self.tokenizer = tokenizer
        self._cache: dict[str, Sequence[ScriptTurn]] = {}
        self._lock = threading.Lock()

    def turns(self, task: Task) -> Sequence[ScriptTurn]:
        if not callable(self.script):
            return self.script
        with self._lock:
            if task.id not in self._cache:
                self._cache[task.id] = self.script(task)
            return self._cache[task.id]

    def act(self, context: Context) -> PolicyOutput:
        turns = self.turns(context.task)
        if context.turn_index < len(turns):
            text = render_turn(turns[context.turn_index])
        else:
            text = format_tool_call("finish", {"message": "The script has ended."})
        if self.tokenizer is None:
            return PolicyOutput(text=text)
        ids = encode(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids(IM_END)]
        # the script's own probability of each token: 1 (see module doc)
        return PolicyOutput(text=text, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def oracle_script(task: Task) -> list[ScriptTurn]:
    """Tool calls that turn ``task.repo`` into the gold solution, in one turn, then ``finish``."""
    if not task.gold_patch:
        answer = task.path / "solution" / "answer.md" if task.path is not None else None
        if answer is not None and answer.is_file():  # a no-edit task: the reference final message
            return [[call("finish", message=answer.read_text(encoding="utf-8"))]]
        return [[call("finish", message=f"Task {task.id} has no gold patch; the oracle cannot solve it.")]]
    calls: list[ToolCall] = []
    for fp in parse_patch(task.gold_patch):
        if fp.binary:
            continue
        if fp.new_path is None:
            calls.append(call("run", command=f"rm -f -- {shlex.quote(fp.old_path)}"))
            continue
        # bytes decoded as they are: read_text would turn CRLF into LF, and the gold hunks keep the CR
        original = "" if fp.old_path is None else (task.repo / fp.old_path).read_bytes().decode("utf-8")
        patched = apply_hunks(original, fp.hunks, fp.path)
        edits = _hunk_edits(original, fp.hunks) if fp.old_path == fp.new_path else None
        if edits is None:
            calls.append(call("write_file", path=fp.new_path, content=patched))
        else:
            calls += [call("edit", path=fp.path, old=old, new=new) for old, new in edits]
        if fp.old_path is not None and fp.old_path != fp.new_path:
            calls.append(call("run", command=f"rm -f -- {shlex.quote(fp.old_path)}"))
        if fp.new_mode == "100755":
            calls.append(call("run", command=f"chmod +x -- {shlex.quote(fp.new_path)}"))
    return [calls, [call("finish", message="I applied the reference change.")]]


def _hunk_edits(original: str, hunks: list) -> list[tuple[str, str]] | None:
    """One (old, new) edit per hunk if each hunk's old text is non-empty and unique at its turn."""
    current, edits = original, []
    for hunk in hunks:
        old, new = "".join(hunk.old_lines), "".join(hunk.new_lines)
        if not old or old == new or current.count(old) != 1:
            return None
        current = current.replace(old, new, 1)
        edits.append((old, new))
    return edits


def oracle_policy(argument: str = "", config: Any = None) -> ScriptedPolicy:
    return ScriptedPolicy(oracle_script, name="oracle")


def noop_policy(argument: str = "", config: Any = None) -> ScriptedPolicy:
    return ScriptedPolicy([[call("finish", message="I made no changes.")]], name="noop")
