"""``training.metrics.merge_ranks``, the one merge of every trainer's metrics across ranks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from opencomposer.distributed.runtime import World
from opencomposer.training.metrics import merge_ranks


@dataclass
class TwoRanks:
    """A world of two ranks whose gather returns this rank's metrics and ``other``'s."""

    other: dict
    distributed: bool = True

    def gather(self, obj):
        return [obj, self.other]


def test_each_rule_combines_the_ranks_values():
    mine = {"loss": 1.0, "aux_loss": 0.2, "ratio_max": 3.0, "ratio_min": 0.5, "tokens": 7, "ratios": [1],
            "counts": torch.tensor([1, 2])}
    other = {"loss": 2.0, "aux_loss": 0.4, "ratio_max": 4.0, "ratio_min": 0.1, "tokens": 9, "ratios": [2, 3],
             "counts": torch.tensor([3, 4])}
    rules = {"loss": "sum", "aux_loss": "mean", "ratio_max": "max", "ratio_min": "min", "ratios": "concat",
             "counts": "sum"}
    merged = merge_ranks(TwoRanks(other), mine, rules)
    assert merged["loss"] == 3.0 and merged["aux_loss"] == pytest.approx(0.3)
    assert (merged["ratio_max"], merged["ratio_min"], merged["tokens"]) == (4.0, 0.1, 7)  # tokens: rank 0's
    assert merged["ratios"] == [1, 2, 3] and merged["counts"].tolist() == [4, 6]
    assert merge_ranks(TwoRanks({"tokens": 9}), {"tokens": 7}, default="sum") == {"tokens": 16}


def test_a_name_only_some_ranks_report_is_merged_over_those():
    """A rank with no rows of an RL step has no metric sums; the step's row is the other ranks'."""
    merged = merge_ranks(TwoRanks({"loss": 2.0, "tokens": 9.0, "ratio_max": 1.5}), {"loss": 0.0},
                         {"ratio_max": "max"}, default="sum")
    assert merged == {"loss": 2.0, "tokens": 9.0, "ratio_max": 1.5}


def test_one_process_gets_its_metrics_and_a_bad_rule_is_named():
    assert merge_ranks(World(), {"loss": 1.5}, {"loss": "sum"}) == {"loss": 1.5}
    with pytest.raises(ValueError, match="unknown rule 'median' for 'loss'"):
        merge_ranks(TwoRanks({"loss": 1.0}), {"loss": 2.0}, {"loss": "median"})
