"""An OpenAI-compatible server over any checkpoint (``opencomposer serve``).

``GET /v1/models`` lists the one served model; ``POST /v1/chat/completions`` answers the request as
the agent harness would sample a turn:

- **Prompt.** The request's messages and ``tools`` are rendered by the model's chat template
  exactly as the agent loop renders a context (``agent.protocol.TokenTranscript``), so a policy
  talking to this server reads the prompt the local policy reads.
- **Sampling.** ``inference.LocalEngine`` behind a ``BatchingEngine``: concurrent requests (FastAPI
  runs each in a worker thread) are gathered into shared ``generate`` calls, and each keeps its
  own random stream, so a request with a ``seed`` samples what it would alone. ``temperature``,
  ``top_p``, ``n``, ``seed``, ``stop`` and ``max_completion_tokens`` (or ``max_tokens``; default:
  the rest of the context window) map onto ``SamplingParams``.
- **Reply.** ``<think>`` blocks become ``reasoning_content`` (``agent.protocol.split_reasoning``);
  when the request has ``tools``, ``<tool_call>`` blocks become ``tool_calls`` with JSON-string
  arguments (``agent.protocol.parse_turn``; a malformed block stays in ``content``) and the finish
  reason ``"tool_calls"``; otherwise ``"stop"`` or ``"length"``. Stop strings are cut from the text.
- **Streaming** (``stream: true``): server-sent ``chat.completion.chunk`` events ending with
  ``data: [DONE]``. The engine has no incremental interface, so the completion is sampled whole
  and then sent as chunks (reasoning, content in word-sized pieces, one chunk per tool call, the
  finish reason, and the usage when ``stream_options.include_usage``): a streamed reply carries the
  same message as the unstreamed one for the same seed, but the first chunk arrives only when the
  whole completion is done.

``POST /v1/completions`` is the legacy text API (what lm-eval-harness and other clients call):
``prompt`` is a string, a list of strings, a list of token ids or a list of such lists; string
prompts are tokenised as they are, without special tokens. Each prompt gets ``n`` choices (choice
``i * n + j`` is sample ``j`` of prompt ``i``); ``max_tokens`` (default 16, 0 allowed),
``temperature``, ``top_p``, ``seed`` and ``stop`` sample as in chat; ``echo`` puts the prompt's
text before each choice's text; ``usage`` counts each prompt once. ``logprobs: 0`` returns the
sampled tokens' logprobs (``tokens``, ``token_logprobs``, ``text_offset``; ``top_logprobs`` null):
the engine records those and no others, so ``logprobs`` above 0 (the top-N alternatives at each
position) and ``echo`` with ``logprobs`` (the prompt's logprobs) are refused with a 400.

Malformed requests get a 400 with an OpenAI-style ``{"error": {...}}`` body (unknown parameters
included: an ignored setting would be a silent lie), an unknown model name a 404. Not here:
chat logprobs, penalties, ``response_format``, forced tool choice, streamed text completions.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException

from opencomposer.agent.protocol import TokenTranscript, decode, encode, parse_turn, split_reasoning
from opencomposer.types import Completion, Message, SamplingParams, ToolCall


class ServeError(RuntimeError):
    """The server cannot start (port in use, model not found); the message says what to change."""


class RequestError(ValueError):
    """A request that cannot be served: answered with ``status`` (400 unless said) and an
    OpenAI-style error body naming ``param``."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


