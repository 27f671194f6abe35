"""Splitting one step's rows over the data-parallel ranks so that each rank's work is about equal.

A row of ``n`` positions costs about ``n`` (the MLPs, the vocabulary projection) plus ``n²`` scaled
by the attention share (causal attention is quadratic). ``split_rows`` assigns rows greedily,
costliest first, to the rank with the least work so far (the classic longest-processing-time
rule, within 4/3 of the best split), deterministically, so every rank computes the same split
from the same rows. Rows stay whole: a sequence never spans two data-parallel positions (the
ranks of a context-parallel group, ``parallel.cp``, share one position and split its rows'
positions instead). The trainers split whole sequences here and pack each share afterwards
(``rl.pack_tokens``, ``sft.pack_tokens``): a sequence is a finer unit than a packed row, so the
shares come out closer to equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

ATTENTION_WEIGHT = 1.0 / 1024  # n² / 1024: attention costs as much as the rest at ~1k positions


def row_cost(length: int, attention_weight: float = ATTENTION_WEIGHT) -> float:
    """Relative compute of a row of ``length`` positions: linear layers plus causal attention."""
    return float(length) + attention_weight * float(length) ** 2


def split_rows(rows: Sequence[T], world_size: int, lengths: Sequence[int] | None = None) -> list[list[T]]:
    """``world_size`` lists of ``rows`` with balanced cost (module doc); each keeps the rows'
    original order. ``lengths`` defaults to ``len(row)``."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    sizes = [len(row) for row in rows] if lengths is None else list(lengths)  # type: ignore[arg-type]
    order = sorted(range(len(rows)), key=lambda i: (-row_cost(sizes[i]), i))
    loads = [0.0] * world_size
    assigned: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += row_cost(sizes[i])
        assigned[rank].append(i)
    return [[rows[i] for i in sorted(indices)] for indices in assigned]
