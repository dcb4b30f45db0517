"""LSAM's recurrence as Triton kernels (docs/maths.md §2): two launches per time step.

Forward, per step ``t`` (N = dirs·B·H' memories of d × d, rows of ``g`` in per-head blocks
``[q k v r w]`` as in :mod:`memnets.ops.lsam.recurrence`)::

    g_t = gx_t + h_{t-1} W_hhᵀ                        # one cuBLAS (b)addmm for every direction
    (q, k) = μ(.);  (p_r, p_w) = σ(.)                 # one Triton program per memory:
    u = p_w (v − M k);  M ← M + u kᵀ;  h_t = p_r (M q)  #   the memory loaded, updated, stored

Backward, per step in reverse: one Triton program per memory walks the memory back
(``M_{t-1} = M_t − u kᵀ``, reset from an exact copy every :data:`SEGMENT` steps), recomputes
q, k, p, ``M_{t-1} q`` and ``M_{t-1} k`` from the saved pre-activations ``g_t``, and writes
``dg_t`` and the memory's gradient in place; one matmul ``dh_{t-1} = dg_t W_hh`` follows.
The weight gradient ``Σ_t dg_tᵀ h_{t-1}`` is one matmul after the loop. Saved for the
backward: ``g_t`` and ``u_t`` of every step and ``T / SEGMENT`` memories.

:class:`LSAMRecurrenceTriton` has the signature and results of
:class:`memnets.ops.lsam.recurrence.LSAMRecurrence`; :func:`memnets.ops.lsam.lsam_scan` runs it
where :func:`memnets.ops.gpu.use_triton` says so (CUDA), and the tests run it on the CPU
through Triton's interpreter against the reference, float32 and float64.
"""
from __future__ import annotations

import functools

import torch

from . import lazy_kernels
from .graphs import graphed
from .._amp import backward_without_autocast

__all__ = ["LSAMRecurrenceTriton", "SEGMENT", "EPS", "MAX_HEAD_DIM", "applies"]

SEGMENT = 32  # steps between exact memory copies kept for the backward
EPS = 1e-6  # μ's eps, as memnets.ops.unit


@lazy_kernels
def kernels():
    """``(forward_step, backward_step)``, compiled on first use (Triton reads
    ``TRITON_INTERPRET`` when a kernel is defined, so defining them lazily lets a process
    choose the interpreter before its first LSAM step)."""
    import triton
    import triton.language as tl

    @triton.jit
    def forward_step(blk_ptr, m_ptr, out_ptr, u_ptr, ck_ptr, d, EPS_: tl.constexpr, SAVE: tl.constexpr,
                     BLOCK: tl.constexpr):
        n = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        msk = i < d
        base = blk_ptr + n * (3 * d + 2)
        qr = tl.load(base + i, mask=msk, other=0.0)
        eps = tl.full([], EPS_, qr.dtype)  # in the data's precision (a float argument would be float32)
        kr = tl.load(base + d + i, mask=msk, other=0.0)
        v = tl.load(base + 2 * d + i, mask=msk, other=0.0)
        a_r = tl.load(base + 3 * d)
        a_w = tl.load(base + 3 * d + 1)
        q = qr / tl.maximum(tl.sqrt(tl.sum(qr * qr, 0)), eps)
        k = kr / tl.maximum(tl.sqrt(tl.sum(kr * kr, 0)), eps)
        p_r = 1.0 / (1.0 + tl.exp(-a_r))
        p_w = 1.0 / (1.0 + tl.exp(-a_w))
        mm = msk[:, None] & msk[None, :]
        offs = n * d * d + i[:, None] * d + i[None, :]  # M[i (value), j (key)]
        M = tl.load(m_ptr + offs, mask=mm, other=0.0)
        a_q = tl.sum(M * q[None, :], 1)
        a_k = tl.sum(M * k[None, :], 1)
        u = p_w * (v - a_k)
        M = M + u[:, None] * k[None, :]
        tl.store(m_ptr + offs, M, mask=mm)
        if SAVE:
            tl.store(ck_ptr + offs, M, mask=mm)
        c = tl.sum(q * k, 0)
        tl.store(out_ptr + n * d + i, p_r * (a_q + u * c), mask=msk)
        tl.store(u_ptr + n * d + i, u, mask=msk)

    @triton.jit
    def backward_step(blk_ptr, m_ptr, dm_ptr, u_ptr, dout_ptr, dh_ptr, dg_ptr, ck_ptr, d, EPS_: tl.constexpr,
                      LOAD: tl.constexpr, BLOCK: tl.constexpr):
        n = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        msk = i < d
        G1 = 3 * d + 2
        base = blk_ptr + n * G1
        qr = tl.load(base + i, mask=msk, other=0.0)
        eps = tl.full([], EPS_, qr.dtype)
        kr = tl.load(base + d + i, mask=msk, other=0.0)
        v = tl.load(base + 2 * d + i, mask=msk, other=0.0)
        a_r = tl.load(base + 3 * d)
        a_w = tl.load(base + 3 * d + 1)
        nq_raw = tl.sqrt(tl.sum(qr * qr, 0))
        nk_raw = tl.sqrt(tl.sum(kr * kr, 0))
        nq = tl.maximum(nq_raw, eps)
        nk = tl.maximum(nk_raw, eps)
        q = qr / nq
        k = kr / nk
        p_r = 1.0 / (1.0 + tl.exp(-a_r))
        p_w = 1.0 / (1.0 + tl.exp(-a_w))
        u = tl.load(u_ptr + n * d + i, mask=msk, other=0.0)
        mm = msk[:, None] & msk[None, :]
        offs = n * d * d + i[:, None] * d + i[None, :]
        if LOAD:
            M = tl.load(ck_ptr + offs, mask=mm, other=0.0)  # the exact M_t
        else:
            M = tl.load(m_ptr + offs, mask=mm, other=0.0)
        M = M - u[:, None] * k[None, :]  # M_{t-1}
        tl.store(m_ptr + offs, M, mask=mm)
        a_q = tl.sum(M * q[None, :], 1)
        a_k = tl.sum(M * k[None, :], 1)
        e = v - a_k
        c = tl.sum(q * k, 0)
        r = a_q + u * c  # M_t q
        dh = tl.load(dout_ptr + n * d + i, mask=msk, other=0.0) + tl.load(dh_ptr + n * d + i, mask=msk, other=0.0)
        dp_r = tl.sum(dh * r, 0)
        dr = dh * p_r  # d(M_{t-1} q)
        dM = tl.load(dm_ptr + offs, mask=mm, other=0.0)  # dM_t
        du = tl.sum(dM * k[None, :], 1) + dr * c
        dc = tl.sum(dr * u, 0)
        dp_w = tl.sum(du * e, 0)
        de = du * p_w  # dv; d(M_{t-1} k) = −de
        dq = tl.sum(M * dr[:, None], 0) + dc * k
        dk = tl.sum(dM * u[:, None], 0) - tl.sum(M * de[:, None], 0) + dc * q
        dM = dM + dr[:, None] * q[None, :] - de[:, None] * k[None, :]  # dM_{t-1}
        tl.store(dm_ptr + offs, dM, mask=mm)
        gq = dq - tl.where(nq_raw > eps, tl.sum(dq * q, 0), 0.0) * q
        gk = dk - tl.where(nk_raw > eps, tl.sum(dk * k, 0), 0.0) * k
        out = dg_ptr + n * G1
        tl.store(out + i, gq / nq, mask=msk)
        tl.store(out + d + i, gk / nk, mask=msk)
        tl.store(out + 2 * d + i, de, mask=msk)
        tl.store(out + 3 * d, dp_r * p_r * (1.0 - p_r))
        tl.store(out + 3 * d + 1, dp_w * p_w * (1.0 - p_w))

    return forward_step, backward_step


