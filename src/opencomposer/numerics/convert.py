"""Switch a transformers MoE model to the quantised matmuls of ``numerics.recipe``.

transformers 5 stores the routed experts of Qwen3-MoE and DeepSeek-V3 (Kimi K2.5's family) as one
module holding ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, called as
``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``. The converter
replaces each such module by ``QuantizedExperts``, which holds the *same* parameter objects (so
optimizers, checkpoints and state-dict keys are untouched) and runs both expert matmuls through
``QuantizedMatmul``. With ``quantize_linears`` the other ``nn.Linear`` layers become
``QuantizedLinear``; the LM head and the routers stay in high precision, as in the report's
recipe (routers are not ``nn.Linear`` in these models; the head is found through
``get_output_embeddings``).

``recipe = "bf16"`` converts nothing: the model keeps computing in its own dtype.

Converting is idempotent: the commands convert the model they train and the samplers deep-copy it,
and a copy that passes through ``convert_model`` again (an evaluation engine built from it) is left
as it is. A model already converted to *another* format is refused rather than converted twice.

What the converted model does not change: its state dict, its checkpoints (``save_pretrained``
writes the same keys and tensors) and anything that reads its parameters directly instead of
calling its modules (the batch-invariant decoder of ``inference.invariant`` does; ``is_converted``
tells a sampler to decode through the modules instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from opencomposer.config import NumericsConfig
from opencomposer.numerics.qlinear import (
    MatmulRecipe,
    MXSpec,
    QuantizedLinear,
    combine_round,
    dispatch_quantize,
    matmul_recipe,
    quantized_linear,
)

DISPATCH_SPEC = MXSpec("e4m3", 32, "floor")


class QuantizedExperts(nn.Module):
    """Drop-in for transformers' fused experts with quantised matmuls (same parameters, same call).

    ``quantize_dispatch``: the tokens reach the experts as MXFP8 (what an expert-parallel
    all-to-all would carry) and the expert outputs return in BF16 before the weighted combine.
    """

    def __init__(
        self,
        experts: nn.Module,
        recipe: MatmulRecipe,
        quantize_dispatch: bool = False,
        dispatch_spec: MXSpec = DISPATCH_SPEC,
    ):
        super().__init__()
        self.num_experts = experts.num_experts
        self.gate_up_proj = experts.gate_up_proj  # [E, 2I, H]
        self.down_proj = experts.down_proj  # [E, H, I]
        self.act_fn = experts.act_fn
        self.recipe = recipe
        self.quantize_dispatch = quantize_dispatch
        self.dispatch_spec = dispatch_spec

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        tokens = (
            dispatch_quantize(hidden_states, self.dispatch_spec) if self.quantize_dispatch else hidden_states
        )
        out = torch.zeros_like(hidden_states)  # [T, H]
        with torch.no_grad():
            # index num_experts is the expert-parallel "not on this rank" sentinel of transformers
            expert_mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(
                2, 1, 0
            )
            hit = torch.nonzero(expert_mask.sum(dim=(1, 2)) > 0).flatten().tolist()
        for expert in hit:
            if expert == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[expert])
            gate, up = quantized_linear(tokens[token_idx], self.gate_up_proj[expert], self.recipe).chunk(
                2, dim=-1
            )
            y = quantized_linear(self.act_fn(gate) * up, self.down_proj[expert], self.recipe)  # [T_e, H]
            if self.quantize_dispatch:
                y = combine_round(y)
            out.index_add_(0, token_idx, (y * top_k_weights[token_idx, top_k_pos, None]).to(out.dtype))
        return out

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, quantize_dispatch={self.quantize_dispatch}, recipe={self.recipe}"


def is_fused_experts(module: nn.Module) -> bool:
    """transformers' fused experts: 3-D ``gate_up_proj`` and ``down_proj`` parameters."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, nn.Parameter)
        and isinstance(down, nn.Parameter)
        and gate_up.ndim == 3
        and down.ndim == 3
    )


@dataclass
class Conversion:
    """What ``convert_model`` replaced."""

    experts: list[str]
    linears: list[str]


def is_converted(model: nn.Module) -> bool:
    """Whether ``convert_model`` switched any module of ``model`` to quantised matmuls."""
    return any(isinstance(module, (QuantizedExperts, QuantizedLinear)) for module in model.modules())


def _check_same_format(model: nn.Module, config: NumericsConfig) -> Conversion:
    """The conversion already in ``model``, when it is the one ``config`` asks for; else an error."""
    experts = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedExperts)}
    linears = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    recipe = matmul_recipe(config)
    formats = {(m.recipe, m.quantize_dispatch, m.dispatch_spec) for m in experts.values()}
    same = (
        recipe is not None
        and formats == {(recipe, config.quantize_dispatch, MXSpec("e4m3", 32, config.mx_scale_mode))}
        and all(m.recipe == recipe for m in linears.values())
        and bool(linears) == config.quantize_linears
    )
    if not same:
        raise ValueError(
            f"{type(model).__name__} is already converted ({len(experts)} expert modules, {len(linears)} "
            f"linears, formats {sorted(map(str, formats))}); it cannot be converted to numerics.recipe = "
            f"{config.recipe!r} with quantize_linears = {config.quantize_linears}, quantize_dispatch = "
            f"{config.quantize_dispatch} and these scales: convert the unconverted model"
        )
    return Conversion(list(experts), list(linears))


def convert_model(model: nn.Module, config: NumericsConfig) -> Conversion:
    """Replace, in place, the experts (and with ``quantize_linears`` the other linears) of
    ``model`` by their quantised versions for ``config.recipe``. A model already in that format is
    returned as it is (see the module doc); the conversion found or made is returned."""
    if is_converted(model):
        return _check_same_format(model, config)
    recipe = matmul_recipe(config)
    if recipe is None:
        return Conversion([], [])
    experts = [(name, module) for name, module in model.named_modules() if is_fused_experts(module)]
    if not experts:
        raise ValueError(
            f"{type(model).__name__} has no fused MoE experts (a module with gate_up_proj [E, 2I, H] and "
            "down_proj [E, H, I]); expected a transformers Qwen3-MoE or DeepSeek-V3 model"
        )
    for name, module in experts:
        if (
            getattr(module, "is_transposed", False)
            or getattr(module, "has_bias", False)
            or not getattr(module, "has_gate", True)
        ):
            raise ValueError(
                f"{name}: experts stored transposed, with biases or without a gate are not supported; "
                "expected gate_up_proj [E, 2I, H] and down_proj [E, H, I] without bias"
            )
        dispatch_spec = MXSpec("e4m3", 32, config.mx_scale_mode)
        _set_submodule(model, name, QuantizedExperts(module, recipe, config.quantize_dispatch, dispatch_spec))
    linears: list[str] = []
    if config.quantize_linears:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for name, module in list(model.named_modules()):
            if type(module) is nn.Linear and module is not head:
                _set_submodule(model, name, QuantizedLinear(module, recipe))
                linears.append(name)
    return Conversion([name for name, _ in experts], linears)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)
