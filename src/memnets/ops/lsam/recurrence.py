"""LSAM's fused recurrence (docs/maths.md §2): :func:`lsam_scan` runs one LSAM layer, all its
directions at once, over a sequence; :class:`LSAMRecurrence` is its per-step part with a
hand-written backward, whose loops are :mod:`memnets.ops.lsam.loops`. The reference is
:func:`memnets.ops.lsam.reference.lsam_scan_reference`; ``LSAM(impl="fused")`` runs this one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._amp import backward_without_autocast, float32_under_autocast
from ..gpu import use_triton
from ..gpu.lsam import LSAMRecurrenceTriton, applies
from ..permute import inverse_permutation, permute
from . import loops as _loops
from . import native as _c

__all__ = ["lsam_scan", "LSAMRecurrence"]


_INDEX: dict = {}  # (D', H', device) -> (_head_major_index, its inverse), made once per device


def _cached_head_major_index(Dp: int, Hp: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_head_major_index` and its inverse permutation, made once per ``(D', H', device)``
    (a call then launches nothing for them); made afresh, and not kept, while a CUDA graph is
    being captured (their values would exist only once the graph is replayed)."""
    key = (Dp, Hp, device)
    pair = _INDEX.get(key)
    if pair is None:
        with torch.inference_mode(False):  # kept for the process: ordinary tensors, whatever the caller's mode
            idx = _head_major_index(Dp, Hp, device)
            pair = (idx, inverse_permutation(idx))
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _INDEX[key] = pair
    return pair


def _head_major_index(Dp: int, Hp: int, device) -> torch.Tensor:
    """Row permutation from ``[q | k | v | p_r | p_w]`` to per-head blocks ``[q_i k_i v_i r_i w_i]``."""
    d = Dp // Hp
    heads = torch.arange(Hp, device=device)
    rows = torch.arange(d, device=device)
    q = heads[:, None] * d + rows[None, :]  # [H', d]
    idx = torch.cat([q, Dp + q, 2 * Dp + q, (3 * Dp + heads)[:, None], (3 * Dp + Hp + heads)[:, None]], 1)
    return idx.reshape(-1)  # [H' * (3d + 2)]


_EPS = 1e-6  # μ's eps, as in memnets.ops.unit
_SEGMENT = 32  # steps between exact memory copies kept for the backward pass


