"""Every seam between the layers, as a ``typing.Protocol``, in one place.

A backend plugs in by implementing one of these; nothing above the seam knows which backend it
talks to. The records that cross the seams (``SamplingParams``, ``Completion``, ``Context``,
``PolicyOutput``, ``RunResult``, ``Grade``) live in ``types``.

| protocol     | implemented by (today)                         | to come                          |
|--------------|------------------------------------------------|----------------------------------|
| ``Engine``     | ``inference.LocalEngine``, ``BatchingEngine``  | vLLM, HTTP, Ray actors           |
| ``Policy``     | ``agent.policies``: local, scripted, OpenAI-compatible HTTP | Ray actors          |
| ``Summarizer`` | test doubles                                   | self-summary, compaction, truncation |
| ``Workspace``  | ``sandbox.Sandbox``                            | remote episode workers           |
| ``Grader``     | ``grading.grade.GradeCache``                    | graders in episode services      |
| ``WeightSink`` | ``LocalEngine``                                | the weight store's subscribers   |

The four services of asynchronous RL (docs/services.md), each with an embedded and a Ray backend:

| protocol               | embedded (``services.*``)        | Ray (``services.ray_backend``)  |
|------------------------|----------------------------------|---------------------------------|
| ``InferenceService``   | ``inference.InferenceService``   | the inference actor's proxy     |
| ``EpisodeWorker``      | ``episodes.EpisodeWorker``       | the worker actor's proxy        |
| ``TrainerService``     | ``rl.trainer.Trainer``           | (the driver's, shared)          |
| ``EvaluationService``  | ``evaluation.EvaluationService`` | the evaluation actor's proxy    |

Where an RL run's groups come from is one more seam, ``RolloutSource``: ``rl.sync.SyncRollouts``
(sample, then train, in turn) or ``services.async_rl.AsyncRollouts`` (the services above, sampling
ahead within ``rl.max_staleness``). ``rl.loop.RLRun`` drives either with the same code.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from opencomposer.types import (
    Completion,
    Context,
    Grade,
    Group,
    Message,
    PolicyOutput,
    RunResult,
    SamplingParams,
    Task,
)


@runtime_checkable
class WeightSink(Protocol):
    """Takes a new version of the policy's weights (``state_dict`` maps parameter names to tensors)."""

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...


@runtime_checkable
class Engine(WeightSink, Protocol):
    """Token in, token out: ``generate`` returns ``len(prompts) * n`` completions, prompt-major
    (all samples of prompt 0, then prompt 1, ...), each with the sampler's logprob of every token
    and, for MoE models, its routed experts. ``policy_version`` is the version of the weights that
    sampled the tokens (docs/recipe.md §6)."""

    policy_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Completion]: ...


@runtime_checkable
class Policy(Protocol):
    """Turns the context into one model turn. Token-level policies set ``tokenizer`` and read
    ``Context.token_ids``; text policies read ``Context.messages``. A policy keeps no per-episode
    state, so one object serves parallel episodes."""

    name: str
    tokenizer: Any | None

    def act(self, context: Context) -> PolicyOutput: ...


@runtime_checkable
class Summarizer(Protocol):
    """Closes a segment when its context is full and opens the next one (docs/recipe.md §5).

    ``loop`` is the running ``agent.loop.AgentLoop`` (its task, segment, messages and policy);
    ``summarize`` returns the messages the next segment starts from.
    """

    def should_summarize(self, loop: Any) -> bool: ...

    def summarize(self, loop: Any) -> list[Message]: ...