@dataclass
class ServerConfig:
    """What ``opencomposer serve`` starts."""

    model: str
    """A model kind (``tiny_moe``, ``smollm2``, ...) or a checkpoint folder; also the served model id."""
    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (printed at start)."""
    device: str = "auto"
    """``auto`` takes CUDA when available."""
    seed: int = 0
    """Initialisation seed of randomly initialised tiny kinds."""
    batch_wait_s: float = 0.02
    """How long a request waits for others to share its engine call (``BatchingEngine.max_wait_s``)."""
    inference: Any = None
    """The ``[inference]`` table (``config.InferenceConfig``) whose ``backend`` builds the engine
    (``inference.factory.make_engine``); None: ``LocalEngine``."""


# ----------------------------------------------------------------------------------------------
# The wire format of a request


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class _FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str


class _WireToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: _FunctionCall


class ChatMessage(BaseModel):
    """One message of a request; fields a client echoes back (``refusal``, ``reasoning_content``) are ignored."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``. Unknown parameters are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None  # kept as sent: the template lists them verbatim
    tool_choice: Literal["none", "auto"] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=64)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    parallel_tool_calls: bool | None = None  # several calls per turn are always allowed
    user: str | None = None

    @field_validator("tools")
    @classmethod
    def _tools_are_functions(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or []):
            function = tool.get("function")
            if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"tool {i} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        return tools

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return _check_stop(stop)


class CompletionRequest(BaseModel):
    """``POST /v1/completions``, the legacy text API. Unknown parameters are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    stream: Literal[False] = False
    user: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts_not_empty(cls, prompt: str | list[str] | list[int] | list[list[int]]) -> Any:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("at least one prompt")
        return prompt

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return _check_stop(stop)

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request, as text or as token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


def _check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    strings = [stop] if isinstance(stop, str) else stop or []
    if len(strings) > 4 or any(not s for s in strings):
        raise ValueError("stop: at most 4 non-empty strings")
    return stop


def _stop_list(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _text(content: str | list[_TextPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content)


def messages_from_wire(messages: list[ChatMessage]) -> list[Message]:
    """The request's messages as the chat template reads them (``developer`` is a system message;
    tool-call arguments are parsed from their JSON strings)."""
    out = []
    for i, m in enumerate(messages):
        calls = []
        for k, call in enumerate(m.tool_calls or []):
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError as e:
                raise RequestError(f"messages[{i}].tool_calls[{k}].function.arguments is not valid JSON: {e.msg}",
                                   f"messages[{i}].tool_calls[{k}].function.arguments") from None
            if not isinstance(arguments, dict):
                raise RequestError(f"messages[{i}].tool_calls[{k}].function.arguments must be a JSON object",
                                   f"messages[{i}].tool_calls[{k}].function.arguments")
            calls.append(ToolCall(call.function.name, arguments, id=call.id))
        role = "system" if m.role == "developer" else m.role
        out.append(Message(role, _text(m.content), tool_calls=calls, tool_call_id=m.tool_call_id, name=m.name))
    return out


# ----------------------------------------------------------------------------------------------
# The reply


@dataclass
class Choice:
    """One sampled answer, split into what the API returns."""

    index: int
    content: str
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    completion_tokens: int = 0

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant",
                                   "content": self.content if self.content or not self.tool_calls else None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [_wire_call(call) for call in self.tool_calls]
        return message


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def build_choice(text: str, finish_reason: str, *, index: int = 0, parse_tools: bool = True,
                 call_id_prefix: str = "call", completion_tokens: int = 0) -> Choice:
    """The reply to one generated ``text`` (stop token and stop strings already cut): ``<think>``
    blocks become the reasoning, well-formed ``<tool_call>`` blocks the tool calls (when
    ``parse_tools``), and what remains the content."""
    reasoning, content = split_reasoning(text)
    calls: list[ToolCall] = []
    if parse_tools:
        parsed = parse_turn(content)
        spans = [(start, end) for start, end, name in parsed.spans if name]  # one per parsed call, in order
        if spans:
            calls = [ToolCall(c.name, c.arguments, id=f"{call_id_prefix}_{index}_{k}") for k, c in enumerate(parsed.calls)]
            kept, pos = [], 0
            for start, end in spans:
                kept.append(content[pos:start])
                pos = end
            content = ("".join(kept) + content[pos:]).strip()
    return Choice(index=index, content=content, reasoning=reasoning, tool_calls=calls,
                  finish_reason="tool_calls" if calls else finish_reason, completion_tokens=completion_tokens)


def _pieces(text: str) -> list[str]:
    """Word-sized pieces of ``text`` (each word with the spaces after it); they join back to ``text``."""
    return re.findall(r"\S+\s*|\s+", text)


@dataclass
class ChatResult:
    """A finished request: its choices and token counts, as a response or as stream chunks."""

    id: str
    model: str
    created: int
    prompt_tokens: int
    choices: list[Choice]

    def usage(self) -> dict[str, int]:
        return _usage(self.prompt_tokens, self.choices)

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": c.index, "message": c.message(), "finish_reason": c.finish_reason, "logprobs": None}
                        for c in self.choices],
            "usage": self.usage(),
        }

    def chunks(self, include_usage: bool = False) -> Iterator[dict[str, Any]]:
        """The response as ``chat.completion.chunk`` objects (see the module doc: sent after sampling)."""
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                         "logprobs": None}]}

        for c in self.choices:
            yield chunk(c.index, {"role": "assistant", "content": ""})
            for piece in _pieces(c.reasoning):
                yield chunk(c.index, {"reasoning_content": piece})
            for piece in _pieces(c.content):
                yield chunk(c.index, {"content": piece})
            for k, call in enumerate(c.tool_calls):
                yield chunk(c.index, {"tool_calls": [{"index": k, **_wire_call(call)}]})
            yield chunk(c.index, {}, c.finish_reason)
        if include_usage:
            yield {**head, "choices": [], "usage": self.usage()}


@dataclass
class TextChoice:
    """One choice of a text completion; ``logprobs`` in the completions API's shape, or None."""

    index: int
    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: dict[str, Any] | None = None


