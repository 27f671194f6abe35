"""From episodes to ``TrainBatch``es: exact token ids, model-token mask, one advantage per episode.

Token in, token out (docs/architecture.md, "Principles"): a row is one ``Segment`` of one episode, its ids
exactly ``segment.token_ids()`` (the prompt the engine saw, every sampled turn, every tool-output
id the environment appended). Next-token prediction shifts by one: a row of T context tokens
gives T-1 positions whose inputs are ``ids[:-1]`` and targets ``ids[1:]``. The loss mask is 1 on
targets the model sampled (thinking, tool calls, final messages, summaries) and 0 on prompts,
tool outputs and padding. Every model token of an episode carries the episode's advantage, in
every segment of a self-summary chain (report §4.1, §5: "the final reward applies to every model
token in the chain"). Sampler logprobs travel with the targets they scored, and so does the policy
version that sampled each target (``versions``, -1 on tokens the model did not sample): with
in-flight weight updates one episode, even one turn, can span versions, and the trainer measures
each token's staleness against the version it trains. For MoE policies the sampler's routes
travel too, aligned with the *inputs* (``routes``: the experts the token at each input position was
routed to, -1 where no engine call ran it), for the trainer to replay (``model.routing``).

By default each segment is one batch row, right-padded; rows are sorted by length and cut into
micro-batches of at most ``max_tokens`` padded positions; right padding needs no attention mask
(causal attention never looks forward, and padded targets carry no loss). The forward pass
(``training.forward``) then computes the prefix that all rows of a micro-batch share (the system
prompt and tool list) once.

**Sequence packing** (``pack_rows``; ``rl.pack_tokens``, ``sft.pack_tokens``): several segments
share one batch row, first-fit by decreasing length into rows of at most ``pack_tokens``
positions, so a step of mixed lengths pads far less. Each segment keeps its own position ids
(restarting at 0), from which the forward attends inside each segment only
(``training.attention.packed_attention``; ``distributed.context.document_ids`` under context
parallelism), so every token's log-probability is the one it has in a row of its own
(``tests/training/test_sequence_packing.py``). ``segment_ids`` numbers the segments of a row;
``episode_ids``, advantages and the per-token arrays stay per segment. A packed micro-batch runs
without the shared-prefix forward (its rows share no prefix beyond their first segment).

This module builds tensors only; it runs no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from opencomposer.types import Episode, TrainBatch


@dataclass
class SequenceRow:
    """One segment of one episode, ready to collate. Arrays are ``[T - 1]``, aligned with targets."""

    episode: int  # index of the episode in the step's list
    input_ids: np.ndarray  # int64, ids[:-1]
    target_ids: np.ndarray  # int64, ids[1:]
    loss_mask: np.ndarray  # bool, the target was sampled by the model
    sampler_logprobs: np.ndarray  # float32, the sampler's log-prob of each model target (0 elsewhere)
    advantage: float = 0.0
    ref_logprobs: np.ndarray | None = None  # float32, log π_ref(target), filled by the reference forward
    versions: np.ndarray | None = None  # int64, policy version that sampled each model target (-1 elsewhere)
    routes: np.ndarray | None = None  # int32 [T - 1, moe_layers, top_k], route of each input (-1: unknown)
    episode_tokens: int = 0  # model tokens of its whole episode, every segment (0: this row's own)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def model_tokens(self) -> int:
        return int(self.loss_mask.sum())


def segment_arrays(segment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids [T], model mask [T], sampler logprobs [T]) of one segment, in context order."""
    ids = np.asarray(segment.token_ids(), dtype=np.int64)
    mask = np.asarray(segment.loss_mask(), dtype=bool)
    logprobs = np.zeros(len(ids), dtype=np.float32)
    position = len(segment.prompt_ids)
    for turn in segment.turns:
        if len(turn.logprobs) != len(turn.token_ids):
            raise ValueError(f"turn has {len(turn.token_ids)} token ids but {len(turn.logprobs)} logprobs")
        logprobs[position : position + len(turn.token_ids)] = turn.logprobs
        position += len(turn.token_ids) + len(turn.observation_ids)
    return ids, mask, logprobs


def segment_versions(segment) -> np.ndarray:
    """[T] int64: the policy version that sampled each token of one segment, -1 on tokens the model
    did not sample (prompt, tool outputs), in context order."""
    versions = [-1] * len(segment.prompt_ids)
    for turn in segment.turns:
        versions += turn.versions()
        versions += [-1] * len(turn.observation_ids)
    return np.asarray(versions, dtype=np.int64)


