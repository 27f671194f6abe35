"""Two ways ``LocalEngine`` runs a model: a lean decoder for Llama/Qwen-style models, and the
generic transformers forward for everything else. (The third, for Llama/Qwen-style decode steps by
default, is ``inference.invariant``; it prefills each prompt with ``LeanDecoder``, whose steps
remain the engine's ``batch_invariant=False`` path.)

Both keep a key/value cache per batch row and expose the same four operations: ``prefill`` a
left-padded batch, ``step`` one token per row, ``repeat`` every row ``n`` times (samples sharing
a prefill), ``select`` a subset of rows (dropping finished ones).

``LeanDecoder`` reuses the model's own modules (embeddings, norms, projections, MLP or MoE block,
rotary embedding, LM head) and only replaces the glue between them: no per-step mask factory,
no output dataclasses, keys/values written into a preallocated buffer that doubles when full, and
grouped-query attention through ``scaled_dot_product_attention(enable_gqa=True)`` instead of
materialising repeated keys. At a few million parameters that glue is most of the step time. It
is exact to the same float32 arithmetic up to summation order (tests compare it with the
transformers forward). ``HFDecoder`` calls ``model(...)`` with a transformers cache whose layers
grow in place; it serves every other architecture (DeepSeek-V3's latent attention, for one).
"""

from __future__ import annotations

import sys

import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from opencomposer.model.loading import cache_argument

LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral")


def lean_supported(model: torch.nn.Module) -> bool:
    """True when the model has the Llama/Qwen layout the lean decoder re-wires."""
    config = model.config
    if config.model_type not in LEAN_MODEL_TYPES:
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return False
    attn = layers[0].self_attn
    return all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling"))


class _KV:
    """Keys and values of one layer, ``[rows, kv_heads, capacity, head_dim]``, filled to ``length``."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            capacity = max(end, 2 * (self.k.shape[2] if self.k is not None else 0), 64)
            new_k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
            if self.length:
                new_k[:, :, : self.length] = self.k[:, :, : self.length]
                new_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def repeat(self, n: int) -> None:
        self.k = self.k.repeat_interleave(n, dim=0)
        self.v = self.v.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        self.k = self.k[rows]
        self.v = self.v[rows]


class LeanDecoder:
    """Prefill and decode for Llama/Qwen-style models without the transformers glue."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        attn_module = sys.modules[type(self.layers[0].self_attn).__module__]
        self.apply_rotary = attn_module.apply_rotary_pos_emb
        self.head_dim = self.layers[0].self_attn.head_dim
        self.scaling = self.layers[0].self_attn.scaling
        self.cache = [_KV() for _ in self.layers]
        self.key_mask: torch.Tensor | None = None  # [rows, length] bool, False on left padding
        self.keep_hidden = False  # keep every position's final-norm hidden state in ``hidden``
        self.hidden: torch.Tensor | None = None  # [rows, T, H] of the last forward, when kept

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run ``input_ids`` [rows, T] (left-padded, ``mask`` 1 on real tokens); logits of the last position."""
        valid = mask.bool()
        width = input_ids.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=input_ids.device).tril()
        attend = causal[None] & valid[:, None, :]
        attend |= torch.eye(width, dtype=torch.bool, device=input_ids.device)[None]  # pad rows see themselves
        self.key_mask = valid
        return self._forward(input_ids, positions, attend[:, None], last_only=True)

    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``token_ids`` [rows, 1]); logits [rows, 1, V]."""
        ones = torch.ones(self.key_mask.shape[0], 1, dtype=torch.bool, device=self.key_mask.device)
        self.key_mask = torch.cat([self.key_mask, ones], dim=1)
        return self._forward(token_ids, positions, self.key_mask[:, None, None, :], last_only=False)

    def repeat(self, n: int) -> None:
        for kv in self.cache:
            kv.repeat(n)
        self.key_mask = self.key_mask.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        for kv in self.cache:
            kv.select(rows)
        self.key_mask = self.key_mask[rows]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, last_only: bool):
        hidden = self.inner.embed_tokens(ids)  # [rows, T, H]
        cos, sin = self.inner.rotary_emb(hidden, positions)
        rows, width, _ = hidden.shape
        for layer, kv in zip(self.layers, self.cache):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(rows, width, -1, self.head_dim)
            k = attn.k_proj(x).view(rows, width, -1, self.head_dim)
            v = attn.v_proj(x).view(rows, width, -1, self.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            keys, values = kv.append(k, v)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=self.scaling,
                                                 enable_gqa=True)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(rows, width, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        if self.keep_hidden:  # computed apart, so the logits below are those of the path without it
            self.hidden = self.inner.norm(hidden)
        if last_only:
            hidden = hidden[:, -1:]
        return self.model.lm_head(self.inner.norm(hidden))


class _GrowingLayer(DynamicLayer):
    """A transformers cache layer that writes into a doubling buffer instead of re-concatenating."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.kv = _KV()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.kv.append(key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.kv.length if self.is_initialized else 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized and self.kv.length:
            self.kv.repeat(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self.kv.length:
            self.kv.select(indices)


class HFDecoder:
    """Prefill and decode through the model's own transformers forward (any architecture)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache_argument = cache_argument(model)  # "cache", or "past_key_values" in older transformers
        self.cache = DynamicCache(config=model.config)
        self.cache.layers = [_GrowingLayer() for _ in self.cache.layers]
        self.mask: torch.Tensor | None = None  # [rows, length] long

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = mask
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         **{self.cache_argument: self.cache}, use_cache=True, logits_to_keep=1)
        return out.logits

    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=token_ids, attention_mask=self.mask, position_ids=positions,
                         **{self.cache_argument: self.cache}, use_cache=True)
        return out.logits

    def repeat(self, n: int) -> None:
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