class LSAMRecurrence(torch.autograd.Function):
    """The per-step part of :func:`lsam_scan` with a hand-written backward (docs/maths.md §2).

    Forward, per step (N = dirs·B·H' memories, rows of ``g`` in per-head blocks)::

        g = gx_t + h_{t-1} W_hhᵀ;  (q, k) = μ(.);  (p_r, p_w) = σ(.)
        (a_q, a_k) = (M q, M k);  u = p_w (v − a_k);  M ← M + u kᵀ
        h_t = p_r (a_q + u (q·k))          # = RD(WR(M, k, v, p_w, p_w), q, p_r)

    The loops themselves are :mod:`memnets.ops.lsam.loops` (compiled by TorchScript
    where available); on float32 / float64 CPU tensors the NAM part of each step runs as one call
    of a C kernel instead (:mod:`memnets.ops.lsam.native`), the same arithmetic. The memory is
    updated in place in one buffer of its own, kept transposed (``Mᵀ``, so that the row-vector
    products ``(q, k) Mᵀ`` read it row-major): no ``[N, d, d]`` tensor is allocated per step.
    ``w_hh`` is ``[dirs, G, D']`` (rows in per-head blocks). Backward walks the steps in reverse
    and recovers ``M_{t-1} = M_t − u_t k_tᵀ`` in place; an exact copy kept every
    :data:`_SEGMENT` steps resets that buffer, so rounding drift is bounded by a few ulps per
    segment while memory is O(T / _SEGMENT) memories. The weight gradient
    ``Σ_t h_{t-1}ᵀ dg_t`` is one matmul after the loop. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, gx, w_hh, M0, h0, compiled=True):
        fwd, _, _ = _loops.loops(compiled)
        kernel = _c.kernel(gx, compiled)  # the C step on float32/float64 CPU tensors
        T, dirs, B, _ = gx.shape
        Dp, N, d = w_hh.shape[2], M0.shape[0], M0.shape[-1]
        X = M0.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # Mᵀ, its own, updated in place
        new = gx.new_empty
        out, QK, NRM, P, CQ = new(T, dirs, B, Dp), new(T, N, 2, d), new(T, N, 2, 1), new(T, N, 2), new(T, N)
        E, U, R, ckpts = new(T, N, d), new(T, N, d), new(T, N, d), new((T - 1) // _SEGMENT, N, d, d)
        if kernel is not None:
            _c.forward_steps(kernel[0], gx, w_hh, X, h0, out, QK, NRM, P, CQ, E, U, R, ckpts, _SEGMENT, _EPS)
        else:
            fwd(gx, w_hh, X, h0, out, QK, NRM, P, CQ, E, U, R, ckpts, _SEGMENT, _EPS)
        ctx.save_for_backward(w_hh, h0, out, X, ckpts, QK, NRM, P, CQ, E, U, R)
        ctx.compiled, ctx.kernel = compiled, kernel
        return out, X.transpose(1, 2).clone(memory_format=torch.contiguous_format)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, dout, dM):
        w_hh, h0, out, X_T, ckpts, QK, NRM, P, CQ, E, U, R = ctx.saved_tensors  # X = Mᵀ, ckpts too
        _, bwd, _ = _loops.loops(ctx.compiled)
        T, dirs, B, Dp = out.shape
        N, d = X_T.shape[0], X_T.shape[-1]
        G = w_hh.shape[1]
        dM = torch.zeros_like(X_T) if dM is None else dM.contiguous().clone()
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        work = X_T.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # M_T, reversed in place to M_0
        dgx = out.new_empty(T, dirs, B, G)
        if ctx.kernel is not None:
            dh = _c.backward_steps(ctx.kernel[1], w_hh, work, dM, dout, dgx, ckpts, QK, NRM, P, CQ, E, U, R,
                                   _SEGMENT, _EPS)
        else:
            S = P * (1 - P)  # σ' for all steps: [T, N, 2]
            INV = 1.0 / NRM  # [T, N, 2, 1] (NRM holds max(‖x‖, eps))
            QKM = QK * (NRM > _EPS)  # μ's projection only where ‖x‖ > eps: [T, N, 2, d]
            QKS = torch.cat([QK[:, :, 1:], QK[:, :, :1]], 2)  # (k, q): [T, N, 2, d]
            dh = bwd(w_hh, work, dM, out.new_zeros(N, d), dout, dgx, ckpts, QK, U, P, CQ, R, E, QKS, QKM, INV,
                     S, _SEGMENT)
        dw = None
        if ctx.needs_input_grad[1]:
            hprev = torch.cat([h0.unsqueeze(0), out[:-1]], 0)  # [T, dirs, B, D']
            if dirs == 1:  # Σ_t dg_tᵀ h_{t-1}: one 2-D matmul
                dw = torch.mm(dgx.view(T * B, G).t(), hprev.view(T * B, Dp)).unsqueeze(0)  # [1, G, D']
            else:
                dg = dgx.permute(1, 3, 0, 2).reshape(dirs, G, T * B)  # [dirs, G, T*B]
                dw = torch.bmm(dg, hprev.transpose(0, 1).reshape(dirs, T * B, Dp))  # [dirs, G, D']
        return dgx, dw, dM, dh.view(dirs, B, Dp), None


@float32_under_autocast
def lsam_scan(x: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor, bias: torch.Tensor,
              memory: torch.Tensor, h: torch.Tensor, num_heads: int, compiled: bool = True):
    """Run one LSAM layer (all its directions at once) over a sequence — the fast path.

    Args:
        x: ``[T, B, F]`` time-major input.
        weight_ih ``[dirs, G, F]``, weight_hh ``[dirs, G, D']``, bias ``[dirs, G]``: the
            :class:`LSAMCell` parameters of each direction (rows ``q | k | v | p_r | p_w``).
        memory: ``[dirs, B, H', d, d]``; h: ``[dirs, B, D']`` initial states.
        num_heads: H' heads per direction.
        compiled: use the TorchScript-compiled loops where available (``False``: the same
            loops as plain Python).
    Returns:
        ``(out [T, B, dirs*D'], memory [dirs, B, H', d, d], h [dirs, B, D'])``; direction 1
        runs from t = T-1 down to 0. Under autocast the whole layer runs in float32 with
        autocast off (inputs cast up; :mod:`memnets.ops._amp`) and returns float32.

    The input projection of every step and direction is one matmul; per step only
    ``h_{t-1} W_hhᵀ`` (one batched matmul over directions) and the NAM update remain, with a
    hand-written backward (:class:`LSAMRecurrence`). Rows are permuted to per-head blocks
    so that a step needs views only.
    """
    T, B, Fi = x.shape
    dirs, G, Dp = weight_hh.shape
    Hp = num_heads
    d = Dp // Hp
    idx, inv = _cached_head_major_index(Dp, Hp, x.device)
    w_ih = permute(weight_ih, 1, idx, inv)  # [dirs, G, F], head-major rows
    w_hh = permute(weight_hh, 1, idx, inv)  # [dirs, G, D'], head-major rows
    b = permute(bias, 1, idx, inv)  # [dirs, G]
    gx = F.linear(x, w_ih.reshape(dirs * G, Fi), b.reshape(dirs * G))  # [T, B, dirs*G]
    gx = gx.unflatten(-1, (dirs, G)).transpose(1, 2)  # [T, dirs, B, G]
    if dirs == 2:
        gx = torch.stack([gx[:, 0], gx[:, 1].flip(0)], dim=1)  # backward direction reversed in time
    M0 = memory.reshape(dirs * B * Hp, d, d)  # [N, d, d]
    # Triton on CUDA (memnets.ops.gpu.lsam), for head dims up to 128
    fn = LSAMRecurrenceTriton if use_triton(gx) and applies(M0) else LSAMRecurrence
    out, M = fn.apply(gx.contiguous(), w_hh, M0, h.contiguous(), bool(compiled))
    h_T = out[-1]  # [dirs, B, D']
    if dirs == 2:
        out = torch.cat([out[:, 0], out[:, 1].flip(0)], dim=-1)  # [T, B, 2D']
    else:
        out = out[:, 0]  # [T, B, D']
    return out, M.view(dirs, B, Hp, d, d), h_T
