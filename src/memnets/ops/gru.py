"""A single-layer GRU (one or both directions) as one autograd Function with a hand-derived
backward: the NAM Turing Machine's controller on its fast path.

``torch.nn.GRU`` on the CPU records a dozen autograd nodes per step and direction; this runs
the recurrence of :class:`torch.nn.GRU` (same parameters, same equations)::

    r, z = σ(W_ir x + b_ir + W_hr h + b_hr), σ(W_iz x + b_iz + W_hz h + b_hz)
    n    = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
    h'   = (1 − z) ⊙ n + z ⊙ h

with the input projections of every step in one matmul before the loop, both directions in
one batched matmul per step, and in the backward pass every factor that depends on forward
values only computed for all steps at once, so that the reverse loop is a few multiplies and
one batched matmul per step. The weight gradients are one matmul each after the loop. The
loops are TorchScript-compiled where available. tests/test_nam_tm_fused.py holds
:func:`gru_scan` to ``torch.nn.GRU`` in float64 (outputs and every gradient) and runs
``gradcheck``. Not twice differentiable.
"""
from __future__ import annotations

import threading
import warnings
from typing import Optional

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

__all__ = ["gru_scan", "gru_module_forward", "forward_loop", "backward_loop"]


def forward_loop(gx: torch.Tensor, w_hhT: torch.Tensor, b_hh: torch.Tensor, h0: torch.Tensor,
                 hs: torch.Tensor, RZ: torch.Tensor, NN: torch.Tensor, GHN: torch.Tensor) -> None:
    """gx ``[T, D, B, 3h]`` (input projections with b_ih), w_hhT ``[D, h, 3h]``, b_hh
    ``[D, 1, 3h]``, h0 ``[D, B, h]``; writes hs ``[T, D, B, h]`` and the saved r, z (RZ),
    n (NN) and W_hn h + b_hn (GHN)."""
    T = gx.shape[0]
    hd = h0.shape[-1]
    h = h0
    for t in range(T):
        gh = torch.baddbmm(b_hh, h, w_hhT)  # [D, B, 3h]
        g = gx[t]
        rz = torch.sigmoid(torch.add(g[:, :, : 2 * hd], gh[:, :, : 2 * hd]), out=RZ[t])
        ghn = GHN[t]
        ghn.copy_(gh[:, :, 2 * hd:])
        n = torch.tanh(torch.addcmul(g[:, :, 2 * hd:], rz[:, :, :hd], ghn), out=NN[t])
        h = torch.lerp(n, h, rz[:, :, hd:], out=hs[t])  # n + z (h − n)


def backward_loop(dout: torch.Tensor, w_hh: torch.Tensor, Z: torch.Tensor, R: torch.Tensor, AN: torch.Tensor,
                  AZ: torch.Tensor, AR: torch.Tensor, DGH: torch.Tensor, DN: torch.Tensor,
                  dh: torch.Tensor) -> torch.Tensor:
    """Reverse pass: fills DGH ``[T, D, B, 3h]`` (gradients of the recurrent pre-activations,
    ``(dr, dz, dn ⊙ r)``) and DN (of the candidate's pre-activation); returns dh₀."""
    T = dout.shape[0]
    hd = dh.shape[-1]
    for t in range(T - 1, -1, -1):
        dh = dh + dout[t]
        dg = DGH[t]
        dn = torch.mul(dh, AN[t], out=DN[t])
        torch.mul(dn, AR[t], out=dg[:, :, :hd])
        torch.mul(dh, AZ[t], out=dg[:, :, hd: 2 * hd])
        torch.mul(dn, R[t], out=dg[:, :, 2 * hd:])
        dh = torch.baddbmm(torch.mul(dh, Z[t]), dg, w_hh)
    return dh


_COMPILED: Optional[tuple] = None
_LOCK = threading.Lock()


def _loops(compiled: bool):
    global _COMPILED
    if not compiled:
        return forward_loop, backward_loop
    with _LOCK:
        if _COMPILED is None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _COMPILED = (torch.jit.script(forward_loop), torch.jit.script(backward_loop))
            except Exception:  # no TorchScript: the same functions in Python
                _COMPILED = (forward_loop, backward_loop)
    return _COMPILED


