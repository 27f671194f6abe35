"""Capture which experts an MoE model routes every token to.

The report's router replay (docs/recipe.md §6) needs, for every sampled token and every MoE layer, the
expert indices the inference engine chose. ``RouteRecorder`` hooks the router modules of a
transformers MoE model (Qwen3-MoE's ``Qwen3MoeTopKRouter``, DeepSeek-V3's ``DeepseekV3TopkRouter``
and any router that returns ``(logits, weights, indices)``) and hands back
``[tokens, moe_layers, top_k]`` index arrays.

Indices are sorted ascending per token: the set of experts is what replay needs, and DeepSeek-V3's
top-k is unsorted, so a canonical order makes routes comparable across engines.

``RouterReplay`` is the trainer's side (report §6.2): a forward hook on the same routers that
makes them select recorded experts while the gate weights stay the trainer's own, with an optional
confidence filter. ``training.forward.token_logprobs`` uses it when a batch carries routes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The router modules of ``model`` in layer order (empty for dense models)."""
    return [
        module
        for module in model.modules()
        if type(module).__name__.lower().endswith(("topkrouter", "topk_router")) and hasattr(module, "top_k")
    ]


def num_experts(model: nn.Module) -> int:
    routers = moe_routers(model)
    return int(routers[0].num_experts) if routers else 0


def route_dtype(model: nn.Module) -> np.dtype:
    """uint8 when every expert index fits in a byte, else uint16."""
    return np.dtype(np.uint8) if num_experts(model) <= 256 else np.dtype(np.uint16)


