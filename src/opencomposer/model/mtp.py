"""Multi-token prediction (MTP) layers on top of any causal LM (docs/recipe.md §3; DeepSeek-V3 §2.2).

MTP layer ``k`` (1-based) predicts the token ``k + 1`` positions ahead. At position ``i`` it reads
the previous depth's hidden state ``h[k-1]_i`` (depth 0: the main model's last hidden state, after
its final norm, which is what the main LM head reads) and the embedding of the token at ``i + k``:

    x_i   = proj(concat(enorm(embed(t[i+k])), hnorm(h[k-1]_i)))      # [2H] -> [H]
    h[k]_i = block(x_i)                                              # one transformer block
    logits = lm_head(norm(h[k]_i))                                   # the main model's head

so the depth-``k`` logits at ``i`` are a guess at the main head's logits at ``i + k``
(``mtp_logits``). The block is a dense pre-norm transformer block (grouped-query attention with
RoPE at the main model's base, SwiGLU MLP) sized from the main config; DeepSeek-V3 uses one of its
own (MoE) decoder layers, a dense block keeps the drafts cheap and the code independent of the
model family. Its final ``norm`` is the block's own (DeepSeek-V3's ``shared_head.norm``); the
embedding table and the output head are the main model's, shared, and the MTP forward reads them
detached (``mtp_logits``), so the MTP losses train the MTP layers only.

**Checkpoints.** ``attach_mtp(model, n)`` adds the layers as ``model.mtp`` and records
``config.opencomposer_mtp_layers = n``, so ``save_pretrained`` writes them under their own keys
(``mtp.layers.K.*``) beside the main weights. Plain ``AutoModelForCausalLM.from_pretrained``
loads such a folder as the main model and skips those keys (a "weights not used" notice); the
project's loader (``model.loading``) calls ``restore_mtp`` to rebuild the layers and load them.
(transformers' own ``num_mtp_layers`` of DeepSeek-V3 configs describes checkpoints that keep their
MTP weights as extra decoder layers, which transformers does not run; it is left alone.)

**Training.** ``mtp_distillation_loss`` is the self-distillation loss of the report: each depth's
distribution at ``i`` is pulled, by KL, onto the detached main-head distribution at ``i + k``.
Positions whose shifted target crosses a document boundary (packed rows) or the end of the row
are left out. Speculative decoding with the depth-1 layer is ``inference.speculative``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

MTP_CONFIG_KEY = "opencomposer_mtp_layers"
"""The model config attribute holding the number of MTP layers (saved in ``config.json``)."""


def mtp_layers(model: nn.Module) -> int:
    """How many MTP layers ``model`` carries (0: none)."""
    stack = getattr(model, "mtp", None)
    return len(stack.layers) if isinstance(stack, MTPStack) else 0


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[..., head_dim]`` for integer ``positions`` (the half-rotation convention)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., head_dim] by the angles whose cos and sin broadcast against it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class MTPBlock(nn.Module):
    """A dense pre-norm transformer block: grouped-query attention with RoPE, SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm = RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, theta: float, attend=None) -> torch.Tensor:
        """``x`` [B, T, H] at ``positions`` [B, T]; attention is causal within each document (a
        document starts where the position id is 0, as in packed rows). ``attend(q, k, v)`` (heads
        first, ``[B, heads, T, D]``) replaces that attention, as context parallelism does."""
        b, t, _ = x.shape
        y = self.attn_norm(x)
        q = self.q_proj(y).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope(positions, self.head_dim, theta, x.dtype)
        q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
        if attend is None:
            document = (positions == 0).cumsum(dim=-1)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            mask = causal[None] & (document[:, :, None] == document[:, None, :])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        else:
            out = attend(q, k, v)
        x = x + self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        y = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class MTPLayer(nn.Module):
    """One depth: combine the previous hidden state with the next token's embedding, one block."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float):
        super().__init__()
        self.enorm = RMSNorm(hidden, eps)
        self.hnorm = RMSNorm(hidden, eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = MTPBlock(hidden, heads, kv_heads, head_dim, intermediate, eps)
        self.norm = RMSNorm(hidden, eps)

    def combine(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, positions: torch.Tensor, theta: float
                ) -> torch.Tensor:
        """The block's output (before ``norm``), ``[B, T, H]``."""
        return self.block(self.combine(hidden, embedded), positions, theta)


