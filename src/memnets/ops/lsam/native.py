"""LSAM's per-step loops with the NAM part of each step in C (``memnets/ops/_native/lsam.c``).

The same recurrence as :func:`memnets.ops.lsam.loops.forward_loop` / ``backward_loop`` and the
same buffers: per step, PyTorch does the one matrix product (``h W_hhᵀ`` forward, ``dg W_hh``
backward) and one call of the C kernel does everything else, one memory at a time, so each
``d × d`` memory and its gradient stay in the first-level cache through the step instead of
passing through a dozen tensor ops over all memories. Memories are split over the threads
PyTorch is allowed (:func:`memnets.ops._native.ranges`) once a step has :data:`MIN_WORK`
multiply-adds per thread: below that, handing a step to a second thread costs more than it saves. Used on float32 / float64 CPU tensors
where the kernel compiles (:func:`kernel`); ``MEMNETS_NATIVE=0`` or ``compiled=False`` run the
TorchScript loops instead, with the same results (``tests/test_native.py`` holds one to the
other in float64).
"""
from __future__ import annotations

import ctypes

import torch

from .. import _native

__all__ = ["kernel", "forward_steps", "backward_steps", "MIN_WORK"]

#: Multiply-adds of one step per thread below which the memories are not split over threads. At
#: B=32, 8 heads of 32 (256 memories, ≈ 0.8 M per step) one thread was faster than two on the
#: 2-core machine of docs/bench.md (LSAM / nn.LSTM 1.25–1.35 against 1.49–1.55, two threads).
MIN_WORK = 1 << 22

_SIGNATURES = {  # N, d, t, n0, n1, eps, pointers
    "lsam_fwd_step": [_native.LONG] * 5 + [ctypes.c_double] + [_native.PTR] * 11,
    "lsam_bwd_step": [_native.LONG] * 5 + [ctypes.c_double] + [_native.PTR] * 12,
}


def kernel(x: torch.Tensor, compiled: bool = True):
    """``(step forward, step backward)`` of the C kernel for ``x``'s dtype, or ``None`` (not a
    float32 / float64 CPU tensor, ``compiled=False``, or no C compiler here)."""
    return _native.functions("lsam", x, _SIGNATURES) if compiled else None


def _check(name: str, x: torch.Tensor, like: torch.Tensor) -> int:
    """The data pointer of ``x`` once it is contiguous, of ``like``'s dtype and device."""
    return _native.pointer("lsam", name, x, like.dtype, like.device)


def forward_steps(step, gx: torch.Tensor, w_hh: torch.Tensor, X: torch.Tensor, h0: torch.Tensor,
                  out: torch.Tensor, QK: torch.Tensor, NRM: torch.Tensor, P: torch.Tensor, CQ: torch.Tensor,
                  E: torch.Tensor, U: torch.Tensor, R: torch.Tensor, ckpts: torch.Tensor, segment: int,
                  eps: float) -> None:
    """:func:`~memnets.ops.lsam.loops.forward_loop` (same arguments after ``step``, the C step)."""
    T, dirs, B, G = gx.shape
    N, d = X.shape[0], X.shape[2]
    if G * dirs * B != N * (3 * d + 2) or tuple(out.shape) != (T, dirs, B, N * d // (dirs * B)):
        raise ValueError(f"lsam native step: shapes do not fit: gx {list(gx.shape)}, X {list(X.shape)}, "
                         f"out {list(out.shape)}")
    for name, buf, shape in (("X", X, (N, d, d)), ("QK", QK, (T, N, 2, d)), ("NRM", NRM, (T, N, 2, 1)),
                             ("P", P, (T, N, 2)), ("CQ", CQ, (T, N)), ("E", E, (T, N, d)), ("U", U, (T, N, d)),
                             ("R", R, (T, N, d))):
        if tuple(buf.shape) != shape:
            raise ValueError(f"lsam native step: `{name}` expected shape {list(shape)}, got {list(buf.shape)}")
    BLK = torch.empty(T, dirs, B, G, dtype=gx.dtype, device=gx.device)  # h_{t-1} W_hhᵀ, this call's own buffer
    ptrs = [_check(n, x, gx) for n, x in (("BLK", BLK), ("gx", gx), ("X", X), ("QK", QK), ("NRM", NRM), ("P", P),
                                          ("CQ", CQ), ("E", E), ("U", U), ("R", R), ("out", out))]
    blks, houts = BLK.unbind(0), out.unbind(0)
    w1, wT = w_hh[0].t(), w_hh.transpose(1, 2)
    parts = _native.ranges(N, N * d * d * 3, MIN_WORK)
    h = h0
    for t in range(T):
        if dirs == 1:  # a 2-D matmul uses every intra-op thread (a batch-of-one bmm does not)
            torch.mm(h[0], w1, out=blks[t][0])  # the step adds gx[t] itself (no copy of it into BLK first)
        else:
            torch.bmm(h, wT, out=blks[t])
        _native.parallel(lambda i, n0, n1, t=t: step(N, d, t, n0, n1, eps, *ptrs), parts)
        h = houts[t]
        if (t + 1) % segment == 0 and t < T - 1:
            ckpts[(t + 1) // segment - 1].copy_(X)


def backward_steps(step, w_hh: torch.Tensor, work: torch.Tensor, dM: torch.Tensor, dout: torch.Tensor,
                   dgx: torch.Tensor, ckpts: torch.Tensor, QK: torch.Tensor, NRM: torch.Tensor, P: torch.Tensor,
                   CQ: torch.Tensor, E: torch.Tensor, U: torch.Tensor, R: torch.Tensor, segment: int,
                   eps: float) -> torch.Tensor:
    """:func:`~memnets.ops.lsam.loops.backward_loop` with the C step: ``work`` (M_T, row-major)
    is reversed in place to M₀, ``dM`` accumulated in place to the gradient of M₀, ``dgx``
    written; returns the gradient of h₀ as ``[N, d]``."""
    T, dirs = dgx.shape[0], dgx.shape[1]
    N, d = work.shape[0], work.shape[2]
    if tuple(dM.shape) != (N, d, d) or dout.numel() != T * N * d or dgx.numel() != T * N * (3 * d + 2):
        raise ValueError(f"lsam native step: shapes do not fit: work {list(work.shape)}, dM {list(dM.shape)}, "
                         f"dout {list(dout.shape)}, dgx {list(dgx.shape)}")
    ptrs = [_check(n, x, work) for n, x in (("work", work), ("dM", dM), ("dout", dout))]
    saved = [_check(n, x, work) for n, x in (("QK", QK), ("NRM", NRM), ("P", P), ("CQ", CQ), ("E", E),
                                             ("U", U), ("R", R), ("dgx", dgx))]
    dgs, w0 = dgx.unbind(0), w_hh[0]
    parts = _native.ranges(N, N * d * d * 3, MIN_WORK)
    dh = work.new_zeros(N, d)
    for t in range(T - 1, -1, -1):
        if (t + 1) % segment == 0 and t < T - 1:
            work.copy_(ckpts[(t + 1) // segment - 1].transpose(1, 2))  # exact M_t
        dh_ptr = dh.data_ptr()
        _native.parallel(lambda i, n0, n1, t=t: step(N, d, t, n0, n1, eps, *ptrs, dh_ptr, *saved), parts)
        dh = torch.mm(dgs[t][0], w0).view(N, d) if dirs == 1 else torch.bmm(dgs[t], w_hh).view(N, d)
    return dh
