"""``opencomposer serve``: the reply builder on fixed text, then the real server process (tiny MoE,
one process for the module) through the official ``openai`` client, the HTTP policy and ``eval``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from opencomposer.agent.policies.http import OpenAIPolicy, openai_messages
from opencomposer.agent.protocol import TokenTranscript
from opencomposer.agent.tools import tool_schemas
from opencomposer.config import HttpPolicyConfig, SamplingConfig
from opencomposer.serve.server import ChatModel, ChatRequest, ChatResult, build_choice
from opencomposer.types import Context, Message, Task, ToolCall
from tests.conftest import skip_missing

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny_moe"

THOUGHT_AND_CALLS = (
    "<think>The bug is in calc.py; <tool_call> here is only a thought.</think>\n"
    "Reading the file first.\n"
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "run", "arguments": {"command": "python -m pytest -q"}}\n</tool_call>'
)


# ----------------------------------------------------------------------------------------------
# Without the network


def test_reply_builder_splits_thinking_content_and_tool_calls():
    choice = build_choice(THOUGHT_AND_CALLS, "stop", call_id_prefix="call_x", completion_tokens=40)
    assert choice.reasoning == "The bug is in calc.py; <tool_call> here is only a thought."
    assert choice.content == "Reading the file first."
    assert choice.finish_reason == "tool_calls"
    message = choice.message()
    assert message["reasoning_content"] == choice.reasoning
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("call_x_0_0", "read_file", {"path": "calc.py"}),
        ("call_x_0_1", "run", {"command": "python -m pytest -q"}),
    ]


def test_reply_builder_without_tools_or_with_a_malformed_call_keeps_the_text():
    plain = build_choice(THOUGHT_AND_CALLS, "length", parse_tools=False)
    assert plain.finish_reason == "length" and plain.tool_calls == []
    assert plain.content.startswith("Reading the file first.\n<tool_call>") and "<think>" not in plain.content
    broken = build_choice('Try: <tool_call>{"name": "run", "arguments": {"command": </tool_call>', "stop")
    assert broken.tool_calls == [] and broken.finish_reason == "stop"
    assert broken.content == 'Try: <tool_call>{"name": "run", "arguments": {"command": </tool_call>'
    assert build_choice("just words", "stop").message() == {"role": "assistant", "content": "just words"}


def test_stream_chunks_carry_the_same_message_as_the_response():
    result = ChatResult("chatcmpl-1", MODEL, 0, prompt_tokens=9, choices=[
        build_choice(THOUGHT_AND_CALLS, "stop", index=0, completion_tokens=40),
        build_choice("  two  words ", "length", index=1, completion_tokens=3),
    ])
    chunks = list(result.chunks(include_usage=True))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 43,
                                                                   "total_tokens": 52}
    for expected in result.response()["choices"]:
        deltas = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == expected["index"]]
        joined = {key: "".join(d["delta"].get(key) or "" for d in deltas) for key in ("content", "reasoning_content")}
        calls = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
        assert joined["content"] == (expected["message"]["content"] or "")
        assert joined["reasoning_content"] == expected["message"].get("reasoning_content", "")
        assert [{k: v for k, v in c.items() if k != "index"} for c in calls] == expected["message"].get("tool_calls", [])
        assert deltas[-1]["finish_reason"] == expected["finish_reason"] and deltas[-1]["delta"] == {}


def test_a_request_renders_as_the_agent_loop_renders_its_context():
    from opencomposer.model.tokenizer import train_tokenizer

    sources = sorted((ROOT / "src" / "opencomposer" / "agent").rglob("*.py"))
    tokenizer = train_tokenizer([p.read_text() for p in sources], vocab_size=700)
    messages = [
        Message("system", "You fix bugs."), Message("user", "Fix calc.py"),
        Message("assistant", "Looking.", tool_calls=[ToolCall("read_file", {"path": "calc.py"}, id="c1")]),
        Message("tool", "def add(a, b):\n    return a - b", tool_call_id="c1"),
    ]
    request = ChatRequest(model=MODEL, messages=openai_messages(messages), tools=tool_schemas())
    chat = ChatModel(MODEL, tokenizer, engine=None, stop_ids=set(), max_positions=4096)
    assert chat.prompt_ids(request) == TokenTranscript(tokenizer, tool_schemas(), messages).prompt_ids


# ----------------------------------------------------------------------------------------------
# The real server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "opencomposer.cli", "serve", *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """``opencomposer serve --model tiny_moe`` on a free port; yields its base URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    process = _serve("--model", MODEL, "--host", "127.0.0.1", "--port", str(port), log=log)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail(f"the server did not answer within 300 s:\n{log.read_text()}")
                time.sleep(0.5)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def client(server: str):
    try:
        import openai
    except ImportError as e:
        skip_missing(f"the openai client (the dev extra: pip install -e '.[dev]'): {e}")
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


USER = [{"role": "user", "content": "Write a function that adds two numbers."}]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_completion_with_n_and_seed(client):
    first = client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=6, seed=7, n=2)
    assert first.object == "chat.completion" and len(first.choices) == 2
    assert all(c.finish_reason in ("stop", "length") and c.message.role == "assistant" for c in first.choices)
    assert 0 < first.usage.completion_tokens <= 12 and first.usage.prompt_tokens > 0
    again = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, seed=7, n=2)
    assert [c.message.content for c in again.choices] == [c.message.content for c in first.choices]


def test_streamed_deltas_equal_the_unstreamed_text(client):
    plain = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, seed=3, temperature=0.8)
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, seed=3, temperature=0.8,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_a_tool_call_round_trip_is_rendered_and_answered(client):
    """The model is random, so it will not call tools itself; the request carries a call and its
    result, which the server must render through the template and answer."""
    messages = [*USER,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b): ..."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=tool_schemas(), max_tokens=4, seed=1)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=1, seed=1).usage.prompt_tokens


