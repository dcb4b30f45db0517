"""Chunkwise-parallel NAM sequence scan (DeltaNet-style UT/WY form), for any p_w, p_e.

Write the recurrence with the pseudo-value ``u_t = p_w,t v_t − p_e,t S_{t−1} k_t`` so that
``S_t = S_{t−1} + u_t k_tᵀ``. Inside a chunk that starts from state ``S_0``,
``S_{t−1} = S_0 + Σ_{s<t} u_s k_sᵀ``, hence

    u_t + p_e,t Σ_{s<t} (k_t·k_s) u_s = p_w,t v_t − p_e,t S_0 k_t,

i.e. ``(I + A) U = P_w V − P_e K S_0ᵀ`` with ``A = tril(P_e K Kᵀ, −1)``: a unit-lower-triangular
system. With ``T = (I + A)⁻¹`` (one small inverse per chunk, every chunk at once) and
``[W_v, W_k] = T [P_w V, P_e K]``, ``U = W_v − W_k S_0ᵀ``; only the chunk-to-chunk state pass
``S ← S + Uᵀ K`` is sequential (T / chunk_size small matmuls). Outputs (read after write):
``O = Q S_0ᵀ + tril(Q Kᵀ) U``, then scaled by ``p_r``.

The chunk pass is one :class:`torch.autograd.Function` with a hand-derived backward (see
:class:`_ChunkScan`): it reuses the saved per-chunk states and ``T``, so the backward pass is
a few batched matmuls plus one reverse sequential pass over the chunks, with no triangular
solve. ``tests/test_nam_scan.py`` holds it to the reference loop (values and gradients,
float64) and runs ``torch.autograd.gradcheck`` on it. The backward is not itself
differentiable: for second derivatives use ``impl="reference"``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from .._amp import backward_without_autocast

__all__ = ["nam_scan_chunked", "unit_lower_inverse"]

_UPCAST = (torch.bfloat16, torch.float16)


def _to_chunks(x: torch.Tensor, n_chunks: int, chunk: int) -> torch.Tensor:
    """``[B, T, H, *rest] -> [N, B*H, C, *rest]`` (contiguous), zero-padding T to N*C."""
    B, T, H = x.shape[:3]
    pad = n_chunks * chunk - T
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 2) + [0, pad])
    x = x.reshape((B, n_chunks, chunk, H) + x.shape[3:]).transpose(2, 3)  # [B, N, H, C, *rest]
    return x.transpose(0, 1).reshape((n_chunks, B * H, chunk) + x.shape[4:]).contiguous()


def unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)⁻¹`` for strictly lower-triangular ``A`` of shape ``[..., C, C]``.

    Block doubling: with the diagonal blocks of size ``b`` already inverted, each pair of them
    forms a ``2b`` block whose inverse is ``[[T₁, 0], [−T₂ A₂₁ T₁, T₂]]``. Starting from the
    identity (``b = 1``) that takes ``⌈log₂ C⌉`` rounds of two batched matmuls each, which on
    a CPU is several times faster than a batched triangular solve against the identity.
    """
    C = A.shape[-1]
    lead = A.shape[:-2]
    P = 1 << max(C - 1, 0).bit_length()  # next power of two >= C
    if P != C:
        A = F.pad(A, (0, P - C, 0, P - C))
    A = A.reshape(-1, P, P)
    n = A.shape[0]
    Tm = A.new_zeros(n, P, P)
    Tm.diagonal(dim1=1, dim2=2).fill_(1)
    b = 1
    while b < P:
        m = P // (2 * b)  # number of 2b blocks on the diagonal
        # Off-diagonal block A21 and the inverted diagonal blocks of every 2b block.
        Ab = A.view(n, m, 2 * b, m, 2 * b).diagonal(dim1=1, dim2=3)  # [n, 2b, 2b, m]
        Tb = Tm.view(n, m, 2 * b, m, 2 * b).diagonal(dim1=1, dim2=3)
        a21 = Ab[:, b:, :b].permute(0, 3, 1, 2).reshape(n * m, b, b)
        t11 = Tb[:, :b, :b].permute(0, 3, 1, 2).reshape(n * m, b, b)
        t22 = Tb[:, b:, b:].permute(0, 3, 1, 2).reshape(n * m, b, b)
        t21 = -(t22 @ (a21 @ t11))
        Tb[:, b:, :b] = t21.view(n, m, b, b).permute(0, 2, 3, 1)
        b *= 2
    Tm = Tm.view(lead + (P, P))
    return Tm[..., :C, :C] if P != C else Tm


