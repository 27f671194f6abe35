"""Capture which experts an MoE model routes every token to.

The report's router replay (RECIPE.md §6) needs, for every sampled token and every MoE layer, the
expert indices the inference engine chose. ``RouteRecorder`` hooks the router modules of a
transformers MoE model (Qwen3-MoE's ``Qwen3MoeTopKRouter``, DeepSeek-V3's ``DeepseekV3TopkRouter``
and any router that returns ``(logits, weights, indices)``) and hands back
``[tokens, moe_layers, top_k]`` index arrays.

Indices are sorted ascending per token: the set of experts is what replay needs, and DeepSeek-V3's
top-k is unsorted, so a canonical order makes routes comparable across engines.
"""

from __future__ import annotations

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
