"""Feature maps φ for fast-weight / linear attention (docs/maths.md §6, Schlag et al. 2021).

All maps act on the last dimension and return non-negative features:

* ``"elu"``:   φ(x) = (elu(x) + 1) / Σ (elu(x) + 1)                 dim d  → d
* ``"dpfpν"``: DPFP-ν (Deterministic Parameter-Free Projection), ν ∈ {1, 2, 3}:
  ``r = [relu(x), relu(−x)]`` (dim 2d), ``φ_{i,j}(x) = r_i · r_{(i−j) mod 2d}`` for
  shifts ``j = 1..ν``, concatenated over ``j`` (dim 2dν), then divided by its sum.

Sum normalisation is what keeps the delta-rule write stable (‖φ‖₂ ≤ ‖φ‖₁ = 1). A feature
vector that is all zero (DPFP of a zero input) stays zero: the sum is clamped at ``eps``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

__all__ = [
    "FEATURE_MAPS",
    "sum_normalize",
    "elu_sum_feature_map",
    "dpfp_feature_map",
    "get_feature_map",
    "feature_dim",
]

FEATURE_MAPS = ("elu", "dpfp1", "dpfp2", "dpfp3")


def sum_normalize(phi: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``φ / max(Σ φ, eps)`` over the last dim; ``phi`` must be non-negative."""
    return phi / phi.sum(dim=-1, keepdim=True).clamp_min(eps)


def elu_sum_feature_map(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(elu(x) + 1)`` divided by its sum: ``[..., d] -> [..., d]``, entries in (0, 1]."""
    return sum_normalize(F.elu(x) + 1.0, eps)


def dpfp_feature_map(x: torch.Tensor, nu: int = 1, eps: float = 1e-6) -> torch.Tensor:
    """Sum-normalised DPFP-ν: ``[..., d] -> [..., 2·d·ν]``, entries in [0, 1].

    ``r = [relu(x), relu(−x)]``; block ``j`` (``j = 1..ν``) is ``r * roll(r, j)``.
    """
    if isinstance(nu, bool) or not isinstance(nu, int) or nu < 1:
        raise ValueError(f"`nu` expected an integer >= 1, got {nu!r}")
    r = torch.cat([F.relu(x), F.relu(-x)], dim=-1)  # [..., 2d]
    phi = torch.cat([r * r.roll(shifts=j, dims=-1) for j in range(1, nu + 1)], dim=-1)  # [..., 2dν]
    return sum_normalize(phi, eps)


def get_feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The feature map called ``name`` (one of :data:`FEATURE_MAPS`)."""
    if name == "elu":
        return elu_sum_feature_map
    if name in ("dpfp1", "dpfp2", "dpfp3"):
        nu = int(name[-1])
        return lambda x: dpfp_feature_map(x, nu)
    raise ValueError(f"`feature_map` expected one of {FEATURE_MAPS}, got {name!r}")


def feature_dim(name: str, d: int) -> int:
    """Output size of feature map ``name`` for inputs of size ``d``."""
    get_feature_map(name)  # validates the name
    return d if name == "elu" else 2 * d * int(name[-1])
