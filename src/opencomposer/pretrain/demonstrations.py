"""Demonstrations: the oracle's tool episodes on the ``[sft]`` section's tasks, recorded in the real
harness, token in, token out, exactly as the agent loop records an RL rollout. What the ``sft``
loss trains on (``pretrain.losses``), in ``opencomposer sft`` and in ``[[pretrain.phases]]`` alike.

The oracle policy (the task's gold patch replayed through the tools, ``agent.policies.scripted``)
plays each task in a sandbox, all its calls in one turn followed by ``finish`` (or, for a task with
a walkthrough, its turns one by one under the recipe's context policy). The project has no
saved-episode format with token ids (``opencomposer eval`` writes chat transcripts without them),
so recorded demonstrations are the only trajectory source.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from opencomposer.config import Config, ConfigError
from opencomposer.types import Episode, EpisodeStatus, Task


def one_turn_oracle(task: Task) -> list[list[Any]]:
    """The oracle's tool calls for ``task`` and a short ``finish``, all in a single turn."""
    from opencomposer.agent.policies.scripted import call, oracle_script

    calls = [c for turn in oracle_script(task) for c in turn if c.name != "finish"]
    return [[*calls, call("finish", message="Done.")]]


def demonstration_script(task: Task, demonstrations: str = "oracle") -> list[Any]:
    """What the teacher plays: a task's walkthrough when it has one (``solution/script.json``, e.g.
    the ``tiny-long`` family: read each note in its own turn, then write), else ``one_turn_oracle``
    or, with ``demonstrations = "explore"``, ``explore_script`` (find, read, edit, test, finish).
    A walkthrough runs under the recipe's ``agent.context_policy``, so with ``self_summary`` the
    demonstrations hold the oracle's summaries and the chains that follow them."""
    from opencomposer.agent.policies.scripted import explore_script, oracle_script

    if task.path is not None and (task.path / "solution" / "script.json").is_file():
        return list(oracle_script(task))
    if demonstrations == "explore":
        return explore_script(task)
    return one_turn_oracle(task)


def record_demonstrations(tasks: list[Task], tokenizer: Any, config: Config) -> list[Episode]:
    """Play ``demonstration_script`` on every task in the real loop and sandbox (no grading
    needed: the oracle's change is the gold patch); returns the token-level episodes."""
    from opencomposer.agent.loop import AgentLoop
    from opencomposer.agent.policies.scripted import ScriptedPolicy
    from opencomposer.sandbox.workspace import Sandbox

    def script(task: Task) -> list[Any]:
        return demonstration_script(task, config.sft.demonstrations)

    policy = ScriptedPolicy(script, name="oracle", tokenizer=tokenizer)
    episodes = []
    for task in tasks:
        with Sandbox(task.repo, config.sandbox, workdir=task.workdir) as sandbox:
            episode = AgentLoop(policy, task, sandbox, config.agent).run()
        if episode.status != EpisodeStatus.OK:
            raise RuntimeError(f"the oracle did not finish task {task.id}: {episode.status.value} ({episode.error})")
        episodes.append(episode)
    return episodes


def demonstration_tasks(config: Config, folder: Path) -> list[Task]:
    """The tasks SFT demonstrates: a folder of tasks, or a tiny family's training split from a seed
    stream of its own (RL's stream is another; the held-out split is never demonstrated). A wrong
    demonstration (``sft.wrong_share``) writes ``sft.decoy_word`` instead of the word asked for; in
    ``tiny-long`` instead of one of the K words (``LongSpec.mistake_position``)."""
    sft = config.sft
    if sft.task_family:
        from opencomposer.tasks.generators.tiny import tiny_spec, write_tiny_task

        seed = config.run.seed + 1  # not RL's stream (run.seed)
        specs = [tiny_spec(seed, "train", i, sft.task_family) for i in range(sft.num_tasks)]
        order = np.random.default_rng([seed, 0x5F7]).permutation(sft.num_tasks)
        wrong = set(order[: round(sft.wrong_share * sft.num_tasks)].tolist())  # the teacher's mistakes
        if wrong and any(sft.decoy_word in spec.words for spec in specs):
            raise ConfigError(f"sft.decoy_word = {sft.decoy_word!r} is a word the family asks for; pick another")
        return [write_tiny_task(folder / f"demo-{i:05d}", spec, answer=sft.decoy_word if i in wrong else None)
                for i, spec in enumerate(specs)]
    if not sft.tasks:
        raise ConfigError('sft: set sft.task_family (e.g. "tiny") or sft.tasks = FOLDER (task folders with gold patches)')
    from opencomposer.tasks.format import load_suite

    tasks = [t for t in load_suite(sft.tasks) if t.gold_patch][: sft.num_tasks]
    if not tasks:
        raise ConfigError(f"sft.tasks: no task under {sft.tasks} has a gold patch to demonstrate")
    return tasks


def demonstrations(config: Config, tokenizer: Any) -> list[Episode]:
    """The oracle's episodes on the ``[sft]`` section's tasks (written to a scratch folder)."""
    with tempfile.TemporaryDirectory(prefix="opencomposer-demonstrations-") as scratch:
        return record_demonstrations(demonstration_tasks(config, Path(scratch) / "tasks"), tokenizer, config)
