"""The agent and the policies that drive it: ``[agent]``, ``[agent.http]``, ``[agent.search]``,
``[sampling]`` (``opencomposer.agent``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section

ContextPolicyName = Literal["off", "self_summary", "compaction", "truncate"]
CONTEXT_POLICIES: tuple[str, ...] = ("off", "self_summary", "compaction", "truncate")

POLICY_NAMES = ("oracle", "noop", "local", "openai")
"""The names a policy spec (``NAME`` or ``NAME:ARGUMENT``) may start with: the keys of
``opencomposer.agent.policy.POLICIES`` (a test keeps the two equal)."""

TOOL_NAMES = ("read_file", "list_dir", "grep", "edit", "write_file", "run", "finish", "codebase_search", "find_files")
"""The tools ``agent.tools`` may list: those of ``opencomposer.agent.tools.TOOLS``, in that order (a
test keeps the two equal)."""
DEFAULT_TOOLS = ("read_file", "list_dir", "grep", "edit", "write_file", "run", "finish")
"""The tool set every episode had before ``codebase_search`` and ``find_files``: the prompts, the
walkthroughs, the SFT demonstrations and the trained checkpoints all assume it, so the two search
tools are opt-in (docs/harness.md, "Tools")."""
SEARCH_RANKERS = ("bm25", "embeddings", "hybrid")


@dataclass
class SamplingConfig(Section):
    """How a policy samples its turns (local engine and OpenAI-compatible servers)."""

    section = "sampling"

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k. Local sampling only: the chat-completions API has no top-k."""
    max_new_tokens: int = 256
    """New tokens a work turn may take. Summary and compaction calls have their own caps
    (``agent.summary_max_tokens``, ``agent.compaction_max_tokens``)."""
    speculative: Literal["off", "mtp"] = "off"
    """``mtp``: the local engine drafts the token after each sampled one with the model's MTP
    layer (``model.num_mtp_layers``) and verifies it in the same forward; lossless (the tokens are
    distributed as without it, and greedy decoding is unchanged bit for bit), faster when the
    drafts are accepted (``inference.speculative``, ``benchmarks/speculative.py``)."""

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"sampling.top_k: must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"sampling.max_new_tokens: must be >= 1, got {self.max_new_tokens}")


@dataclass
class HttpPolicyConfig(Section):
    """An OpenAI-compatible chat-completions endpoint (hosted models, vLLM or SGLang servers)."""

    section = "agent.http"

    base_url: str = "https://api.openai.com/v1"
    """Endpoint root; ``/chat/completions`` is appended."""
    model: str = ""
    """Model name sent with each request; ``--policy openai:NAME`` overrides it."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (never put the key in a recipe); may be unset for
    local servers."""
    max_retries: int = 5
    """Retries of a request that failed with a network error, 429 or 5xx."""
    backoff_s: float = 1.0
    """First retry delay; doubled after each failure (honours ``Retry-After``)."""
    request_timeout_s: float = 300.0
    input_cost_per_mtok: float = 0.0
    """Price of a million prompt tokens, for cost accounting from ``usage``."""
    output_cost_per_mtok: float = 0.0
    """Price of a million completion tokens."""
    native_tools: bool = True
    """Send the tool schemas as ``tools`` and read native ``tool_calls``. False for servers without a
    tool-call parser: the schemas go into the system prompt and calls are read from the reply text
    (``agent.protocol.text_protocol_messages``)."""

    def validate(self) -> None:
        if self.max_retries < 0:
            raise ConfigError(f"agent.http.max_retries: must be >= 0, got {self.max_retries}")
        if self.backoff_s < 0 or self.request_timeout_s <= 0:
            raise ConfigError("agent.http.backoff_s must be >= 0 and agent.http.request_timeout_s > 0")
        if self.input_cost_per_mtok < 0 or self.output_cost_per_mtok < 0:
            raise ConfigError("agent.http.input_cost_per_mtok and output_cost_per_mtok: must be >= 0")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"agent.http.base_url: {self.base_url!r} is not an http(s) URL")