@runtime_checkable
class Workspace(Protocol):
    """A task repository the agent may change, and a jail to run commands over it."""

    workspace: Path  # the host folder holding the repository
    slot_wait_s: float  # seconds its commands have waited to start (slots shared with other workspaces)

    def run(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> RunResult:
        """Run ``command`` in the jail; what it does (fail, time out, hit a limit) is in the result."""
        ...

    def resolve(self, path: str, must_exist: bool = False) -> Path:
        """The host path of a workspace path, refusing anything that leaves the workspace."""
        ...

    def relpath(self, host_path: Path) -> str:
        """The workspace-relative path of a host path inside it."""
        ...

    def command_path(self, rel: str) -> str:
        """How a command inside the jail names the workspace-relative path ``rel``."""
        ...

    def diff(self) -> str:
        """The unified diff from the task's starting repository to the workspace now."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Grader(Protocol):
    """Scores a change to a task: hidden tests, rubric and lint. ``out_dir`` (when given) receives
    ``reward.json``. An infrastructure failure raises; it is never a zero grade."""

    def grade(self, task: Task, diff: str, final_message: str | None = None, *, out_dir: Path | None = None) -> Grade: ...


@runtime_checkable
class InferenceService(WeightSink, Protocol):
    """Serves many episodes at once and takes new weights while it runs (in flight, between decode
    steps). Each episode samples through its own ``session()``, an ``Engine``."""

    policy_version: int

    def session(self) -> Engine: ...


@runtime_checkable
class EpisodeWorker(Protocol):
    """Rolls out one group at a time (sandbox, agent loop, grading): ``start`` returns at once with
    a future of the ``Group``. ``last_beat`` is the monotonic time of its last heartbeat; a worker
    silent past ``services.worker_timeout_s`` is declared dead and its group sampled elsewhere."""

    worker_id: int
    last_beat: float

    def start(self, index: int, task: Task, seeds: list[int], attempt: int) -> Future[Group]: ...

    def close(self) -> None: ...


@runtime_checkable
class TrainerService(Protocol):
    """Consumes scored groups, steps, publishes weights: ``score`` computes rewards and advantages
    of a step's groups, ``train`` takes one optimizer step on them (``version``: the policy version
    being trained, for the staleness metrics), ``publish`` pushes the weights into a sink."""

    def score(self, groups: list[Group]) -> Any: ...

    def train(self, scored: Any, version: int | None = None) -> tuple[float, dict[str, float]]: ...

    def publish(self, engine: Any, version: int) -> None: ...


@runtime_checkable
class EvaluationService(Protocol):
    """Evaluates the held-out suite on chosen policy versions without blocking the trainer:
    ``submit(version)`` queues one, ``poll`` returns the finished ``(version, metrics)``."""

    pending: int

    def submit(self, version: int) -> None: ...

    def poll(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]: ...

    def close(self) -> None: ...


@runtime_checkable
class RolloutSource(Protocol):
    """Where an RL run's scored groups come from, and where its new weights go (docs/rl.md,
    "Rollout sources"). ``rl.loop.RLRun`` calls, in this order: ``open(run)`` once (the run's
    state, stream, trainer and policy are set up; a source may start its services here), then per
    step ``next_batch(step)`` (an ``rl.rollouts.RolloutBatch``: the groups step ``step + 1``
    trains, their stream indices, the cursor, groups dropped before training, metrics),
    ``trained(step, records)`` (the step's exactly-once records, before anything of it is written),
    ``checkpointed()`` when a checkpoint holds them, and ``publish(version)`` (the new weights out,
    after the checkpoint); ``evaluate(version)`` for each due evaluation of a version in
    ``versions()``, whose metrics ``evaluations(wait)`` returns; ``close()`` at the end, even
    after a failure. The sources differ only in when weights are published and which version a
    group was sampled with."""

    def open(self, run: Any) -> None: ...

    def next_batch(self, step: int) -> Any: ...

    def trained(self, step: int, records: list[Any]) -> None: ...

    def checkpointed(self) -> None: ...

    def publish(self, version: int) -> None: ...

    def versions(self) -> list[int]: ...

    def evaluate(self, version: int) -> None: ...

    def evaluations(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]: ...

    def close(self) -> None: ...
