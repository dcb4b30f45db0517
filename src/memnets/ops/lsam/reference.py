"""LSAM's reference (docs/maths.md §2): one step written with :func:`memnets.ops.nam_write` /
:func:`memnets.ops.nam_read` under plain autograd, and the layer as a loop of it (twice
differentiable; ``LSAM(impl="reference")``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..nam import merge_heads, nam_read, nam_write, split_heads, unit

__all__ = ["lsam_cell_step", "lsam_scan_reference"]


def lsam_cell_step(x_t, memory, h, weight_ih, weight_hh, bias, num_heads):
    """One LSAM step (docs/maths.md §2) with :func:`nam_write` / :func:`nam_read`, plain autograd.

    x_t ``[B, F]``, memory ``[B, H, d, d]``, h ``[B, D]``, weight_ih ``[3D+2H, F]``,
    weight_hh ``[3D+2H, D]``, bias ``[3D+2H]`` -> ``(memory, h)`` after the step.
    """
    D, H = h.shape[-1], num_heads
    z = torch.cat([x_t, h], dim=-1)  # [B, F + D]
    g = F.linear(z, torch.cat([weight_ih, weight_hh], dim=1), bias)
    q, k, v, a_r, a_w = g.split([D, D, D, H, H], dim=-1)
    q = unit(split_heads(q, H))  # [B, H, d]
    k = unit(split_heads(k, H))  # [B, H, d]
    v = split_heads(v, H)  # [B, H, d]
    p_r, p_w = torch.sigmoid(a_r), torch.sigmoid(a_w)  # [B, H]
    memory = nam_write(memory, k, v, p_w, p_w)
    return memory, merge_heads(nam_read(memory, q, p_r))  # [B, H, d, d], [B, D]


def lsam_scan_reference(x, weight_ih, weight_hh, bias, memory, h, num_heads):
    """:func:`~memnets.ops.lsam.recurrence.lsam_scan` as a loop of :func:`lsam_cell_step` (same
    signature and results; plain autograd, so also twice differentiable)."""
    dirs, outs, mems, hs = weight_hh.shape[0], [], [], []
    for j in range(dirs):
        xs = x if j == 0 else x.flip(0)
        M, hj, ys = memory[j], h[j], []
        for x_t in xs.unbind(0):
            M, hj = lsam_cell_step(x_t, M, hj, weight_ih[j], weight_hh[j], bias[j], num_heads)
            ys.append(hj)
        y = torch.stack(ys, 0)  # [T, B, D']
        outs.append(y if j == 0 else y.flip(0))
        mems.append(M)
        hs.append(hj)
    return torch.cat(outs, -1), torch.stack(mems, 0), torch.stack(hs, 0)
