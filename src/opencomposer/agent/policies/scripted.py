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

Summaries (``agent.context_policy``): when the loop asks for one (``Context.summary``; the request
is the last message) the policy answers with a plain-text summary instead of its next turn, and it
indexes its script by ``turn_index - summaries``, so summaries never shift the script. The summary
(``ScriptedPolicy.summary``) is computed from that script position alone: the turns already played
(their ``note`` where a ``NotedTurn`` has one, else a compact line per tool call; a note
``LABEL: text`` replaces an earlier note with the same label, so a running fact such as a list of
findings appears once, as it stands) and the steps
that remain (each call's tool and the command, pattern or path it acts on, never its content,
which the agent could not know yet). After a summary the next context holds only the system prompt, the task and that summary,
so a summary computed from the position carries every earlier fact forward, complete and
deterministic. Its tokens and logprobs are those of any scripted turn (text tokens, end-of-turn
token, logprob 0).

Built-in scripts: ``oracle_script`` plays the task folder's ``solution/script.json`` where it has
one (a walkthrough of several turns with notes, e.g. the ``tiny-long`` family: ``load_script``);
otherwise it replays the gold patch through the tools (one ``edit`` per hunk where the hunk's old
text is unique, else ``write_file`` of the patched file, ``run rm`` for deletions), then finishes;
a task without a gold patch whose folder has ``solution/answer.md`` (a question that must not edit
code) is answered with that text as the final message. ``noop_policy`` finishes at once.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from opencomposer.agent.protocol import THINK_CLOSE, THINK_OPEN, encode, format_tool_call
from opencomposer.model.tokenizer import IM_END
from opencomposer.pysource import parse
from opencomposer.sandbox.patch import apply_hunks, parse_patch
from opencomposer.types import Context, PolicyOutput, Task, ToolCall

SCRIPT_FILE = Path("solution") / "script.json"  # a task folder's walkthrough for the oracle
TURN_KEYS = ("calls", "note", "scratch")
SUMMARY_ARGUMENT_CHARS = 80  # a summary line shows at most this much of a path or command


class NotedTurn(list[ToolCall]):
    """A turn of tool calls with a ``note``: what playing it taught the agent (e.g.
    "notes/part2.txt: key = node"), which the oracle's summaries repeat (the latest note of each
    label: ``script_summary``), and a ``scratch``: what the oracle thinks, in a ``<think>`` block,
    before a summary written right after this turn (the fact the summary is about to add, found
    in the tool output; the loop drops the block from what the summary hands on). It is a plain
    list of calls to everything else (rendering, ``one_turn_oracle``)."""

    def __init__(self, calls: Iterable[ToolCall] = (), note: str = "", scratch: str = ""):
        super().__init__(calls)
        self.note = note
        self.scratch = scratch


ScriptTurn = str | list[ToolCall]
Script = Sequence[ScriptTurn] | Callable[[Task], Sequence[ScriptTurn]]


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name, arguments)


def describe_call(c: ToolCall) -> str:
    """A call in one short line: its name and the command, pattern and path it acts on ("grep def
    total in src"), never a file's content, an edit's text or a message."""
    shown = []
    for key in ("command", "pattern", "path"):
        value = c.arguments.get(key)
        if isinstance(value, str) and value:
            shown.append(value if len(value) <= SUMMARY_ARGUMENT_CHARS else value[: SUMMARY_ARGUMENT_CHARS - 3] + "...")
    return " ".join([c.name, " in ".join(shown)]) if shown else c.name


def describe_turn(turn: ScriptTurn) -> list[str]:
    """What a played turn did, for a summary: its note, else one line per call."""
    if isinstance(turn, str):
        return ["a reply without tool calls"]
    note = getattr(turn, "note", "")
    return [note] if note else [describe_call(c) for c in turn]


def latest_by_label(lines: list[str]) -> list[str]:
    """``lines`` where a line ``LABEL: text`` drops every earlier line with the same ``LABEL``
    (the text before the first ": "); lines without one are all kept, in order."""
    last = {line.split(": ", 1)[0]: i for i, line in enumerate(lines) if ": " in line}
    return [line for i, line in enumerate(lines) if ": " not in line or last[line.split(": ", 1)[0]] == i]


