"""The OpenAI-compatible policy against a local HTTP server that answers like one."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.http import OpenAIPolicy
from opencomposer.agent.policy import PolicyError, make_policy
from opencomposer.config import Config, HttpPolicyConfig, load_recipe
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import load_task
from opencomposer.types import EpisodeStatus

from .conftest import FIXTURES


def tool_reply(call_id: str, name: str, arguments: str, prompt_tokens: int = 1000, completion_tokens: int = 50,
               cached_tokens: int = 0):
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return 200, {
        "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}}],
        "usage": usage,
    }


class FakeServer:
    """Serves scripted (status, body) replies in order and records each request."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers["Content-Length"])
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                        "body": json.loads(self.rfile.read(length))})
                status, body = server.replies.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OC_TEST_KEY", "sk-test")
    return HttpPolicyConfig(api_key_env="OC_TEST_KEY", backoff_s=0.01, max_retries=2,
                            input_cost_per_mtok=2.0, output_cost_per_mtok=10.0)


@pytest.mark.bwrap
def test_episode_with_native_tool_calls_retries_and_cost(config: HttpPolicyConfig):
    old, new = "    return a - b", "    return a + b"
    server = FakeServer([
        (503, {"error": "overloaded"}),
        (429, {"error": "slow down"}),
        tool_reply("c1", "edit", json.dumps({"path": "calc.py", "old": old, "new": new})),
        tool_reply("c2", "finish", '{"message": "Fixed."}', prompt_tokens=2000, completion_tokens=20,
                   cached_tokens=900),
    ])
    config.base_url = server.url
    task = load_task(FIXTURES / "fix-add")
    try:
        with Sandbox(task.repo) as sandbox:
            episode = AgentLoop(OpenAIPolicy(config, model="gpt-test"), task, sandbox).run()
            diff = sandbox.diff()
    finally:
        server.close()
    assert episode.status == EpisodeStatus.OK and episode.final_message == "Fixed."
    assert diff == task.gold_patch
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 4
    assert server.requests[0]["auth"] == "Bearer sk-test"
    body = server.requests[3]["body"]
    assert body["model"] == "gpt-test" and [t["function"]["name"] for t in body["tools"]][0] == "read_file"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][2]["tool_calls"][0]["id"] == "c1" and body["messages"][3]["tool_call_id"] == "c1"
    assert json.loads(body["messages"][2]["tool_calls"][0]["function"]["arguments"])["new"] == new
    assert episode.metrics["prompt_tokens"] == 3000.0 and episode.metrics["completion_tokens"] == 70.0
    assert episode.metrics["cached_tokens"] == 900.0  # usage.prompt_tokens_details.cached_tokens
    assert episode.metrics["cost"] == pytest.approx((3000 * 2.0 + 70 * 10.0) / 1e6)


@pytest.mark.bwrap
def test_bad_arguments_are_a_format_error_and_cost_budget_stops(config: HttpPolicyConfig):
    server = FakeServer([tool_reply("c1", "edit", "{not json", prompt_tokens=500_000, completion_tokens=0)] * 3)
    config.base_url = server.url
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_cost, task.budgets.max_tokens = 1.5, None
    try:
        with Sandbox(task.repo) as sandbox:
            episode = AgentLoop(OpenAIPolicy(config, model="m"), task, sandbox).run()
    finally:
        server.close()
    assert episode.status == EpisodeStatus.TIMEOUT and "cost budget used up (2.0000 of 1.5)" in episode.error
    assert episode.turns[0].format_error.startswith("Tool call 1 (edit) has arguments that are not valid JSON")
    assert episode.segments[0].messages[3].role == "user"


def test_client_errors_and_exhausted_retries_are_policy_errors(config: HttpPolicyConfig):
    from opencomposer.agent.policy import Context
    from opencomposer.types import Task

    context = Context(task=Task(id="t", instruction="x", repo=FIXTURES), messages=[], token_ids=None,
                      turn_index=0, max_new_tokens=10)
    server = FakeServer([(401, {"error": "bad key"}), (500, {}), (500, {}), (500, {})])
    config.base_url = server.url
    try:
        with pytest.raises(PolicyError, match="answered 401"):
            OpenAIPolicy(config, model="m").act(context)
        with pytest.raises(PolicyError, match="failed after 3 attempts: HTTP 500"):
            OpenAIPolicy(config, model="m").act(context)
    finally:
        server.close()


def test_policy_specs():
    config = load_recipe(None, ["agent.http.base_url=http://localhost:9/v1"])
    assert make_policy("openai:my-model", config).name == "openai:my-model"
    assert make_policy("oracle", Config()).name == "oracle" and make_policy("noop", Config()).name == "noop"
    with pytest.raises(ValueError, match="unknown name 'gpt'; expected one of oracle, noop, local, openai"):
        make_policy("gpt", Config())
    with pytest.raises(PolicyError, match="no model name"):
        make_policy("openai", Config())


