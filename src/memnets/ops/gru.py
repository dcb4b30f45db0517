"""A single-layer GRU (one or both directions) as one autograd Function with a hand-derived
backward: the NAM Turing Machine's controller on its fast path.

``torch.nn.GRU`` on the CPU records a dozen autograd nodes per step and direction; this runs
the recurrence of :class:`torch.nn.GRU` (same parameters, same equations)::

    r, z = σ(W_ir x + b_ir + W_hr h + b_hr), σ(W_iz x + b_iz + W_hz h + b_hz)
    n    = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
    h'   = (1 − z) ⊙ n + z ⊙ h

with the input projections of every step in one batched matmul before the loop, both
directions in one batched matmul per step, and in the backward pass every factor that depends
on forward values only computed for all steps at once, so that the reverse loop is a few
multiplies and one batched matmul per step. The weight gradients are one matmul each after
the loop. The loops are TorchScript-compiled where available.

Layout: every per-step tensor is kept as ``[D, B, T, ·]`` in input time order, for both
directions. The reverse direction's step t reads and writes time ``T − 1 − t``; both
directions' slices of one step are still one strided view (:func:`step_view`: the direction
stride is ``B·T·F + (T − 1 − 2t)·F > 0``), so nothing is ever flipped or restacked, and the
output ``[B, T, D·h]`` is one copy. tests/test_nam_tm_fused.py holds :func:`gru_scan` and
:func:`gru_module_forward` to ``torch.nn.GRU`` in float64 (outputs and every gradient) and
runs ``gradcheck``. Not twice differentiable.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from . import _native
from ._script import script_once
from ._workspace import WorkspacePool
from ._amp import backward_without_autocast
from .varlen import reverse_within

__all__ = ["gru_scan", "gru_module_forward", "forward_loop", "backward_loop", "step_view"]


def step_view(X: torch.Tensor, t: int, row0: int, reverse: bool) -> torch.Tensor:
    """Step ``t`` of ``X [D, B, R, F]`` (rows = time, time 0 at row ``row0``) as ``[D, B, F]``:
    time t for direction 0 and, with ``reverse``, time ``T − 1 − t`` for direction 1
    (``T = R − 2·row0``)."""
    sD, sB, sR, sF = X.stride(0), X.stride(1), X.stride(2), X.stride(3)
    if reverse:
        sD = sD + (X.shape[2] - 2 * row0 - 1 - 2 * t) * sR
    return X.as_strided([X.shape[0], X.shape[1], X.shape[3]], [sD, sB, sF],
                        X.storage_offset() + (row0 + t) * sR)


def forward_loop(gx: torch.Tensor, w_hhT: torch.Tensor, b_hh: torch.Tensor, HS: torch.Tensor,
                 RZ: torch.Tensor, NN: torch.Tensor, GHN: torch.Tensor, reverse: bool) -> None:
    """gx ``[D, B, T, 3h]`` (input projections with b_ih), w_hhT ``[D, h, 3h]``, b_hh
    ``[D, 1, 3h]``; HS ``[D, B, T+2, h]`` holds h0 at rows 0 and T+1 and receives the hidden
    state of time τ at row τ+1; writes the saved r, z (RZ), n (NN) and W_hn h + b_hn (GHN),
    ``[D, B, T, ·]``."""
    T = gx.shape[2]
    hd = HS.shape[-1]
    h = step_view(HS, -1, 1, reverse)  # the initial state: row 0, and row T+1 for a reverse direction
    for t in range(T):
        gh = torch.baddbmm(b_hh, h, w_hhT)  # [D, B, 3h]
        g = step_view(gx, t, 0, reverse)
        rz = torch.sigmoid(torch.add(g[:, :, : 2 * hd], gh[:, :, : 2 * hd]), out=step_view(RZ, t, 0, reverse))
        ghn = step_view(GHN, t, 0, reverse).copy_(gh[:, :, 2 * hd:])
        n = torch.tanh(torch.addcmul(g[:, :, 2 * hd:], rz[:, :, :hd], ghn), out=step_view(NN, t, 0, reverse))
        h = torch.lerp(n, h, rz[:, :, hd:], out=step_view(HS, t, 1, reverse))  # n + z (h − n)


def backward_loop(dout: torch.Tensor, w_hh: torch.Tensor, Z: torch.Tensor, R: torch.Tensor, AN: torch.Tensor,
                  AZ: torch.Tensor, AR: torch.Tensor, DGH: torch.Tensor, DN: torch.Tensor,
                  dh: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Reverse pass over ``[D, B, T, ·]`` tensors: fills DGH (gradients of the recurrent
    pre-activations, ``(dr, dz, dn ⊙ r)``) and DN (of the candidate's pre-activation);
    returns dh₀."""
    T = dout.shape[2]
    hd = dh.shape[-1]
    dh = dh + step_view(dout, T - 1, 0, reverse)  # the gradient of the state after step t
    for t in range(T - 1, -1, -1):
        dg = step_view(DGH, t, 0, reverse)
        dn = torch.mul(dh, step_view(AN, t, 0, reverse), out=step_view(DN, t, 0, reverse))
        torch.mul(dn, step_view(AR, t, 0, reverse), out=dg[:, :, :hd])
        torch.mul(dh, step_view(AZ, t, 0, reverse), out=dg[:, :, hd: 2 * hd])
        torch.mul(dn, step_view(R, t, 0, reverse), out=dg[:, :, 2 * hd:])
        zt = step_view(Z, t, 0, reverse)
        direct = torch.addcmul(step_view(dout, t - 1, 0, reverse), dh, zt) if t > 0 else torch.mul(dh, zt)
        dh = torch.baddbmm(direct, dg, w_hh)
    return dh


