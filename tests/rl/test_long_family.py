"""The ``tiny-long`` family (``tasks.generators.long``): a long-horizon task whose obstacle is the
context window. What is checked here is what its module doc claims: tasks are pure functions of
(seed, split, index), the splits are disjoint, the words are single tokens, the grader accepts the
gold change and refuses the untouched workspace, a read is the size the doc says, and the oracle's
full read-through overruns ``CONTEXT_WINDOW`` (so without a context policy the episode cannot
succeed), while with self-summarisation every segment fits and the task is solved."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.scripted import NotedTurn, ScriptedPolicy, oracle_script
from opencomposer.agent.protocol import encode, format_tool_call
from opencomposer.config import ConfigError, load_recipe
from opencomposer.episode import run_episode
from opencomposer.tasks.generators import long
from opencomposer.tasks.generators.long import CONTEXT_WINDOW, FILLER_LINES, LENGTHS, WORDS, LongSpec
from opencomposer.tasks.generators.tiny import FAMILIES, split_size, tiny_spec, verify_task, write_tiny_task
from opencomposer.types import EndReason, EpisodeStatus

READ_TOKENS = (350, 460)  # the module doc: one read's output is 370-440 tokens (a margin each side)


def written(tmp_path: Path, seed: int, split: str, index: int, answer: str | None = None):
    spec = tiny_spec(seed, split, index, "tiny-long")
    return spec, write_tiny_task(tmp_path / f"{spec.task_id}-{answer}", spec, answer=answer)


def first_of_length(split: str, k: int, seed: int = 0) -> int:
    """The position of the first task of ``split`` with ``k`` notes."""
    return next(i for i in range(200) if tiny_spec(seed, split, i, "tiny-long").k == k)


def test_the_family_is_registered_with_the_others():
    assert "tiny-long" in FAMILIES and isinstance(tiny_spec(0, "train", 0, "tiny-long"), LongSpec)
    assert split_size("train", "tiny-long") == long.split_size("train") == len(long.family().combinations("train"))


def test_splits_are_disjoint_and_each_round_holds_every_sequence_once():
    family = long.family()
    train, heldout = family.combinations("train"), family.combinations("heldout")
    assert not set(train) & set(heldout)
    assert len(train) + len(heldout) == len(LENGTHS) * long.SEQUENCES_PER_LENGTH
    assert (len(train), len(heldout)) == (split_size("train", "tiny-long"), split_size("heldout", "tiny-long"))
    assert len(heldout) > 250 and len(train) > 1000  # room for RL's single epoch and a held-out suite
    for split in (train, heldout):
        assert {len(words) for words in split} == set(LENGTHS)  # every K in both splits
        assert all(len(set(words)) == len(words) for words in split)  # a task's words are distinct
    first_round = [tiny_spec(0, "heldout", i, "tiny-long").words for i in range(len(heldout))]
    assert sorted(first_round) == sorted(heldout)
    with pytest.raises(ValueError, match="split"):
        family.combinations("test")


def test_a_task_is_a_pure_function_of_seed_split_and_index():
    specs = [tiny_spec(3, "train", i, "tiny-long") for i in range(8)]
    assert specs == [tiny_spec(3, "train", i, "tiny-long") for i in range(8)]
    assert [s.notes() for s in specs] == [s.notes() for s in (tiny_spec(3, "train", i, "tiny-long") for i in range(8))]
    other = [tiny_spec(4, "train", i, "tiny-long") for i in range(8)]
    assert [s.words for s in specs] != [s.words for s in other]
    assert specs[0].notes() != tiny_spec(3, "heldout", 0, "tiny-long").notes()
    assert len({s.task_id for s in specs}) == 8


def test_words_are_single_tokens(tiny_tokenizer):
    """Each word is one token on its own. After a space (as in ``out.txt``) it may take two: the
    code tokenizer is trained on the installed packages' source, so that depends on the
    environment (a fresh one split " tree"); the family does not rely on it."""
    for word in WORDS:
        assert len(encode(tiny_tokenizer, word)) == 1, word


def test_each_note_names_exactly_one_word():
    pattern = re.compile(r"\b(" + "|".join(WORDS) + r"|key)\b")
    for split in ("train", "heldout"):
        for i in range(30):
            spec = tiny_spec(1, split, i, "tiny-long")
            for part, (path, text) in enumerate(spec.notes().items(), 1):
                assert path == f"notes/part{part}.txt"
                lines = text.splitlines()
                assert len(lines) == FILLER_LINES + 1
                named = [line for line in lines if pattern.search(line)]
                assert named == [f"key: {spec.words[part - 1]}"], (spec.task_id, part)


def test_the_task_folder_holds_the_walkthrough_and_budgets(tmp_path):
    spec, task = written(tmp_path, 0, "train", first_of_length("train", 4))
    k = spec.k
    assert task.budgets.max_turns == 2 * k + 6 and task.budgets.max_tokens == (k + 3) * CONTEXT_WINDOW
    assert f'"notes/part{k}.txt"' in task.instruction and '"out.txt"' in task.instruction
    assert sorted(p.name for p in (task.repo / "notes").iterdir()) == [f"part{i}.txt" for i in range(1, k + 1)]
    answer = " ".join(spec.words)
    assert f"+{answer}" in task.gold_patch
    turns = oracle_script(task)
    assert all(isinstance(turn, NotedTurn) for turn in turns) and len(turns) == k + 2
    assert [turn[0].name for turn in turns] == ["read_file"] * k + ["write_file", "finish"]
    pending = [f'pending write_file: {{"path": "out.txt", "content": "{" ".join(spec.words[:i])}"}}' for i in range(1, k + 1)]
    assert [turn.note for turn in turns[:k]] == pending  # the answer's write, with the words read so far
    assert [turn.scratch for turn in turns[:k]] == [f"key: {word}" for word in spec.words]  # the word just read
    assert turns[k][0].arguments == {"path": "out.txt", "content": answer + "\n"}
    raw = json.loads((task.path / "solution" / "script.json").read_text())
    assert raw[0] == {"calls": [{"name": "read_file", "arguments": {"path": "notes/part1.txt"}}], "note": pending[0],
                      "scratch": f"key: {spec.words[0]}"}
    # the final write's arguments repeat the last note's, token for token up to the closing newline
    assert ('"arguments": ' + pending[-1].split(": ", 1)[1][:-2] + "\\n") in format_tool_call("write_file", turns[k][0].arguments)


def test_a_wrong_demonstration_misreads_one_note(tmp_path):
    spec, task = written(tmp_path, 0, "train", 0, answer="data")
    wrong = list(spec.words)
    wrong[spec.mistake_position] = "data"
    assert f"+{' '.join(wrong)}\n" in task.gold_patch
    turns = oracle_script(task)
    assert turns[spec.k][0].arguments["content"] == " ".join(wrong) + "\n"
    assert turns[spec.mistake_position].note.endswith('data"}')
    assert all("data" in turn.note for turn in turns[spec.mistake_position: spec.k])  # carried from there on
    assert turns[spec.mistake_position].scratch == "key: data"
    with pytest.raises(ValueError, match="one word"):
        write_tiny_task(tmp_path / "bad", spec, answer="two words")


def test_sft_demonstrations_and_the_rl_stream_take_the_family(tmp_path):
    from opencomposer.pretrain.sft import demonstration_tasks
    from opencomposer.rl.tasks import TaskStream, heldout_tasks

    config = load_recipe(None, ["sft.task_family=tiny-long", "sft.num_tasks=8", "sft.wrong_share=0.25",
                                "sft.decoy_word=data"])
    tasks = demonstration_tasks(config, tmp_path / "demo")
    assert sum("data" in t.gold_patch for t in tasks) == 2
    with pytest.raises(ConfigError, match="a word the family asks for"):
        demonstration_tasks(load_recipe(None, ["sft.task_family=tiny-long", "sft.num_tasks=8",
                                               "sft.wrong_share=0.25", "sft.decoy_word=code"]), tmp_path / "d2")
    config = load_recipe(None, ["rl.task_family=tiny-long", "rl.eval_tasks=3"])
    stream = TaskStream(config, tmp_path / "run")
    assert stream.size == split_size("train", "tiny-long")
    assert (stream.task(0).path / "solution" / "script.json").is_file()
    heldout = heldout_tasks(config, tmp_path / "run")
    assert len(heldout) == 3 and all(t.id.startswith("tiny-long-heldout-") for t in heldout)


# ------------------------------------------------------------------------------------------------
# Through the real sandbox, grader and agent loop


@pytest.mark.integration
@pytest.mark.bwrap
def test_gold_resolves_and_the_untouched_workspace_does_not(tmp_path):
    from opencomposer.config import GradingConfig
    from opencomposer.grading.grade import grade

    for split in ("train", "heldout"):
        _, task = written(tmp_path, 0, split, 0)
        verify_task(task)  # raises unless gold resolves and the untouched workspace does not
    _, wrong = written(tmp_path, 0, "train", 0, answer="data")
    assert not grade(wrong, wrong.gold_patch, None, None, GradingConfig(lint=False)).resolved


@pytest.mark.integration
@pytest.mark.bwrap
def test_read_sizes_and_the_full_read_through_overrun_the_window(tmp_path, tiny_tokenizer):
    """The oracle without a context policy: each read is ``READ_TOKENS``, and the single segment
    of a full read-through is longer than ``CONTEXT_WINDOW`` for every K (that the shortest task
    stops at the window before its write: ``test_the_window_needs_a_context_policy``; the prompt and
    reads alone come within ~2% of the window, more or less with the tokenizer of each installation,
    so that sum is not asserted)."""
    from opencomposer.sandbox.workspace import Sandbox

    for k in LENGTHS:
        spec, task = written(tmp_path, 0, "train", first_of_length("train", k))
        with Sandbox(task.repo) as sandbox:
            episode = AgentLoop(ScriptedPolicy(oracle_script, tokenizer=tiny_tokenizer), task, sandbox).run()
        assert episode.status == EpisodeStatus.OK and len(episode.segments) == 1
        reads = [m.content for m in episode.segments[0].messages if m.role == "tool"][:k]
        sizes = [len(encode(tiny_tokenizer, content)) for content in reads]
        assert all(READ_TOKENS[0] <= size <= READ_TOKENS[1] for size in sizes), sizes
        prompt = len(episode.segments[0].prompt_ids)
        assert 1300 < prompt < 1500  # system prompt and tools (~1,300) and the instruction
        total = len(episode.segments[0].token_ids())
        assert total > CONTEXT_WINDOW + 200, (k, total)


@pytest.mark.integration
@pytest.mark.bwrap
def test_the_window_needs_a_context_policy(tmp_path, tiny_tokenizer):
    """At ``CONTEXT_WINDOW``: without a context policy the oracle runs out of window before it
    writes the answer, at the shortest K too; with self-summarisation (its summaries carry the
    notes) every segment fits and the grader resolves the task."""
    off = load_recipe(None, [f"agent.context_window={CONTEXT_WINDOW}", "grading.lint=false"])
    for k in (min(LENGTHS), max(LENGTHS)):
        _, task = written(tmp_path, 0, "heldout", first_of_length("heldout", k))
        episode = run_episode(task, ScriptedPolicy(oracle_script, tokenizer=tiny_tokenizer), off)
        assert episode.status == EpisodeStatus.TIMEOUT and episode.limit == EndReason.TOKEN_BUDGET, k
        assert "out.txt" not in (episode.diff or "") and episode.reward == 0.0

    # the longest task (the loop's last) with self-summarisation
    config = load_recipe(None, [f"agent.context_window={CONTEXT_WINDOW}", "agent.context_policy=self_summary",
                                "grading.lint=false"])
    episode = run_episode(task, ScriptedPolicy(oracle_script, tokenizer=tiny_tokenizer), config)
    assert episode.status == EpisodeStatus.OK and episode.reward == 1.0, episode.error
    assert len(episode.segments) > 2
    assert all(len(segment.token_ids()) <= CONTEXT_WINDOW for segment in episode.segments)
    last = episode.summaries[-1]  # facts carried forward: one running list, as it stands
    assert last.count("pending write_file") == 1 and '"content": "' + " ".join(task.metadata["words"]) + '"' in last
    # each summary after a read thinks first (the word just read; the summary after the write does
    # not), and the block stays out of what it hands on
    words = task.metadata["words"]
    summaries = [segment.turns[-1].text for segment in episode.segments[:-1]]
    assert [text.split("\n")[:3] for text in summaries[:len(words)]] == [["<think>", f"key: {w}", "</think>"]
                                                                         for w in words]
    assert not any("<think>" in text for text in summaries[len(words):])
    assert not any("<think>" in summary or "key: " in summary for summary in episode.summaries)


@pytest.mark.integration
@pytest.mark.bwrap
def test_sft_demonstrations_walk_through_and_summarise(tmp_path, tiny_tokenizer):
    """The SFT teacher plays a walkthrough turn by turn (one read per turn, never the whole change
    in one turn) and, under self-summarisation, writes summaries that the demonstrations keep."""
    from opencomposer.pretrain.sft import demonstration_tasks, record_demonstrations

    config = load_recipe(None, ["sft.task_family=tiny-long", "sft.num_tasks=1", f"agent.context_window={CONTEXT_WINDOW}",
                                "agent.context_policy=self_summary", "agent.summary_max_tokens=256"])
    tasks = demonstration_tasks(config, tmp_path / "demo")
    episode = record_demonstrations(tasks, tiny_tokenizer, config)[0]
    work = [t for t in episode.turns if not t.summary]
    k = len(json.loads((tasks[0].path / "solution" / "script.json").read_text())) - 2
    assert [len(t.tool_calls) for t in work] == [1] * (k + 2)  # K reads, the write, finish
    assert any(t.summary for t in episode.turns) and len(episode.segments) >= 2
    assert all(len(s.token_ids()) <= CONTEXT_WINDOW for s in episode.segments)


@pytest.mark.integration
@pytest.mark.bwrap
@pytest.mark.parametrize("policy", ["compaction", "truncate"])
def test_the_baselines_run_the_family_end_to_end(tmp_path, tiny_tokenizer, policy):
    _, task = written(tmp_path, 0, "train", first_of_length("train", 4))
    config = load_recipe(None, [f"agent.context_window={CONTEXT_WINDOW}", f"agent.context_policy={policy}",
                                "agent.summary_max_tokens=256", "grading.lint=false"])
    episode = run_episode(task, ScriptedPolicy(oracle_script, tokenizer=tiny_tokenizer), config)
    assert episode.status == EpisodeStatus.OK and episode.reward == 1.0, episode.error
    assert len(episode.segments) >= 2 and not any(t.summary for t in episode.turns)
    assert all(len(s.token_ids()) <= CONTEXT_WINDOW for s in episode.segments)


class ForgetfulOracle(ScriptedPolicy):
    """The oracle's work turns, with summaries whose running list keeps only the newest word."""

    def summary(self, task, played):
        return re.sub(r'"content": "(?:\S+ )*(\S+)"', r'"content": "\1"', super().summary(task, played))