def script_summary(turns: Sequence[ScriptTurn], played: int) -> str:
    """The oracle's summary after ``played`` turns of ``turns``: what was done and learned, and
    the steps that remain (module doc)."""
    played = min(played, len(turns))
    done = latest_by_label([line for turn in turns[:played] for line in describe_turn(turn)])
    remaining = ([describe_call(c) for turn in turns[played:] if not isinstance(turn, str) for c in turn]
                 or ["finish"])
    lines = [f"Progress: {played} of {len(turns)} planned steps done.", "Done:"]
    lines += [f"- {line}" for line in done] or ["- nothing yet"]
    lines += ["Remaining:", *(f"- {line}" for line in remaining)]
    scratch = getattr(turns[played - 1], "scratch", "") if played else ""
    return (f"{THINK_OPEN}\n{scratch}\n{THINK_CLOSE}\n" if scratch else "") + "\n".join(lines)


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

    def summary(self, task: Task, played: int) -> str:
        """The summary after ``played`` script turns (``script_summary``)."""
        return script_summary(self.turns(task), played)

    def act(self, context: Context) -> PolicyOutput:
        turns = self.turns(context.task)
        position = context.turn_index - context.summaries  # summary turns do not advance the script
        if position < 0:
            raise ValueError(f"context: {context.summaries} summaries but only {context.turn_index} turns taken")
        if context.summary:
            text = self.summary(context.task, position)
        elif position < len(turns):
            text = render_turn(turns[position])
        else:
            text = format_tool_call("finish", {"message": "The script has ended."})
        if self.tokenizer is None:
            return PolicyOutput(text=text)
        ids = encode(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids(IM_END)]
        # the script's own probability of each token: 1 (see module doc)
        return PolicyOutput(text=text, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def load_script(path: Path) -> list[ScriptTurn]:
    """Read a walkthrough (``solution/script.json``): a JSON list of turns, each an object with
    ``calls`` (a non-empty list of ``{"name": TOOL, "arguments": {...}}``) and an optional
    ``note`` and ``scratch`` (strings, ``NotedTurn``). Raises ``ValueError`` naming the file and
    the turn for anything else."""
    from opencomposer.agent.tools import TOOL_NAMES, tool_schemas

    tools = {schema["function"]["name"] for schema in tool_schemas(TOOL_NAMES)}  # every tool; agent.tools decides at run time
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the walkthrough: {e}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of turns")
    turns: list[ScriptTurn] = []
    for i, entry in enumerate(data):
        where = f"{path}: turn {i}"
        if not isinstance(entry, dict) or set(entry) - set(TURN_KEYS) or "calls" not in entry:
            raise ValueError(f"{where}: expected an object with 'calls' and an optional 'note' and 'scratch', "
                             f"got {entry!r}")
        note, scratch = entry.get("note", ""), entry.get("scratch", "")
        for key, value in (("note", note), ("scratch", scratch)):
            if not isinstance(value, str):
                raise ValueError(f"{where}: {key!r} must be a string, got {value!r}")
        calls = entry["calls"]
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"{where}: 'calls' must be a non-empty list of tool calls")
        parsed = []
        for c in calls:
            if not isinstance(c, dict) or set(c) != {"name", "arguments"} or not isinstance(c["arguments"], dict):
                raise ValueError(f"{where}: a call must be {{\"name\": ..., \"arguments\": {{...}}}}, got {c!r}")
            if c["name"] not in tools:
                raise ValueError(f"{where}: unknown tool {c['name']!r}; expected one of {', '.join(sorted(tools))}")
            parsed.append(ToolCall(c["name"], dict(c["arguments"])))
        turns.append(NotedTurn(parsed, note, scratch))
    return turns


def oracle_script(task: Task) -> list[ScriptTurn]:
    """The task folder's walkthrough (``solution/script.json``) where it has one; else tool calls
    that turn ``task.repo`` into the gold solution, in one turn, then ``finish``."""
    if task.path is not None and (task.path / SCRIPT_FILE).is_file():
        return load_script(task.path / SCRIPT_FILE)
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


READ_CONTEXT_LINES = 10  # explore_script reads this many lines either side of a change outside any function


