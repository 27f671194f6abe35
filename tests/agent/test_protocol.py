"""The tool-call text protocol: parsing (golden cases and 10,000 fuzz cases) and exact tokens."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencomposer.agent.errors import FormatError
from opencomposer.agent.protocol import (
    NO_CALL_MESSAGE,
    TokenTranscript,
    format_tool_call,
    initial_messages,
    message_dicts,
    parse_tool_calls,
    parse_turn,
    token_kinds,
    truncate_middle,
)
from opencomposer.agent.tools import tool_schemas
from opencomposer.types import Message, TokenKind, ToolCall


def test_one_call_and_parallel_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    assert parse_tool_calls(text, 3) == [ToolCall("read_file", {"path": "a.py"}, id="call_3_1")]
    two = format_tool_call("grep", {"pattern": "x"}) + "\n" + format_tool_call("list_dir", {"path": "."})
    assert [c.name for c in parse_tool_calls(two)] == ["grep", "list_dir"]


def test_markers_inside_json_strings_and_think_blocks_are_not_calls():
    content = 'print("<tool_call>") # </tool_call>'
    text = "<think>maybe <tool_call>{}</tool_call></think>" + format_tool_call("write_file", {"path": "x", "content": content})
    assert parse_tool_calls(text) == [ToolCall("write_file", {"path": "x", "content": content}, id="call_0_1")]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("I will just answer.", NO_CALL_MESSAGE),
        ('<tool_call>{"name": "run", "arguments": {"command": "ls"}}', "is not closed"),
        ("<tool_call>{name: run}</tool_call>", "tool call 1 is not valid JSON (Expecting property name"),
        ('<tool_call>["run"]</tool_call>', "must be a JSON object, got list"),
        ('<tool_call>{"name": "run", "arguments": "ls"}</tool_call>', "needs an 'arguments' object"),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "non-empty string 'name'"),
        ('<tool_call>{"name": "run", "arguments": {}, "id": 1}</tool_call>', "unexpected key 'id'"),
        ('<tool_call>{"name": "run", "arguments": {}} trailing</tool_call>', "right after its JSON object"),
        ('</tool_call><tool_call>{"name": "finish", "arguments": {}}</tool_call>', "has no matching <tool_call>"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "tool call 1 is not valid JSON"),
    ],
)
def test_malformed_turns_become_format_errors(text: str, problem: str):
    with pytest.raises(FormatError) as info:
        parse_tool_calls(text)
    assert problem in str(info.value)


# Pieces of well-formed calls, markers and stray characters; joined at random they hit every branch.
TEXT_PIECES = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', ":",
                               '"arguments"', "[", "]", "\n", " ", '"', "\\", "null", "1e999", '"run"', ",",
                               '{"name": "run", "arguments": {}}', "<", ">", "é", "\x00", "tool_call", "x"])
FUZZ_TEXT = st.lists(TEXT_PIECES, max_size=40).map("".join)


def check_parse(text: str) -> None:
    parsed = parse_turn(text)
    assert (parsed.error is None) == bool(parsed.calls), (text, parsed.error, parsed.calls)  # one or the other
    for start, end, _ in parsed.spans:
        assert 0 <= start < end <= len(text) and text.startswith("<tool_call>", start)
    for call in parsed.calls:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)


FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)


@settings(max_examples=1_000, **FUZZ)
@given(text=FUZZ_TEXT)
def test_parser_survives_arbitrary_text(text: str):
    check_parse(text)


@pytest.mark.slow
@settings(max_examples=10_000, **FUZZ)
@given(text=FUZZ_TEXT | st.text(max_size=200))
def test_parser_survives_10000_cases(text: str):
    check_parse(text)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
CALLS = st.lists(st.tuples(st.text(min_size=1, max_size=10), st.dictionaries(st.text(max_size=8), JSON_VALUES,
                                                                               max_size=3)), min_size=1, max_size=4)


@settings(max_examples=300, **FUZZ)
@given(calls=CALLS, prose=st.text(max_size=20).filter(lambda s: "<" not in s))
def test_formatted_calls_parse_back_exactly(calls, prose: str):
    text = prose + "\n".join(format_tool_call(name, args) for name, args in calls)
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed] == calls


def test_truncate_middle_keeps_both_ends():
    assert truncate_middle("abcdefghij", 20) == "abcdefghij"
    assert truncate_middle("abcdefghij", 4) == "ab\n[... 6 characters omitted ...]\nij"


# ----------------------------------------------------------------------------------------------
# Exact tokens


def render(tokenizer, messages, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(message_dicts(messages), tools=tool_schemas(),
                                         add_generation_prompt=generation_prompt, tokenize=False)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_transcript_ids_are_the_tokenised_template_rendering(tokenizer):
    messages = initial_messages("Fix the bug in calc.py.")
    transcript = TokenTranscript(tokenizer, tool_schemas(), messages)
    assert transcript.prompt_ids == encode(tokenizer, render(tokenizer, messages, True))
    assert transcript.turn_closing == "<|im_end|>\n"
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = list(transcript.prompt_ids)

    turn = format_tool_call("read_file", {"path": "calc.py"}) + "\n" + format_tool_call("list_dir", {"path": "."})
    sampled = encode(tokenizer, turn) + [end]
    assert transcript.model_turn(sampled, "stop") == turn
    text, observation = transcript.environment_turn(
        [Message("tool", "     1\tx = 1", tool_call_id="a"), Message("tool", "calc.py (6 bytes)", tool_call_id="b")])
    assert text == ("\n<|im_start|>user\n<tool_response>\n     1\tx = 1\n</tool_response>\n<tool_response>\n"
                    "calc.py (6 bytes)\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    ids += sampled + observation

    cut = encode(tokenizer, "<think>I ran out of tok")  # a turn stopped by the length limit
    assert transcript.model_turn(cut, "length") == "<think>I ran out of tok"
    text, observation = transcript.environment_turn([Message("user", "Your message contains no tool call.")])
    assert text.startswith("<|im_end|>\n<|im_start|>user\n")  # the closing the model never sampled
    ids += cut + observation

    assert ids == encode(tokenizer, render(tokenizer, transcript.messages, True))
    assert tokenizer.decode(ids, skip_special_tokens=False) == render(tokenizer, transcript.messages, True)


def test_token_kinds_label_thinking_calls_and_the_final_message(tokenizer):
    think = "<think>plan</think>"
    call = format_tool_call("run", {"command": "ls"})
    final = format_tool_call("finish", {"message": "done"})
    ids = [*encode(tokenizer, think), *encode(tokenizer, call), *encode(tokenizer, "\n"), *encode(tokenizer, final),
           tokenizer.convert_tokens_to_ids("<|im_end|>")]
    kinds = token_kinds(tokenizer, ids)
    n_think, n_call, n_final = (len(encode(tokenizer, t)) for t in (think, call, final))
    assert kinds[:n_think] == [TokenKind.THINKING] * n_think
    assert kinds[n_think:n_think + n_call] == [TokenKind.TOOL_CALL] * n_call
    start = n_think + n_call + len(encode(tokenizer, "\n"))
    assert kinds[start:start + n_final] == [TokenKind.FINAL_MESSAGE] * n_final
    assert kinds[-1] == TokenKind.THINKING and len(kinds) == len(ids)


def test_tool_schemas_are_openai_function_specs():
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas()}
    assert list(schemas) == ["read_file", "list_dir", "grep", "edit", "write_file", "run", "finish"]
    assert schemas["read_file"]["parameters"]["required"] == ["path"]
    assert schemas["run"]["parameters"]["properties"]["timeout_s"]["type"] == "number"
    assert json.loads(json.dumps(tool_schemas())) == tool_schemas()


def test_think_marker_inside_a_call_argument_is_not_thinking():
    """A ``<think>`` inside a call's JSON is data; the calls after it still count (found by fuzzing)."""
    text = format_tool_call("write_file", {"path": "a.md", "content": "<think>"}) + format_tool_call("finish", {})
    assert [c.name for c in parse_tool_calls(text)] == ["write_file", "finish"]
    thought = "<think>" + format_tool_call("run", {"command": "ls"}) + "</think>" + format_tool_call("finish", {})
    assert [c.name for c in parse_tool_calls(thought)] == ["finish"]
