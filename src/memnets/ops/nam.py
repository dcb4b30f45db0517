"""NAM primitives (docs/maths.md §1): the read RD, the write WR and the unit normalisation μ.

Shapes are batch-first with any number of leading batch dims ``...``:
memory ``M`` is ``[..., dv, dk]``, keys/queries ``[..., dk]``, values ``[..., dv]``,
probabilities ``[...]`` (or Python floats).

    RD(M, q, p_r)         = p_r · M q
    WR(M, k, v, p_w, p_e) = M + p_w · v kᵀ − p_e · (M k) kᵀ

With ``p_e = p_w = β`` the write is the delta rule ``M + β (v − M k) kᵀ``.
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F

from .._checks import check_tensor

__all__ = ["unit", "nam_read", "nam_write", "split_heads", "merge_heads"]

Prob = Union[torch.Tensor, float, int, None]


def unit(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """μ(x) = x / max(‖x‖₂, eps) along ``dim``; zero vectors stay zero (no NaN)."""
    check_tensor("x", x)
    return F.normalize(x, p=2.0, dim=dim, eps=eps)


def _prob(name: str, p: Prob, batch_shape: torch.Size, ref: torch.Tensor) -> torch.Tensor | float:
    """Return ``p`` ready to multiply a ``[..., n]`` tensor: a float or ``[..., 1]``."""
    if p is None:
        return 1.0
    if isinstance(p, (float, int)) and not isinstance(p, bool):
        return float(p)
    check_tensor(name, p)
    if p.dim() == 0:
        return p
    if p.shape != batch_shape:
        raise ValueError(
            f"`{name}` expected the batch shape of the memory [...] = {list(batch_shape)} "
            f"(or a scalar), got {list(p.shape)}"
        )
    return p.unsqueeze(-1).to(ref.dtype)


def _check_memory(M: torch.Tensor) -> None:
    check_tensor("M", M)
    if M.dim() < 2:
        raise ValueError(f"`M` expected [..., dv, dk] (at least 2 dims), got {list(M.shape)}")


def nam_read(M: torch.Tensor, q: torch.Tensor, p_r: Prob = None) -> torch.Tensor:
    """RD(M, q, p_r) = p_r · M q.

    Args:
        M: memory ``[..., dv, dk]``.
        q: query ``[..., dk]`` (callers normalise it with :func:`unit`).
        p_r: read probability ``[...]``, a scalar, or ``None`` (= 1).
    Returns:
        ``[..., dv]``.
    """
    _check_memory(M)
    check_tensor("q", q)
    if q.shape != M.shape[:-2] + M.shape[-1:]:
        raise ValueError(
            f"`q` expected [..., dk] = {list(M.shape[:-2]) + [M.shape[-1]]}, got {list(q.shape)}"
        )
    r = torch.matmul(M, q.unsqueeze(-1)).squeeze(-1)  # [..., dv]
    return r * _prob("p_r", p_r, M.shape[:-2], r)


def nam_write(
    M: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_w: Prob = 1.0, p_e: Prob = 1.0
) -> torch.Tensor:
    """WR(M, k, v, p_w, p_e) = M + p_w · v kᵀ − p_e · (M k) kᵀ.

    Args:
        M: memory ``[..., dv, dk]``.
        k: key ``[..., dk]`` (unit norm for the theorems of docs/maths.md §1 to hold).
        v: value ``[..., dv]``.
        p_w, p_e: write and erase probabilities ``[...]`` or scalars.
    Returns:
        the new memory ``[..., dv, dk]``.
    """
    _check_memory(M)
    check_tensor("k", k)
    check_tensor("v", v)
    batch, dv, dk = M.shape[:-2], M.shape[-2], M.shape[-1]
    if k.shape != batch + (dk,):
        raise ValueError(f"`k` expected [..., dk] = {list(batch) + [dk]}, got {list(k.shape)}")
    if v.shape != batch + (dv,):
        raise ValueError(f"`v` expected [..., dv] = {list(batch) + [dv]}, got {list(v.shape)}")
    Mk = torch.matmul(M, k.unsqueeze(-1)).squeeze(-1)  # [..., dv]
    u = v * _prob("p_w", p_w, batch, v) - Mk * _prob("p_e", p_e, batch, v)  # pseudo-value
    return M + u.unsqueeze(-1) * k.unsqueeze(-2)  # [..., dv, dk]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[..., H*D] -> [..., H, D]`` (contiguous heads, as the authors' code cuts them)."""
    if x.shape[-1] % num_heads:
        raise ValueError(
            f"last dim of size {x.shape[-1]} is not divisible by num_heads={num_heads}"
        )
    return x.unflatten(-1, (num_heads, x.shape[-1] // num_heads))  # [..., H, D]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[..., H, D] -> [..., H*D]``."""
    return x.flatten(-2)