_POOL = WorkspacePool()  # the saved gates and the backward's temporaries (memnets.ops._workspace)
def _loops(compiled: bool):
    return script_once(forward_loop, backward_loop)[:2] if compiled else (forward_loop, backward_loop)


_SIGNATURES = {  # D, B, T, H, t, reverse, pointers
    "gru_fwd_step": [_native.LONG] * 5 + [_native.INT] + [_native.PTR] * 7,
    "gru_bwd_step": [_native.LONG] * 5 + [_native.INT] + [_native.PTR] * 10,
}


def _kernel(x: torch.Tensor, compiled: bool):
    """``(step forward, step backward)`` of the C kernel (memnets/ops/_native/gru.c) for
    ``x``'s dtype, or ``None`` (not a float32/float64 CPU tensor, ``compiled=False``, or no C
    compiler: then the TorchScript loops run; the results are the same)."""
    return _native.functions("gru", x, _SIGNATURES) if compiled else None


def _native_forward(step, gx, w_hhT, b_hh, HS, RZ, NN, GHN, reverse: bool) -> None:
    """:func:`forward_loop` with the elementwise part of each step in C."""
    D, B, T, G = gx.shape
    h = HS[:, :, 0].clone()  # [D, B, h]: the state each step starts from, updated in place
    gh = gx.new_empty(D, B, G)
    head = (D, B, T, G // 3)
    ptrs = [x.data_ptr() for x in (gx, gh, RZ, NN, GHN, HS, h)]
    for t in range(T):
        torch.baddbmm(b_hh, h, w_hhT, out=gh)
        step(*head, t, reverse, *ptrs)


def _native_backward(step, dO, w_hh, RZ, NN, GHN, HS, DGH, DN, reverse: bool) -> torch.Tensor:
    """:func:`backward_loop` with the elementwise part of each step in C; returns dh₀."""
    D, B, T, hd = NN.shape
    dh = step_view(dO, T - 1, 0, reverse).clone()  # the gradient of the state after step T − 1
    other, dg, direct = torch.empty_like(dh), dh.new_empty(D, B, 3 * hd), torch.empty_like(dh)
    head = (D, B, T, hd)
    ptrs = [x.data_ptr() for x in (dO, RZ, NN, GHN, HS)]
    tail = [x.data_ptr() for x in (DGH, DN, dg, direct)]
    for t in range(T - 1, -1, -1):
        step(*head, t, reverse, *ptrs, dh.data_ptr(), *tail)
        torch.baddbmm(direct, dg, w_hh, out=other)
        dh, other = other, dh
    return dh


class _GRURecurrence(torch.autograd.Function):
    """gx ``[D, B, T, 3h]`` (time order of the input) -> hidden states ``[B, T, D·h]``."""

    @staticmethod
    def forward(ctx, gx, w_hh, b_hh, h0, reverse, compiled):
        fwd, _ = _loops(compiled)
        kernel = _kernel(gx, compiled)
        D, B, T, G = gx.shape
        hd = G // 3
        HS = gx.new_empty(D, B, T + 2, hd)
        HS[:, :, 0].copy_(h0)
        HS[:, :, T + 1].copy_(h0)
        key = ("forward", D, B, T, hd, gx.dtype, gx.device)
        # the saved gates: held by the node until the graph is freed, then reused
        ctx.lease = _POOL.lease(key, lambda: (gx.new_empty(D, B, T, 2 * hd), gx.new_empty(D, B, T, hd),
                                              gx.new_empty(D, B, T, hd)))
        RZ, NN, GHN = ctx.lease.space
        if kernel is not None:
            _native_forward(kernel[0], gx, w_hh.transpose(1, 2), b_hh.unsqueeze(1), HS, RZ, NN, GHN, reverse)
        else:
            fwd(gx, w_hh.transpose(1, 2), b_hh.unsqueeze(1), HS, RZ, NN, GHN, reverse)
        ctx.save_for_backward(w_hh, HS)
        ctx.compiled, ctx.reverse, ctx.kernel = compiled, reverse, kernel
        return HS[:, :, 1: T + 1].permute(1, 2, 0, 3).reshape(B, T, D * hd)

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dout):
        w_hh, HS = ctx.saved_tensors
        RZ, NN, GHN = ctx.lease.space
        _, bwd = _loops(ctx.compiled)
        D, B, T, hd = NN.shape
        R, Z = RZ[..., :hd], RZ[..., hd:]
        # the state each step started from: time τ−1 (row τ), or τ+1 (row τ+2) for a reverse direction
        sD = HS.stride(0) + (2 * HS.stride(2) if ctx.reverse and D > 1 else 0)
        key = (D, B, T, hd, NN.dtype, NN.device)
        space = _POOL.take(key, lambda: NN.new_empty(7, D, B, T, hd))  # the temporaries below
        hprev, AN, AZ, AR, DN, dO, t1 = space.unbind(0)
        hprev.copy_(HS.as_strided((D, B, T, hd), (sD, HS.stride(1), HS.stride(2), 1)))
        DGH = NN.new_empty(D, B, T, 3 * hd)
        dO.copy_(dout.view(B, T, D, hd).permute(2, 0, 1, 3))
        if ctx.kernel is not None:  # the factors below are taken per step in C
            dh0 = _native_backward(ctx.kernel[1], dO, w_hh, RZ, NN, GHN, HS, DGH, DN, ctx.reverse)
        else:
            torch.neg(Z, out=t1).add_(1)  # 1 − z
            torch.mul(NN, NN, out=AN).neg_().add_(1).mul_(t1)  # dn_pre = dh · AN,  AN = (1 − z)(1 − n²)
            torch.sub(hprev, NN, out=AZ).mul_(Z).mul_(t1)  # dz_pre = dh · AZ,  AZ = (h − n) z (1 − z)
            torch.mul(GHN, R, out=AR).mul_(torch.neg(R, out=t1).add_(1))  # dr_pre = dn_pre · AR
            dh0 = bwd(dO, w_hh, Z, R, AN, AZ, AR, DGH, DN, NN.new_zeros(D, B, hd), ctx.reverse)
        dw = torch.bmm(DGH.view(D, B * T, 3 * hd).transpose(1, 2), hprev.view(D, B * T, hd))
        db = DGH.sum((1, 2))
        DGH[..., 2 * hd:].copy_(DN)  # the input projections' gradient: (dr, dz, dn)
        _POOL.give(key, space)
        return DGH, dw, db, dh0, None, None