@pytest.mark.integration
@pytest.mark.bwrap
def test_summary_retention_scores_what_the_summaries_carry(tmp_path, tiny_tokenizer):
    """``summary_retention``: the oracle's summaries carry every word read (1.0); summaries that
    keep only the newest word carry 1/n of the n words read before the n-th fresh segment; a
    summary of the whole vocabulary scores 1.0 and is caught by ``summary_spurious``."""
    spec, task = written(tmp_path, 0, "train", first_of_length("train", 4))
    config = load_recipe(None, [f"agent.context_window={CONTEXT_WINDOW}", "agent.context_policy=self_summary",
                                "grading.lint=false"])
    episode = run_episode(task, ScriptedPolicy(oracle_script, tokenizer=tiny_tokenizer), config)
    assert episode.reward == 1.0 and len(episode.segments) == spec.k + 2  # a summary after every read
    assert long.summary_retention(episode, spec.words) == 1.0

    forgetful = run_episode(task, ForgetfulOracle(oracle_script, tokenizer=tiny_tokenizer), config)
    assert forgetful.reward == 1.0  # the oracle writes from its script, not from what it was told
    # segment n (n = 1..K) opens after n reads and names the newest word only; the last one opens
    # after the write, whose note ("wrote out.txt: ...") names all K
    expected = [1 / n for n in range(1, spec.k + 1)] + [1.0]
    assert long.summary_retention(forgetful, spec.words) == pytest.approx(sum(expected) / len(expected))
    assert long.notes_read(episode.segments[0]) == {1} and long.notes_read(episode.segments[-1]) == set()
    assert long.summary_spurious(episode, spec.words) == long.summary_spurious(forgetful, spec.words) == 0.0

    # a summary that lists the whole vocabulary "retains" everything; the spurious share exposes it
    spam = run_episode(task, SpammingOracle(oracle_script, tokenizer=tiny_tokenizer), config)
    assert long.summary_retention(spam, spec.words) == 1.0 and long.summary_spurious(spam, spec.words) == 1.0


