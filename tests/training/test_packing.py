"""Packing episodes into TrainBatches: exact ids, model-token mask, one advantage per episode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opencomposer.training.packing import (
    collate,
    common_prefix,
    episode_rows,
    micro_batches,
    padded_positions,
    segment_arrays,
    segment_versions,
)
from opencomposer.types import Episode, EpisodeStatus, Segment, TokenKind, Turn

T, C, OUT = TokenKind.THINKING, TokenKind.TOOL_CALL, TokenKind.TOOL_OUTPUT


def turn(ids, logprobs, observation=()):
    return Turn(token_ids=list(ids), logprobs=list(logprobs), token_kinds=[C] * len(ids),
                observation_ids=list(observation), observation_kinds=[OUT] * len(observation))


def summary_chain_episode() -> Episode:
    """Two segments (a self-summary chain): the second opens with a fresh prompt."""
    first = Segment(prompt_ids=[1, 2, 3], turns=[turn([10, 11], [-0.5, -0.25], observation=[20, 21]),
                                                 turn([12], [-1.0])])
    second = Segment(prompt_ids=[4, 5], turns=[turn([13, 14, 15], [-0.1, -0.2, -0.3])])
    return Episode(task_id="t", segments=[first, second])


def test_segment_arrays_are_the_exact_context_with_sampler_logprobs_on_model_tokens():
    ids, mask, logprobs = segment_arrays(summary_chain_episode().segments[0])
    assert ids.tolist() == [1, 2, 3, 10, 11, 20, 21, 12]
    assert mask.tolist() == [False, False, False, True, True, False, False, True]
    np.testing.assert_array_equal(logprobs, np.array([0, 0, 0, -0.5, -0.25, 0, 0, -1.0], dtype=np.float32))


def test_every_segment_is_a_row_and_every_model_token_carries_the_episode_advantage():
    episodes = [summary_chain_episode(), summary_chain_episode()]
    rows = episode_rows(episodes, [0.75, -0.75])
    assert [row.episode for row in rows] == [0, 0, 1, 1]
    first, second = rows[0], rows[1]
    assert first.input_ids.tolist() == [1, 2, 3, 10, 11, 20, 21]  # inputs: ids[:-1]
    assert first.target_ids.tolist() == [2, 3, 10, 11, 20, 21, 12]  # targets: ids[1:]
    assert first.loss_mask.tolist() == [False, False, True, True, False, False, True]
    assert second.target_ids.tolist() == [5, 13, 14, 15] and second.loss_mask.tolist() == [False, True, True, True]
    batch = collate(rows, pad_id=0)
    assert batch.input_ids.shape == (4, 7) and batch.num_episodes == 2
    # the summary segment's tokens get the same advantage as the first segment's
    assert batch.advantages[0][batch.loss_mask[0]].tolist() == [0.75] * 3
    assert batch.advantages[1][batch.loss_mask[1]].tolist() == [0.75] * 3
    assert batch.advantages[3][batch.loss_mask[3]].tolist() == [-0.75] * 3
    assert float(batch.advantages[~batch.loss_mask].abs().sum()) == 0.0
    torch.testing.assert_close(batch.sampler_logprobs[1, :4], torch.tensor([0.0, -0.1, -0.2, -0.3]), rtol=0, atol=0)
    assert batch.input_ids[1, 4:].tolist() == [0, 0, 0] and not batch.loss_mask[1, 4:].any()  # right padding
    assert batch.episode_ids[:, 0].tolist() == [0, 0, 1, 1]


def test_episodes_without_advantage_and_rows_without_model_tokens_are_left_out():
    failed = summary_chain_episode()
    failed.status = EpisodeStatus.INFRA_ERROR
    prompt_only = Episode(task_id="t", segments=[Segment(prompt_ids=[1, 2, 3])])
    rows = episode_rows([failed, summary_chain_episode(), prompt_only], [None, 0.5, 0.0])
    assert [row.episode for row in rows] == [1, 1]


def test_micro_batches_respect_the_token_budget_and_are_deterministic():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 40, size=25)
    episodes = [Episode(task_id="t", segments=[Segment(prompt_ids=[1, 2], turns=[turn(range(5, 5 + n - 2), [-0.1] * (n - 2))])])
                for n in lengths]
    rows = episode_rows(episodes, [1.0] * len(episodes))
    chunks = micro_batches(rows, max_tokens=100)
    assert sorted(row.episode for chunk in chunks for row in chunk) == list(range(25))
    for chunk in chunks:
        assert len(chunk) * max(len(r) for r in chunk) <= 100 or len(chunk) == 1
    # longest first, ties in input order, and the same cut on a second call
    longest_first = sorted(range(25), key=lambda e: (-lengths[e], e))
    assert [row.episode for chunk in chunks for row in chunk] == longest_first
    assert [[r.episode for r in c] for c in chunks] == [[r.episode for r in c] for c in micro_batches(rows, 100)]
    # the first micro-batch collated: each episode's context minus its last id, right-padded with -1
    width = int(lengths[longest_first[0]]) - 1
    expected = [([1, 2, *range(5, 3 + int(lengths[r.episode]))][:-1] + [-1] * width)[:width] for r in chunks[0]]
    assert collate(chunks[0], pad_id=-1).input_ids.tolist() == expected


def test_a_shared_prefix_counts_once_in_the_budget():
    """With ``prefix`` P, a micro-batch of n rows, the longest L, costs P + n·(L − P) from two rows
    on; every row still lands once, longest first, and P = 0 cuts as before."""
    rng = np.random.default_rng(1)
    prompt = list(range(1, 41))
    lengths = rng.integers(45, 90, size=20)
    episodes = [Episode(task_id="t", segments=[Segment(prompt_ids=prompt, turns=[turn(range(500, 500 + n - 40), [-0.1] * (n - 40))])])
                for n in lengths]
    rows = episode_rows(episodes, [1.0] * len(episodes))
    prefix = common_prefix(rows, 16)
    assert prefix == 39  # the prompt's inputs before the first model target
    chunks = micro_batches(rows, 300, prefix)
    assert sorted(row.episode for chunk in chunks for row in chunk) == list(range(20))
    for chunk in chunks:
        width = max(len(r) for r in chunk)
        assert prefix + len(chunk) * (width - prefix) <= 300 or len(chunk) == 1
    assert len(chunks) < len(micro_batches(rows, 300))
    assert padded_positions(rows, 300, prefix)[1] == sum(len(c) * max(len(r) for r in c) for c in chunks)
    assert micro_batches(rows, 300, 0) == micro_batches(rows, 300)
    other = episode_rows([Episode(task_id="t", segments=[Segment(prompt_ids=[7, *prompt[1:]],
                                                                 turns=[turn([600, 601], [-0.1, -0.1])])])], [1.0])
    assert common_prefix([*rows, *other], 16) == 0  # a row that differs at its first id: nothing shared


def test_sampler_versions_travel_with_their_targets_and_are_minus_one_elsewhere():
    episode = summary_chain_episode()
    first, second = episode.segments
    first.turns[0].policy_version, first.turns[0].token_versions = 3, [3, 4]  # switched inside the turn
    first.turns[1].policy_version = 4  # no per-token list: every token at the turn's version
    second.turns[0].policy_version, second.turns[0].token_versions = 4, [4, 4, 5]
    assert segment_versions(first).tolist() == [-1, -1, -1, 3, 4, -1, -1, 4]  # ids 1 2 3 10 11 20 21 12
    assert episode.policy_versions == [3, 4, 5]
    rows = episode_rows([episode], [1.0])
    assert rows[0].versions.tolist() == [-1, -1, 3, 4, -1, -1, 4]  # aligned with targets 2 3 10 11 20 21 12
    batch = collate(rows, pad_id=0)
    assert batch.versions.dtype == torch.int64 and batch.versions.shape == batch.loss_mask.shape
    assert batch.versions[1].tolist() == [-1, 4, 4, 5, -1, -1, -1]  # right padding is -1 too
    assert ((batch.versions >= 0) == batch.loss_mask).all()
    turn_ = first.turns[0]
    turn_.token_versions = [3]
    with pytest.raises(ValueError, match="2 token ids but 1 token versions"):
        episode_rows([episode], [1.0])


def test_collate_without_versions_leaves_them_out():
    rows = episode_rows([summary_chain_episode()], [1.0])
    rows[0].versions = None
    assert collate(rows, pad_id=0).versions is None
