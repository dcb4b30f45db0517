"""DNC memory-access ops (docs/maths.md §8; Graves et al. 2016): one function per equation.

Batch-first with any leading batch dims ``...``; N memory slots, R read heads, one write
head. Weightings are ``[..., N]`` (write) and ``[..., R, N]`` (read); the temporal link
matrix is ``[..., N, N]``.

    ψ_t    = Π_i (1 − f^i w^{r,i}_{t-1})                            dnc_retention
    u_t    = (u_{t-1} + w^w_{t-1} − u_{t-1} ∘ w^w_{t-1}) ∘ ψ_t       dnc_usage
    a[φ_j] = (1 − u[φ_j]) Π_{i<j} u[φ_i]                             dnc_allocation
    w^w_t  = g^w [g^a a_t + (1 − g^a) c^w_t]                         dnc_write_weighting
    p_t    = (1 − Σ w^w_t) p_{t-1} + w^w_t                           dnc_precedence
    L_t    = (1 − w^w[i] − w^w[j]) L_{t-1} + w^w[i] p_{t-1}[j], L_ii = 0   dnc_link
    f = L w^r,  b = Lᵀ w^r                                           dnc_directional_weights
    w^r_t  = π[0] b + π[1] c^r + π[2] f                              dnc_read_weights

Content weightings and the erase/add write are the NTM ops of :mod:`memnets.ops.addressing`.
"""
from __future__ import annotations

import torch

from ..._checks import check_tensor

__all__ = [
    "dnc_retention",
    "dnc_usage",
    "dnc_allocation",
    "dnc_write_weighting",
    "dnc_precedence",
    "dnc_link",
    "dnc_directional_weights",
    "dnc_read_weights",
]


def _same(name: str, x: torch.Tensor, shape: torch.Size, what: str) -> None:
    check_tensor(name, x)
    if x.shape != shape:
        raise ValueError(f"`{name}` expected {what} = {list(shape)}, got {list(x.shape)}")


def dnc_retention(free_gates: torch.Tensor, read_weights_prev: torch.Tensor) -> torch.Tensor:
    """Memory retention ``ψ = Π_i (1 − f^i w^{r,i}_{t-1})`` (docs/maths.md §8).

    Args:
        free_gates: f in [0, 1], ``[..., R]``.
        read_weights_prev: ``[..., R, N]``.
    Returns:
        ψ ``[..., N]`` in [0, 1].
    """
    check_tensor("read_weights_prev", read_weights_prev)
    if read_weights_prev.dim() < 2:
        raise ValueError(f"`read_weights_prev` expected [..., R, N], got {list(read_weights_prev.shape)}")
    _same("free_gates", free_gates, read_weights_prev.shape[:-1], "[..., R]")
    return (1 - free_gates.unsqueeze(-1) * read_weights_prev).prod(dim=-2)


def dnc_usage(
    usage_prev: torch.Tensor, write_weights_prev: torch.Tensor, retention: torch.Tensor
) -> torch.Tensor:
    """Usage ``u_t = (u_{t-1} + w^w_{t-1} − u_{t-1} ∘ w^w_{t-1}) ∘ ψ_t`` (docs/maths.md §8).

    Args:
        usage_prev: ``[..., N]`` in [0, 1].
        write_weights_prev: ``[..., N]``, entries in [0, 1].
        retention: ψ ``[..., N]`` in [0, 1].
    Returns:
        ``[..., N]`` in [0, 1].
    """
    check_tensor("usage_prev", usage_prev)
    _same("write_weights_prev", write_weights_prev, usage_prev.shape, "[..., N]")
    _same("retention", retention, usage_prev.shape, "[..., N]")
    return (usage_prev + write_weights_prev - usage_prev * write_weights_prev) * retention


def dnc_allocation(usage: torch.Tensor) -> torch.Tensor:
    """Allocation weighting ``a[φ_j] = (1 − u[φ_j]) Π_{i<j} u[φ_i]`` (docs/maths.md §8).

    φ sorts the usage ascending (the free list); ties keep slot order. Differentiable in
    ``usage`` almost everywhere (the sort permutation is piecewise constant).
    Example: usage ``(0.4, 0.8, 0.1)`` gives ``(0.06, 0.008, 0.9)``.

    Args:
        usage: ``[..., N]`` in [0, 1].
    Returns:
        ``[..., N]``, entries ≥ 0 summing to ``1 − Π_i u_i`` ≤ 1.
    """
    check_tensor("usage", usage)
    if usage.dim() < 1:
        raise ValueError("`usage` expected [..., N], got a scalar")
    sorted_u, phi = torch.sort(usage, dim=-1, stable=True)  # [..., N] each
    ones = torch.ones_like(sorted_u[..., :1])
    excl = torch.cumprod(torch.cat([ones, sorted_u[..., :-1]], dim=-1), dim=-1)  # Π_{i<j} u[φ_i]
    a_sorted = (1 - sorted_u) * excl
    return torch.zeros_like(a_sorted).scatter(-1, phi, a_sorted)