class ShortPlanOracle(ScriptedPolicy):
    """The oracle's work turns, with summaries whose plan drops the last note still to read."""

    def summary(self, task, played):
        return re.sub(r"\n- read_file notes/part\d+\.txt(?=\n- write_file)", "", super().summary(task, played))


class LongPlanOracle(ScriptedPolicy):
    """The oracle's work turns, with summaries whose plan reads a note the task does not have."""

    def summary(self, task, played):
        return super().summary(task, played).replace("Remaining:", "Remaining:\n- read_file notes/part9.txt")


@pytest.mark.integration
@pytest.mark.bwrap
def test_summary_plan_scores_the_notes_a_summary_leaves_to_read(tmp_path, tiny_tokenizer):
    """``summary_plan``: the oracle's summaries name exactly the notes still to read (1.0); a plan
    without the last unread note is right only once nothing is left to read (the K-th and the
    last fresh segment of K + 1); one with a note the task lacks is never right, nor is a summary
    without a plan while notes remain."""
    spec, task = written(tmp_path, 0, "train", first_of_length("train", 4))
    config = load_recipe(None, [f"agent.context_window={CONTEXT_WINDOW}", "agent.context_policy=self_summary",
                                "grading.lint=false"])

    def plan(policy):
        episode = run_episode(task, policy(oracle_script, tokenizer=tiny_tokenizer), config)
        assert episode.reward == 1.0 and len(episode.segments) == spec.k + 2
        return long.summary_plan(episode, spec.words)

    assert plan(ScriptedPolicy) == 1.0
    assert plan(ShortPlanOracle) == pytest.approx(2 / (spec.k + 1))
    assert plan(LongPlanOracle) == 0.0
    assert plan(SpammingOracle) == pytest.approx(2 / (spec.k + 1))


class SpammingOracle(ScriptedPolicy):
    """The oracle's work turns, with summaries that name every word of the family."""

    def summary(self, task, played):
        return "Words: " + " ".join(WORDS)
