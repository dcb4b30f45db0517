"""NTM addressing ops (docs/maths.md §7): content, interpolation, shift, sharpen, erase/add, read.

One function per equation of Graves et al. (2014), batch-first with any leading batch dims
``...``. Memory is ``[..., N, W]`` (N slots of width W); a weighting is ``[..., N]``.

Head form: every op also accepts an extra head dim ``H`` right before the last dim of the
per-head arguments (``key [..., H, W]``, ``w [..., H, N]``), detected by the argument having
as many dims as the memory; the memory ``[..., N, W]`` is then shared by the H heads.

    w_c  = softmax_i(β · cos(k, M[i]))                  content_weights
    w_g  = g w_c + (1 − g) w_prev                       interpolate
    w̃(i) = Σ_j w_g(j) s(i − j)     (circular)          circular_shift
    w(i) = w̃(i)^γ / Σ_j w̃(j)^γ                         sharpen
    r    = Σ_i w(i) M[i]                                weighted_read
    M'   = M ∘ (1 − w eᵀ) + w aᵀ                         erase_add_write

All ops are safe on degenerate input: an all-zero memory or key gives a uniform content
weighting (cosine uses ``sqrt(‖x‖² + eps)``) and sharpening an all-zero weighting gives a
uniform one, with finite gradients in both cases.
"""
from __future__ import annotations

import torch

from .._checks import check_tensor

__all__ = [
    "cosine_similarity",
    "content_weights",
    "interpolate",
    "circular_shift",
    "sharpen",
    "weighted_read",
    "erase_add_write",
]

_EPS = 1e-6