def test_concurrent_requests_are_all_answered(client):
    replies: dict[int, int] = {}

    def ask(seed: int) -> None:
        reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5, seed=seed, temperature=1.0)
        replies[seed] = reply.usage.completion_tokens

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(replies) == [0, 1, 2, 3] and all(0 < n <= 5 for n in replies.values())


def test_malformed_requests_are_400_with_an_openai_error_body(client, server: str):
    import openai

    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[])
    assert empty.value.body["type"] == "invalid_request_error" and empty.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match="unsupported parameter 'logit_bias'"):
        client.chat.completions.create(model=MODEL, messages=USER, logit_bias={"1": 5})
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=USER, temperature=3.0)
    with pytest.raises(openai.NotFoundError, match="this server serves 'tiny_moe'"):
        client.chat.completions.create(model="gpt-9", messages=USER)
    request = urllib.request.Request(server + "/chat/completions", data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as bad_json:
        urllib.request.urlopen(request, timeout=30)
    assert bad_json.value.code == 400
    assert json.loads(bad_json.value.read())["error"]["message"].startswith("the request body is not valid JSON")


def test_a_taken_port_and_an_unknown_model_fail_clearly(server: str, tmp_path: Path):
    port = server.rsplit(":", 1)[1].split("/")[0]
    taken = subprocess.run([sys.executable, "-m", "opencomposer.cli", "serve", "--model", MODEL, "--port", port],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert taken.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in taken.stderr
    missing = subprocess.run([sys.executable, "-m", "opencomposer.cli", "serve", "--model", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert missing.returncode == 2 and "--model: model spec" in missing.stderr and "checkpoint folder" in missing.stderr


def test_the_http_policy_in_text_mode_is_served(server: str):
    policy = OpenAIPolicy(HttpPolicyConfig(base_url=server, native_tools=False, max_retries=0),
                          SamplingConfig(max_new_tokens=4), model=MODEL)
    context = Context(task=Task(id="t", instruction="x", repo=ROOT), token_ids=None, turn_index=0,
                      max_new_tokens=100, messages=[Message("system", "Be brief."), Message("user", "Fix it.")])
    output = policy.act(context)
    assert 0 < output.completion_tokens <= 4 and output.prompt_tokens > 100  # the tool listing is in the prompt
    assert output.tool_calls is None and policy.token_cap_key == "max_completion_tokens"


@pytest.mark.bwrap
def test_eval_runs_through_the_server(server: str, tmp_path: Path):
    """``opencomposer eval`` with ``openai:tiny_moe`` pointed at the server: the random model fails
    the task, but the episode ran its turns through the server and ended as a scored episode."""
    from opencomposer.cli import main

    out = tmp_path / "eval"
    code = main(["eval", "--suite", str(ROOT / "tests" / "fixtures" / "tasks"), "--limit", "1",
                 "--policy", f"openai:{MODEL}", "--out", str(out),
                 "--set", f'agent.http.base_url="{server}"', "--set", "agent.http.max_retries=0",
                 "--set", "sampling.max_new_tokens=8"])
    assert code == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["policy"] == f"openai:{MODEL}"
    assert rows[0]["status"] != "infra_error", rows[0]["error"]
    assert rows[0]["turns"] >= 1 and rows[0]["completion_tokens"] > 0 and rows[0]["prompt_tokens"] > 0
    trajectory = json.loads(next((out / "episodes").rglob("trajectory.json")).read_text())
    assert len(trajectory["segments"][0]["turns"]) == rows[0]["turns"]
    assert (out / "summary.json").is_file()


PROMPT = "def add(a, b):\n"


def test_text_completion_with_n_seed_and_several_prompts(client):
    first = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=7, n=2)
    assert first.object == "text_completion" and [c.index for c in first.choices] == [0, 1]
    assert all(c.finish_reason in ("stop", "length") and c.logprobs is None for c in first.choices)
    assert 0 < first.usage.completion_tokens <= 12 and first.usage.prompt_tokens > 0
    both = client.completions.create(model=MODEL, prompt=[PROMPT, "import os\n"], max_tokens=6, seed=7, n=2)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices[:2]] == [c.text for c in first.choices]  # prompt 0 samples as alone
    assert both.usage.prompt_tokens > first.usage.prompt_tokens


def test_text_completion_echo_and_token_id_prompts(client):
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert echoed.choices[0].text == PROMPT and echoed.usage.completion_tokens == 0
    ids = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=3, echo=True, seed=2)
    assert ids.usage.prompt_tokens == 5 and len(ids.choices) == 2
    plain = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3, seed=2)
    assert ids.choices[0].text.endswith(plain.choices[0].text) and len(ids.choices[0].text) > len(plain.choices[0].text)


def test_text_completion_logprobs_are_the_sampled_tokens(client):
    import openai

    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=4, logprobs=0)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text and logprobs.text_offset[0] == 0
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) > 0 and all(lp <= 0 for lp in logprobs.token_logprobs)
    with pytest.raises(openai.BadRequestError, match="top alternatives") as top:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=1)
    assert top.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError, match="prompt's logprobs"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    with pytest.raises(openai.BadRequestError, match="unsupported parameter 'best_of'"):
        client.completions.create(model=MODEL, prompt=PROMPT, best_of=2)
    with pytest.raises(openai.BadRequestError, match="outside"):
        client.completions.create(model=MODEL, prompt=[10**9])
    with pytest.raises(openai.NotFoundError, match="this server serves 'tiny_moe'"):
        client.completions.create(model="gpt-9", prompt=PROMPT)
