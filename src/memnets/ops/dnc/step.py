"""One fused DNC memory-access step (docs/maths.md §8): the per-step form of the fused path.

:func:`dnc_access_fused` is the memory access of one step with the equations regrouped into
fewer ops; the erase/add write, temporal link, precedence and directional weightings are one
autograd node, :class:`WriteLink`, with a hand-derived backward. ``DNC(impl="fused")`` runs
it for ``step`` and ``forward(..., return_aux=True)``; the whole-sequence forward is
:class:`~memnets.ops.dnc.recurrence.DNCRecurrence`. The per-equation reference is
:mod:`memnets.ops.dnc.equations`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from .._amp import backward_without_autocast

__all__ = ["WriteLink", "dnc_access_fused", "interface_sizes"]


def interface_sizes(R: int, W: int) -> list[int]:
    """Widths of the interface vector's parts in docs/maths.md §8 order: read keys, read strengths,
    write key, write strength, erase, write vector, free gates, allocation gate, write gate, read modes."""
    return [R * W, R, W, 1, W, W, R, 1, 1, 3 * R]


class WriteLink(torch.autograd.Function):
    """Fused erase/add write, temporal link, precedence and directional weightings (docs/maths.md §8).

    One autograd node with a hand-derived backward instead of ~40 small ones; the per-equation
    reference is ``DNC(impl="reference")``'s access (tests hold both equal in values and gradients).
    Inputs: memory [B, N, W], link [B, N, N], precedence [B, N], w [B, N], erase [B, W],
    v [B, W], read_weights_prev [B, R, N], offdiag [N, N] (constant).
    Outputs: memory', link', precedence', forward [B, R, N], backward [B, R, N].
    """

    @staticmethod
    def forward(ctx, mem, link, prec, w, erase, v, wr, offdiag):
        wcol = w.unsqueeze(-1)  # [B, N, 1]
        keep = 1 - wcol * erase.unsqueeze(1)  # [B, N, W]
        mem_new = torch.baddbmm(mem * keep, wcol, v.unsqueeze(1))
        decay = 1 - wcol - w.unsqueeze(1)  # [B, N, N]
        link_new = torch.baddbmm(link * decay, wcol, prec.unsqueeze(1)) * offdiag
        prec_new = (1 - w.sum(-1, keepdim=True)) * prec + w
        fwd = torch.bmm(wr, link_new.transpose(1, 2))  # f[r, i] = Σ_j L[i, j] w[r, j]
        bwd = torch.bmm(wr, link_new)  # b[r, j] = Σ_i L[i, j] w[r, i]
        ctx.save_for_backward(mem, link, prec, w, erase, v, wr, offdiag, keep, decay, link_new)
        return mem_new, link_new, prec_new, fwd, bwd

    @staticmethod
    @backward_without_autocast
    def backward(ctx, g_mem, g_link, g_prec, g_fwd, g_bwd):
        mem, link, prec, w, erase, v, wr, offdiag, keep, decay, link_new = ctx.saved_tensors
        zeros = torch.zeros_like
        g_mem = zeros(mem) if g_mem is None else g_mem
        g_link = zeros(link) if g_link is None else g_link
        g_prec = zeros(prec) if g_prec is None else g_prec
        g_fwd = zeros(wr) if g_fwd is None else g_fwd
        g_bwd = zeros(wr) if g_bwd is None else g_bwd
        # directional weightings
        g_wr = torch.bmm(g_fwd, link_new) + torch.bmm(g_bwd, link_new.transpose(1, 2))
        G = (g_link + torch.bmm(g_fwd.transpose(1, 2), wr) + torch.bmm(wr.transpose(1, 2), g_bwd)) * offdiag
        # link: L' = (1 - w_i - w_j) L + w_i p_j
        g_link_prev = G * decay
        GL = G * link
        g_w = torch.bmm(G, prec.unsqueeze(-1)).squeeze(-1) - GL.sum(2) - GL.sum(1)
        g_p = torch.bmm(w.unsqueeze(1), G).squeeze(1)
        # precedence: p' = (1 - Σ w) p + w
        g_p = g_p + g_prec * (1 - w.sum(-1, keepdim=True))
        g_w = g_w + g_prec - (g_prec * prec).sum(-1, keepdim=True)
        # memory: M' = M ∘ (1 - w eᵀ) + w vᵀ
        g_mem_prev = g_mem * keep
        GM = g_mem * mem
        g_w = g_w + torch.bmm(g_mem, v.unsqueeze(-1)).squeeze(-1) - torch.bmm(GM, erase.unsqueeze(-1)).squeeze(-1)
        g_erase = -torch.bmm(w.unsqueeze(1), GM).squeeze(1)
        g_v = torch.bmm(w.unsqueeze(1), g_mem).squeeze(1)
        return g_mem_prev, g_link_prev, g_p, g_w, g_erase, g_v, g_wr, None


def dnc_access_fused(xi: torch.Tensor, R: int, W: int, memory: torch.Tensor, usage: torch.Tensor,
                     link: torch.Tensor, precedence: torch.Tensor, read_weights: torch.Tensor,
                     write_weights: torch.Tensor, offdiag: torch.Tensor, eps: float = 1e-6):
    """The memory access of one step from the interface vector ``xi [B, |interface|]`` (rows in
    :func:`interface_sizes` order) and the previous access state (memory ``[B, N, W]``, usage
    ``[B, N]``, link ``[B, N, N]``, precedence ``[B, N]``, read weights ``[B, R, N]``, write weights
    ``[B, N]``); ``offdiag = 1 − I_N``. Returns ``(reads [B, R, W], (memory, usage, link,
    precedence, read_weights, write_weights), read_modes [B, R, 3])``, the values of the
    per-equation reference."""
    B = xi.shape[0]
    sizes = interface_sizes(R, W)
    k_r, _, k_w, _, _, v, _, _, _, modes = torch.split(xi, sizes, dim=-1)
    _, b_r, _, b_w, _, _, _, _, _, _ = torch.split(F.softplus(xi), sizes, dim=-1)
    _, _, _, _, erase, _, free, g_a, g_w, _ = torch.split(torch.sigmoid(xi), sizes, dim=-1)
    # retention, usage and sort-based allocation
    psi = (1 - free.unsqueeze(-1) * read_weights).prod(1)
    usage = (usage + write_weights * (1 - usage)) * psi
    with torch.no_grad():
        phi = torch.sort(usage, dim=-1, stable=True)[1]
    su = usage.gather(-1, phi)
    excl = torch.cumprod(F.pad(su[:, :-1], (1, 0), value=1.0), dim=-1)  # Π_{i<j} u[φ_i]
    alloc = torch.zeros_like(su).scatter(-1, phi, (1 - su) * excl)
    # write weighting: β·cos folded into the scaled unit key
    kw = k_w * ((1 + b_w) * torch.rsqrt((k_w * k_w).sum(-1, keepdim=True) + eps))
    mem = memory
    c_w = torch.softmax(torch.bmm(mem, kw.unsqueeze(-1)).squeeze(-1) * torch.rsqrt((mem * mem).sum(-1) + eps), -1)
    w_w = g_w * (c_w + g_a * (alloc - c_w))
    mem, link, precedence, fwd, bwd = WriteLink.apply(mem, link, precedence, w_w, erase, v, read_weights, offdiag)
    # read weighting
    kr = k_r.view(B, R, W)  # [B, R, W]
    kr = kr * ((1 + b_r).unsqueeze(-1) * torch.rsqrt((kr * kr).sum(-1, keepdim=True) + eps))
    nrm = torch.rsqrt((mem * mem).sum(-1) + eps).unsqueeze(1)
    c_r = torch.softmax(torch.bmm(kr, mem.transpose(1, 2)) * nrm, -1)
    read_modes = torch.softmax(modes.view(B, R, 3), dim=-1)  # [B, R, 3]
    w_r = read_modes[..., 0:1] * bwd + read_modes[..., 1:2] * c_r + read_modes[..., 2:3] * fwd
    reads = torch.bmm(w_r, mem)  # [B, R, W]
    return reads, (mem, usage, link, precedence, w_r, w_w), read_modes