def _context(messages=None):
    from opencomposer.types import Context, Message, Task

    messages = messages or [Message("system", "Be brief."), Message("user", "Fix calc.py")]
    return Context(task=Task(id="t", instruction="x", repo=FIXTURES), messages=messages, token_ids=None,
                   turn_index=0, max_new_tokens=10)


def test_the_token_cap_falls_back_to_max_tokens_once_and_for_good(config: HttpPolicyConfig):
    refusal = {"error": {"message": "Unsupported parameter: 'max_completion_tokens' is not supported with this "
                                    "model. Use 'max_tokens' instead.", "type": "invalid_request_error"}}
    server = FakeServer([(400, refusal), tool_reply("c1", "finish", "{}"), tool_reply("c2", "finish", "{}"),
                         (400, {"error": {"message": "messages: too long"}})])
    config.base_url = server.url
    policy = OpenAIPolicy(config, model="m")
    try:
        policy.act(_context())
        policy.act(_context())
        with pytest.raises(PolicyError, match="answered 400"):  # another 400 is not retried
            policy.act(_context())
    finally:
        server.close()
    caps = [{k: r["body"].get(k) for k in ("max_completion_tokens", "max_tokens")} for r in server.requests]
    assert caps == [{"max_completion_tokens": 10, "max_tokens": None}] + [{"max_completion_tokens": None,
                                                                           "max_tokens": 10}] * 3


def test_a_summary_request_has_the_loop_cap_and_a_work_turn_the_sampling_cap(config: HttpPolicyConfig):
    """``sampling.max_new_tokens`` caps work turns; a summary (or compaction) call gets the cap the
    loop gives it (``agent.summary_max_tokens`` within what is left)."""
    from dataclasses import replace

    from opencomposer.config import SamplingConfig

    server = FakeServer([tool_reply("c1", "finish", "{}"), tool_reply("c2", "finish", "{}")])
    config.base_url = server.url
    policy = OpenAIPolicy(config, model="m", sampling=SamplingConfig(max_new_tokens=6))
    try:
        policy.act(replace(_context(), max_new_tokens=300))
        policy.act(replace(_context(), max_new_tokens=300, summary=True))
    finally:
        server.close()
    assert [r["body"]["max_completion_tokens"] for r in server.requests] == [6, 300]


def test_without_native_tools_the_tools_travel_in_the_prompt(config: HttpPolicyConfig, tokenizer):
    """``agent.http.native_tools = false``: no ``tools`` in the request, and the messages render to
    the same prompt text as the native request would (tools listed by the template)."""
    from opencomposer.agent.protocol import SYSTEM_PROMPT, TokenTranscript, text_protocol_messages
    from opencomposer.agent.tools import tool_schemas
    from opencomposer.types import Message, ToolCall

    transcript = [
        Message("system", SYSTEM_PROMPT), Message("user", "Fix calc.py"),
        Message("assistant", "Two reads.", tool_calls=[ToolCall("read_file", {"path": "a.py"}, id="c1"),
                                                       ToolCall("list_dir", {"path": "."}, id="c2")]),
        Message("tool", "x = 1", tool_call_id="c1"), Message("tool", "a.py (6 bytes)", tool_call_id="c2"),
        Message("assistant", '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>'),
    ]
    native = TokenTranscript(tokenizer, tool_schemas(), transcript).prompt_text
    as_text = TokenTranscript(tokenizer, [], text_protocol_messages(transcript, tool_schemas())).prompt_text
    assert as_text == native
    without_system = TokenTranscript(tokenizer, [], text_protocol_messages(transcript[1:2], tool_schemas()))
    assert without_system.prompt_text == TokenTranscript(tokenizer, tool_schemas(), transcript[1:2]).prompt_text

    server = FakeServer([(200, {"choices": [{"finish_reason": "stop", "message": {
        "role": "assistant", "content": '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>'}}]})])
    config.base_url, config.native_tools = server.url, False
    try:
        output = OpenAIPolicy(config, model="m").act(_context(transcript[:5]))
    finally:
        server.close()
    body = server.requests[0]["body"]
    assert "tools" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"].startswith(SYSTEM_PROMPT + "\n\n# Tools")
    assert body["messages"][3]["content"] == "<tool_response>\nx = 1\n</tool_response>\n<tool_response>\na.py (6 bytes)\n</tool_response>"
    assert output.tool_calls is None and output.text.startswith("<tool_call>")  # the loop parses the text


@pytest.mark.bwrap
def test_reasoning_content_is_recorded_with_the_turn(config: HttpPolicyConfig):
    _, reply = tool_reply("c1", "finish", '{"message": "done"}')
    reply["choices"][0]["message"]["reasoning_content"] = "Nothing to change."
    server = FakeServer([(200, reply)])
    config.base_url = server.url
    task = load_task(FIXTURES / "fix-add")
    try:
        with Sandbox(task.repo) as sandbox:
            episode = AgentLoop(OpenAIPolicy(config, model="m"), task, sandbox).run()
    finally:
        server.close()
    assert episode.status == EpisodeStatus.OK
    assert episode.turns[0].text == "<think>Nothing to change.</think>\n"
    assert episode.segments[0].messages[2].content == ""  # the thinking is not sent back to the server
