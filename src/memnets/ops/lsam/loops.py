"""The per-step loops of LSAM's fused recurrence (:class:`memnets.ops.lsam.recurrence.LSAMRecurrence`).

Both loops are written in the subset of Python that TorchScript compiles. :func:`loops` hands
out compiled versions when TorchScript is available: a compiled loop runs without Python's
per-operation overhead. Where compiling fails (no TorchScript in the installed PyTorch,
sources not shipped) the same functions run as plain Python, with identical results.

Buffers (N = dirs·B·H' memories of d × d, T steps):

- ``X [N, d, d]``: the memory, stored transposed (``Mᵀ``) so that the row-vector products
  ``(q, k) Mᵀ`` read it row-major; updated in place.
- ``QK [T, N, 2, d]``, ``NRM [T, N, 2, 1]``, ``P [T, N, 2]``, ``CQ [T, N]``, ``E``, ``U``,
  ``R [T, N, d]``: the per-step values the backward pass needs (unit q/k, their norms,
  (p_r, p_w), q·k, v − M k, u = p_w (v − M k), M_t q).
- ``ckpts [(T-1)//segment, N, d, d]``: exact copies of ``X`` every ``segment`` steps.
"""
from __future__ import annotations

import torch

from .._script import script_once

__all__ = ["forward_loop", "backward_loop", "loops"]


