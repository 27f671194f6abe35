"""The progress display: plain lines when stdout is not a terminal, nothing when disabled."""

from __future__ import annotations

import re

import pytest

from opencomposer.training.progress import ProgressBar


def test_without_a_terminal_every_nth_and_the_last_item_print_one_line(capsys):
    with ProgressBar("sft", 5, status="loss {loss:.3f}", every=2) as bar:
        for step in range(1, 6):
            bar.update(step, loss=1.0 / step)
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"\d+ s$", "T s", line) for line in lines] == [
        "sft 2/5  loss 0.500  T s", "sft 4/5  loss 0.250  T s", "sft 5/5  loss 0.200  T s"]


def test_every_item_prints_by_default_and_a_resumed_loop_counts_from_where_it_is(capsys):
    with ProgressBar("rl", 4, status="reward {reward:.2f}", completed=2) as bar:
        bar.update(3, reward=0.5)
        bar.update(4, reward=0.75)
    lines = capsys.readouterr().out.splitlines()
    assert [line.rsplit("  ", 1)[0] for line in lines] == ["rl 3/4  reward 0.50", "rl 4/4  reward 0.75"]


def test_a_disabled_display_prints_nothing(capsys):
    with ProgressBar("pretraining", 3, status="loss {loss:.3f}", enabled=False) as bar:
        for step in range(1, 4):
            bar.update(step, loss=0.1)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="every"):
        ProgressBar("x", 3, every=0)