@dataclass
class TextResult:
    """A finished ``/v1/completions`` request."""

    id: str
    model: str
    created: int
    prompt_tokens: int
    choices: list[TextChoice]

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": c.index, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
                        for c in self.choices],
            "usage": _usage(self.prompt_tokens, self.choices),
        }


def _usage(prompt_tokens: int, choices: list[Choice] | list[TextChoice]) -> dict[str, int]:
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


# ----------------------------------------------------------------------------------------------
# The model


class ChatModel:
    """The served model: renders a request, samples it through ``engine``, builds the reply.
    ``engine`` is an ``Engine`` safe to call from many threads (a ``BatchingEngine``)."""

    def __init__(self, model_id: str, tokenizer: Any, engine: Any, stop_ids: set[int], max_positions: int):
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.engine = engine
        self.stop_ids = stop_ids
        self.max_positions = max_positions
        self.created = int(time.time())

    @classmethod
    def load(cls, config: ServerConfig) -> ChatModel:
        """Load ``config.model`` and put its engine (``config.inference``'s backend; ``LocalEngine``
        by default) behind a ``BatchingEngine``."""
        import torch

        from opencomposer.config.inference import InferenceConfig
        from opencomposer.inference.batching import BatchingEngine
        from opencomposer.inference.factory import make_engine
        from opencomposer.model import load_model
        from opencomposer.model.tokenizer import ensure_chat_template, stop_token_ids

        device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model(config.model, seed=config.seed, device=device)
        if tokenizer.chat_template is None:  # a bare HF folder: speak the project's ChatML
            ensure_chat_template(tokenizer)
        configured_eos = model.generation_config.eos_token_id
        configured_eos = [configured_eos] if isinstance(configured_eos, int) else list(configured_eos or [])
        inference = config.inference if config.inference is not None else InferenceConfig()
        engine = BatchingEngine(make_engine(inference, model, tokenizer), max_wait_s=config.batch_wait_s)
        max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        return cls(config.model, tokenizer, engine, set(stop_token_ids(tokenizer)) | set(configured_eos), max_positions)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "opencomposer", "max_model_len": self.max_positions}]}

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The request rendered as the agent loop renders a context, tokenised."""
        from jinja2 import TemplateError

        try:
            return TokenTranscript(self.tokenizer, request.tools or [], messages_from_wire(request.messages)).prompt_ids
        except TemplateError as e:
            raise RequestError(f"the model's chat template cannot render these messages: {e}", "messages") from None

    def complete(self, request: ChatRequest) -> ChatResult:
        """Answer a ``/v1/chat/completions`` request."""
        self._check_model(request.model)
        prompt = self.prompt_ids(request)
        room = self._room([prompt], "messages")
        stops = _stop_list(request.stop)
        params = self._params(min(request.max_completion_tokens or request.max_tokens or room, room), request, stops)
        result_id = f"chatcmpl-{uuid.uuid4().hex}"
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        choices = []
        for index, completion in enumerate(self._sample([prompt], params, request.n)):
            _, text, finish = self._finished(completion, stops)
            choices.append(build_choice(text, finish, index=index, parse_tools=parse_tools,
                                        call_id_prefix=f"call_{result_id[-12:]}",
                                        completion_tokens=len(completion.token_ids)))
        return ChatResult(result_id, self.model_id, int(time.time()), len(prompt), choices)

    def complete_text(self, request: CompletionRequest) -> TextResult:
        """Answer a ``/v1/completions`` request (see the module doc for what ``logprobs`` can be)."""
        self._check_model(request.model)
        if request.logprobs:
            raise RequestError(f"logprobs: {request.logprobs} asks for the top alternatives at each position, which "
                               "the engine does not give; logprobs: 0 returns the sampled tokens' logprobs", "logprobs")
        if request.echo and request.logprobs is not None:
            raise RequestError("echo with logprobs asks for the prompt's logprobs, which the engine does not give",
                               "echo")
        texts = request.prompts()
        prompts = [self._text_prompt_ids(prompt, i) for i, prompt in enumerate(texts)]
        stops = _stop_list(request.stop)
        params = self._params(min(request.max_tokens, self._room(prompts, "prompt")), request, stops)
        choices = []
        for index, completion in enumerate(self._sample(prompts, params, request.n)):
            ids, text, finish = self._finished(completion, stops)
            logprobs = None if request.logprobs is None else self._logprobs(ids, completion.logprobs, len(text))
            prompt = texts[index // request.n]
            head = "" if not request.echo else prompt if isinstance(prompt, str) else decode(self.tokenizer, prompt)
            choices.append(TextChoice(index, head + text, finish, len(completion.token_ids), logprobs))
        return TextResult(f"cmpl-{uuid.uuid4().hex}", self.model_id, int(time.time()), sum(map(len, prompts)), choices)

    def _check_model(self, name: str) -> None:
        if name != self.model_id:
            raise RequestError(f"The model {name!r} does not exist; this server serves {self.model_id!r}",
                               "model", status=404, code="model_not_found")

    def _text_prompt_ids(self, prompt: str | list[int], index: int) -> list[int]:
        """A completions prompt as token ids: text is tokenised as it is (no special tokens added)."""
        ids = encode(self.tokenizer, prompt) if isinstance(prompt, str) else prompt
        if not ids:
            raise RequestError(f"prompt {index} is empty", "prompt")
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt {index} has token ids outside [0, {vocab}): {bad[:5]}", "prompt")
        return ids

    def _room(self, prompts: list[list[int]], param: str) -> int:
        """How many tokens the longest prompt leaves in the model's context (at least one)."""
        longest = max(map(len, prompts))
        if longest >= self.max_positions:
            raise RequestError(f"the prompt has {longest} tokens; the model's context is {self.max_positions}", param)
        return self.max_positions - longest

    @staticmethod
    def _params(max_new_tokens: int, request: ChatRequest | CompletionRequest, stops: list[str]) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            stop=stops,
            seed=None if request.seed is None else request.seed % (1 << 63),
        )

    def _sample(self, prompts: list[list[int]], params: SamplingParams, n: int) -> list[Completion]:
        """``n`` completions of each prompt, prompt-major, from one engine session."""
        session = self.engine.session()
        try:
            return session.generate(prompts, params, n=n)
        finally:
            session.close()

    def _finished(self, completion: Completion, stops: list[str]) -> tuple[list[int], str, str]:
        """The completion's ids without its stop token, its text cut before the first stop string,
        and its finish reason."""
        ids, finish = list(completion.token_ids), completion.finish_reason
        if finish == "stop" and ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        text = decode(self.tokenizer, ids)
        cut = min((i for i in (text.find(s) for s in stops) if i != -1), default=-1)
        if cut != -1:
            text, finish = text[:cut], "stop"
        return ids, text, finish

    def _logprobs(self, ids: list[int], logprobs: list[float], text_length: int) -> dict[str, Any]:
        """The completions API's ``logprobs`` for the tokens that start inside the returned text."""
        tokens: list[str] = []
        offsets: list[int] = []
        before = ""
        for k in range(len(ids)):
            if len(before) >= text_length:
                break
            upto = decode(self.tokenizer, ids[: k + 1])
            tokens.append(upto[len(before):])
            offsets.append(len(before))
            before = upto
        return {"tokens": tokens, "token_logprobs": logprobs[: len(tokens)], "top_logprobs": None,
                "text_offset": offsets}