MAX_HEAD_DIM = 128  # one program holds a d × d memory (and its gradient) in registers


def _block(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def _warps(block: int) -> int:
    """Warps per program: enough threads that a ``block × block`` tile (two in the backward)
    stays in registers."""
    return 2 if block <= 16 else 4 if block <= 32 else 8 if block <= 64 else 16


def applies(M0: torch.Tensor) -> bool:
    """Whether the kernels take memories like ``M0 [N, d, d]`` (d up to :data:`MAX_HEAD_DIM`)."""
    return M0.shape[-1] <= MAX_HEAD_DIM


def _check(gx: torch.Tensor, w_hh: torch.Tensor, M0: torch.Tensor, h0: torch.Tensor) -> None:
    if gx.dim() != 4 or w_hh.dim() != 3 or M0.dim() != 3 or h0.dim() != 3:
        raise ValueError(f"LSAM recurrence expected gx [T, dirs, B, G], w_hh [dirs, G, D'], M0 [N, d, d], "
                         f"h0 [dirs, B, D'], got {tuple(gx.shape)}, {tuple(w_hh.shape)}, {tuple(M0.shape)}, "
                         f"{tuple(h0.shape)}")
    T, dirs, B, G = gx.shape
    Dp, N, d = w_hh.shape[2], M0.shape[0], M0.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"LSAM recurrence on Triton takes head dims up to {MAX_HEAD_DIM}, got d={d}")
    if T < 1 or d < 1 or Dp % d or N != dirs * B * (Dp // d) or G != (Dp // d) * (3 * d + 2) \
            or tuple(w_hh.shape) != (dirs, G, Dp) or tuple(M0.shape) != (N, d, d) or tuple(h0.shape) != (dirs, B, Dp):
        raise ValueError(f"LSAM recurrence: inconsistent shapes gx {tuple(gx.shape)}, w_hh {tuple(w_hh.shape)}, "
                         f"M0 {tuple(M0.shape)}, h0 {tuple(h0.shape)}")
    dtypes = {t.dtype for t in (gx, w_hh, M0, h0)}
    if len(dtypes) != 1 or gx.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"LSAM recurrence expected one dtype, float32 or float64, got {sorted(map(str, dtypes))}")
    if len({t.device for t in (gx, w_hh, M0, h0)}) != 1:
        raise ValueError("LSAM recurrence: gx, w_hh, M0 and h0 must be on one device")


