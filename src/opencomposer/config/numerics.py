"""``NumericsConfig``: low-precision matmuls, the argument of ``opencomposer.numerics.convert``.

As the recipe section ``[numerics]`` it applies to every model a command trains or samples from:
``opencomposer pretrain`` and ``sft`` convert the model they train, ``opencomposer rl`` converts the
policy, the KL reference and the sampler (which then decodes through the converted modules), and the
asynchronous services' inference and evaluation engines copy the converted policy
(``docs/numerics.md``, "In the pipeline"). Library code builds it directly
(``convert_model(model, NumericsConfig(recipe="mxfp8"))``); every combination it accepts there is a
valid one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class NumericsConfig(Section):
    """Low-precision matmuls (report §6.1), emulated bit-exactly on CPU by ``opencomposer.numerics``."""

    section = "numerics"

    recipe: Literal["bf16", "mxfp8", "nvfp4_fwd_mxfp8_bwd"] = "bf16"
    """``bf16``: leave the model as it is (matmuls in its own dtype). ``mxfp8``: expert matmuls in
    MXFP8 both ways. ``nvfp4_fwd_mxfp8_bwd``: the report's MoE split, forward in NVFP4 with a
    per-token FP32 scale, backward in MXFP8."""
    quantize_linears: bool = False
    """Also convert the other ``nn.Linear`` layers (attention, dense and shared-expert MLPs); the
    LM head and the routers always stay in high precision."""
    quantize_dispatch: bool = False
    """Quantise the tokens sent to the experts to MXFP8 before dispatch; the combine of the expert
    outputs stays in BF16 (report §6.1)."""
    mx_scale_mode: Literal["floor", "rceil"] = "floor"
    """MX scale rounding: OCP's ``floor`` or NVIDIA hardware's ``rceil``."""
    mx_grad_dtype: Literal["e4m3", "e5m2"] = "e4m3"
    """Element format of gradients in the MXFP8 backward."""
    nvfp4_activation_scale: Literal["token", "tensor"] = "token"
    """FP32 scale of NVFP4 activations: per token (the report) or per tensor (standard NVFP4)."""
    nvfp4_weight_scale: Literal["token", "tensor"] = "tensor"
    """FP32 scale of NVFP4 weights: per tensor (per expert matrix) or per row (output channel)."""
    division: Literal["exact", "approx"] = "exact"
    """Divisions inside the quantisers: IEEE-exact, or the fast path's reciprocal multiply."""
    reciprocal_ulp: int = 0
    """With ``division = "approx"``: nudge each inexact reciprocal by this many ulps (-1, 0, 1)."""

    def validate(self) -> None:
        if self.reciprocal_ulp not in (-1, 0, 1):
            raise ConfigError(f"numerics.reciprocal_ulp: expected -1, 0 or 1, got {self.reciprocal_ulp}")
        if self.reciprocal_ulp and self.division != "approx":
            raise ConfigError(
                f'numerics.reciprocal_ulp = {self.reciprocal_ulp} needs numerics.division = "approx", '
                f"got {self.division!r}"
            )
        if self.recipe == "bf16" and (self.quantize_linears or self.quantize_dispatch):
            raise ConfigError(
                'numerics.quantize_linears / quantize_dispatch do nothing with numerics.recipe = "bf16"; '
                'pick "mxfp8" or "nvfp4_fwd_mxfp8_bwd"'
            )
