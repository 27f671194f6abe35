"""The paged key/value cache of the batch-invariant decoder (``inference.invariant.PagedCache``)
and its attention (``planned_attention``): a query's result is the same bits whichever rows share
its blocks and tiles, and agrees with ``scaled_dot_product_attention``; ``repeat`` shares a
prompt's full blocks and copies the rest; ``row_prefix`` gives back what was loaded and written."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from opencomposer.inference.invariant import BLOCK, SHARED_ROWS, PagedCache, planned_attention

HEADS, KV_HEADS, DIM = 4, 2, 16


def _cache(lengths: list[int], n: int, seed: int) -> tuple[PagedCache, list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    keys = [torch.randn(KV_HEADS, length, DIM, generator=generator) for length in lengths]
    values = [torch.randn(KV_HEADS, length, DIM, generator=generator) for length in lengths]
    cache = PagedCache([[k] for k in keys], [[v] for v in values])
    cache.repeat(n)
    return cache, keys, values


def _attend(cache: PagedCache, q: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One query per row (``q`` [rows, heads, D]) over the row's first ``lengths[r]`` keys."""
    rows = torch.arange(q.shape[0])
    plan = cache.plan(rows, lengths)
    return planned_attention(q, plan, cache.shared_kv(0, plan), cache.own_kv(0, plan), DIM**-0.5)


def test_a_query_gets_the_same_bits_whoever_shares_its_blocks():
    generator = torch.Generator().manual_seed(3)
    prompt = 3 * BLOCK + 10  # three shared full blocks and a partial one
    q = torch.randn(HEADS, DIM, generator=generator)
    alone, keys, values = _cache([prompt], 1, seed=0)
    reference = _attend(alone, q[None], torch.tensor([prompt]))[0]
    for others, n, slot in [([], SHARED_ROWS, 5), ([70, 2 * BLOCK], 3, 1), ([9], 2 * SHARED_ROWS + 1, 12)]:
        other_keys = [torch.randn(KV_HEADS, length, DIM, generator=generator) for length in others]
        other_values = [torch.randn(KV_HEADS, length, DIM, generator=generator) for length in others]
        fresh = PagedCache([[k] for k in [*other_keys, keys[0]]], [[v] for v in [*other_values, values[0]]])
        fresh.repeat(n)
        rows = fresh.table.shape[0]
        queries = torch.randn(rows, HEADS, DIM, generator=generator)
        # the other rows' queries sit one past their prompts (an unwritten, zero key), as when decoding
        lengths = torch.tensor([length + 1 for length in others for _ in range(n)] + [prompt] * n)
        mine = len(others) * n + slot
        queries[mine] = q
        assert torch.equal(_attend(fresh, queries, lengths)[mine], reference), (others, n, slot)
    expected = F.scaled_dot_product_attention(q[None, :, None], keys[0][None], values[0][None],
                                              enable_gqa=True)[0, :, 0]
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-5)


def test_repeat_shares_full_blocks_and_rows_keep_what_they_wrote():
    lengths = [2 * BLOCK, BLOCK + 5]
    cache, keys, values = _cache(lengths, 3, seed=1)
    table = cache.table
    assert torch.equal(table[0, :2], table[1, :2]) and torch.equal(table[3, :1], table[5, :1])  # shared
    assert cache.k[0].shape[0] == 3  # one copy of each full block, whatever n
    for r, length in enumerate(lengths):
        got_k, got_v = cache.row_prefix(3 * r + 2, length)
        assert torch.equal(got_k[0], keys[r]) and torch.equal(got_v[0], values[r])
    rows, positions = torch.tensor([0, 4]), torch.tensor([2 * BLOCK + 70, BLOCK + 5])
    index = cache.slots(rows, positions)  # grows the own caches to two blocks
    new_k, new_v = torch.randn(2, KV_HEADS, DIM), torch.randn(2, KV_HEADS, DIM)
    cache.write(0, rows, index, new_k, new_v)
    cache.select(torch.tensor([4, 0]))
    got_k, got_v = cache.row_prefix(0, BLOCK + 6)
    assert torch.equal(got_k[0][:, : BLOCK + 5], keys[1]) and torch.equal(got_k[0][:, -1], new_k[1])
    got_k, got_v = cache.row_prefix(1, 2 * BLOCK + 71)
    assert torch.equal(got_v[0][:, : 2 * BLOCK], values[0]) and torch.equal(got_v[0][:, -1], new_v[0])
    assert not got_v[0][:, 2 * BLOCK : -1].any()  # unwritten slots are zeros
