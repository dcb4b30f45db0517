"""Reference NAM sequence scan: a plain time loop straight from docs/maths.md §1.

For t = 1..T (per batch element and head):
    S_t = S_{t-1} + p_w,t v_t k_tᵀ − p_e,t (S_{t-1} k_t) k_tᵀ        (WR)
    o_t = p_r,t S_t q_t                                             (RD, read after write)
"""
from __future__ import annotations

import torch

__all__ = ["nam_scan_reference", "nam_step_reference"]


def nam_step_reference(
    q: torch.Tensor,  # [B, H, dk]
    k: torch.Tensor,  # [B, H, dk]
    v: torch.Tensor,  # [B, H, dv]
    p_w: torch.Tensor,  # [B, H]
    p_e: torch.Tensor,  # [B, H]
    p_r: torch.Tensor | None,  # [B, H] or None
    state: torch.Tensor,  # [B, H, dv, dk]
) -> tuple[torch.Tensor, torch.Tensor]:
    Sk = torch.einsum("bhvk,bhk->bhv", state, k)
    u = p_w.unsqueeze(-1) * v - p_e.unsqueeze(-1) * Sk  # [B, H, dv]
    state = state + u.unsqueeze(-1) * k.unsqueeze(-2)  # [B, H, dv, dk]
    o = torch.einsum("bhvk,bhk->bhv", state, q)
    if p_r is not None:
        o = o * p_r.unsqueeze(-1)
    return o, state


def nam_scan_reference(
    q: torch.Tensor,  # [B, T, H, dk]
    k: torch.Tensor,  # [B, T, H, dk]
    v: torch.Tensor,  # [B, T, H, dv]
    p_w: torch.Tensor,  # [B, T, H]
    p_e: torch.Tensor,  # [B, T, H]
    p_r: torch.Tensor | None,  # [B, T, H] or None
    initial_state: torch.Tensor,  # [B, H, dv, dk]
) -> tuple[torch.Tensor, torch.Tensor]:
    state = initial_state
    outs = []
    # unbind (not q[:, t]) so the backward pass stacks per-step gradients instead of
    # materialising a full-size zero gradient per step (which would make it quadratic in T).
    steps = zip(q.unbind(1), k.unbind(1), v.unbind(1), p_w.unbind(1), p_e.unbind(1),
                [None] * q.shape[1] if p_r is None else p_r.unbind(1))
    for q_t, k_t, v_t, pw_t, pe_t, pr_t in steps:
        o, state = nam_step_reference(q_t, k_t, v_t, pw_t, pe_t, pr_t, state)
        outs.append(o)
    return torch.stack(outs, dim=1), state  # [B, T, H, dv], [B, H, dv, dk]