@dataclass
class SearchConfig(Section):
    """How the ``codebase_search`` tool ranks the workspace's chunks (``opencomposer.agent.search``)."""

    section = "agent.search"

    ranker: Literal["bm25", "embeddings", "hybrid"] = "bm25"
    """``bm25``: lexical, code-aware words (no endpoint needed); ``embeddings``: cosine similarity
    of ``embeddings``' vectors; ``hybrid``: both, by reciprocal-rank fusion."""
    embeddings: str = ""
    """``openai:MODEL``: an OpenAI-compatible ``/embeddings`` endpoint at ``base_url`` (a hosted model,
    or a local one behind a vLLM, SGLang or llama.cpp server). Required by the two embedding rankers."""
    base_url: str = ""
    """Root of the embeddings endpoint (``/embeddings`` is appended); empty takes ``agent.http.base_url``."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the embeddings endpoint's key; may be unset for local servers."""
    request_timeout_s: float = 60.0

    def validate(self) -> None:
        if self.ranker not in SEARCH_RANKERS:
            raise ConfigError(f"agent.search.ranker: {self.ranker!r} is not one of {', '.join(SEARCH_RANKERS)}")
        if self.embeddings and not (self.embeddings.startswith("openai:") and self.embeddings[len("openai:"):]):
            raise ConfigError(f"agent.search.embeddings: expected 'openai:MODEL', got {self.embeddings!r}")
        if self.ranker != "bm25" and not self.embeddings:
            raise ConfigError(f'agent.search.ranker = "{self.ranker}" needs agent.search.embeddings = "openai:MODEL"')
        if self.ranker == "bm25" and self.embeddings:
            raise ConfigError('agent.search.embeddings does nothing with agent.search.ranker = "bm25"; '
                              'set the ranker to "embeddings" or "hybrid"')
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"agent.search.base_url: {self.base_url!r} is not an http(s) URL")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"agent.search.request_timeout_s: must be > 0, got {self.request_timeout_s}")


@dataclass
class AgentConfig(Section):
    """The agent loop (``opencomposer.agent.loop``); per-task budgets come from each task."""

    section = "agent"

    system_prompt: str = ""
    """System prompt; empty uses the built-in one (``opencomposer.agent.protocol.SYSTEM_PROMPT``)."""
    max_observation_chars: int = 12_000
    """A tool result longer than this is cut to its first and last halves before the model sees it."""
    context_window: int = 0
    """Tokens one segment may hold (prompt, turns and tool outputs); 0 takes the model's maximum.
    Reaching it ends the episode as a budget stop, unless a context policy closed the segment first."""
    context_policy: ContextPolicyName = "off"
    """What happens when a segment's context reaches ``summary_trigger_tokens`` (``agent.context``,
    docs/recipe.md §5): ``self_summary`` (the model summarises in its own context and goes on in a fresh
    one from its summary; the summary is trained on), ``compaction`` (a separate, long, fixed
    compaction prompt writes the summary; not trained on), ``truncate`` (drop the oldest tool
    outputs) or ``off`` (the window ends the episode)."""
    summary_trigger_tokens: int = 0
    """Context tokens of a segment at which the context policy acts; 0 takes the context window
    less ``summary_max_tokens`` and a 512-token margin for the request and one tool output."""
    summary_max_tokens: int = 1024
    """New tokens a summary (or a compaction) may take; the report's summaries average ~1k tokens."""
    compaction_max_tokens: int = 4096
    """New tokens the compaction baseline's summary may take (its prompt asks for a thorough one)."""
    max_summaries: int = 8
    """Summaries (or compactions, truncations) one episode may make; after that the window ends it."""
    tools: list[str] = field(default_factory=lambda: list(DEFAULT_TOOLS))
    """The tools the model is given, listed in its prompt in this order; a call of any other is
    refused. Add ``"codebase_search"`` (ranked search over files and symbols, ``[agent.search]``) and
    ``"find_files"`` (glob) to the default set to give them; ``finish`` is required."""
    http: HttpPolicyConfig = field(default_factory=HttpPolicyConfig)
    search: SearchConfig = field(default_factory=SearchConfig)

    def validate(self) -> None:
        unknown = [name for name in self.tools if name not in TOOL_NAMES]
        if unknown:
            raise ConfigError(f"agent.tools: unknown tool {unknown[0]!r}; the tools are: {', '.join(TOOL_NAMES)}")
        if len(set(self.tools)) != len(self.tools):
            raise ConfigError(f"agent.tools: each tool may be listed once, got {self.tools}")
        if "finish" not in self.tools:
            raise ConfigError(f"agent.tools: must include 'finish' (the only way an episode ends), got {self.tools}")
        if self.search.ranker != "bm25" and "codebase_search" not in self.tools:
            raise ConfigError(f'agent.search.ranker = "{self.search.ranker}" does nothing without "codebase_search" '
                              "in agent.tools")
        if self.max_observation_chars < 200:
            raise ConfigError(
                f"agent.max_observation_chars: must be at least 200, got {self.max_observation_chars}"
            )
        if self.context_window < 0:
            raise ConfigError(f"agent.context_window: must be >= 0, got {self.context_window}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ConfigError(f"agent.context_policy: {self.context_policy!r} is not one of {', '.join(CONTEXT_POLICIES)}")
        if self.summary_trigger_tokens < 0 or self.max_summaries < 0:
            raise ConfigError("agent.summary_trigger_tokens and agent.max_summaries: must be >= 0")
        if self.summary_max_tokens < 16 or self.compaction_max_tokens < 16:
            raise ConfigError("agent.summary_max_tokens and agent.compaction_max_tokens: must be >= 16")
        if self.context_window and self.summary_trigger_tokens >= self.context_window:
            raise ConfigError(
                f"agent.summary_trigger_tokens = {self.summary_trigger_tokens} must be below agent.context_window = "
                f"{self.context_window}: the summary request and the summary are written inside the window"
            )