def _safe_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(Σ x² + eps)`` over the last dim: smooth, so its gradient at 0 is 0, not NaN."""
    return torch.sqrt((x * x).sum(-1) + eps)


def _heads(name: str, x: torch.Tensor, memory: torch.Tensor, last: int, last_name: str) -> bool:
    """True for the head form (``x`` has as many dims as the memory); checks the last dim."""
    check_tensor(name, x)
    if x.dim() not in (memory.dim() - 1, memory.dim()) or x.shape[-1] != last:
        raise ValueError(
            f"`{name}` expected [..., {last_name}] or [..., H, {last_name}] with "
            f"{last_name} = {last} and the memory's batch dims {list(memory.shape[:-2])}, "
            f"got {list(x.shape)}"
        )
    return x.dim() == memory.dim()


def _check_memory(memory: torch.Tensor) -> None:
    check_tensor("memory", memory)
    if memory.dim() < 2:
        raise ValueError(f"`memory` expected [..., N, W] (at least 2 dims), got {list(memory.shape)}")


def cosine_similarity(memory: torch.Tensor, key: torch.Tensor, eps: float = _EPS) -> torch.Tensor:
    """cos(k, M[i]) for every slot i (docs/maths.md §7, §8).

    Args:
        memory: ``[..., N, W]``.
        key: ``[..., W]`` or ``[..., H, W]`` (head form).
        eps: added under the square root of each norm; zero rows give cosine 0.
    Returns:
        ``[..., N]`` or ``[..., H, N]``, values in [-1, 1].
    """
    _check_memory(memory)
    heads = _heads("key", key, memory, memory.shape[-1], "W")
    k = key if heads else key.unsqueeze(-2)  # [..., H or 1, W]
    dot = torch.matmul(k, memory.transpose(-1, -2))  # [..., H, N]
    norm = _safe_norm(k, eps).unsqueeze(-1) * _safe_norm(memory, eps).unsqueeze(-2)  # [..., H, N]
    cos = dot / norm
    return cos if heads else cos.squeeze(-2)


def content_weights(
    memory: torch.Tensor, key: torch.Tensor, strength: torch.Tensor, eps: float = _EPS
) -> torch.Tensor:
    """Content weighting ``w_c[i] = softmax_i(β · cos(k, M[i]))`` (docs/maths.md §7; DNC's C(M, k, β)).

    Args:
        memory: ``[..., N, W]``.
        key: ``[..., W]`` or ``[..., H, W]``.
        strength: β ≥ 0, ``[...]`` (or ``[..., H]`` in head form).
    Returns:
        weighting ``[..., N]`` (or ``[..., H, N]``) on the simplex.
    """
    cos = cosine_similarity(memory, key, eps)
    check_tensor("strength", strength)
    if strength.shape != cos.shape[:-1]:
        raise ValueError(
            f"`strength` expected the key's batch shape {list(cos.shape[:-1])}, got {list(strength.shape)}"
        )
    return torch.softmax(strength.unsqueeze(-1) * cos, dim=-1)


def _gate(name: str, g: torch.Tensor | float, w: torch.Tensor) -> torch.Tensor | float:
    if isinstance(g, (float, int)) and not isinstance(g, bool):
        return float(g)
    check_tensor(name, g)
    if g.shape != w.shape[:-1]:
        raise ValueError(f"`{name}` expected the weighting's batch shape {list(w.shape[:-1])}, got {list(g.shape)}")
    return g.unsqueeze(-1)


def interpolate(w_c: torch.Tensor, w_prev: torch.Tensor, gate: torch.Tensor | float) -> torch.Tensor:
    """Interpolation ``w_g = g w_c + (1 − g) w_prev`` (docs/maths.md §7).

    Args:
        w_c: content weighting ``[..., N]``.
        w_prev: previous weighting ``[..., N]``.
        gate: g in [0, 1], ``[...]`` or a float.
    Returns:
        ``[..., N]``; on the simplex when both inputs are.
    """
    check_tensor("w_c", w_c)
    check_tensor("w_prev", w_prev)
    if w_prev.shape != w_c.shape:
        raise ValueError(f"`w_prev` expected the shape of `w_c` {list(w_c.shape)}, got {list(w_prev.shape)}")
    g = _gate("gate", gate, w_c)
    return g * w_c + (1 - g) * w_prev


def circular_shift(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Circular convolution ``w̃(i) = Σ_k s(k) w(i − k)`` over shifts k = −n..+n (docs/maths.md §7).

    Index j of ``s`` is the shift ``j − n``. Example: ``w = (1, 0, 0, 0)`` with
    P(−1) = 0.2, P(0) = 0.1, P(+1) = 0.7 (``s = (0.2, 0.1, 0.7)``) gives ``(0.1, 0.7, 0, 0.2)``.

    Args:
        w: weighting ``[..., N]``.
        s: shift distribution ``[..., 2n+1]`` (odd length, 2n+1 <= N so that no two shifts alias).
    Returns:
        ``[..., N]``; on the simplex when both inputs are.
    """
    check_tensor("w", w)
    check_tensor("s", s)
    if s.shape[:-1] != w.shape[:-1] or s.dim() != w.dim() or s.shape[-1] % 2 != 1:
        raise ValueError(
            f"`s` expected [..., 2n+1] (odd) with batch shape {list(w.shape[:-1])}, got {list(s.shape)}"
        )
    if s.shape[-1] > w.shape[-1]:
        raise ValueError(f"`s` has 2n+1 = {s.shape[-1]} shifts, more than the N = {w.shape[-1]} slots of `w` "
                         "(shifts would alias modulo N)")
    n = s.shape[-1] // 2
    # torch.roll(w, k)[i] = w[i − k]
    rolled = torch.stack([torch.roll(w, k, dims=-1) for k in range(-n, n + 1)], dim=-1)  # [..., N, 2n+1]
    return torch.matmul(rolled, s.unsqueeze(-1)).squeeze(-1)  # [..., N]


def sharpen(w: torch.Tensor, gamma: torch.Tensor | float, eps: float = 1e-12) -> torch.Tensor:
    """Sharpening ``w(i) = w̃(i)^γ / Σ_j w̃(j)^γ`` (docs/maths.md §7), γ ≥ 1.

    Computed as ``softmax(γ · log(w̃ + eps))``: the same values up to ``eps``, always on the
    simplex, and an all-zero ``w̃`` gives the uniform weighting with finite gradients.

    Args:
        w: weighting ``[..., N]``, entries ≥ 0.
        gamma: ``[...]`` or a float.
    Returns:
        ``[..., N]`` on the simplex.
    """
    check_tensor("w", w)
    g = _gate("gamma", gamma, w)
    return torch.softmax(g * torch.log(w.clamp_min(0) + eps), dim=-1)


def weighted_read(memory: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Read ``r = Σ_i w(i) M[i] = Mᵀ w`` (docs/maths.md §7, §8).

    Args:
        memory: ``[..., N, W]``.
        w: ``[..., N]`` or ``[..., H, N]`` (head form).
    Returns:
        ``[..., W]`` or ``[..., H, W]``.
    """
    _check_memory(memory)
    heads = _heads("w", w, memory, memory.shape[-2], "N")
    if heads:
        return torch.matmul(w, memory)  # [..., H, W]
    return torch.matmul(w.unsqueeze(-2), memory).squeeze(-2)  # [..., W]


def erase_add_write(
    memory: torch.Tensor, w: torch.Tensor, erase: torch.Tensor, add: torch.Tensor
) -> torch.Tensor:
    """Erase then add: ``M' = M ∘ (1 − w eᵀ) + w aᵀ`` (docs/maths.md §7; the DNC write of §8).

    In head form (``w [..., H, N]``, ``erase``/``add`` ``[..., H, W]``) the erases of all heads
    multiply and the adds sum, as in Graves et al. (2014):
    ``M' = M ∘ Π_h (1 − w_h e_hᵀ) + Σ_h w_h a_hᵀ``.

    Args:
        memory: ``[..., N, W]``.
        w: write weighting ``[..., N]`` (or ``[..., H, N]``).
        erase: e in [0, 1], ``[..., W]`` (or ``[..., H, W]``).
        add: a, ``[..., W]`` (or ``[..., H, W]``).
    Returns:
        the new memory ``[..., N, W]``.
    """
    _check_memory(memory)
    heads = _heads("w", w, memory, memory.shape[-2], "N")
    for name, t in (("erase", erase), ("add", add)):
        check_tensor(name, t)
        if t.shape != w.shape[:-1] + memory.shape[-1:]:
            raise ValueError(
                f"`{name}` expected [..., W] matching `w` = {list(w.shape[:-1]) + [memory.shape[-1]]}, "
                f"got {list(t.shape)}"
            )
    if not heads:
        w, erase, add = w.unsqueeze(-2), erase.unsqueeze(-2), add.unsqueeze(-2)  # [..., 1, N|W]
    keep = 1 - w.unsqueeze(-1) * erase.unsqueeze(-2)  # [..., H, N, W]
    keep = keep.prod(dim=-3) if keep.shape[-3] > 1 else keep.squeeze(-3)  # [..., N, W]
    return memory * keep + torch.matmul(w.transpose(-1, -2), add)  # [..., N, W]
