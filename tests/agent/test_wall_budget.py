"""The wall-time budget counts the policy's own time: waits for other episodes' batches and for
sandbox command slots are load, not a slow policy, and never turn into a scored timeout.

The checks are driven by events, not by how long the machine takes: the clock of the loop, the
sandbox and the batcher is real time plus jumps the test makes (``tests.conftest.Clock``). A policy "computes"
or "waits in a queue" by jumping the clock, and a slot or a batch is held until the episode is
seen waiting for it, then the clock jumps an hour before it is let go. The budget (``BUDGET``)
sits far below an hour and far above what the real work takes, however loaded the machine, so
only the rule under test decides the outcome.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from opencomposer.agent import loop as agent_loop
from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.policies.scripted import ScriptedPolicy, call, render_turn
from opencomposer.agent.protocol import encode
from opencomposer.config import SamplingConfig, SandboxConfig
from opencomposer.inference import batching
from opencomposer.inference.batching import BatchingEngine
from opencomposer.model.tokenizer import IM_END
from opencomposer.sandbox import workspace
from opencomposer.sandbox.jail import command_slots
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import load_task
from opencomposer.types import Completion, EpisodeStatus, PolicyOutput
from tests.conftest import Clock

from .conftest import FIXTURES

pytestmark = pytest.mark.bwrap

HOUR = 3600.0
BUDGET = 600.0  # seconds of the policy's own time an episode may use
LOOK = [call("list_dir", path=".")]
SCRIPT = [LOOK, LOOK, [call("finish", message="done")]]


@pytest.fixture
def clock(clock: Clock) -> Clock:
    """The clock the agent loop, the sandbox and the batcher read."""
    clock.drive(agent_loop, workspace, batching)
    return clock


def run(policy, sandbox_config: SandboxConfig | None = None):
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_wall_s = BUDGET
    with Sandbox(task.repo, sandbox_config) as sandbox:
        return AgentLoop(policy, task, sandbox).run(), sandbox


class SlowPolicy(ScriptedPolicy):
    """Takes ``seconds`` per turn (a jump of the clock), reported as waiting in a queue or not."""

    def __init__(self, script, clock: Clock, seconds: float, queued: bool):
        super().__init__(script)
        self.clock, self.seconds, self.queued = clock, seconds, queued

    def act(self, context) -> PolicyOutput:
        self.clock.jump(self.seconds)
        return dataclasses.replace(super().act(context), wait_s=self.seconds if self.queued else 0.0)


def test_time_a_policy_reports_as_queued_does_not_count(clock):
    episode, _ = run(SlowPolicy(SCRIPT, clock, HOUR, queued=True))
    assert episode.status == EpisodeStatus.OK, episode.error  # three hours of wall time, all queued
    assert episode.metrics["waited_s"] == pytest.approx(3 * HOUR)
    assert episode.metrics["policy_s"] < BUDGET < 3 * HOUR <= episode.metrics["wall_s"]


def test_a_policy_that_computes_too_long_times_out(clock):
    episode, _ = run(SlowPolicy(SCRIPT, clock, 0.6 * BUDGET, queued=False))
    assert episode.status == EpisodeStatus.TIMEOUT and episode.scored
    assert "wall-time budget used up" in episode.error and len(episode.turns) == 2  # 0.6, then 1.2 budgets


class WatchedSlots:
    """The sandbox's command slots, setting ``asked`` each time a command asks for one."""

    def __init__(self, slots: threading.BoundedSemaphore):
        self.slots, self.asked = slots, threading.Event()

    def __enter__(self):
        self.asked.set()
        return self.slots.__enter__()

    def __exit__(self, *exc):
        return self.slots.__exit__(*exc)


def test_waiting_for_a_sandbox_slot_does_not_count(clock, monkeypatch):
    watched = WatchedSlots(command_slots(1))
    monkeypatch.setattr(workspace, "command_slots", lambda limit: watched)
    taken = threading.Event()

    def hold_the_only_slot_until_asked():  # another episode's command, running for an hour
        with watched.slots:
            taken.set()
            watched.asked.wait(60)
            clock.jump(HOUR)

    holder = threading.Thread(target=hold_the_only_slot_until_asked)
    holder.start()
    taken.wait(60)
    try:
        script = [[call("run", command="true")], [call("run", command="true")], [call("finish", message="ok")]]
        episode, sandbox = run(ScriptedPolicy(script), sandbox_config=SandboxConfig(max_concurrent=1))
    finally:
        watched.asked.set()
        holder.join()
    assert episode.status == EpisodeStatus.OK, episode.error
    assert sandbox.slot_wait_s >= HOUR and episode.metrics["waited_s"] >= HOUR
    assert episode.metrics["policy_s"] < BUDGET


class TurnEngine:
    """An engine that answers the n-th call with the n-th turn of a script, after ``compute``
    (a jump of the clock, or nothing)."""

    policy_version = 0

    def __init__(self, tokenizer, script, compute=lambda: None):
        self.tokenizer, self.script, self.compute, self.calls = tokenizer, script, compute, 0

    def generate(self, prompts, params, n=1, row_seeds=None):
        self.compute()
        text = render_turn(self.script[min(self.calls, len(self.script) - 1)])
        self.calls += 1
        ids = encode(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids(IM_END)]
        return [Completion(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop", text=text,
                           prompt_index=i, sample_index=j) for i in range(len(prompts)) for j in range(n)]

    def load_weights(self, state_dict, version):
        self.policy_version = version


def test_turns_held_up_by_another_episodes_batch_do_not_count(tokenizer, clock):
    # another episode's session is open, and joins each batch an hour after this episode's turn
    # is queued (the batcher's queue is read to see it), with the same sampling settings: one
    # engine call per batch, one turn of the script
    batcher = BatchingEngine(TurnEngine(tokenizer, SCRIPT), max_wait_s=10 * HOUR)
    elsewhere, done = batcher.session(), threading.Event()

    def join_each_batch_an_hour_late():
        for _ in SCRIPT:
            while not batcher._pending:
                if done.wait(0.01):
                    return
            clock.jump(HOUR)
            elsewhere.generate([[1]], batcher._pending[0].params)

    other = threading.Thread(target=join_each_batch_an_hour_late)
    other.start()
    try:
        episode, _ = run(EnginePolicy(batcher.session(), tokenizer, SamplingConfig(max_new_tokens=200)))
    finally:
        done.set()
        other.join()
        elsewhere.close()
    assert episode.status == EpisodeStatus.OK, episode.error
    assert episode.metrics["waited_s"] >= 3 * HOUR and episode.metrics["policy_s"] < BUDGET


def test_turns_of_an_engine_that_computes_too_long_count(tokenizer, clock):
    batcher = BatchingEngine(TurnEngine(tokenizer, SCRIPT, compute=lambda: clock.jump(HOUR)), max_wait_s=HOUR)
    policy = EnginePolicy(batcher.session(), tokenizer, SamplingConfig(max_new_tokens=200))
    episode, _ = run(policy)
    assert episode.status == EpisodeStatus.TIMEOUT and "wall-time budget used up" in episode.error
    assert episode.metrics["waited_s"] < BUDGET  # alone in the batcher: its call's hour is its own
