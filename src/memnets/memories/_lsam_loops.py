"""The per-step loops of LSAM's fused recurrence (:class:`memnets.memories.lsam._LSAMRecurrence`).

Both loops are written in the subset of Python that TorchScript compiles. :func:`loops` hands
out compiled versions when TorchScript is available: a compiled loop runs without Python's
per-operation overhead and without holding the GIL, so the batch slices of one recurrence can
run side by side on threads (``lsam_scan(..., parts=...)``). Where compiling fails (no
TorchScript in the installed PyTorch, sources not shipped) the same functions run as plain
Python, with identical results.

Buffers (N = dirs·B·H' memories of d × d, T steps):

- ``X [N, d, d]``: the memory, stored transposed (``Mᵀ``) so that the row-vector products
  ``(q, k) Mᵀ`` read it row-major; updated in place.
- ``QK [T, N, 2, d]``, ``NRM [T, N, 2, 1]``, ``P [T, N, 2]``, ``CQ [T, N]``, ``E``, ``U``,
  ``R [T, N, d]``: the per-step values the backward pass needs (unit q/k, their norms,
  (p_r, p_w), q·k, v − M k, u = p_w (v − M k), M_t q).
- ``ckpts [(T-1)//segment, N, d, d]``: exact copies of ``X`` every ``segment`` steps.
"""
from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["forward_loop", "backward_loop", "loops"]


