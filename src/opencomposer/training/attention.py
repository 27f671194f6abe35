"""Attention for packed rows: each document of a row attends causally to itself only, at the cost
of its own length squared.

A packed row (``training.packing.pack_rows``) holds several segments whose position ids restart at
0. transformers reads such rows as packed too, but builds a dense ``[rows, 1, T, T]`` mask for its
``sdpa`` and ``eager`` kernels: every layer then computes all T² scores of the row and masks most
of them away, so a row of 4,096 positions packed from sixteen of 256 costs sixteen times the
attention of the sixteen rows alone, and the padding that packing saved in the linear layers is
spent again (``benchmarks/packing.py`` measured it on this machine). ``packed_attention`` switches a
model to ``opencomposer_packed`` instead (registered with transformers' ``AttentionInterface``;
the model's ``config._attn_implementation`` is restored on exit), which runs
``scaled_dot_product_attention`` with ``is_causal`` on each document's slice, the way variable-length
flash attention does on GPUs: Σ nᵢ² scores, no mask built. transformers builds no mask for an
implementation it does not know, so nothing else changes. Only ``sdpa`` and ``eager`` are replaced
(``REPLACED``); a model on flash attention keeps it (its variable-length kernels read the packed
position ids themselves). The switch is ``model.attention.attention_implementation``, which a
copy taken mid-forward can undo (``model.attention.restore_attention``).

Document boundaries are where a row's position ids do not continue by one (transformers' own
rule, ``distributed.context.document_ids``); right padding continues the last document's ids, so it
rides along with it (causal: no real token sees it). A forward with a cache (the shared-prefix
path, the sampler) never runs here: packed batches go through the model in one cache-free call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

PACKED_ATTENTION = "opencomposer_packed"
"""The transformers attention implementation name that ``packed_attention`` switches a model to."""

_SPANS: contextvars.ContextVar[list[list[tuple[int, int]]] | None] = contextvars.ContextVar(
    "opencomposer_packed_spans", default=None)


def document_spans(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row of ``position_ids`` ``[rows, T]``, the ``(start, end)`` of each document, in order."""
    ids = position_ids.detach().cpu()
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1] + 1
    spans = []
    for row in starts:
        edges = row.nonzero().flatten().tolist() + [len(row)]
        spans.append(list(zip(edges[:-1], edges[1:], strict=True)))
    return spans


def packed_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The transformers attention function ``opencomposer_packed`` (the ``sdpa`` contract: queries
    ``[B, H, T, D]``, keys and values ``[B, H_kv, T, D]``; returns ``[B, T, H, D_v]``)."""
    spans = _SPANS.get()
    if spans is None:
        raise RuntimeError(f"attention implementation {PACKED_ATTENTION!r} runs only inside packed_attention(...)")
    if kwargs.get("sliding_window"):
        raise NotImplementedError("packed attention: sliding-window layers are not supported")
    rows, _, length, _ = query.shape
    if key.shape[2] != length or len(spans) != rows or any(row[-1][1] != length for row in spans):
        raise RuntimeError(f"packed attention: {rows} rows of {length} queries and {key.shape[2]} keys, but the "
                           f"documents were given for {len(spans)} rows of {spans[0][-1][1] if spans else 0}")
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    for b, row in enumerate(spans):
        pieces = [F.scaled_dot_product_attention(query[b : b + 1, :, s:e], key[b : b + 1, :, s:e],
                                                 value[b : b + 1, :, s:e], dropout_p=dropout, is_causal=True,
                                                 scale=scaling, enable_gqa=gqa)
                  for s, e in row]
        outputs.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    return torch.cat(outputs, dim=0).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)


REPLACED = ("sdpa", "eager")
"""The implementations ``packed_attention`` stands in for: those for which transformers would build
a dense mask. Any other (flash attention's variable-length kernels, which read packed position
ids themselves, or a custom one) is left as it is."""


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module, position_ids: torch.Tensor) -> Iterator[None]:
    """Run ``model``'s cache-free forwards inside with per-document attention over the rows whose
    position ids are ``position_ids`` ``[rows, T]`` (module doc), when the model attends with
    ``sdpa`` or ``eager``; otherwise leave its own implementation on."""
    from opencomposer.model.attention import attention_implementation

    config = getattr(model, "config", None)
    if config is None or config._attn_implementation not in REPLACED:
        yield
        return
    _register()
    token = _SPANS.set(document_spans(position_ids))
    try:
        with attention_implementation(model, PACKED_ATTENTION):
            yield
    finally:
        _SPANS.reset(token)