def forward_loop(gx: torch.Tensor, w_hh: torch.Tensor, X: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
                 QK: torch.Tensor, NRM: torch.Tensor, P: torch.Tensor, CQ: torch.Tensor, E: torch.Tensor,
                 U: torch.Tensor, R: torch.Tensor, ckpts: torch.Tensor, segment: int, eps: float) -> None:
    """Run the recurrence over ``gx [T, dirs, B, G]`` (rows in per-head blocks ``[q k v r w]``),
    recurrent weight ``w_hh [dirs, G, D']``, from ``X`` (= M₀ᵀ, updated in place to M_Tᵀ) and
    ``h0 [dirs, B, D']``, writing ``out [T, dirs, B, D']`` and the saved buffers.

    Every per-step view of the buffers is cut once before the loop (``unbind``), so a step
    runs its arithmetic and almost no indexing operations."""
    T, dirs, B, G = gx.shape[0], gx.shape[1], gx.shape[2], gx.shape[3]
    N, d = X.shape[0], X.shape[2]
    BLK = torch.empty(T, dirs, B, G, dtype=gx.dtype, device=gx.device)  # g_t, per-head blocks
    blk4 = BLK.view(T, N, 3 * d + 2)
    raws = blk4[:, :, : 2 * d].view(T, N, 2, d).unbind(0)
    vs = blk4[:, :, 2 * d: 3 * d].unbind(0)
    rws = blk4[:, :, 3 * d:].unbind(0)
    gxs, blks = gx.unbind(0), BLK.unbind(0)
    nrms, qks, ps, es, us, cqs, rs = NRM.unbind(0), QK.unbind(0), P.unbind(0), E.unbind(0), U.unbind(0), \
        CQ.unbind(0), R.unbind(0)
    qs, ks, kTs = QK[:, :, 0].unbind(0), QK[:, :, 1].unbind(0), QK[:, :, 1:].transpose(2, 3).unbind(0)
    p_rs, p_ws = P[:, :, :1].unbind(0), P[:, :, 1:].unbind(0)
    outs = out.view(T, N, d).unbind(0)
    houts = out.unbind(0)
    ab = torch.empty(N, 2, d, dtype=gx.dtype, device=gx.device)
    a_q, a_k = ab[:, 0], ab[:, 1]
    w1 = w_hh[0].t()  # [D', G]
    wT = w_hh.transpose(1, 2)  # [dirs, D', G]
    h = h0
    for t in range(T):
        if dirs == 1:  # a 2-D matmul uses every intra-op thread (a batch-of-one bmm does not)
            torch.addmm(gxs[t][0], h[0], w1, out=blks[t][0])
        else:
            torch.baddbmm(gxs[t], h, wT, out=blks[t])
        nrm = torch.linalg.vector_norm(raws[t], 2.0, [-1], True, out=nrms[t]).clamp_min_(eps)  # [N, 2, 1]
        qk = torch.div(raws[t], nrm, out=qks[t])  # [N, 2, d] = (μ(q), μ(k))
        torch.sigmoid(rws[t], out=ps[t])  # [N, 2] = (p_r, p_w)
        torch.bmm(qk, X, out=ab)  # [N, 2, d] = (M q, M k)
        e = torch.sub(vs[t], a_k, out=es[t])  # v − M k
        u = torch.mul(e, p_ws[t], out=us[t])  # [N, d]
        X.addcmul_(kTs[t], u.unsqueeze(1))  # Mᵀ + k uᵀ, in place
        c = torch.linalg.vecdot(qs[t], ks[t], out=cqs[t]).unsqueeze(-1)  # q·k: [N, 1]
        r = torch.addcmul(a_q, u, c, out=rs[t])  # M_t q = M q + u (k·q)
        torch.mul(r, p_rs[t], out=outs[t])  # h_t = p_r M_t q
        h = houts[t]
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
    dqk = torch.empty(N, 2, d, dtype=work.dtype, device=work.device)
    dMT = dM.transpose(1, 2)
    da_q, da_k, dabT, dqk_k = dab[:, 0], dab[:, 1], dab.transpose(1, 2), dqk[:, 1:]
    g4 = dgx.view(T, N, 3 * d + 2)  # per-head blocks [q k v r w] of every dg_t
    g_qks = g4[:, :, : 2 * d].view(T, N, 2, d).unbind(0)
    g_vs = g4[:, :, 2 * d: 3 * d].unbind(0)
    g_rs, g_ws = g4[:, :, 3 * d].unbind(0), g4[:, :, 3 * d + 1].unbind(0)
    dgs = dgx.unbind(0)
    dos = dout.reshape(T, N, d).unbind(0)
    qks, k1s, us, u1s, uks = QK.unbind(0), QK[:, :, 1:].unbind(0), U.unbind(0), U.unsqueeze(2).unbind(0), \
        U.unsqueeze(3).unbind(0)
    p_rs, p_ws, cs = P[:, :, :1].unbind(0), P[:, :, 1:].unbind(0), CQ.unsqueeze(-1).unbind(0)
    rs, es, qkss, qkms, invs = R.unbind(0), E.unbind(0), QKS.unbind(0), QKM.unbind(0), INV.unbind(0)
    s_rs, s_ws = S[:, :, 0].unbind(0), S[:, :, 1].unbind(0)
    w0 = w_hh[0]
    for t in range(T - 1, -1, -1):
        qk, k1, u, c = qks[t], k1s[t], us[t], cs[t]
        if (t + 1) % segment == 0 and t < T - 1:
            work.copy_(ckpts[(t + 1) // segment - 1].transpose(1, 2))  # exact M_t
        work.addcmul_(uks[t], k1, value=-1.0)  # M_{t-1} = M_t − u kᵀ
        dh = dos[t] + dh
        dp_r = torch.linalg.vecdot(dh, rs[t])
        dr = torch.mul(dh, p_rs[t], out=da_q)  # = d(a_q)
        du = torch.bmm(k1, dMT).squeeze(1).addcmul_(dr, c)  # dM k + dr (q·k)
        dc = torch.linalg.vecdot(dr, u)
        dp_w = torch.linalg.vecdot(du, es[t])
        de = torch.mul(du, p_ws[t], out=g_vs[t])  # = dv = −d(a_k)
        torch.neg(de, out=da_k)
        torch.bmm(dab, work, out=dqk)  # [N, 2, d] = (M_{t-1}ᵀ da_q, M_{t-1}ᵀ da_k)ᵀ
        dqk_k.add_(torch.bmm(u1s[t], dM))  # + dM_tᵀ u (baddbmm_ into a strided slice is slow)
        dqk.addcmul_(qkss[t], dc.view(N, 1, 1))  # + dc (k, q)
        dM.baddbmm_(dabT, qk)  # dM_{t-1} = dM_t + da_q qᵀ + da_k kᵀ
        proj = torch.linalg.vecdot(dqk, qkms[t]).unsqueeze(-1)  # [N, 2, 1]
        torch.mul(dqk.addcmul_(qk, proj, value=-1.0), invs[t], out=g_qks[t])  # μ backward
        torch.mul(dp_r, s_rs[t], out=g_rs[t])  # σ backward
        torch.mul(dp_w, s_ws[t], out=g_ws[t])
        if dirs == 1:
            dh = torch.mm(dgs[t][0], w0).view(N, d)
        else:
            dh = torch.bmm(dgs[t], w_hh).view(N, d)
    return dh


def loops(compiled: bool = True):
    """``(forward_loop, backward_loop, is_compiled)``: the TorchScript-compiled pair when
    ``compiled`` and compiling works (tried once per process), else the Python functions."""
    return script_once(forward_loop, backward_loop) if compiled else (forward_loop, backward_loop, False)