def forward_loop(gx: torch.Tensor, w_hh: torch.Tensor, X: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
                 QK: torch.Tensor, NRM: torch.Tensor, P: torch.Tensor, CQ: torch.Tensor, E: torch.Tensor,
                 U: torch.Tensor, R: torch.Tensor, ckpts: torch.Tensor, segment: int, eps: float) -> None:
    """Run the recurrence over ``gx [T, dirs, B, G]`` (rows in per-head blocks ``[q k v r w]``),
    recurrent weight ``w_hh [dirs, G, D']``, from ``X`` (= M₀ᵀ, updated in place to M_Tᵀ) and
    ``h0 [dirs, B, D']``, writing ``out [T, dirs, B, D']`` and the saved buffers."""
    T, dirs, B = gx.shape[0], gx.shape[1], gx.shape[2]
    Dp = w_hh.shape[2]
    N, d = X.shape[0], X.shape[2]
    h = h0
    w1 = w_hh[0].t()  # [D', G]
    wT = w_hh.transpose(1, 2)  # [dirs, D', G]
    outv = out.view(T, N, d)
    for t in range(T):
        if dirs == 1:  # a 2-D matmul uses every intra-op thread (a batch-of-one bmm does not)
            blk = torch.addmm(gx[t, 0], h[0], w1).view(N, 3 * d + 2)
        else:
            blk = torch.baddbmm(gx[t], h, wT).view(N, 3 * d + 2)
        raw = blk[:, : 2 * d].view(N, 2, d)
        nrm = torch.linalg.vector_norm(raw, 2.0, [-1], True, out=NRM[t]).clamp_min_(eps)  # [N, 2, 1]
        qk = torch.div(raw, nrm, out=QK[t])  # [N, 2, d] = (μ(q), μ(k))
        p = torch.sigmoid(blk[:, 3 * d:], out=P[t])  # [N, 2] = (p_r, p_w)
        ab = torch.bmm(qk, X)  # [N, 2, d] = (M q, M k)
        e = torch.sub(blk[:, 2 * d: 3 * d], ab[:, 1], out=E[t])  # v − M k
        u = torch.mul(e, p[:, 1:], out=U[t])  # [N, d]
        X.addcmul_(qk[:, 1:].transpose(1, 2), u.unsqueeze(1))  # Mᵀ + k uᵀ, in place
        c = torch.linalg.vecdot(qk[:, 0], qk[:, 1], out=CQ[t]).unsqueeze(-1)  # q·k: [N, 1]
        r = torch.addcmul(ab[:, 0], u, c, out=R[t])  # M_t q = M q + u (k·q)
        h = torch.mul(r, p[:, :1], out=outv[t]).view(dirs, B, Dp)  # h_t = p_r M_t q
        if (t + 1) % segment == 0 and t < T - 1:
            ckpts[(t + 1) // segment - 1].copy_(X)


def backward_loop(w_hh: torch.Tensor, work: torch.Tensor, dM: torch.Tensor, dh: torch.Tensor,
                  dout: torch.Tensor, dgx: torch.Tensor, ckpts: torch.Tensor, QK: torch.Tensor,
                  U: torch.Tensor, P: torch.Tensor, CQ: torch.Tensor, R: torch.Tensor, E: torch.Tensor,
                  QKS: torch.Tensor, QKM: torch.Tensor, INV: torch.Tensor, S: torch.Tensor,
                  segment: int) -> torch.Tensor:
    """Reverse pass: ``work`` holds M_T (row-major, reversed in place to M₀), ``dM [N, d, d]``
    the gradient of M_T (accumulated in place to that of M₀), ``dh [N, d]`` that of h_T;
    writes ``dgx [T, dirs, B, G]`` and returns the gradient of h₀ as ``[N, d]``.
    ``QKS`` is ``QK`` with (q, k) swapped, ``QKM`` ``QK`` where the norm exceeded eps (else
    0), ``INV = 1 / NRM``, ``S = P (1 − P)``."""
    T, dirs = dgx.shape[0], dgx.shape[1]
    N, d = work.shape[0], work.shape[2]
    dab = torch.empty(N, 2, d, dtype=work.dtype, device=work.device)  # (d a_q, d a_k)
    dMT = dM.transpose(1, 2)
    da_q, da_k, dabT = dab[:, 0], dab[:, 1], dab.transpose(1, 2)
    g4 = dgx.view(T, N, 3 * d + 2)  # per-head blocks [q k v r w] of every dg_t
    dov = dout.reshape(T, N, d)
    for t in range(T - 1, -1, -1):
        qk, u, p, c, r, e = QK[t], U[t], P[t], CQ[t].unsqueeze(-1), R[t], E[t]
        if (t + 1) % segment == 0 and t < T - 1:
            work.copy_(ckpts[(t + 1) // segment - 1].transpose(1, 2))  # exact M_t
        k1 = qk[:, 1:]  # [N, 1, d]
        work.addcmul_(u.unsqueeze(-1), k1, value=-1.0)  # M_{t-1} = M_t − u kᵀ
        dh = dov[t] + dh
        dp_r = torch.linalg.vecdot(dh, r)
        dr = torch.mul(dh, p[:, :1], out=da_q)  # = d(a_q)
        du = torch.bmm(k1, dMT).squeeze(1).addcmul_(dr, c)  # dM k + dr (q·k)
        dc = torch.linalg.vecdot(dr, u)
        dp_w = torch.linalg.vecdot(du, e)
        g = g4[t]
        de = torch.mul(du, p[:, 1:], out=g[:, 2 * d: 3 * d])  # = dv = −d(a_k)
        torch.neg(de, out=da_k)
        dqk = torch.bmm(dab, work)  # [N, 2, d] = (M_{t-1}ᵀ da_q, M_{t-1}ᵀ da_k)ᵀ
        dqk[:, 1:] += torch.bmm(u.unsqueeze(1), dM)  # + dM_tᵀ u
        dqk.addcmul_(QKS[t], dc.view(N, 1, 1))  # + dc (k, q)
        dM.baddbmm_(dabT, qk)  # dM_{t-1} = dM_t + da_q qᵀ + da_k kᵀ
        proj = torch.linalg.vecdot(dqk, QKM[t]).unsqueeze(-1)  # [N, 2, 1]
        torch.mul(torch.addcmul(dqk, qk, proj, value=-1.0), INV[t], out=g[:, : 2 * d].view(N, 2, d))  # μ'
        sg = S[t]
        torch.mul(dp_r, sg[:, 0], out=g[:, 3 * d])  # σ backward
        torch.mul(dp_w, sg[:, 1], out=g[:, 3 * d + 1])
        if dirs == 1:
            dh = torch.mm(dgx[t, 0], w_hh[0]).view(N, d)
        else:
            dh = torch.bmm(dgx[t], w_hh).view(N, d)
    return dh


_COMPILED: tuple | None = None
_LOCK = threading.Lock()


def loops(compiled: bool = True):
    """``(forward_loop, backward_loop, is_compiled)``: the TorchScript-compiled pair when
    ``compiled`` and compiling works (tried once per process), else the Python functions."""
    global _COMPILED
    if not compiled:
        return forward_loop, backward_loop, False
    with _LOCK:
        if _COMPILED is None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TorchScript's deprecation notice
                    _COMPILED = (torch.jit.script(forward_loop), torch.jit.script(backward_loop), True)
            except Exception:  # no TorchScript, or no sources to compile: plain Python
                _COMPILED = (forward_loop, backward_loop, False)
    return _COMPILED