def episode_rows(episodes: list[Episode], advantages: list[float | None] | None = None) -> list[SequenceRow]:
    """One row per segment with at least one model token; episodes whose advantage is None are
    left out (infrastructure failures, dropped groups). Without ``advantages`` every episode is
    kept with advantage 0 (for the reference forward, which comes before the advantages)."""
    rows = []
    for index, episode in enumerate(episodes):
        advantage = 0.0 if advantages is None else advantages[index]
        if advantage is None:
            continue
        for segment in episode.segments:
            ids, mask, logprobs = segment_arrays(segment)
            if len(ids) < 2 or not mask[1:].any():
                continue
            versions = segment_versions(segment)
            routes = segment.routes()  # [T, layers, k] or None
            rows.append(
                SequenceRow(
                    episode=index,
                    input_ids=ids[:-1],
                    target_ids=ids[1:],
                    loss_mask=mask[1:],
                    sampler_logprobs=logprobs[1:],
                    advantage=float(advantage),
                    versions=versions[1:],
                    routes=None if routes is None else routes[:-1],
                )
            )
    totals: dict[int, int] = {}
    for row in rows:
        totals[row.episode] = totals.get(row.episode, 0) + row.model_tokens
    for row in rows:  # a self-summary chain is one sequence for the losses that count sequences
        row.episode_tokens = totals[row.episode]
    return rows


@dataclass
class PackedRow:
    """Several ``SequenceRow``s in one batch row, in order (``pack_rows``)."""

    parts: list[SequenceRow]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    @property
    def model_tokens(self) -> int:
        return sum(part.model_tokens for part in self.parts)


Row = SequenceRow | PackedRow


def row_parts(row: Row) -> list[SequenceRow]:
    """The segments of a batch row: its parts when packed, else the row itself."""
    return row.parts if isinstance(row, PackedRow) else [row]


def pack_rows(rows: list[SequenceRow], max_tokens: int) -> list[PackedRow]:
    """``rows`` packed into rows of at most ``max_tokens`` positions: first fit, longest first (a
    row longer than ``max_tokens`` gets a row of its own). Every row lands in exactly one packed
    row; parts keep the order they arrived in. Deterministic."""
    if max_tokens < 1:
        raise ValueError(f"pack_rows: max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = len(rows[i])
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(max_tokens - n)
    return [PackedRow([rows[i] for i in sorted(members)]) for members in bins]


def padded_positions(rows: list[Row], max_tokens: int, prefix: int = 0) -> tuple[int, int]:
    """``(positions holding a token, positions after padding)`` of ``rows`` cut into micro-batches
    of ``max_tokens`` (``micro_batches``, with its ``prefix``): what packing saves."""
    real = sum(len(row) for row in rows)
    padded = sum(len(chunk) * max(len(row) for row in chunk) for chunk in micro_batches(rows, max_tokens, prefix))
    return real, padded


def micro_batches(rows: list[Row], max_tokens: int, prefix: int = 0) -> list[list[Row]]:
    """Rows sorted by length (longest first) and cut so that each micro-batch's positions stay
    within ``max_tokens`` (a row longer than the budget gets a micro-batch of its own).
    Deterministic. A micro-batch of n rows, the longest L, costs n × L; with ``prefix`` (positions
    that every row shares and the shared-prefix forward computes once, ``common_prefix``) it costs
    prefix + n × (L − prefix) from two rows on, so rows that share a long system prompt go more to
    a micro-batch."""
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i))
    batches: list[list[SequenceRow]] = []
    current: list[SequenceRow] = []
    for i in order:
        row = rows[i]
        width = len(current[0]) if current else len(row)
        count = len(current) + 1
        cost = prefix + count * (width - prefix) if prefix and count > 1 else count * width
        if current and cost > max_tokens:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches


def common_prefix(rows: list[SequenceRow], min_prefix: int) -> int:
    """Leading input positions that every row has the same and no loss target depends on (what
    ``training.forward.shared_prefix_length`` finds in any micro-batch of them), or 0 when that is
    shorter than ``min_prefix``, there are fewer than two rows, or a row is packed or carries
    routes (router replay shares a prefix only where the routes agree too)."""
    if len(rows) < 2 or any(not isinstance(row, SequenceRow) or row.routes is not None for row in rows):
        return 0
    length = min(len(row) for row in rows)
    first = rows[0].input_ids
    for row in rows:
        differs = np.flatnonzero(row.input_ids[:length] != first[:length])
        losses = np.flatnonzero(row.loss_mask[:length])
        length = min(length, differs[0] if len(differs) else length, losses[0] if len(losses) else length)
    length = min(length, min(len(row) for row in rows) - 1)
    return int(length) if length >= min_prefix else 0