def dnc_write_weighting(
    write_content: torch.Tensor,
    allocation: torch.Tensor,
    write_gate: torch.Tensor,
    allocation_gate: torch.Tensor,
) -> torch.Tensor:
    """Write weighting ``w^w = g^w [g^a a + (1 − g^a) c^w]`` (docs/maths.md §8).

    Args:
        write_content: content weighting c^w ``[..., N]``.
        allocation: a ``[..., N]``.
        write_gate: g^w in [0, 1], ``[...]``.
        allocation_gate: g^a in [0, 1], ``[...]``.
    Returns:
        ``[..., N]`` with sum ≤ 1.
    """
    check_tensor("write_content", write_content)
    _same("allocation", allocation, write_content.shape, "[..., N]")
    _same("write_gate", write_gate, write_content.shape[:-1], "[...]")
    _same("allocation_gate", allocation_gate, write_content.shape[:-1], "[...]")
    ga = allocation_gate.unsqueeze(-1)
    return write_gate.unsqueeze(-1) * (ga * allocation + (1 - ga) * write_content)


def dnc_precedence(precedence_prev: torch.Tensor, write_weights: torch.Tensor) -> torch.Tensor:
    """Precedence ``p_t = (1 − Σ_i w^w_t[i]) p_{t-1} + w^w_t`` (docs/maths.md §8).

    Args:
        precedence_prev: ``[..., N]``.
        write_weights: ``[..., N]`` with sum ≤ 1.
    Returns:
        ``[..., N]`` with sum ≤ 1.
    """
    check_tensor("precedence_prev", precedence_prev)
    _same("write_weights", write_weights, precedence_prev.shape, "[..., N]")
    return (1 - write_weights.sum(-1, keepdim=True)) * precedence_prev + write_weights


def dnc_link(
    link_prev: torch.Tensor, precedence_prev: torch.Tensor, write_weights: torch.Tensor
) -> torch.Tensor:
    """Temporal link ``L[i,j] = (1 − w[i] − w[j]) L_{t-1}[i,j] + w[i] p_{t-1}[j]``, ``L[i,i] = 0``.

    (docs/maths.md §8.) ``L[i, j]`` is the degree to which slot i was written right after slot j.

    Args:
        link_prev: ``[..., N, N]``.
        precedence_prev: p_{t-1} ``[..., N]``.
        write_weights: w^w_t ``[..., N]``.
    Returns:
        ``[..., N, N]`` with entries in [0, 1] and a zero diagonal.
    """
    check_tensor("write_weights", write_weights)
    n = write_weights.shape[-1]
    _same("link_prev", link_prev, write_weights.shape + (n,), "[..., N, N]")
    _same("precedence_prev", precedence_prev, write_weights.shape, "[..., N]")
    wi = write_weights.unsqueeze(-1)  # [..., N, 1]
    wj = write_weights.unsqueeze(-2)  # [..., 1, N]
    link = (1 - wi - wj) * link_prev + wi * precedence_prev.unsqueeze(-2)  # [..., N, N]
    eye = torch.eye(n, dtype=torch.bool, device=link.device)
    return link.masked_fill(eye, 0.0)


def dnc_directional_weights(
    link: torch.Tensor, read_weights_prev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``f^i = L w^{r,i}_{t-1}`` and backward ``b^i = Lᵀ w^{r,i}_{t-1}`` (docs/maths.md §8).

    Args:
        link: ``[..., N, N]``.
        read_weights_prev: ``[..., R, N]``.
    Returns:
        ``(forward, backward)``, each ``[..., R, N]``.
    """
    check_tensor("link", link)
    check_tensor("read_weights_prev", read_weights_prev)
    n = link.shape[-1]
    if link.dim() < 2 or link.shape[-2] != n:
        raise ValueError(f"`link` expected [..., N, N], got {list(link.shape)}")
    if read_weights_prev.dim() != link.dim() or read_weights_prev.shape[-1] != n:
        raise ValueError(
            f"`read_weights_prev` expected [..., R, N] with N = {n} and the link's batch dims, "
            f"got {list(read_weights_prev.shape)}"
        )
    forward = torch.matmul(read_weights_prev, link.transpose(-1, -2))  # f[i] = Σ_j L[i,j] w[j]
    backward = torch.matmul(read_weights_prev, link)  # b[j] = Σ_i L[i,j] w[i]
    return forward, backward


def dnc_read_weights(
    read_content: torch.Tensor,
    forward: torch.Tensor,
    backward: torch.Tensor,
    read_modes: torch.Tensor,
) -> torch.Tensor:
    """Read weighting ``w^r = π[0] b + π[1] c^r + π[2] f`` (docs/maths.md §8).

    Args:
        read_content: c^r ``[..., R, N]``.
        forward: f ``[..., R, N]``.
        backward: b ``[..., R, N]``.
        read_modes: π on the simplex over (backward, content, forward), ``[..., R, 3]``.
    Returns:
        ``[..., R, N]``.
    """
    check_tensor("read_content", read_content)
    _same("forward", forward, read_content.shape, "[..., R, N]")
    _same("backward", backward, read_content.shape, "[..., R, N]")
    _same("read_modes", read_modes, read_content.shape[:-1] + (3,), "[..., R, 3]")
    pi = read_modes.unsqueeze(-1)  # [..., R, 3, 1]
    return pi[..., 0, :] * backward + pi[..., 1, :] * read_content + pi[..., 2, :] * forward
