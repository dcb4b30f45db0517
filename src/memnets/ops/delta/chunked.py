"""Chunkwise-parallel NAM sequence scan (DeltaNet-style UT/WY form), for any p_w, p_e.

Write the recurrence with the pseudo-value ``u_t = p_w,t v_t − p_e,t S_{t−1} k_t`` so that
``S_t = S_{t−1} + u_t k_tᵀ``. Inside a chunk that starts from state ``S_0``,
``S_{t−1} = S_0 + Σ_{s<t} u_s k_sᵀ``, hence

    u_t + p_e,t Σ_{s<t} (k_t·k_s) u_s = p_w,t v_t − p_e,t S_0 k_t,

i.e. ``(I + A) U = P_w V − P_e K S_0ᵀ`` with ``A = tril(P_e K Kᵀ, −1)`` unit-lower-triangular
system. Solving once for ``[P_w V, P_e K]`` (every chunk in parallel) gives
``U = W_v − W_k S_0ᵀ``; only the chunk-to-chunk state pass ``S ← S + Uᵀ K`` is sequential
(T / chunk_size small matmuls). Outputs: ``O = P_r (Q S_0ᵀ + tril(Q Kᵀ) U)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["nam_scan_chunked"]

_UPCAST = (torch.bfloat16, torch.float16)


def _to_chunks(x: torch.Tensor, n_chunks: int, chunk: int) -> torch.Tensor:
    """``[B, T, H, *rest] -> [B, H, N, C, *rest]``, zero-padding T to N*C."""
    x = x.movedim(1, 2)  # [B, H, T, *rest]
    pad = n_chunks * chunk - x.shape[2]
    if pad:
        widths = [0, 0] * (x.dim() - 3) + [0, pad]
        x = F.pad(x, widths)
    return x.reshape(x.shape[:2] + (n_chunks, chunk) + x.shape[3:])  # [B, H, N, C, *rest]


def nam_scan_chunked(
    q: torch.Tensor,  # [B, T, H, dk]
    k: torch.Tensor,  # [B, T, H, dk]
    v: torch.Tensor,  # [B, T, H, dv]
    p_w: torch.Tensor,  # [B, T, H]
    p_e: torch.Tensor,  # [B, T, H]
    p_r: torch.Tensor | None,  # [B, T, H] or None
    initial_state: torch.Tensor,  # [B, H, dv, dk]
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    out_dtype = v.dtype
    if out_dtype in _UPCAST:  # triangular solves need float32 or better
        q, k, v, p_w, p_e, initial_state = (
            t.float() for t in (q, k, v, p_w, p_e, initial_state)
        )
        p_r = None if p_r is None else p_r.float()
    C = min(chunk_size, T)
    N = -(-T // C)
    qc = _to_chunks(q, N, C)  # [B, H, N, C, dk]
    kc = _to_chunks(k, N, C)  # [B, H, N, C, dk]
    vc = _to_chunks(v, N, C)  # [B, H, N, C, dv]
    pw = _to_chunks(p_w, N, C).unsqueeze(-1)  # [B, H, N, C, 1]
    pe = _to_chunks(p_e, N, C).unsqueeze(-1)  # [B, H, N, C, 1]

    # Intra-chunk system (I + A) [W_v, W_k] = [P_w V, P_e K], all chunks at once.
    # Triangular masks as multiplications: batched .tril() is slow on CPU.
    lower = torch.ones(C, C, dtype=kc.dtype, device=kc.device).tril()  # incl. diagonal
    eye = torch.eye(C, dtype=kc.dtype, device=kc.device)
    A = pe * (kc @ kc.transpose(-1, -2)) * (lower - eye)  # strictly lower: [B, H, N, C, C]
    rhs = torch.cat([pw * vc, pe * kc], dim=-1)  # [B, H, N, C, dv + dk]
    sol = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    Wv, Wk = sol.split([dv, dk], dim=-1)  # [B, H, N, C, dv], [B, H, N, C, dk]

    # Sequential pass of the state across chunks.
    # (unbind, not indexing: its backward stacks the gradients instead of materialising a
    # full-size zero gradient per chunk.)
    S = initial_state
    starts, us = [], []
    for wv, wk, kn in zip(Wv.unbind(2), Wk.unbind(2), kc.unbind(2)):
        starts.append(S)
        U = torch.baddbmm(wv.flatten(0, 1), wk.flatten(0, 1), S.flatten(0, 1).transpose(-1, -2),
                          alpha=-1).view(wv.shape)  # [B, H, C, dv]
        S = S + U.transpose(-1, -2) @ kn  # [B, H, dv, dk]
        us.append(U)
    S0 = torch.stack(starts, dim=2)  # [B, H, N, dv, dk]
    U = torch.stack(us, dim=2)  # [B, H, N, C, dv]

    # Read after write: o_t = S_t q_t = S_0 q_t + Σ_{s<=t} (k_s·q_t) u_s.
    O = qc @ S0.transpose(-1, -2) + ((qc @ kc.transpose(-1, -2)) * lower) @ U  # [B, H, N, C, dv]
    O = O.reshape(B, H, N * C, dv)[:, :, :T].movedim(2, 1)  # [B, T, H, dv]
    if p_r is not None:
        O = O * p_r.unsqueeze(-1)
    return O.to(out_dtype), S.to(out_dtype)
