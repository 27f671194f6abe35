"""A policy served by an OpenAI-compatible chat-completions endpoint (hosted models, vLLM, SGLang,
``opencomposer serve``).

Text in, text out, with native function calling: the loop's messages and the tool schemas go to
``{base_url}/chat/completions``; the reply's ``tool_calls`` (arguments as JSON strings) come back
as ``ToolCall`` objects. For servers without a tool-call parser set ``agent.http.native_tools =
false``: no ``tools`` are sent, the schemas are written into the system prompt and calls and results
travel as text (``agent.protocol.text_protocol_messages``), and the loop parses the reply's
``<tool_call>`` blocks as it does for token-level policies. A reply's ``reasoning_content`` (or
``reasoning``) becomes ``PolicyOutput.reasoning``, which the loop records with the turn.

The token cap is sent as ``max_completion_tokens``; a server that refuses it with a 400 naming the
parameter is asked again with ``max_tokens``, and the policy remembers that for later requests.
The API key is read from the environment variable ``agent.http.api_key_env`` (absent is fine for
local servers). Network errors, 429 and 5xx are retried with exponential backoff (``Retry-After``
honoured); other errors, and exhausted retries, raise ``PolicyError`` (an infrastructure failure).
Token counts (the cached part of the prompt from ``usage.prompt_tokens_details.cached_tokens``) and
cost come from ``usage``.

Standard library only (``urllib``); no token ids or logprobs are recorded, so these episodes are
for evaluation, not training.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from opencomposer.agent.policy import PolicyError, turn_token_cap
from opencomposer.agent.protocol import text_protocol_messages
from opencomposer.agent.tools import tool_schemas
from opencomposer.config import Config, HttpPolicyConfig, SamplingConfig
from opencomposer.types import Context, Message, PolicyOutput, ToolCall

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class RequestRefused(PolicyError):
    """The server answered with a status that is not worth retrying (4xx other than 408/409/429)."""

    def __init__(self, url: str, status: int, detail: str):
        super().__init__(f"{url} answered {status}: {detail}")
        self.status = status
        self.detail = detail


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our messages in the chat-completions wire format."""
    out = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append({
                "role": "assistant",
                "content": m.content or None,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                               for c in m.tool_calls],
            })
        else:
            out.append({"role": m.role, "content": m.content})
    return out


class OpenAIPolicy:
    """Chat completions with function calling against ``config.base_url``."""

    tokenizer = None

    def __init__(self, config: HttpPolicyConfig, sampling: SamplingConfig | None = None, model: str | None = None):
        self.config = config
        self.sampling = sampling or SamplingConfig()
        self.model = model or config.model
        if not self.model:
            raise PolicyError("no model name: pass --policy openai:MODEL or set agent.http.model")
        self.name = f"openai:{self.model}"
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.token_cap_key = "max_completion_tokens"  # "max_tokens" once a server refused it

    def act(self, context: Context) -> PolicyOutput:
        tools = context.tools if context.tools is not None else tool_schemas()
        messages = context.messages if self.config.native_tools else text_protocol_messages(context.messages, tools)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": openai_messages(messages),
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            self.token_cap_key: turn_token_cap(self.sampling.max_new_tokens, context),
        }
        if self.config.native_tools:
            body["tools"] = tools
        reply = self._post_chat(body)
        try:
            choice = reply["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as e:
            raise PolicyError(f"{self.url} answered without choices[0].message: {str(reply)[:300]}") from e
        usage = reply.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        cached_tokens = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
        calls, error = self._tool_calls(message.get("tool_calls"))
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        return PolicyOutput(
            text=message.get("content") or "",
            tool_calls=calls,
            format_error=error,
            reasoning=reasoning if isinstance(reasoning, str) else "",
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            cost=(prompt_tokens * self.config.input_cost_per_mtok
                  + completion_tokens * self.config.output_cost_per_mtok) / 1e6,
        )

    def _post_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body``; once, a 400 that names ``max_completion_tokens`` is answered by sending
        the cap as ``max_tokens`` instead, now and in every later request of this policy."""
        try:
            return self._post(body)
        except RequestRefused as e:
            if e.status != 400 or "max_completion_tokens" not in e.detail or "max_completion_tokens" not in body:
                raise
        self.token_cap_key = "max_tokens"  # a plain assignment: parallel episodes may race to it harmlessly
        body["max_tokens"] = body.pop("max_completion_tokens")
        return self._post(body)

    @staticmethod
    def _tool_calls(raw: Any) -> tuple[list[ToolCall] | None, str | None]:
        """Native tool calls, or None when there are none (the loop then parses the text)."""
        if not raw:
            return None, None
        calls = []
        for number, item in enumerate(raw, 1):
            function = (item or {}).get("function") or {}
            name, arguments = function.get("name"), function.get("arguments", "{}")
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except json.JSONDecodeError as e:
                return [], f"Tool call {number} ({name}) has arguments that are not valid JSON: {e.msg}. Nothing was run."
            if not isinstance(name, str) or not isinstance(parsed, dict):
                return [], f"Tool call {number} needs a function name and a JSON object of arguments. Nothing was run."
            calls.append(ToolCall(name, parsed, id=str(item.get("id") or f"call_{number}")))
        return calls, None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.config.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        delay = self.config.backoff_s
        last_error = ""
        for attempt in range(self.config.max_retries + 1):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.config.request_timeout_s) as response:
                    return json.loads(response.read().decode())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:300]
                if e.code not in RETRY_STATUS:
                    raise RequestRefused(self.url, e.code, detail) from e
                last_error = f"HTTP {e.code}: {detail}"
                retry_after = e.headers.get("Retry-After") if e.headers else None
                wait = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else delay
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
                last_error = f"{type(e).__name__}: {e}"
                wait = delay
            if attempt < self.config.max_retries:
                time.sleep(wait)
                delay *= 2
        raise PolicyError(f"{self.url} failed after {self.config.max_retries + 1} attempts: {last_error}")


def openai_policy(argument: str, config: Config) -> OpenAIPolicy:
    return OpenAIPolicy(config.agent.http, config.sampling, model=argument or None)