def _hmm(h: torch.Tensor, w: torch.Tensor, out: torch.Tensor, add: torch.Tensor | None) -> None:
    """``out = add + h wᵀ`` per direction (``add`` None: ``h w``), one launch: h ``[dirs, B, X]``."""
    if add is not None:
        if h.shape[0] == 1:
            torch.addmm(add[0], h[0], w[0].t(), out=out[0])
        else:
            torch.baddbmm(add, h, w.transpose(1, 2), out=out)
    elif h.shape[0] == 1:
        torch.mm(h[0], w[0], out=out[0])
    else:
        torch.bmm(h, w, out=out)


def _forward_loop(gx, w_hh, M0, h0, *, seg):
    """The forward time loop on its arguments alone (what :func:`graphed` captures):
    ``(out, M_T, U, ckpts, blk)``, all buffers of its own."""
    fwd, _ = kernels()
    gx, w_hh, h0 = gx.contiguous(), w_hh.contiguous(), h0.contiguous()
    T, dirs, B, G = gx.shape
    N, d = M0.shape[0], M0.shape[-1]
    M = M0.clone(memory_format=torch.contiguous_format)  # updated in place
    blk, out, U = gx.new_empty(T, dirs, B, G), gx.new_empty(T, dirs, B, w_hh.shape[2]), gx.new_empty(T, N, d)
    ckpts = gx.new_empty(max((T - 1) // seg, 1), N, d, d)
    BLOCK, h = _block(d), h0
    for t in range(T):
        _hmm(h, w_hh, blk[t], gx[t])
        save = (t + 1) % seg == 0 and t < T - 1
        fwd[(N,)](blk[t], M, out[t], U[t], ckpts[(t + 1) // seg - 1] if save else M, d, EPS,
                  SAVE=save, BLOCK=BLOCK, num_warps=_warps(BLOCK))
        h = out[t]
    return out, M, U, ckpts, blk


def _backward_loop(w_hh, out, M_T, ckpts, blk, U, dout, dM, *, seg):
    """The backward time loop on its arguments alone: ``(dgx, dh_0, dM_0)``."""
    _, bwd = kernels()
    T, dirs, B, Dp = out.shape
    N, d = M_T.shape[0], M_T.shape[-1]
    G = w_hh.shape[1]
    w_hh, dout = w_hh.contiguous(), dout.contiguous()
    work = M_T.clone()  # walked back to M_0
    dM = dM.contiguous().clone()
    dgx = out.new_empty(T, dirs, B, G)
    dh = out.new_zeros(dirs, B, Dp)  # d h_t through the next step's g (none after the last)
    BLOCK = _block(d)
    for t in range(T - 1, -1, -1):
        load = (t + 1) % seg == 0 and t < T - 1
        bwd[(N,)](blk[t], work, dM, U[t], dout[t], dh, dgx[t], ckpts[(t + 1) // seg - 1] if load else work,
                  d, EPS, LOAD=load, BLOCK=BLOCK, num_warps=_warps(BLOCK))
        _hmm(dgx[t], w_hh, dh, None)
    return dgx, dh, dM


class LSAMRecurrenceTriton(torch.autograd.Function):
    """:class:`memnets.ops.lsam.recurrence.LSAMRecurrence` on Triton kernels (module docstring):
    ``(gx [T, dirs, B, G], w_hh [dirs, G, D'], M0 [N, d, d], h0 [dirs, B, D'])`` ->
    ``(out [T, dirs, B, D'], M_T [N, d, d])``. Every buffer it writes is its own."""

    @staticmethod
    def forward(ctx, gx, w_hh, M0, h0, compiled=True):
        _check(gx, w_hh, M0, h0)
        seg = SEGMENT
        out, M, U, ckpts, blk = graphed(("lsam.forward", seg), functools.partial(_forward_loop, seg=seg), gx, w_hh,
                                        M0.detach(), h0)
        ctx.segment = seg
        ctx.save_for_backward(w_hh, h0, out, M, ckpts, blk, U)
        ctx.mark_non_differentiable()
        return out, M.clone()

    @staticmethod
    @backward_without_autocast
    def backward(ctx, dout, dM):
        w_hh, h0, out, M_T, ckpts, blk, U = ctx.saved_tensors
        T, dirs, B, Dp = out.shape
        G = w_hh.shape[1]
        dM = torch.zeros_like(M_T) if dM is None else dM
        dout = torch.zeros_like(out) if dout is None else dout
        dgx, dh, dM = graphed(("lsam.backward", ctx.segment), functools.partial(_backward_loop, seg=ctx.segment),
                              w_hh, out, M_T, ckpts, blk, U, dout, dM)
        dw = None
        if ctx.needs_input_grad[1]:
            hprev = torch.cat([h0.unsqueeze(0), out[:-1]], 0)  # [T, dirs, B, D']
            dg = dgx.permute(1, 3, 0, 2).reshape(dirs, G, T * B)
            dw = torch.bmm(dg, hprev.transpose(0, 1).reshape(dirs, T * B, Dp))
        return dgx, dw, dM, dh, None
