"""The wall-time budget counts the policy's own time: waits for other episodes' batches and for
sandbox command slots are load, not a slow policy, and never turn into a scored timeout."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.policies.scripted import ScriptedPolicy, call, render_turn
from opencomposer.agent.protocol import encode
from opencomposer.config import SamplingConfig, SandboxConfig
from opencomposer.inference.batching import BatchingEngine
from opencomposer.model.tokenizer import IM_END
from opencomposer.sandbox.jail import command_slots
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.format import load_task
from opencomposer.types import Completion, EpisodeStatus, PolicyOutput

from .conftest import FIXTURES

pytestmark = pytest.mark.bwrap

LOOK = [call("list_dir", path=".")]
SCRIPT = [LOOK, LOOK, [call("finish", message="done")]]


def run(policy, max_wall_s: float, sandbox_config: SandboxConfig | None = None):
    task = load_task(FIXTURES / "fix-add")
    task.budgets.max_wall_s = max_wall_s
    with Sandbox(task.repo, sandbox_config) as sandbox:
        return AgentLoop(policy, task, sandbox).run(), sandbox


class SlowPolicy(ScriptedPolicy):
    """Takes ``delay`` seconds per turn, reported as waiting in a queue or not."""

    def __init__(self, script, delay: float, queued: bool):
        super().__init__(script)
        self.delay, self.queued = delay, queued

    def act(self, context) -> PolicyOutput:
        time.sleep(self.delay)
        return dataclasses.replace(super().act(context), wait_s=self.delay if self.queued else 0.0)


def test_time_a_policy_reports_as_queued_does_not_count():
    episode, _ = run(SlowPolicy(SCRIPT, delay=0.3, queued=True), max_wall_s=0.5)
    assert episode.status == EpisodeStatus.OK, episode.error  # 0.9 s of wall time, nearly all queued
    assert episode.metrics["waited_s"] >= 0.85 and episode.metrics["policy_s"] < 0.5 <= episode.metrics["wall_s"]


def test_a_policy_that_computes_too_long_times_out():
    episode, _ = run(SlowPolicy(SCRIPT, delay=0.3, queued=False), max_wall_s=0.5)
    assert episode.status == EpisodeStatus.TIMEOUT and episode.scored
    assert "wall-time budget used up" in episode.error and len(episode.turns) == 2


def test_waiting_for_a_sandbox_slot_does_not_count():
    slots, taken, release = command_slots(1), threading.Event(), threading.Event()

    def hold_the_only_slot():
        with slots:
            taken.set()
            release.wait(5)

    holder = threading.Thread(target=hold_the_only_slot)
    holder.start()
    taken.wait(5)
    threading.Timer(0.8, release.set).start()  # another episode's command holds the slot for 0.8 s
    try:
        script = [[call("run", command="true")], [call("run", command="true")], [call("finish", message="ok")]]
        episode, sandbox = run(ScriptedPolicy(script), max_wall_s=0.5, sandbox_config=SandboxConfig(max_concurrent=1))
    finally:
        release.set()
        holder.join()
    assert episode.status == EpisodeStatus.OK, episode.error
    assert sandbox.slot_wait_s >= 0.6 and episode.metrics["waited_s"] >= 0.6


class TurnEngine:
    """An engine that answers the n-th call with the n-th turn of a script, after ``compute_s``."""

    policy_version = 0

    def __init__(self, tokenizer, script, compute_s: float = 0.0):
        self.tokenizer, self.script, self.compute_s, self.calls = tokenizer, script, compute_s, 0

    def generate(self, prompts, params, n=1, row_seeds=None):
        time.sleep(self.compute_s)
        text = render_turn(self.script[min(self.calls, len(self.script) - 1)])
        self.calls += 1
        ids = encode(self.tokenizer, text) + [self.tokenizer.convert_tokens_to_ids(IM_END)]
        return [Completion(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop", text=text,
                           prompt_index=i, sample_index=j) for i in range(len(prompts)) for j in range(n)]

    def load_weights(self, state_dict, version):
        self.policy_version = version


def test_turns_held_up_by_another_episodes_batch_do_not_count(tokenizer):
    # another episode's session is open but busy elsewhere: each turn waits max_wait_s for it
    batcher = BatchingEngine(TurnEngine(tokenizer, SCRIPT), max_wait_s=0.4)
    busy_elsewhere = batcher.session()
    policy = EnginePolicy(batcher.session(), tokenizer, SamplingConfig(max_new_tokens=200))
    episode, _ = run(policy, max_wall_s=0.3)
    busy_elsewhere.close()
    assert episode.status == EpisodeStatus.OK, episode.error
    assert episode.metrics["waited_s"] >= 1.1 and episode.metrics["policy_s"] < 0.3


def test_turns_of_an_engine_that_computes_too_long_count(tokenizer):
    batcher = BatchingEngine(TurnEngine(tokenizer, SCRIPT, compute_s=0.4), max_wait_s=0.4)
    policy = EnginePolicy(batcher.session(), tokenizer, SamplingConfig(max_new_tokens=200))
    episode, _ = run(policy, max_wall_s=0.3)
    assert episode.status == EpisodeStatus.TIMEOUT and "wall-time budget used up" in episode.error
    assert episode.metrics["waited_s"] < 0.1  # alone in the batcher: its call's time is its own