class _ChunkScan(torch.autograd.Function):
    """Chunk pass on chunked tensors: q, k ``[N, BH, C, dk]``, v ``[N, BH, C, dv]``,
    p_w, p_e ``[N, BH, C, 1]``, state ``[BH, dv, dk]`` -> (O ``[N, BH, C, dv]``, final state).

    Chunk-major layout: the sequential passes touch one contiguous ``[BH, ...]`` slice per chunk.

    Backward (per chunk, ``P = tril(Q Kᵀ)``, ``L = I + A``, ``T = L⁻¹``,
    ``[W_v, W_k] = T [P_w V, P_e K]``; ``dS₁`` is the gradient of the state after the chunk)::

        dU  = Pᵀ dO + K dS₁ᵀ                      (reverse pass over chunks)
        dS₀ = dS₁ + dOᵀ Q − dUᵀ W_k
        dP  = tril(dO Uᵀ);  dQ = dO S₀ + dP K;  dK = dPᵀ Q + U dS₁
        dR_v = Tᵀ dU;  dR_k = −dR_v S₀;  dA = −stril(dR_v Uᵀ)
        M   = dA K + dR_k;  dP_e = rowsum(M ⊙ K);  dP_w = rowsum(dR_v ⊙ V)
        dK += P_e M + (P_e dA)ᵀ K;  dV = P_w dR_v

    (``rowsum(dA ⊙ K Kᵀ) = rowsum((dA K) ⊙ K)``, so the Gram matrix need not be kept.)
    Matmuls run on 3-D views with in-place accumulation (``baddbmm_``): on a CPU, allocating
    a fresh output costs about as much as an elementwise pass over it.
    """

    @staticmethod
    def forward(ctx, q, k, v, pw, pe, state):
        N, BH, C, dk = k.shape
        dv = v.shape[-1]
        NB = N * BH
        q3, k3, v3 = (x.view(NB, C, x.shape[-1]) for x in (q, k, v))
        pw3, pe3 = pw.view(NB, C, 1), pe.view(NB, C, 1)
        lower = torch.ones(C, C, dtype=k.dtype, device=k.device).tril()
        strict = lower.tril(-1)
        A = torch.bmm(k3, k3.mT).mul_(pe3).mul_(strict)  # stril(P_e K Kᵀ)
        Tm = unit_lower_inverse(A)  # (I + A)⁻¹
        if torch.compiler.is_compiling():  # the compiler refuses out= into a strided view
            R = torch.cat([v3 * pw3, k3 * pe3], -1)
        else:
            R = k.new_empty(NB, C, dv + dk)  # [P_w V, P_e K] (written in place: torch.cat along
            torch.mul(v3, pw3, out=R[..., :dv])  # the last dim is far slower on CPU)
            torch.mul(k3, pe3, out=R[..., dv:])
        W = torch.bmm(Tm, R).view(N, BH, C, dv + dk)  # [W_v, W_k]
        Wk = W[..., dv:]

        # States at the chunk boundaries: Sb[n] is the state before chunk n, Sb[N] the final one.
        Sb = k.new_empty(N + 1, BH, dv, dk)
        Sb[0] = state
        U = W[..., :dv].contiguous()  # becomes U = W_v − W_k S₀ᵀ in place
        for n in range(N):
            U[n].baddbmm_(Wk[n], Sb[n].mT, alpha=-1)
            torch.baddbmm(Sb[n], U[n].mT, k[n], out=Sb[n + 1])
        S0 = Sb[:N]
        S03, U3 = S0.view(NB, dv, dk), U.view(NB, C, dv)
        P = torch.bmm(q3, k3.mT).mul_(lower)  # tril(Q Kᵀ)
        O = torch.bmm(q3, S03.mT).baddbmm_(P, U3)
        ctx.save_for_backward(q, k, v, pw, pe, Tm, Wk, S0, U, P)
        return O.view(N, BH, C, dv), Sb[N]

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dO, dS):
        q, k, v, pw, pe, Tm, Wk, S0, U, P = ctx.saved_tensors
        N, BH, C, dk = k.shape
        dv = v.shape[-1]
        NB = N * BH
        q3, k3, v3 = (x.view(NB, C, x.shape[-1]) for x in (q, k, v))
        pw3, pe3 = pw.view(NB, C, 1), pe.view(NB, C, 1)
        S03, U3 = S0.view(NB, dv, dk), U.view(NB, C, dv)
        lower = torch.ones(C, C, dtype=k.dtype, device=k.device).tril()
        nstrict = -lower.tril(-1)
        # Incoming gradients may be broadcast views (e.g. of a ``.sum()``); matmuls on
        # stride-0 operands copy matrix by matrix, so materialise them once.
        dO3 = dO.contiguous().view(NB, C, dv)

        # Gradients at the chunk boundaries: dSb[n + 1] is that of the state after chunk n.
        # dSb[:N] starts as dOᵀ Q per chunk and becomes dS₀ = dS₁ + dOᵀ Q − dUᵀ W_k in place.
        dSb = k.new_empty(N + 1, BH, dv, dk)
        torch.bmm(dO3.mT, q3, out=dSb[:N].view(NB, dv, dk))
        dSb[N] = dS
        dU = torch.bmm(P.mT, dO3).view(N, BH, C, dv)  # Pᵀ dO, completed below
        for n in range(N - 1, -1, -1):
            dUn = dU[n].baddbmm_(k[n], dSb[n + 1].mT)
            dSb[n].add_(dSb[n + 1]).baddbmm_(dUn.mT, Wk[n], alpha=-1)
        d_state = dSb[0]
        dU3, dS13 = dU.view(NB, C, dv), dSb[1:].view(NB, dv, dk)

        # dR_v = Tᵀ dU and dR_k = −Tᵀ dU S₀ = −dR_v S₀; with U = W_v − W_k S₀ᵀ,
        # dA = −stril(dR_v W_vᵀ + dR_k W_kᵀ) = −stril(dR_v Uᵀ).
        dRv = torch.bmm(Tm.mT, dU3)
        ndRk = torch.bmm(dRv, S03)  # −dR_k
        dA = torch.bmm(dRv, U3.mT).mul_(nstrict)
        M = torch.bmm(dA, k3).sub_(ndRk)  # dA K + dR_k
        dpe = torch.linalg.vecdot(M, k3)
        dk_ = torch.bmm(dA.mul_(pe3).mT, k3).addcmul_(M, pe3)
        dP = torch.bmm(dO3, U3.mT).mul_(lower)
        dq = torch.bmm(dO3, S03).baddbmm_(dP, k3)
        dk_.baddbmm_(dP.mT, q3).baddbmm_(U3, dS13)
        dpw = torch.linalg.vecdot(dRv, v3)
        dv_ = dRv * pw3
        shape = (N, BH, C)
        return (dq.view(shape + (dk,)), dk_.view(shape + (dk,)), dv_.view(shape + (dv,)),
                dpw.view(shape + (1,)), dpe.view(shape + (1,)), d_state)