# ----------------------------------------------------------------------------------------------
# HTTP


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def _validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc).lstrip(".") or None
    if error.get("type") == "extra_forbidden":
        return f"unsupported parameter {param!r}", param
    if error.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}", None
    if error.get("type") == "missing" and param is None:
        return "the request needs a JSON body", None
    return f"{param}: {error.get('msg')}" if param else str(error.get("msg")), param


def create_app(chat: ChatModel) -> FastAPI:
    """The FastAPI application serving ``chat`` (both endpoints); handlers are plain functions, run in worker threads."""
    app = FastAPI(title="opencomposer", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problems)"
        return _error(400, message, param)

    @app.exception_handler(RequestError)
    def _refused(request: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.param, exc.code)

    @app.exception_handler(HTTPException)
    def _http(request: Request, exc: HTTPException) -> JSONResponse:  # unknown paths, wrong methods
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    def _crash(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}")

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return chat.models()

    @app.post("/v1/chat/completions", response_model=None)
    def chat_completions(request: ChatRequest) -> dict[str, Any] | StreamingResponse:
        result = chat.complete(request)
        if not request.stream:
            return result.response()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = (f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n" for chunk in result.chunks(include_usage))
        return StreamingResponse(_with_done(events), media_type="text/event-stream")

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict[str, Any]:
        return chat.complete_text(request).response()

    return app


def _with_done(events: Iterator[str]) -> Iterator[str]:
    yield from events
    yield "data: [DONE]\n\n"


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)``, before the slow model load, so a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use; pick another with --port (0 picks a free one)") from None
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(config: ServerConfig) -> None:
    """Check the model spec, bind the port, load the model, then serve until interrupted (SIGINT or
    SIGTERM: uvicorn finishes the requests in flight and returns)."""
    import uvicorn

    from opencomposer.config import ConfigError
    from opencomposer.model.loading import resolve_spec

    try:
        resolve_spec(config.model)
    except ConfigError as e:
        raise ServeError(f"--model: {e}") from None
    sock = bind(config.host, config.port)
    try:
        try:
            chat = ChatModel.load(config)
        except ConfigError as e:
            raise ServeError(f"--model: {e}") from None
        port = sock.getsockname()[1]
        print(f"opencomposer serve: {chat.model_id} at http://{config.host}:{port}/v1", flush=True)
        uvicorn.Server(uvicorn.Config(create_app(chat), log_level="info")).run(sockets=[sock])
    finally:
        sock.close()