def gru_scan(gx: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor, h0: torch.Tensor,
             compiled: bool = True) -> torch.Tensor:
    """The GRU recurrence, time-major, ``D`` independent directions batched.

    Args:
        gx: input projections with their bias ``[T, D, B, 3h]`` (gate order r, z, n as in
            ``torch.nn.GRU``); a reverse direction passes its inputs time-reversed.
        w_hh: ``[D, 3h, h]``; b_hh: ``[D, 3h]``; h0: ``[D, B, h]``.
    Returns:
        hidden states ``[T, D, B, h]`` (float32 under autocast: the recurrence runs in float32
        there, inputs cast up and autocast off inside).
    """
    T, D, B, G = gx.shape
    hs = _gru(gx.permute(1, 2, 0, 3), w_hh, b_hh, h0, False, compiled)  # [B, T, D·h]
    return hs.view(B, T, D, G // 3).permute(1, 2, 0, 3)


def _check(gx, w_hh, b_hh, h0) -> None:
    """Shapes, dtypes and devices, checked before the recurrence (whose C kernel trusts them)."""
    if gx.dim() != 4 or gx.shape[-1] % 3:
        raise ValueError(f"gru: the input projections expected [D, B, T, 3h], got {list(gx.shape)}")
    D, B, T, G = gx.shape
    for name, x, shape in (("w_hh", w_hh, (D, G, G // 3)), ("b_hh", b_hh, (D, G)), ("h0", h0, (D, B, G // 3))):
        if tuple(x.shape) != shape:
            raise ValueError(f"gru: `{name}` expected shape {list(shape)}, got {list(x.shape)}")
        if x.device != gx.device or (x.dtype != gx.dtype and not torch.is_autocast_enabled(gx.device.type)):
            raise ValueError(f"gru: `{name}` expected {gx.dtype} on {gx.device} like the inputs, "
                             f"got {x.dtype} on {x.device}")


def _gru(gx, w_hh, b_hh, h0, reverse: bool, compiled: bool):
    _check(gx, w_hh, b_hh, h0)
    dev = gx.device.type
    if torch.is_autocast_enabled(dev) and gx.dtype != torch.float64:
        # the loops write into buffers of one dtype: run them in float32, autocast off
        with torch.autocast(dev, enabled=False):
            return _GRURecurrence.apply(gx.float().contiguous(), w_hh.float().contiguous(),
                                        b_hh.float().contiguous(), h0.float().contiguous(), reverse,
                                        bool(compiled))
    return _GRURecurrence.apply(gx.contiguous(), w_hh.contiguous(), b_hh.contiguous(), h0.contiguous(),
                                reverse, bool(compiled))


def gru_module_forward(gru: nn.GRU, x: torch.Tensor, compiled: bool = True,
                       lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``gru(x)[0]`` for a one-layer, batch-first ``torch.nn.GRU`` (either direction count)
    from a zero state: ``x [B, T, in] -> [B, T, D·h]``.

    ``lengths`` ``[B]``: sequence b ends after step ``lengths[b]``, as in a packed batch; the
    reverse direction then starts at each sequence's own end (its steps run forward in time
    over each sequence reversed within its length, :func:`memnets.ops.varlen.reverse_within`).
    Outputs past an end are computed on the padding and mean nothing."""
    if gru.num_layers != 1 or not gru.batch_first or not gru.bias:
        raise ValueError("gru_module_forward expects a one-layer, batch-first GRU with biases")
    D = 2 if gru.bidirectional else 1
    sfx = ["", "_reverse"][:D]
    w_ih = torch.stack([getattr(gru, "weight_ih_l0" + s) for s in sfx], 0)  # [D, 3h, in]
    b_ih = torch.stack([getattr(gru, "bias_ih_l0" + s) for s in sfx], 0)
    w_hh = torch.stack([getattr(gru, "weight_hh_l0" + s) for s in sfx], 0)  # [D, 3h, h]
    b_hh = torch.stack([getattr(gru, "bias_hh_l0" + s) for s in sfx], 0)
    B, T, F = x.shape
    hd = gru.hidden_size
    within = lengths is not None and D == 2
    if within:  # the second direction runs forward in time over each sequence reversed within its length
        xs = torch.stack([x, reverse_within(x, lengths)]).view(D, B * T, F)
    else:
        xs = x.reshape(1, B * T, F).expand(D, B * T, F)
    gx = torch.baddbmm(b_ih.unsqueeze(1), xs, w_ih.transpose(1, 2))
    hs = _gru(gx.view(D, B, T, 3 * hd), w_hh, b_hh, x.new_zeros(D, B, hd), not within, compiled)  # [B, T, D·h]
    if within:
        hs = torch.cat([hs[..., :hd], reverse_within(hs[..., hd:], lengths)], -1)
    return hs