def block_sizes(config) -> dict[str, int | float]:
    """The MTP block's sizes, from the main model's config (any Llama/Qwen/DeepSeek-style one)."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    if head_dim % 2:
        head_dim -= 1  # RoPE rotates pairs
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    eps = float(getattr(config, "rms_norm_eps", None) or 1e-6)
    if heads % kv_heads:
        kv_heads = heads
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "intermediate": intermediate, "eps": eps}


class MTPStack(nn.Module):
    """The MTP layers of a model, ``model.mtp.layers[k - 1]`` for depth ``k``."""

    def __init__(self, config, count: int):
        super().__init__()
        sizes = block_sizes(config)
        self.layers = nn.ModuleList(MTPLayer(**sizes) for _ in range(count))


def attach_mtp(model: nn.Module, count: int, seed: int = 0) -> nn.Module:
    """Give ``model`` ``count`` freshly initialised MTP layers (``model.mtp``), on its device and
    in its dtype, and record the count in its config. Initialisation: normal with the config's
    ``initializer_range`` (0.02 by default) for the projections, ones for the norms; the output
    projections of attention and MLP are scaled down by ``sqrt(2)`` so a fresh block starts
    near the identity on the residual stream."""
    if count < 1:
        raise ValueError(f"attach_mtp: count must be >= 1, got {count}")
    if mtp_layers(model):
        raise ValueError(f"attach_mtp: {type(model).__name__} already has {mtp_layers(model)} MTP layers")
    parameter = next(model.parameters())
    std = float(getattr(model.config, "initializer_range", None) or 0.02)
    generator = torch.Generator().manual_seed(seed)
    stack = MTPStack(model.config, count)
    with torch.no_grad():
        for name, p in stack.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                scale = std / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    model.mtp = stack.to(device=parameter.device, dtype=parameter.dtype)
    setattr(model.config, MTP_CONFIG_KEY, count)
    return model


def restore_mtp(model: nn.Module, folder: str | Path) -> nn.Module:
    """Rebuild the MTP layers a checkpoint folder's config names and load their weights from its
    safetensors files (``model.safetensors`` or the shards its index lists)."""
    count = int(getattr(model.config, MTP_CONFIG_KEY, 0) or 0)
    if not count:
        return model
    from safetensors import safe_open

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    state = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith("mtp."):
                    state[key[len("mtp."):]] = f.get_tensor(key)
    delattr(model.config, MTP_CONFIG_KEY)
    attach_mtp(model, count)
    missing, unexpected = model.mtp.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}: config.json names {count} MTP layers but the weights do not match them "
                         f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    return model


def main_hidden(model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor | None = None, **kwargs):
    """The main model's forward with its last hidden state: ``(logits, hidden)``, both ``[B, T, ·]``."""
    out = model(input_ids=input_ids, position_ids=positions, output_hidden_states=True, use_cache=False, **kwargs)
    return out.logits, out.hidden_states[-1]


def rope_base(model: nn.Module) -> float:
    """The RoPE base the main model runs with (the MTP block follows it, long-context phases included)."""
    params = getattr(model.config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(model.config, "rope_theta", None) or 10_000.0)