def explore_script(task: Task) -> list[ScriptTurn]:
    """The gold patch replayed the way an engineer works, one step per turn: find the function
    around each change (``grep`` for its ``def`` over the whole workspace, so the file and line
    the read goes to are in the observation before it), read it (``read_file`` of exactly its lines),
    fix it with the smallest edits (only the changed lines, widened with context lines until the
    old text is unique), run the task's tests, ``finish``. SFT on these episodes teaches the
    read → edit → test → finish pattern (``sft.demonstrations = "explore"``).

    Falls back to ``oracle_script`` for a task this cannot express: a walkthrough of its own, no
    gold patch, or a patch that creates, deletes, renames or binary-changes a file."""
    import ast

    if task.path is not None and (task.path / SCRIPT_FILE).is_file() or not task.gold_patch:
        return oracle_script(task)
    patches = parse_patch(task.gold_patch)
    if any(fp.binary or fp.old_path is None or fp.old_path != fp.new_path or fp.new_mode for fp in patches):
        return oracle_script(task)
    greps: list[ToolCall] = []
    reads: list[ToolCall] = []
    edits: list[ToolCall] = []
    for fp in patches:
        original = (task.repo / fp.path).read_bytes().decode("utf-8")
        try:
            functions = [node for node in ast.walk(parse(original))
                         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        except SyntaxError:
            functions = []
        spans: list[tuple[int, int, str | None]] = []
        for hunk in fp.hunks:
            first = hunk.old_start + _leading_context(hunk)
            around = [f for f in functions if f.lineno <= first <= (f.end_lineno or f.lineno)]
            if around:  # the innermost function holding the first changed line
                f = max(around, key=lambda f: f.lineno)
                span = (f.lineno, f.end_lineno or f.lineno, f.name)
            else:
                span = (max(1, first - READ_CONTEXT_LINES), first + READ_CONTEXT_LINES, None)
            if span not in spans:
                spans.append(span)
        for start, end, name in spans:
            if name is not None:
                greps.append(call("grep", pattern=rf"def {name}\b"))
            reads.append(call("read_file", path=fp.path, offset=start, limit=end - start + 1))
        minimal = _minimal_edits(original, fp.hunks)
        if minimal is None:
            return oracle_script(task)
        edits += [call("edit", path=fp.path, old=old, new=new) for old, new in minimal]
    turns: list[ScriptTurn] = []
    if greps:
        turns.append(NotedTurn(greps, "found the code at fault"))
    turns += [NotedTurn(reads, "read the code at fault"), NotedTurn(edits, "fixed it"),
              NotedTurn([call("run", command=task.test_command)], "ran the tests"),
              [call("finish", message="Fixed the bug; the tests pass.")]]
    return turns


def _leading_context(hunk: Any) -> int:
    """Unchanged lines at the start of a hunk (its context before the first change)."""
    n = 0
    while n < min(len(hunk.old_lines), len(hunk.new_lines)) and hunk.old_lines[n] == hunk.new_lines[n]:
        n += 1
    return n


def _minimal_edits(original: str, hunks: list) -> list[tuple[str, str]] | None:
    """One (old, new) edit per hunk holding only its changed lines, widened by one context line at
    a time (before, then after) until the old text occurs exactly once; None if none is unique."""
    current, edits = original, []
    for hunk in hunks:
        old_lines, new_lines = hunk.old_lines, hunk.new_lines
        lead = _leading_context(hunk)
        trail = 0
        while (trail < min(len(old_lines), len(new_lines)) - lead
               and old_lines[len(old_lines) - 1 - trail] == new_lines[len(new_lines) - 1 - trail]):
            trail += 1
        lo, hi_old, hi_new = lead, len(old_lines) - trail, len(new_lines) - trail
        while True:
            old, new = "".join(old_lines[lo:hi_old]), "".join(new_lines[lo:hi_new])
            if old and current.count(old) == 1:
                break
            if lo > 0:
                lo -= 1
            elif hi_old < len(old_lines):
                hi_old, hi_new = hi_old + 1, hi_new + 1
            else:
                return None
        current = current.replace(old, new, 1)
        edits.append((old, new))
    return edits


def oracle_policy(argument: str = "", config: Any = None) -> ScriptedPolicy:
    return ScriptedPolicy(oracle_script, name="oracle")


def noop_policy(argument: str = "", config: Any = None) -> ScriptedPolicy:
    return ScriptedPolicy([[call("finish", message="I made no changes.")]], name="noop")