class RouteRecorder:
    """Context manager recording the top-k expert indices of every router call.

    After a forward pass over ``[batch, seq]`` tokens, ``take(batch, seq)`` returns an int64 tensor
    ``[batch, seq, moe_layers, top_k]`` and clears the record. A dense model records nothing and
    ``take`` returns None.
    """

    def __init__(self, model: nn.Module):
        self.routers = moe_routers(model)
        self._handles: list = []
        self._record: list[torch.Tensor] = []

    def __enter__(self) -> RouteRecorder:
        for router in self.routers:
            self._handles.append(router.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._record.clear()

    def _hook(self, module: nn.Module, inputs, output) -> None:
        self.record(output[2] if isinstance(output, tuple) else output)

    def record(self, indices: torch.Tensor) -> None:
        """Add one router call's expert indices [tokens, top_k]; for code that routes without
        calling the router module (``inference.invariant``), in layer order like the hooks."""
        self._record.append(indices.detach())

    def clear(self) -> None:
        """Drop what was recorded (routes nobody asked for, such as a prompt's)."""
        self._record.clear()

    def take(self, batch: int, seq: int) -> torch.Tensor | None:
        if not self.routers:
            return None
        if len(self._record) != len(self.routers):
            raise RuntimeError(
                f"expected one router call per MoE layer ({len(self.routers)}), saw {len(self._record)}"
            )
        routes = torch.stack(self._record, dim=1)  # [batch*seq, layers, top_k]
        self._record.clear()
        routes, _ = routes.sort(dim=-1)
        return routes.view(batch, seq, len(self.routers), -1)


# ----------------------------------------------------------------------------------------------
# Router replay (report §6.2; R3, "Stabilizing MoE RL by aligning training and inference routers",
# arXiv 2510.11370)

ReplayMode = Literal["replay", "filtered"]


def _softmax_gates(router: nn.Module, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE: softmax over every expert, top-k on it."""
    scores = torch.softmax(logits, dim=-1, dtype=torch.float)
    return scores, scores


def _softmax_weights(router: nn.Module, scores: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    weights = scores.gather(1, indices)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype)


def _sigmoid_gates(router: nn.Module, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3: sigmoid affinities; the choice adds the load-balancing bias and keeps the
    ``topk_group`` groups whose two best biased scores sum highest (-inf elsewhere)."""
    scores = logits.sigmoid()
    choice = scores + router.e_score_correction_bias
    per_group = router.num_experts // router.num_group
    group_scores = choice.view(-1, router.num_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
    groups = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    allowed = allowed.unsqueeze(-1).expand(-1, router.num_group, per_group).reshape(-1, router.num_experts)
    return scores, choice.masked_fill(~allowed, float("-inf"))


def _sigmoid_weights(router: nn.Module, scores: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    weights = scores.gather(1, indices)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


# Router class -> (gate scores and selection scores from the router logits, gate weights at chosen
# experts). Each pair restates the transformers router's own formula, so that replaying the
# router's own choice gives its own weights (tests/model/test_router_replay.py).
REPLAY_ROUTERS = {
    "Qwen3MoeTopKRouter": (_softmax_gates, _softmax_weights),
    "DeepseekV3TopkRouter": (_sigmoid_gates, _sigmoid_weights),
}


def replayable_routers(model: nn.Module) -> list[nn.Module]:
    """The routers of ``model``; ValueError unless it is an MoE model whose routers
    ``RouterReplay`` knows (``REPLAY_ROUTERS``)."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"router replay needs an MoE model; {type(model).__name__} has no routers")
    unknown = sorted({type(r).__name__ for r in routers} - set(REPLAY_ROUTERS))
    if unknown:
        raise ValueError(f"router replay does not know the routers {unknown}; supported: {sorted(REPLAY_ROUTERS)}")
    return routers


@dataclass
class ReplayStats:
    """Counts over the router calls of a replay, per MoE layer (``[moe_layers]`` int64 tensors):
    replayed (token, column) entries with a known route, those the filter replaced, and those the
    trainer's own top-k also chose."""

    replayed: torch.Tensor
    replaced: torch.Tensor
    agreed: torch.Tensor

    @classmethod
    def zeros(cls, layers: int) -> ReplayStats:
        return cls(*(torch.zeros(layers, dtype=torch.long) for _ in range(3)))

    def metrics(self) -> dict[str, float]:
        """``router_replay_replace_rate`` (replaced / replayed) and ``router_replay_agreement``
        (agreed / replayed), over every layer; empty when nothing was replayed."""
        replayed = int(self.replayed.sum())
        if not replayed:
            return {}
        return {
            "router_replay_replace_rate": int(self.replaced.sum()) / replayed,
            "router_replay_agreement": int(self.agreed.sum()) / replayed,
        }

    def agreement_per_layer(self) -> list[float]:
        """Share of the replayed experts that the trainer's own top-k chose, per MoE layer."""
        return [a / r if r else float("nan") for a, r in zip(self.agreed.tolist(), self.replayed.tolist(), strict=True)]


class RouterReplay:
    """Make the routers of ``model`` select the experts the sampler recorded (report §6.2).

    ``with replay.routes(routes): model(...)`` runs one forward in which every MoE layer ``l``
    selects, for the token at ``[b, s]``, the experts ``routes[b, s, l]`` (``routes`` is
    ``[batch, seq, moe_layers, top_k]``, the shape of the forward's ``input_ids`` plus the route,
    -1 on tokens whose route is unknown). The **gate weights are the trainer's own**: its router
    scores at the replayed experts, normalised by the router's own rule, so the router weight keeps
    its gradient; only the discrete choice comes from the sampler. Columns keep their order (the
    k-th weight belongs to the k-th replayed expert). A token whose route is unknown (-1: padding, a
    tool output no engine call ran) is routed by the trainer itself, exactly as without replay.

    ``mode = "filtered"`` adds the **confidence filter**: a replayed expert whose trainer gate
    score (softmax probability, or DeepSeek-V3's sigmoid affinity without the bias) is below
    ``threshold × the smallest gate score among the trainer's own top-k`` is implausible for the
    trainer, and is replaced by the trainer's best own candidate (its top-k in its own order, by
    its own selection rule: bias and group limits included) that is not already selected, in the
    same column. Every selected expert then scores at least that floor. The report gives no value;
    ``rl.router_replay_threshold`` documents ours.

    ``stats`` counts, per layer, the replayed entries, the replaced ones and those the trainer's
    own top-k agreed with (``ReplayStats.metrics``). Supported routers: ``REPLAY_ROUTERS``.
    """

    def __init__(self, model: nn.Module, mode: ReplayMode = "replay", threshold: float = 0.5):
        if mode not in ("replay", "filtered"):
            raise ValueError(f"router replay mode {mode!r}: expected 'replay' or 'filtered'")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"router replay threshold {threshold}: expected a ratio in (0, 1]")
        self.routers = replayable_routers(model)
        self.mode = mode
        self.threshold = threshold
        self.top_k = int(self.routers[0].top_k)
        self.num_experts = int(self.routers[0].num_experts)
        self._layer = {id(router): layer for layer, router in enumerate(self.routers)}
        self._routes: torch.Tensor | None = None
        self.stats = ReplayStats.zeros(len(self.routers))

    def check(self, routes: torch.Tensor) -> None:
        """Raise ValueError unless ``routes`` is ``[batch, seq, moe_layers, top_k]`` of expert
        indices of this model, -1 only on whole tokens."""
        expected = (len(self.routers), self.top_k)
        if routes.dim() != 4 or tuple(routes.shape[2:]) != expected:
            raise ValueError(
                f"routes: shape {tuple(routes.shape)}, expected [batch, seq, {expected[0]}, {expected[1]}] "
                f"(the model's MoE layers and top-k)"
            )
        if routes.numel() and (int(routes.min()) < -1 or int(routes.max()) >= self.num_experts):
            raise ValueError(
                f"routes: expert indices in [{int(routes.min())}, {int(routes.max())}], expected -1 (unknown) "
                f"or [0, {self.num_experts})"
            )
        known = routes >= 0
        if not torch.equal(known.all(-1), known.any(-1)):
            raise ValueError("routes: a token has some experts known and others -1; a route is known whole or not")

    @contextmanager
    def routes(self, routes: torch.Tensor) -> Iterator[RouterReplay]:
        """Replay ``routes`` ``[batch, seq, moe_layers, top_k]`` in the forward(s) run inside."""
        self.check(routes)
        self._routes = routes
        handles = [router.register_forward_hook(self._hook) for router in self.routers]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self._routes = None

    def metrics(self) -> dict[str, float]:
        return self.stats.metrics()

    def _hook(self, router: nn.Module, inputs, output):
        logits, own_weights, own_indices = output
        layer = self._layer[id(router)]
        routes = self._routes[:, :, layer].reshape(-1, self.top_k).to(logits.device, torch.long)  # [tokens, k]
        if routes.shape[0] != logits.shape[0]:
            raise RuntimeError(
                f"router replay: MoE layer {layer} routed {logits.shape[0]} tokens, but the routes cover "
                f"{routes.shape[0]} ({tuple(self._routes.shape[:2])}); give the routes of this forward's input_ids"
            )
        gates, weights_of = REPLAY_ROUTERS[type(router).__name__]
        scores, choice = gates(router, logits)  # [tokens, E] each
        known = routes[:, 0] >= 0  # [tokens]
        chosen = routes.clamp(min=0)
        with torch.no_grad():
            own = choice.topk(self.top_k, dim=-1).indices  # [tokens, k], best first
            agreed = (chosen[:, :, None] == own[:, None, :]).any(-1) & known[:, None]
            replaced = torch.zeros_like(agreed)
            if self.mode == "filtered":
                chosen, replaced = confidence_filter(scores, chosen, own, self.threshold)
                replaced &= known[:, None]
            self.stats.replayed[layer] += int(known.sum()) * self.top_k
            self.stats.replaced[layer] += int(replaced.sum())
            self.stats.agreed[layer] += int(agreed.sum())
        weights = weights_of(router, scores, chosen, own_weights.dtype)
        indices = torch.where(known[:, None], chosen, own_indices)
        weights = torch.where(known[:, None], weights, own_weights)
        return logits, weights, indices


def confidence_filter(
    scores: torch.Tensor,  # [tokens, E] the trainer's gate scores
    replayed: torch.Tensor,  # [tokens, k] long, the sampler's experts
    own: torch.Tensor,  # [tokens, k] long, the trainer's own top-k, best first
    threshold: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # [tokens, k] experts, [tokens, k] bool replaced
    """Replace each replayed expert scoring below ``threshold × min(scores at own)`` by the best
    expert of ``own`` not already among the kept ones, column by column (the j-th replaced column
    gets the j-th free own expert). Enough free ones always exist: ``k - r`` kept experts can take
    at most ``k - r`` of the ``k`` own ones. Returns the experts and which columns were replaced."""
    k = replayed.shape[1]
    floor = threshold * scores.gather(1, own).min(dim=-1, keepdim=True).values
    low = scores.gather(1, replayed) < floor  # [tokens, k]
    taken = ((own[:, :, None] == replayed[:, None, :]) & ~low[:, None, :]).any(-1)  # own expert already kept
    free_rank = torch.where(taken, k, (~taken).cumsum(-1) - 1)  # rank among the free ones, k: not free
    candidates = own.new_zeros(own.shape[0], k + 1).scatter_(1, free_rank, own)[:, :k]  # [tokens, k]
    replacement = candidates.gather(1, (low.cumsum(-1) - 1).clamp(min=0))
    return torch.where(low, replacement, replayed), low
