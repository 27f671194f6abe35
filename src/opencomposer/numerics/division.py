"""Division modes for quantisers: IEEE-exact division and the fast approximate one.

Composer 2 report, section 6.1: NVFP4 quantisation must divide with IEEE round-to-nearest
(CUDA's ``__fdiv_rn``); compiled with fast math, ``a / b`` becomes ``a * rcp.approx(b)`` whose
reciprocal is only accurate to about one unit in the last place (ulp), and an RL run with that
kernel diverged after ~100 steps. MXFP8 does not care: its scales are powers of two, whose
reciprocals are exact, so every faithful reciprocal of them is the exact one.

``divide(a, b, "exact")`` is ``a / b`` in float32 with one rounding (PyTorch's CPU division is
IEEE). ``divide(a, b, "approx", reciprocal_ulp)`` emulates the fast path: ``a * r`` with ``r`` the
float32 reciprocal ``RN(1/b)`` (two roundings instead of one), optionally nudged by
``reciprocal_ulp`` = +-1 ulp to model hardware that lands on the other side of the true value.
Where ``1/b`` is exactly representable (``b`` a power of two) the reciprocal is never nudged: an
approximation that is off by less than one ulp cannot miss a representable value.

What this module is not: a model of any particular GPU's reciprocal table. The nudge is a worst
case of the documented error bound, used to measure how sensitive a format is to it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

Division = Literal["exact", "approx"]
DIVISIONS = ("exact", "approx")


def check_division(division: str, reciprocal_ulp: int) -> None:
    if division not in DIVISIONS:
        raise ValueError(f"division {division!r}: expected one of {DIVISIONS}")
    if reciprocal_ulp not in (-1, 0, 1):
        raise ValueError(f"reciprocal_ulp {reciprocal_ulp}: expected -1, 0 or 1")
    if reciprocal_ulp and division == "exact":
        raise ValueError(
            f"reciprocal_ulp {reciprocal_ulp} needs division='approx' (exact division has no reciprocal)"
        )


def reciprocal(b: torch.Tensor, reciprocal_ulp: int = 0) -> torch.Tensor:
    """float32 ``RN(1/b)``, nudged by ``reciprocal_ulp`` ulps where ``1/b`` is not exact."""
    b = b.to(torch.float32)
    r = 1.0 / b
    if reciprocal_ulp == 0:
        return r
    # r * b is exact in float64 (24 + 24 significant bits < 53); it is 1 only when 1/b is exact.
    inexact = (r.double() * b.double() != 1.0) & torch.isfinite(r) & (r != 0)
    target = torch.full_like(r, float("inf") if reciprocal_ulp > 0 else float("-inf"))
    return torch.where(inexact, torch.nextafter(r, target), r)


def divide(
    a: torch.Tensor | float, b: torch.Tensor, division: Division = "exact", reciprocal_ulp: int = 0
) -> torch.Tensor:
    """``a / b`` in float32, exactly rounded or through a (nudged) reciprocal; broadcasts."""
    if division == "exact":
        return torch.div(a, b.to(torch.float32))
    return a * reciprocal(b, reciprocal_ulp)


def divide_reference(
    a: np.float32, b: np.float32, division: Division = "exact", reciprocal_ulp: int = 0
) -> np.float32:
    """Scalar twin of ``divide`` in NumPy float32 arithmetic (each operation one IEEE rounding)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        a, b = np.float32(a), np.float32(b)
        if division == "exact":
            return np.float32(a / b)
        r = np.float32(np.float32(1.0) / b)
        if reciprocal_ulp and np.isfinite(r) and r != 0 and float(r) * float(b) != 1.0:
            r = np.nextafter(r, np.float32(np.inf if reciprocal_ulp > 0 else -np.inf))
        return np.float32(a * r)