def collate(rows: list[Row], pad_id: int, num_episodes: int = 0) -> TrainBatch:
    """Right-pad ``rows`` into one ``TrainBatch`` ``[rows, longest]``.

    ``segment_ids`` numbers the segments of a packed row (``PackedRow``; all zeros without packing),
    and their position ids restart at 0 where each begins; padding continues the last segment's
    position ids and is excluded by ``loss_mask``;
    ``episode_ids`` and ``episode_tokens`` say which episode each token belongs to and how many
    model tokens that episode has over all its segments (rows of one chain may sit in different
    micro-batches);
    ``ref_logprobs`` and ``versions`` (-1 on padding) are set when every row has them; ``routes``
    when any row has them (-1 on padding and on the rows without), which must then all have the
    same MoE layers and top-k.
    """
    if not rows:
        raise ValueError("collate: no rows")
    width = max(len(row) for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    target_ids = torch.full(shape, pad_id, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    advantages = torch.zeros(shape, dtype=torch.float32)
    sampler = torch.zeros(shape, dtype=torch.float32)
    segment_ids = torch.zeros(shape, dtype=torch.long)
    episode_ids = torch.full(shape, -1, dtype=torch.long)
    episode_tokens = torch.zeros(shape, dtype=torch.float32)
    parts = [part for row in rows for part in row_parts(row)]
    with_ref = all(part.ref_logprobs is not None for part in parts)
    ref = torch.zeros(shape, dtype=torch.float32) if with_ref else None
    with_versions = all(part.versions is not None for part in parts)
    versions = torch.full(shape, -1, dtype=torch.long) if with_versions else None
    routes = _route_tensor(rows, width)
    position_ids = torch.arange(width).expand(shape).clone()
    for r, packed in enumerate(rows):
        start = 0
        for s, row in enumerate(row_parts(packed)):
            n = len(row)
            span = slice(start, start + n)
            input_ids[r, span] = torch.from_numpy(row.input_ids)
            target_ids[r, span] = torch.from_numpy(row.target_ids)
            mask = torch.from_numpy(row.loss_mask)
            loss_mask[r, span] = mask
            advantages[r, span] = mask * row.advantage
            sampler[r, span] = torch.from_numpy(row.sampler_logprobs)
            episode_ids[r, span] = row.episode
            episode_tokens[r, span] = float(row.episode_tokens or row.model_tokens)
            segment_ids[r, span] = s
            position_ids[r, start:] = torch.arange(width - start)  # padding continues the last segment
            if ref is not None:
                ref[r, span] = torch.from_numpy(row.ref_logprobs)
            if versions is not None:
                versions[r, span] = torch.from_numpy(row.versions)
            if routes is not None and row.routes is not None:
                routes[r, span] = torch.from_numpy(row.routes)
            start += n
    return TrainBatch(
        input_ids=input_ids,
        target_ids=target_ids,
        loss_mask=loss_mask,
        advantages=advantages,
        sampler_logprobs=sampler,
        position_ids=position_ids,
        segment_ids=segment_ids,
        ref_logprobs=ref,
        versions=versions,
        routes=routes,
        num_episodes=num_episodes or len({part.episode for part in parts}),
        episode_ids=episode_ids,
        episode_tokens=episode_tokens,
    )


def unpack(values: torch.Tensor, rows: list[Row]) -> list[np.ndarray]:
    """Per segment (in ``row_parts`` order, row after row), its positions of ``values``
    ``[rows, width]``: the inverse of ``collate`` for a per-position result."""
    out = []
    for r, packed in enumerate(rows):
        start = 0
        for row in row_parts(packed):
            out.append(values[r, start : start + len(row)].numpy())
            start += len(row)
    return out


def _route_tensor(rows: list[Row], width: int) -> torch.Tensor | None:
    """``[rows, width, moe_layers, top_k]`` int32 filled with -1, when any row has routes."""
    count = len(rows)
    rows = [part for row in rows for part in row_parts(row)]
    shapes = {row.routes.shape[1:] for row in rows if row.routes is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"collate: rows have routes of different [moe_layers, top_k]: {sorted(shapes)}")
    for i, row in enumerate(rows):
        if row.routes is not None and len(row.routes) != len(row):
            raise ValueError(f"collate: row {i} has {len(row)} inputs but routes for {len(row.routes)}")
    return torch.full((count, width, *shapes.pop()), -1, dtype=torch.int32)
