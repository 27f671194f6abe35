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
from opencomposer.sandbox.workspace import Sandbox, bwrap_available
from opencomposer.tasks.format import load_task
from opencomposer.types import EpisodeStatus

from .conftest import FIXTURES


def tool_reply(call_id: str, name: str, arguments: str, prompt_tokens: int = 1000, completion_tokens: int = 50):
    return 200, {
        "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
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


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")
def test_episode_with_native_tool_calls_retries_and_cost(config: HttpPolicyConfig):
    old, new = "    return a - b", "    return a + b"
    server = FakeServer([
        (503, {"error": "overloaded"}),
        (429, {"error": "slow down"}),
        tool_reply("c1", "edit", json.dumps({"path": "calc.py", "old": old, "new": new})),
        tool_reply("c2", "finish", '{"message": "Fixed."}', prompt_tokens=2000, completion_tokens=20),
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
    assert episode.metrics["cost"] == pytest.approx((3000 * 2.0 + 70 * 10.0) / 1e6)


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")
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
