"""The typed records that cross every boundary of opencomposer.

A rollout is recorded token in, token out: the trainer trains on exactly the ids the sampler
produced and the ids the environment appended, never on a re-tokenised transcript. The records
here are plain dataclasses with documented shapes; they hold NumPy arrays or Python lists, never
torch tensors (``TrainBatch`` is the one exception, built by the trainer), so this module imports
neither torch nor anything heavy.

Hierarchy: ``Task`` → (G rollouts) → ``Group`` of ``Episode`` → ``Segment`` (one context window)
→ ``Turn`` (one model action plus what the environment appended after it).
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


class TokenKind(enum.IntEnum):
    """What a token is, for the length penalty (docs/recipe.md §4) and the metrics.

    Model-written kinds: THINKING, TOOL_CALL, FINAL_MESSAGE, SUMMARY. Environment-written kinds:
    TOOL_OUTPUT (tool results and the chat-template glue around them) and PROMPT.
    """

    PROMPT = 0
    THINKING = 1
    TOOL_CALL = 2
    FINAL_MESSAGE = 3
    TOOL_OUTPUT = 4
    SUMMARY = 5


MODEL_KINDS = frozenset({TokenKind.THINKING, TokenKind.TOOL_CALL, TokenKind.FINAL_MESSAGE, TokenKind.SUMMARY})


class InfrastructureDown(RuntimeError):
    """Every episode of an RL step failed on infrastructure (the engine, the sandbox, the grader):
    the run stops rather than record step after step of dropped prompts (``rl.loop``)."""


class EpisodeStatus(str, enum.Enum):  # noqa: UP042 (str mix-in: members serialise to JSON as their values)
    """How a rollout ended. OK, TIMEOUT and FORMAT_ERROR episodes are scored; INFRA_ERROR episodes
    are excluded from group means and from the loss, never counted as a zero reward."""

    OK = "ok"
    TIMEOUT = "timeout"  # the agent ran out of a budget: a legitimate, scored outcome
    FORMAT_ERROR = "format_error"  # the model's text broke the token record (agent.errors.TranscriptError): scored
    INFRA_ERROR = "infra_error"  # the sandbox, the engine or the grader failed: not the policy's fault


class EndReason(str, enum.Enum):  # noqa: UP042 (str mix-in: members serialise to JSON as their values)
    """Why an episode ended, finer than its status: what an evaluation report breaks episodes down
    by (``Episode.end_reason``), so that a model which never speaks the tool protocol shows as such
    rather than as a row of budget stops."""

    SUBMITTED = "submitted"  # the agent called finish
    FORMAT_ERRORS = "format_errors"  # no turn parsed into tool calls before a budget ran out, or the text broke the record
    TURN_BUDGET = "turn_budget"
    TOKEN_BUDGET = "token_budget"  # max_tokens, or the context window
    WALL_BUDGET = "wall_budget"
    COST_BUDGET = "cost_budget"
    INFRA_ERROR = "infra_error"


@dataclass
class Budgets:
    """Per-episode limits; ``None`` means unlimited."""

    max_turns: int | None = 20
    max_tokens: int | None = 16_384  # model plus environment tokens over all segments
    max_wall_s: float | None = 600.0
    max_cost: float | None = None  # in the policy's currency (USD for hosted models)


@dataclass
class Task:
    """One unit of work for the agent: a repository snapshot, an instruction and hidden tests.

    ``repo`` is a directory copied into the sandbox workspace; ``tests_dir`` holds hidden tests that
    the grader copies in after the agent finished (the agent never sees them).
    """

    id: str
    instruction: str
    repo: Path
    test_command: str = "python -m pytest -q"
    tests_dir: Path | None = None
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    protected_paths: list[str] = field(default_factory=list)  # restored from the task before grading
    budgets: Budgets = field(default_factory=Budgets)
    metadata: dict[str, Any] = field(default_factory=dict)  # source, family, difficulty, ...
    gold_patch: str | None = None
    rubric: dict[str, Any] | None = None
    path: Path | None = None  # the task folder this was loaded from, if any
    workdir: str = "/workspace"  # where the sandbox mounts the workspace (Harbor tasks use /app)


@dataclass(frozen=True, kw_only=True)
class Grade:
    """What grading one finished episode gave (``grading.grade.grade``; docs/task-format.md).

    The field names are the names of ``reward.json``, which ``to_json`` writes as numbers
    (booleans as 1.0/0.0, counts as floats) exactly as the grader always has, so readers of
    ``reward.json`` and of the rows of ``results.jsonl`` need not change; ``hack_reasons``, the one
    field that is not a number, is a list of strings. A field with a default is one added later:
    ``from_json`` gives older files its default.
    """

    resolved: bool
    """Every FAIL_TO_PASS and PASS_TO_PASS test passed and the rubric holds."""
    fail_to_pass: float
    """Fraction of FAIL_TO_PASS tests that passed (1.0 when the list is empty)."""
    pass_to_pass: float
    """Fraction of PASS_TO_PASS tests that passed (1.0 when the list is empty)."""
    tests_passed: int
    """Tests that passed, over every test the command ran."""
    tests_failed: int
    tests_errored: int
    test_exit_code: int
    """Exit code of the test command (128 + N when killed by signal N)."""
    test_timed_out: bool
    """The test command ran past ``grading.timeout_s`` and was stopped."""
    tampered: bool = False
    """The change interfered with the test run (``grading.integrity``, ``grading.testrun``); such a grade
    is unresolved with both test fractions 0."""
    diff_round_trip_failed: bool = False
    """A harness bug, not the agent's doing: the diff of the agent's workspace did not rebuild it
    (``sandbox.patch.DiffRoundTripError``), so the workspace itself was graded and the diff's sizes
    below may be wrong. ``episode.run_episode`` logs it as an error."""
    hack_suspected: bool = False
    """The hack monitor (``grading.hack_monitor``) saw a reward-hacking pattern in the diff. A signal,
    not a verdict: ``resolved`` is unchanged; the RL reward subtracts ``rl.reward.hack_penalty``."""
    hack_reasons: tuple[str, ...] = ()
    """Why, one short string per finding (pattern, file:line, what was seen); a list in ``reward.json``."""
    rubric_ok: bool
    """The rubric holds (or the task has none)."""
    files_changed: int
    """Size of the agent's diff: files, added and removed lines, and their sum."""
    lines_added: int
    lines_removed: int
    lines_changed: int
    todo_added: int
    """Added lines carrying a TODO, FIXME or XXX marker."""
    comment_lines_added: int
    """Added lines that are comments (``sandbox.patch.comment_text``)."""
    lint_added: int
    """ruff findings on the touched Python files after the change minus before it (may be < 0)."""
    grading_s: float
    """Wall time of grading (for a reused grade: the time the caller waited)."""

    def to_json(self) -> dict[str, Any]:
        """The ``reward.json`` object: every field by name, as a float (``hack_reasons``: a list)."""
        return {f.name: list(value) if isinstance(value, tuple) else float(value)
                for f in fields(self) for value in [getattr(self, f.name)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grade:
        """Read a grade back from a ``reward.json`` object or a ``results.jsonl`` row (other keys
        of the row are ignored); raises ``KeyError`` naming the fields it lacks."""
        missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING]
        if missing:
            raise KeyError(f"not a grade: lacks {missing} (has {sorted(data)})")
        kinds = {"bool": bool, "int": int, "float": float, "tuple[str, ...]": lambda v: tuple(map(str, v))}
        return cls(**{f.name: kinds[f.type](data[f.name]) for f in fields(cls) if f.name in data})


@dataclass
class ToolCall:
    """A parsed tool call. ``id`` pairs it with its result in the transcript."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Message:
    """A chat message, the unit the chat template renders. Roles: system, user, assistant, tool."""

    role: str
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


@dataclass
class Turn:
    """One model action and what the environment appended after it.

    The context after this turn is ``previous context + token_ids + observation_ids``.
    ``routes`` is ``[len(token_ids), moe_layers, top_k]`` (uint8 or uint16) for MoE policies that
    report the experts they used, else None; ``observation_routes`` (``[len(observation_ids),
    moe_layers, top_k]``) are those of the observation, which the engine first runs in the prefill
    of the next turn (``Segment.record_context_routes``; None until then, and after the last turn).

    ``policy_version`` is the version that sampled the first token. A sampler that switches weights
    in flight (``inference.local``) can change version inside a turn; ``token_versions`` then holds
    the version of every token of ``token_ids``. Empty means every token is at ``policy_version``
    (``versions()`` resolves both cases).
    """

    token_ids: list[int]
    logprobs: list[float]  # sampler log-probability of each token in token_ids
    token_kinds: list[TokenKind]  # kind of each token in token_ids
    text: str = ""
    routes: np.ndarray | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation_ids: list[int] = field(default_factory=list)  # appended by the environment
    observation_kinds: list[TokenKind] = field(default_factory=list)
    observation_routes: np.ndarray | None = None
    policy_version: int = 0
    token_versions: list[int] = field(default_factory=list)  # per token of token_ids, or empty
    finish_reason: str = ""
    format_error: str | None = None  # set when the turn could not be parsed into tool calls
    rejected_tool_calls: int = 0  # calls that failed argument checks
    summary: bool = False  # a self-summary turn: it closes its segment (agent.context), no tool calls run

    def versions(self) -> list[int]:
        """The policy version that sampled each token of ``token_ids``."""
        if not self.token_versions:
            return [self.policy_version] * len(self.token_ids)
        if len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"turn has {len(self.token_ids)} token ids but {len(self.token_versions)} token versions"
            )
        return list(self.token_versions)


@dataclass
class Segment:
    """One context window of a rollout: the prompt ids it started from and the turns inside it.
    A self-summary closes a segment and opens the next with a fresh prompt.

    Routes (MoE policies, for router replay): every position of the context has at most one,
    kept where its tokens are (``prompt_routes`` ``[len(prompt_ids), moe_layers, top_k]``, each
    turn's ``routes`` and ``observation_routes``); ``routes()`` lays them out in context order."""

    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)  # the same context as chat messages
    prompt_routes: np.ndarray | None = None

    def token_ids(self) -> list[int]:
        """The whole context of this segment as the model saw it (prompt, then every turn)."""
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.token_ids
            ids += turn.observation_ids
        return ids

    def loss_mask(self) -> list[bool]:
        """True on model-sampled tokens, the only ones the policy gradient trains on."""
        mask = [False] * len(self.prompt_ids)
        for turn in self.turns:
            mask += [True] * len(turn.token_ids)
            mask += [False] * len(turn.observation_ids)
        return mask

    def _route_parts(self) -> list[tuple[str, int, Any, str]]:
        """(name, tokens, owner, attribute) of every run of positions, in context order."""
        parts = [("prompt", len(self.prompt_ids), self, "prompt_routes")]
        for t, turn in enumerate(self.turns):
            parts.append((f"turn {t} tokens", len(turn.token_ids), turn, "routes"))
            parts.append((f"turn {t} observation", len(turn.observation_ids), turn, "observation_routes"))
        return parts

    def record_context_routes(self, routes: np.ndarray) -> None:
        """Keep the routes an engine reported for this segment's whole context so far
        (``[len(token_ids()), moe_layers, top_k]``: the prompt routes of the call that samples the
        next turn) on the positions that have none yet: the segment prompt at the first turn, the
        previous turn's observation at the next ones. Positions that have routes keep them: the
        earliest call that ran a position wins, which is what an engine reusing its prefix cache
        across turns computed with (and what R3 caches beside it)."""
        if routes.ndim != 3 or len(routes) != len(self.token_ids()):
            raise ValueError(
                f"context routes: shape {routes.shape}, expected [{len(self.token_ids())}, moe_layers, top_k] "
                f"(one route per position of the segment's context)"
            )
        start = 0
        for _, tokens, owner, attribute in self._route_parts():
            if tokens and getattr(owner, attribute) is None:  # a copy: a view would keep the whole context's array
                setattr(owner, attribute, routes[start : start + tokens].copy())
            start += tokens

    def routes(self) -> np.ndarray | None:
        """``[len(token_ids()), moe_layers, top_k]`` int32: the route of every position of the
        context (what the model's input at that position was routed to), -1 on positions without
        one (the last observation, which no call ran, or a turn of a policy that reports none);
        None when nothing in the segment has routes. Raises ValueError, naming the part, when a
        part's routes do not match its tokens or the others' layers and top-k."""
        parts = self._route_parts()
        known = [(name, tokens, getattr(owner, attribute)) for name, tokens, owner, attribute in parts
                 if getattr(owner, attribute) is not None]
        if not known:
            return None
        shape = known[0][2].shape[1:]
        for name, tokens, routes in known:
            if routes.ndim != 3 or len(routes) != tokens or routes.shape[1:] != shape:
                raise ValueError(
                    f"segment routes: {name} has routes of shape {routes.shape}, expected [{tokens}, "
                    f"{', '.join(map(str, shape))}] (its tokens, and the layers and top-k of the other parts)"
                )
        out = np.full((len(self.token_ids()), *shape), -1, dtype=np.int32)
        start = 0
        for _, tokens, owner, attribute in parts:
            routes = getattr(owner, attribute)
            if routes is not None:
                out[start : start + tokens] = routes
            start += tokens
        return out


@dataclass
class Episode:
    """One rollout of one task: a chain of segments, its reward and its bookkeeping."""

    task_id: str
    segments: list[Segment] = field(default_factory=list)
    status: EpisodeStatus = EpisodeStatus.OK
    reward: float = 0.0
    reward_terms: dict[str, float] = field(default_factory=dict)  # every named term, for logging
    grade: Grade | None = None  # the grader's verdict; None until graded, and for infra errors
    metrics: dict[str, float] = field(default_factory=dict)  # turns, tokens, wall time, cost, ...
    error: str | None = None  # what failed, for INFRA_ERROR and TIMEOUT
    final_message: str | None = None
    diff: str | None = None  # the agent's change to the repo
    sample_index: int = 0  # position inside its group
    limit: EndReason | None = None  # the budget that ended a TIMEOUT episode (set by the agent loop)
    summaries: list[str] = field(default_factory=list)  # what each summary of the chain handed on

    @property
    def turns(self) -> list[Turn]:
        return [turn for segment in self.segments for turn in segment.turns]

    @property
    def policy_versions(self) -> list[int]:
        """Every policy version that sampled a token of this episode (a turn without tokens, from
        a hosted policy, counts with its ``policy_version``)."""
        turns = self.turns
        return sorted({turn.policy_version for turn in turns} | {v for turn in turns for v in turn.token_versions})

    def token_counts(self) -> dict[str, int]:
        """Tokens by kind over the whole chain, plus tool calls and turns (length-penalty inputs)."""
        counts = {kind.name.lower(): 0 for kind in TokenKind}
        for segment in self.segments:
            counts["prompt"] += len(segment.prompt_ids)
            for turn in segment.turns:
                for kind in (*turn.token_kinds, *turn.observation_kinds):
                    counts[TokenKind(kind).name.lower()] += 1
        counts["tool_calls"] = sum(len(turn.tool_calls) for turn in self.turns)
        counts["turns"] = len(self.turns)
        return counts

    @property
    def scored(self) -> bool:
        return self.status != EpisodeStatus.INFRA_ERROR

    @property
    def end_reason(self) -> EndReason | None:
        """Why the episode ended. A budget stop in which not one turn parsed counts as
        ``FORMAT_ERRORS``: the model never spoke the tool protocol, whichever budget it used up
        repeating so. None for a budget stop whose budget nobody recorded."""
        if self.status == EpisodeStatus.INFRA_ERROR:
            return EndReason.INFRA_ERROR
        if self.status == EpisodeStatus.OK:
            return EndReason.SUBMITTED
        turns = self.turns
        if self.status == EpisodeStatus.FORMAT_ERROR or (turns and all(t.format_error for t in turns)):
            return EndReason.FORMAT_ERRORS
        return self.limit


@dataclass
class Group:
    """The G episodes sampled for one task, with their advantages (one number per episode,
    shared by every model token of that episode, summaries included)."""

    task: Task
    episodes: list[Episode]
    advantages: list[float] = field(default_factory=list)


@dataclass
class TrainBatch:
    """Packed tensors for one optimiser step; every tensor is ``[rows, seq_len]`` unless noted.

    Built by the trainer from episodes. ``loss_mask`` is 1 on model-sampled target tokens;
    ``advantages`` is the per-token advantage (0 where masked); ``sampler_logprobs`` and
    ``ref_logprobs`` are aligned with the *target* token at each position; ``routes`` (int32,
    ``[rows, seq_len, moe_layers, top_k]``) is aligned with the *input* token: the experts the
    sampler routed it to, -1 where unknown (padding, positions no engine call ran), None when no
    row has routes; ``segment_ids`` separates packed sequences;
    ``versions`` (int64) is the policy version that sampled each target token, -1 on tokens the
    model did not sample and on padding (None when the batch was built without them).
    ``episode_ids`` (int64, -1 on padding) is the step's index of each token's episode and
    ``episode_tokens`` (float) that episode's model tokens over all its segments: the losses that
    count sequences count episodes, so a self-summary chain is one sequence (None: each packed
    sequence is its own).
    """

    input_ids: torch.Tensor
    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    routes: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    num_episodes: int = 0
    episode_ids: torch.Tensor | None = None
    episode_tokens: torch.Tensor | None = None


# ----------------------------------------------------------------------------------------------
# What crosses the seams of protocols.py: sampling (Engine), one model turn (Policy), one command (Workspace)


@dataclass
class SamplingParams:
    """How to sample. ``temperature = 0`` is greedy decoding.

    Logprobs are those of the distribution sampled from: temperature-scaled, cut by top-k / top-p
    and renormalised (``inference.sampling``), which is how the trainer scores the same tokens.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    stop: list[str] = field(default_factory=list)  # stop strings; the match is kept in the output
    stop_token_ids: list[int] = field(default_factory=list)  # added to the tokenizer's EOS ids
    seed: int | None = None  # per-request seed; sample j of prompt i uses (seed, i, j)
    ignore_eos: bool = False
    speculative: str = "off"  # "mtp": draft with the model's MTP layer, lossless (inference.speculative)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.speculative not in ("off", "mtp"):
            raise ValueError(f'speculative must be "off" or "mtp", got {self.speculative!r}')


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    ``routed_experts``: ``[len(token_ids), moe_layers, top_k]`` uint8 (uint16 above 256 experts)
    for MoE models, None for dense ones; ``prompt_routed_experts``: ``[len(prompt), moe_layers,
    top_k]``, the routes of the prompt's prefill (None for dense models, and when nothing was run:
    ``max_new_tokens = 0``). Row ``p`` of ``prompt_routed_experts + routed_experts`` is the route
    of input position ``p`` of the context. ``finish_reason``: ``"stop"`` (EOS, stop token or stop
    string) or ``"length"`` (max_new_tokens reached).

    ``token_versions``: the policy version that sampled each token; a sampler that takes new
    weights between decode steps (``inference.local``) can switch inside one completion. None
    means every token is at ``policy_version``, which is always the version of the first token
    (for an empty completion, the version it would have been sampled with).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    routed_experts: np.ndarray | None = None
    prompt_routed_experts: np.ndarray | None = None
    prompt_index: int = 0
    sample_index: int = 0
    policy_version: int = 0
    token_versions: list[int] | None = None
    queue_wait_s: float = 0.0  # time the request spent queued behind other work (a batching front-end), not sampling


@dataclass
class Context:
    """What a policy sees before its turn."""

    task: Task
    messages: list[Message]  # the segment's chat transcript so far
    token_ids: list[int] | None  # the exact context ids, for token-in/token-out policies
    turn_index: int  # turns taken so far in this episode
    max_new_tokens: int  # what the budgets leave for this turn
    seed: int = 0  # per-episode seed for sampling
    summary: bool = False  # the loop asks for a summary (agent.context_policy): the last message is the request
    summaries: int = 0  # summary turns earlier in this episode (turn_index counts them too)
    tools: list[dict[str, Any]] | None = None  # the enabled tools' schemas (agent.tools); None: the default set


@dataclass
class PolicyOutput:
    """One model turn. ``token_ids`` / ``logprobs`` / ``routes`` (``[tokens, moe_layers, top_k]``)
    come from token-level policies, with ``prompt_routes`` (``[len(Context.token_ids), moe_layers,
    top_k]``, the routes of the context's prefill); ``tool_calls`` from servers with native
    function calling (None means: parse them from ``text``)."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    routes: np.ndarray | None = None
    prompt_routes: np.ndarray | None = None
    finish_reason: str = "stop"
    tool_calls: list[ToolCall] | None = None
    format_error: str | None = None  # native tool calls that could not be read
    reasoning: str = ""  # a server's separate thinking text (``reasoning_content``), not part of ``text``
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those a server read from its prompt cache
    cost: float = 0.0
    policy_version: int = 0  # the version of the first token
    token_versions: list[int] | None = None  # the version of each token, when it can change inside a turn
    wait_s: float = 0.0  # part of the call spent waiting for other episodes' work, not charged to the wall-time budget


@dataclass
class RunResult:
    """What one command did. ``exit_code`` is the command's status (128 + N when killed by signal
    N, as a shell reports it); ``output`` interleaves stdout and stderr, capped."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float
    truncated: bool