def mtp_logits(model: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor
               ) -> list[torch.Tensor]:
    """Logits of every MTP depth. ``hidden`` [B, T, H]: the main model's last hidden state for
    inputs ``input_ids`` [B, T] at ``positions`` [B, T]. Depth ``k`` returns ``[B, T - k, V]``:
    row ``i`` predicts the token at ``i + k + 1`` (it read the tokens up to ``i + k``), the guess at
    the main head's row ``i + k``. The trunk (hidden state, embedding table, head) is detached."""
    if not mtp_layers(model):
        raise ValueError(f"{type(model).__name__} has no MTP layers (model.num_mtp_layers)")
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings()
    theta = rope_base(model)
    out = []
    h = hidden.detach()
    for k, layer in enumerate(model.mtp.layers, start=1):
        h = h[:, :-1]  # depth k at row i reads h[k-1]_i and the token at i + k
        tokens = input_ids[:, k:]
        if tokens.shape[1] == 0:
            break
        h = layer(h, F.embedding(tokens, embed), positions[:, : tokens.shape[1]], theta)
        out.append(F.linear(layer.norm(h), head.weight.detach(),
                            head.bias.detach() if head.bias is not None else None))
    return out


def shift_valid(positions: torch.Tensor, k: int, targets: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T - k]`` bool: row ``i`` of depth ``k`` is trained when the tokens ``i+1 .. i+k`` stay in
    ``i``'s document (no position id restarts at 0 there) and, with ``targets`` [B, T] (rows whose
    main distribution is worth matching, such as a demonstration's model-token rows), when row
    ``i + k`` is one of them."""
    t = positions.shape[1]
    valid = torch.ones(positions.shape[0], t - k, dtype=torch.bool, device=positions.device)
    for j in range(1, k + 1):
        valid &= positions[:, j : t - k + j] != 0
    if targets is not None:
        valid &= targets[:, k:].bool()
    return valid


def mtp_distillation_loss(model: nn.Module, logits: torch.Tensor, hidden: torch.Tensor, input_ids: torch.Tensor,
                          positions: torch.Tensor, targets: torch.Tensor | None = None,
                          reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
                          ) -> tuple[torch.Tensor, dict[str, float]]:
    """Self-distillation of every MTP depth onto the main head (module doc): the mean over depths
    and valid rows of ``KL(p_main(· | row i + k) || p_mtp_k(· | row i))``, the main distribution
    detached. ``logits``/``hidden``: the main forward on ``input_ids`` at ``positions``; ``targets``:
    see ``shift_valid``. Metrics:
    ``mtp_kl`` (the loss), ``mtp_kl_k`` per depth and ``mtp_top1_k`` (the share of rows whose
    argmax agrees with the main head's: the greedy acceptance rate of speculative decoding).

    ``reduce``: for a data-parallel rank, the sum over the ranks of a ``[depths, 3]`` float64
    tensor (KL sum, argmax agreements, valid rows per depth); the loss is then this rank's KL sum
    over the valid rows of *every* rank (the ranks' losses add up to the whole batch's), and the
    metrics are the whole batch's."""
    target = torch.log_softmax(logits.detach().float(), dim=-1)
    depths = mtp_logits(model, hidden, input_ids, positions)
    sums, stats = [], []
    for k, draft in enumerate(depths, start=1):
        valid = shift_valid(positions, k, targets)
        p_log = target[:, k:][valid]  # [N, V]
        q_log = torch.log_softmax(draft.float(), dim=-1)[valid]
        kl = (p_log.exp() * (p_log - q_log)).sum(-1).sum()
        sums.append(kl)
        stats.append([float(kl.detach()), float((p_log.argmax(-1) == q_log.argmax(-1)).sum()), float(len(p_log))])
    every = torch.tensor(stats, dtype=torch.float64).reshape(len(depths), 3)
    if reduce is not None:
        every = reduce(every)
    total, metrics, overall = logits.new_zeros((), dtype=torch.float), {}, 0.0
    for k, (kl, (kl_sum, agreed, rows)) in enumerate(zip(sums, every.tolist(), strict=True), start=1):
        if not rows:
            continue
        total = total + kl / rows / len(depths)
        metrics[f"mtp_kl_{k}"] = kl_sum / rows
        metrics[f"mtp_top1_{k}"] = agreed / rows
        overall += kl_sum / rows / len(depths)
    metrics["mtp_kl"] = overall
    return total, metrics