class _GRURecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gx, w_hh, b_hh, h0, compiled):
        fwd, _ = _loops(compiled)
        T, D, B, G = gx.shape
        hd = G // 3
        hs = gx.new_empty(T, D, B, hd)
        RZ, NN, GHN = gx.new_empty(T, D, B, 2 * hd), gx.new_empty(T, D, B, hd), gx.new_empty(T, D, B, hd)
        fwd(gx, w_hh.transpose(1, 2), b_hh.unsqueeze(1), h0, hs, RZ, NN, GHN)
        ctx.save_for_backward(w_hh, h0, hs, RZ, NN, GHN)
        ctx.compiled = compiled
        return hs

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        w_hh, h0, hs, RZ, NN, GHN = ctx.saved_tensors
        _, bwd = _loops(ctx.compiled)
        T, D, B, hd = hs.shape
        R, Z = RZ[..., :hd], RZ[..., hd:]
        hprev = torch.cat([h0.unsqueeze(0), hs[:-1]], 0)
        AN = (1 - Z) * (1 - NN * NN)  # dn_pre = dh · AN
        AZ = (hprev - NN) * Z * (1 - Z)  # dz_pre = dh · AZ
        AR = GHN * R * (1 - R)  # dr_pre = dn_pre · AR
        DGH, DN = hs.new_empty(T, D, B, 3 * hd), hs.new_empty(T, D, B, hd)
        dh0 = bwd(dout.contiguous(), w_hh, Z.contiguous(), R.contiguous(), AN, AZ, AR, DGH, DN,
                  torch.zeros_like(h0))
        dgx = torch.cat([DGH[..., : 2 * hd], DN], -1)
        dw = torch.bmm(DGH.permute(1, 3, 0, 2).reshape(D, 3 * hd, T * B), hprev.transpose(0, 1).reshape(D, T * B, hd))
        db = DGH.sum((0, 2))
        return dgx, dw, db, dh0, None


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
    dev = gx.device.type
    if torch.is_autocast_enabled(dev) and gx.dtype != torch.float64:
        # the loops write into buffers of one dtype: run them in float32, autocast off
        with torch.autocast(dev, enabled=False):
            return _GRURecurrence.apply(gx.float().contiguous(), w_hh.float().contiguous(),
                                        b_hh.float().contiguous(), h0.float().contiguous(), bool(compiled))
    return _GRURecurrence.apply(gx.contiguous(), w_hh.contiguous(), b_hh.contiguous(), h0.contiguous(),
                                bool(compiled))


def gru_module_forward(gru: nn.GRU, x: torch.Tensor, compiled: bool = True) -> torch.Tensor:
    """``gru(x)[0]`` for a one-layer, batch-first ``torch.nn.GRU`` (either direction count)
    from a zero state, through :func:`gru_scan`: ``x [B, T, in] -> [B, T, D·h]``."""
    if gru.num_layers != 1 or not gru.batch_first or not gru.bias:
        raise ValueError("gru_module_forward expects a one-layer, batch-first GRU with biases")
    D = 2 if gru.bidirectional else 1
    sfx = ["", "_reverse"][:D]
    w_ih = torch.cat([getattr(gru, "weight_ih_l0" + s) for s in sfx], 0)  # [D·3h, in]
    b_ih = torch.cat([getattr(gru, "bias_ih_l0" + s) for s in sfx], 0)
    w_hh = torch.stack([getattr(gru, "weight_hh_l0" + s) for s in sfx], 0)  # [D, 3h, h]
    b_hh = torch.stack([getattr(gru, "bias_hh_l0" + s) for s in sfx], 0)
    B, T = x.shape[0], x.shape[1]
    hd = gru.hidden_size
    gx = torch.nn.functional.linear(x.transpose(0, 1), w_ih, b_ih).view(T, B, D, 3 * hd).transpose(1, 2)  # [T, D, B, 3h]
    if D == 2:
        gx = torch.stack([gx[:, 0], gx[:, 1].flip(0)], 1)
    hs = gru_scan(gx, w_hh, b_hh, x.new_zeros(D, B, hd), compiled)  # [T, D, B, h]
    if D == 2:
        hs = torch.stack([hs[:, 0], hs[:, 1].flip(0)], 1)
    return hs.permute(2, 0, 1, 3).reshape(B, T, D * hd)
