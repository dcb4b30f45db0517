"""The row layout of the DNC interface vector that the fused recurrence reads (docs/maths.md §8)."""
from __future__ import annotations

import torch

__all__ = ["interface_layout", "interface_permutation"]


def interface_layout(R: int, W: int) -> dict[str, int]:
    """Offsets of the permuted interface vector: keys ``(R+1)·W`` (R read keys, then the write
    key), strengths ``R+1`` (read, then write), write vector ``W``, then the σ block
    (erase ``W``, free gates ``R``, allocation gate, write gate) and the read modes ``3R``,
    mode-major (π₀ of every head, then π₁, then π₂: a softmax over a dim of 3 that is not the
    last is cheaper on CPU)."""
    o = {"keys": 0, "str": (R + 1) * W}
    o["v"] = o["str"] + R + 1
    o["sig"] = o["v"] + W  # erase
    o["free"] = o["sig"] + W
    o["ga"] = o["free"] + R
    o["gw"] = o["ga"] + 1
    o["modes"] = o["gw"] + 1
    o["size"] = o["modes"] + 3 * R
    return o


def interface_permutation(R: int, W: int, device=None) -> torch.Tensor:
    """Row indices taking the DNC interface layer (docs/maths.md §8 order: read keys, read strengths,
    write key, write strength, erase, write vector, free gates, allocation gate, write gate,
    read modes) to the layout of :func:`interface_layout`."""
    sizes = [R * W, R, W, 1, W, W, R, 1, 1, 3 * R]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    k_r, b_r, k_w, b_w, erase, v, free, g_a, g_w, modes = (
        torch.arange(s, s + n, device=device) for s, n in zip(starts, sizes))
    modes = modes.view(R, 3).t().reshape(-1)  # head-major -> mode-major
    return torch.cat([k_r, k_w, b_r, b_w, v, erase, free, g_a, g_w, modes])