def _first_nonfinite(bad: torch.Tensor) -> list[int]:
    """The distinct steps at which a row of ``bad`` (``[R, T]`` bool: the step's inputs are not
    all finite) turns bad for the first time, sorted."""
    rows = bad.any(-1)
    return sorted(set(bad[rows].to(torch.uint8).argmax(-1).tolist()))


def _nonfinite_cuts(k, v, p_w, p_e) -> list[int]:
    """Where to cut the sequence so that a NaN or Inf at step t reaches no output before t.

    Inside a chunk the scan multiplies by triangular matrices, and ``0 · NaN`` is NaN, so a
    non-finite key, value or probability at step t would spoil the chunk's earlier outputs
    too. Cutting the sequence at the first non-finite step of each sequence and head keeps
    such a step first in its chunk: a sequence is then either clean in a chunk or spoilt from
    its first step on, as in the step-by-step recurrence. Queries and ``p_r`` reach only their
    own step's output. Empty when every value is finite: one sum (a NaN or Inf anywhere makes it
    non-finite; finite values whose sum overflows only take the slower look below)."""
    if bool(torch.isfinite(k.sum() + v.sum() + p_w.sum() + p_e.sum())):
        return []
    bad = (~torch.isfinite(k).all(-1) | ~torch.isfinite(v).all(-1) | ~torch.isfinite(p_w)
           | ~torch.isfinite(p_e))  # [B, T, H]
    return [t for t in _first_nonfinite(bad.transpose(1, 2).reshape(-1, bad.shape[1])) if t > 0]


def _scan(q, k, v, p_w, p_e, S, chunk_size: int):
    """The chunk pass over ``[B, T, H, ·]`` inputs from the states ``S`` ``[B·H, dv, dk]``:
    ``(O [B, T, H, dv], final state [B·H, dv, dk])``."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    C = min(chunk_size, T)
    N = -(-T // C)
    qc, kc, vc = (_to_chunks(x, N, C) for x in (q, k, v))
    pw = _to_chunks(p_w, N, C).unsqueeze(-1)  # [N, BH, C, 1]
    pe = _to_chunks(p_e, N, C).unsqueeze(-1)
    O, S = _ChunkScan.apply(qc, kc, vc, pw, pe, S)  # O: [N, B*H, C, dv]
    return O.view(N, B, H, C, dv).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, dv)[:, :T], S


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
    if out_dtype in _UPCAST:  # the chunk inverse needs float32 or better
        q, k, v, p_w, p_e, initial_state = (
            t.float() for t in (q, k, v, p_w, p_e, initial_state)
        )
        p_r = None if p_r is None else p_r.float()
    S = initial_state.expand(B, H, dv, dk).reshape(B * H, dv, dk)
    cuts = [] if torch.compiler.is_compiling() else _nonfinite_cuts(k, v, p_w, p_e)
    if not cuts:
        O, S = _scan(q, k, v, p_w, p_e, S, chunk_size)
    else:  # every cut starts a run of chunks: no chunk holds a non-finite step after a clean one
        outs = []
        for a, b in zip([0] + cuts, cuts + [T]):
            if b > a:
                o, S = _scan(q[:, a:b], k[:, a:b], v[:, a:b], p_w[:, a:b], p_e[:, a:b], S, chunk_size)
                outs.append(o)
        O = torch.cat(outs, 1)
    if p_r is not None:
        O = O * p_r.unsqueeze(-1)
    return O.to(out_dtype), S.view(B, H, dv, dk).to(out_dtype)
