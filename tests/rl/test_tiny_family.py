"""The ``tiny`` task family that the RL learning test trains and evaluates on.

``rl.tasks`` does not re-grade the tiny tasks it generates (two grader runs per task would double
a tiny run's cost); this file is why that is safe: every phrasing the family can produce is
verified here through the real grader (the gold change resolves it, the untouched workspace does
not), and the split that the held-out evaluation reads never shows a phrasing that training sees.
"""

from __future__ import annotations

import pytest

from opencomposer.tasks.generators.tiny import (
    PHRASINGS,
    TinySpec,
    family,
    split_size,
    tiny_spec,
    verify_task,
    write_tiny_task,
)


def test_splits_are_disjoint_and_cover_every_phrasing():
    tiny = family("tiny")
    train, heldout = tiny.combinations("train"), tiny.combinations("heldout")
    assert {p for _, _, p in heldout} == {4, 9, 11, 15, 19, 22, 23, 27}
    assert not set(train) & set(heldout)
    assert sorted(p for _, _, p in train + heldout) == list(range(len(PHRASINGS)))
    assert (split_size("train"), split_size("heldout")) == (len(train), len(heldout)) == (20, 8)
    first_round = [tiny_spec(0, "train", i).phrasing for i in range(split_size("train"))]
    assert sorted(first_round) == sorted(p for _, _, p in train)  # each round is a permutation of the split


def test_task_index_is_a_pure_function_of_seed_split_and_index():
    first = [tiny_spec(3, "heldout", i) for i in range(9)]
    assert first == [tiny_spec(3, "heldout", i) for i in range(9)]
    assert [s.phrasing for s in first] != [tiny_spec(4, "heldout", i).phrasing for i in range(9)]
    assert sorted(s.phrasing for s in first[:8]) == [4, 9, 11, 15, 19, 22, 23, 27]  # one round: each once


@pytest.mark.integration
@pytest.mark.bwrap
@pytest.mark.parametrize("phrasing", range(len(PHRASINGS)))
def test_every_phrasing_is_graded_correctly(tmp_path, phrasing):
    tiny = family("tiny")
    split = "heldout" if tiny.held_out("node", "out.txt", phrasing) else "train"
    spec = TinySpec(family="tiny", split=split, index=phrasing, word="node", file="out.txt", phrasing=phrasing)
    task = write_tiny_task(tmp_path / spec.task_id, spec)
    assert '"node"' in task.instruction and '"out.txt"' in task.instruction
    verify_task(task)  # raises unless gold resolves and the untouched workspace does not


def test_composed_family_holds_out_new_combinations_of_familiar_parts():
    composed = family("tiny-composed")
    train, heldout = composed.combinations("train"), composed.combinations("heldout")
    assert len(train) + len(heldout) == len(composed.templates) == 160 and not set(train) & set(heldout)
    assert (len(train), len(heldout)) == (112, 48)  # room for the learning test: 24 steps x 4, then 32 held out
    verbs = {composed.templates[p].split()[0] for _, _, p in train}
    assert {composed.templates[p].split()[0] for _, _, p in heldout} <= verbs  # every held-out verb is trained
    spec = tiny_spec(0, "heldout", 0, "tiny-composed")
    assert spec.instruction == composed.templates[spec.phrasing].format(word="node", file="out.txt")


@pytest.mark.integration
@pytest.mark.bwrap
def test_composed_phrasings_are_graded_correctly(tmp_path):
    for split in ("train", "heldout"):
        spec = tiny_spec(0, split, 0, "tiny-composed")
        task = write_tiny_task(tmp_path / spec.task_id, spec)
        assert task.instruction.strip() == spec.instruction
        verify_task(task)
