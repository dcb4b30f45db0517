"""A NAM memory scanned step by step by a C kernel: the NAM-TM's value tape on the CPU.

:func:`nam_tape_scan` computes what :func:`memnets.ops.nam_scan` computes (docs/maths.md §1),
for each sequence (b, h) and step t, read after write::

    a = S k;   u = p_w v − p_e a;   S' = S + u kᵀ;   o = p_r S' q

but one sequence at a time to the end, in plain loops (memnets/ops/_native/nam_tape.c), so
that the memory ``S`` stays in the processor's first-level cache. For the NAM-TM's tapes
(dk = tape length, dv = tape width, a few dozen each, T of a few hundred) this is several
times faster on a CPU than the chunked scan, whose matrix products are then too small to pay
for themselves. The backward is hand-derived; it walks ``S`` back (``S = S' − u kᵀ``) from
copies saved every :data:`SEGMENT` steps, so rounding builds up over at most that many steps. Float32 and float64 CPU tensors only: :func:`available` says whether
the kernel applies (it needs a C compiler, see :mod:`memnets.ops._native`). Held to
:func:`memnets.ops.nam_scan` ``impl="reference"`` in float64 by tests/test_nam_tape.py, with
``gradcheck``. Not twice differentiable.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import _native
from .gpu import use_triton
from ._amp import backward_without_autocast

__all__ = ["nam_tape_scan", "available", "SEGMENT"]

SEGMENT = 16  # steps between the memories saved for the backward


_SIGNATURES = {  # B, T, H, K, V, the q/k strides, pointers, S_, pointers, n0, n1
    "nam_tape_fwd": [_native.LONG] * 8 + [_native.PTR] * 9 + [_native.LONG] + [_native.PTR] * 3 + [_native.LONG] * 2,
    "nam_tape_bwd": [_native.LONG] * 8 + [_native.PTR] * 7 + [_native.LONG] + [_native.PTR] * 11 + [_native.LONG] * 2,
}


def _kernel(x: torch.Tensor):
    return _native.functions("nam_tape", x, _SIGNATURES)


def available(x: torch.Tensor) -> bool:
    """Whether :func:`nam_tape_scan` can run on tensors like ``x`` (a float32/float64 CPU
    tensor, and the kernel compiled), outside autocast."""
    return not torch.is_autocast_enabled("cpu") and _kernel(x) is not None


def _ptr(x: Optional[torch.Tensor]):
    return None if x is None else x.data_ptr()


class _TapeScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pw, pe, pr, S0):
        fwd, bwd = _kernel(q)
        B, T, H, K = q.shape
        V = v.shape[-1]
        new = q.new_empty
        # S as rows of keys [B, H, K, V]: a copy the kernel owns (``contiguous`` alone would return
        # S0 itself when K or V is 1, and the kernel writes the final state into it)
        o, St = new(B, T, H, V), S0.transpose(-1, -2).clone(memory_format=torch.contiguous_format)
        Sc, Aa, U = new(-(-T // SEGMENT) + 1, B * H, K, V), new(B, T, H, V), new(B, T, H, V)
        parts = _native.ranges(B * H, B * H * T * K * V * 3)
        work = new(len(parts), 2, K, V)
        args = (B, T, H, K, V, *q.stride()[:3], _ptr(q), _ptr(k), _ptr(v), _ptr(pw), _ptr(pe), _ptr(pr), _ptr(o),
                _ptr(St), _ptr(Sc), SEGMENT, _ptr(Aa), _ptr(U))
        _native.parallel(lambda i, n0, n1: fwd(*args, _ptr(work[i]), n0, n1), parts)
        ctx.save_for_backward(q, k, v, pw, pe, pr, Sc, Aa, U)
        ctx.bwd = bwd
        ctx.set_materialize_grads(False)  # backward makes the zeros of an unused output itself
        return o, St.transpose(-1, -2)

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, go, gS):
        q, k, v, pw, pe, pr, Sc, Aa, U = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        new = q.new_empty
        go = torch.zeros_like(v) if go is None else go.contiguous()
        dS = (q.new_zeros(B, H, K, V) if gS is None  # written by the kernel: never the incoming tensor
              else gS.transpose(-1, -2).clone(memory_format=torch.contiguous_format))
        dq, dk, dv, dpw, dpe = new(q.shape), new(k.shape), new(v.shape), new(pw.shape), new(pe.shape)  # contiguous
        dpr = new(pr.shape) if pr is not None else None
        parts = _native.ranges(B * H, B * H * T * K * V * 6)
        work = new(len(parts), K * V + 4 * V)  # S and four rows of scratch per thread
        args = (B, T, H, K, V, *q.stride()[:3], _ptr(q), _ptr(k), _ptr(v), _ptr(pw), _ptr(pe), _ptr(pr), _ptr(Sc),
                SEGMENT,
                _ptr(Aa), _ptr(U), _ptr(go), _ptr(dS), _ptr(dq), _ptr(dk), _ptr(dv), _ptr(dpw), _ptr(dpe),
                _ptr(dpr))
        _native.parallel(lambda i, n0, n1: ctx.bwd(*args, _ptr(work[i]), n0, n1), parts)
        return dq, dk, dv, dpw, dpe, dpr, dS.transpose(-1, -2)


def nam_tape_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_w: torch.Tensor, p_e: torch.Tensor,
                  p_r: Optional[torch.Tensor], initial_state: Optional[torch.Tensor]):
    """:func:`memnets.ops.nam_scan` by the step-by-step C kernel (see the module docstring).

    Args:
        q, k: ``[B, T, H, dk]`` (views with the same strides are read in place, e.g. the
            read and write heads of one tensor); v: ``[B, T, H, dv]``; p_w, p_e: ``[B, T, H]``; p_r: ``[B, T, H]``
            or ``None`` (= 1); initial_state: ``[B, H, dv, dk]`` (``None``: zeros). One dtype, float32 or
            float64, on the CPU (check with :func:`available`).
    Returns:
        ``(outputs [B, T, H, dv], final_state [B, H, dv, dk])``.
    """
    if use_triton(q):  # the CUDA path: the Triton kernel (memnets.ops.gpu.nam_tm)
        from .gpu.nam_tm import nam_tape_scan_triton
        return nam_tape_scan_triton(q, k, v, p_w, p_e, p_r, initial_state)
    if not available(q):
        raise RuntimeError("nam_tape_scan needs float32/float64 CPU tensors outside autocast and a C compiler "
                           "(memnets.ops._native); use memnets.ops.nam_scan")
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"`q` and `v` expected [B, T, H, d], got {list(q.shape)} and {list(v.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if initial_state is None:
        initial_state = q.new_zeros(B, H, V, K)
    for name, x in (("k", k), ("p_w", p_w), ("p_e", p_e)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"`{name}` expected a tensor, got {type(x).__name__}")
    for name, x, shape in (("k", k, (B, T, H, K)), ("v", v, (B, T, H, V)), ("p_w", p_w, (B, T, H)),
                           ("p_e", p_e, (B, T, H)), ("p_r", p_r, (B, T, H)),
                           ("initial_state", initial_state, (B, H, V, K))):
        if x is not None and (tuple(x.shape) != shape or x.dtype != q.dtype or x.device != q.device):
            raise ValueError(f"`{name}` expected shape {list(shape)}, {q.dtype} on {q.device}, "
                             f"got {list(x.shape)}, {x.dtype} on {x.device}")
    if B * T * H * K * V == 0:  # nothing for the kernel to do: o = p_r S' q is an empty sum or empty
        return q.new_zeros(B, T, H, V), initial_state.clone()
    if q.stride(-1) != 1 or k.stride() != q.stride():  # q and k may be views with one set of strides
        q, k = q.contiguous(), k.contiguous()
    c = [x.contiguous() if x is not None else None for x in (v, p_w, p_e, p_r, initial_state)]
    return _TapeScan.apply(q, k, *c)
