"""The NAM-TM head and key-tape recurrence over a whole sequence, one autograd Function.

In the NAM Turing Machine (docs/maths.md, NAM-TM) only the heads and the key tape depend on
the previous step in a non-linear way: the JUMP target ``K'ᵀ q`` is read from the key tape,
which is written at the write head, which moved by the previous JUMP. The value tape is a
NAM memory addressed by the head sequence, so once the heads are known it is one
:func:`memnets.ops.nam_scan` (keys ``H_w``, queries ``H_r``), chunkwise-parallel.
:func:`nam_tm_heads` runs only the sequential part, per step (N = batch·tapes)::

    position key tape   a = K H_w;   u = p_w k − p_e a;   K' = K + u H_wᵀ
    transposed          a = Kᵀ k;    w = p_w H_w − p_e a; K' = K + k wᵀ
    jump                j = K'ᵀ q
    heads               H'_h = Σ_a act_{h,a} · move_a(H_h)    (h = read, write head)
                        LEFT = roll(H, −1), NOOP = H, RIGHT = roll(H, +1), JUMP = j

With ``unit_keys`` (the NAM-TM's ``normalize_heads="all"``) the key tape is written at (or,
transposed, with) ``μ(H_w)`` in place of ``H_w``; the C kernel only.

Without JUMP among the actions the key tape is never read, so it is neither written nor
returned changed, and the heads move by the shifts alone.

On the CPU (float32/float64) the whole recurrence, forward and backward, is one C kernel
(memnets/ops/_native/nam_tm_heads.c, :mod:`memnets.ops._native`): one sequence at a time to
the end, its key tape in cache, the backward walking the tape back from copies saved every
:data:`_SEGMENT` steps. Elsewhere (CUDA, no C compiler, ``MEMNETS_NATIVE=0``) the loops below
run. The loops (:func:`forward_loop`, :func:`backward_loop`) are written in the subset of
Python that TorchScript compiles, as :mod:`memnets.ops.lsam.loops` is; the Function saves
every step's key tape and walks the steps in reverse with a hand-derived backward. They take
lists of per-step views made once before the loop (no indexing or reshaping per step), and
what depends on forward values only is prepared for all steps at once (``p_w k``, ``−p_e``).
The jump-query gradient ``K_{t+1} dj_t`` is taken in the reverse loop, where ``K_{t+1}`` was
just read (one pass over all the saved tapes afterwards costs more). What depends on forward
values and the loop's results only is batched after the loop: the action-weight gradients
``<move_a(H_t), dH_{t+1}>`` (a few steps at a time) and the gradients of ``k, p_w, p_e``.
The saved key tapes and the backward's buffers come from a workspace pool. Held to the
per-step reference (:func:`memnets.memories.nam_tm.nam_tm_step`) in float64 by
tests/test_nam_tm_fused.py, with ``gradcheck``. Not twice differentiable.
"""
from __future__ import annotations

import ctypes
from typing import List, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _native
from .gpu import use_triton
from ._script import script_once
from ._workspace import WorkspacePool
from ._amp import backward_without_autocast

__all__ = ["nam_tm_heads", "kernel_available", "forward_loop", "backward_loop", "loops"]

LEFT, NOOP, RIGHT, JUMP = 0, 1, 2, 3


def _move(H: torch.Tensor, a: int) -> torch.Tensor:
    """A shift of the heads ``H [..., L]`` (LEFT, NOOP, RIGHT)."""
    if a == LEFT:
        return torch.roll(H, -1, -1)
    if a == RIGHT:
        return torch.roll(H, 1, -1)
    return H


def forward_loop(W: List[List[torch.Tensor]], q1: List[torch.Tensor], k1: List[torch.Tensor],
                 PK: List[torch.Tensor], PW: List[torch.Tensor], NPE: List[torch.Tensor],
                 hs: List[torch.Tensor], Ks: List[torch.Tensor], Aa1: List[torch.Tensor],
                 U1: List[torch.Tensor], J1: List[torch.Tensor], order: List[int], has_jump: bool,
                 transposed: bool) -> None:
    """Fill the heads ``hs[t + 1]`` (``[N, 2, L]``; ``hs[0]`` given) and, with JUMP, the key
    tapes ``Ks[t + 1]`` (stored transposed, ``Kᵀ [N, L, C]``, so that every product is a row
    vector times a matrix; ``Ks[0]`` given), ``Aa1[t]`` (``a``), ``U1[t]`` (``u`` or ``w``)
    and ``J1[t]`` (the jump, ``[N, 1, L]``). Every argument is a list of per-step views:
    ``W[i][t]`` the weights ``[N, 2, 1]`` of action ``order[i]``; ``q1``, ``k1`` ``[N, 1, C]``;
    ``PK = p_w k`` ``[N, 1, C]`` (position key tape only); ``PW = p_w``, ``NPE = −p_e``
    ``[N, 1, 1]``."""
    T = len(W[0])
    for t in range(T):
        H = hs[t]
        j = H  # replaced by the jump below when JUMP is an action
        if has_jump:
            K, Kn = Ks[t], Ks[t + 1]
            hw1 = H[:, 1:2]  # [N, 1, L]
            if transposed:
                a = torch.bmm(k1[t], K.transpose(1, 2), out=Aa1[t])  # Kᵀ k: [N, 1, L]
                w = torch.mul(hw1, PW[t], out=U1[t]).addcmul_(a, NPE[t])
                torch.addcmul(K, w.transpose(1, 2), k1[t], out=Kn)  # K' = K + k wᵀ
            else:
                a = torch.bmm(hw1, K, out=Aa1[t])  # K H_w: [N, 1, C]
                u = torch.addcmul(PK[t], a, NPE[t], out=U1[t])
                torch.addcmul(K, hw1.transpose(1, 2), u, out=Kn)  # K' = K + u H_wᵀ
            j = torch.bmm(q1[t], Kn.transpose(1, 2), out=J1[t])  # K'ᵀ q: [N, 1, L]
        out = hs[t + 1]
        for i in range(len(order)):
            a = order[i]
            if a == 0:
                m = torch.roll(H, -1, -1)
            elif a == 2:
                m = torch.roll(H, 1, -1)
            elif a == 1:
                m = H
            else:
                m = j  # [N, 1, L]: the same jump for both heads
            if i == 0:
                torch.mul(m, W[i][t], out=out)
            else:
                out.addcmul_(m, W[i][t])


def backward_loop(W: List[List[torch.Tensor]], q1: List[torch.Tensor], k1: List[torch.Tensor],
                  PW: List[torch.Tensor], NPE: List[torch.Tensor], hs: List[torch.Tensor],
                  Ks: List[torch.Tensor], U1: List[torch.Tensor], gH: List[torch.Tensor], dK: torch.Tensor,
                  DH: List[torch.Tensor], DJ: List[torch.Tensor], DQ1: List[torch.Tensor],
                  DU1: List[torch.Tensor], DK1: List[torch.Tensor], dH0: torch.Tensor,
                  order: List[int], has_jump: bool, transposed: bool) -> None:
    """Reverse pass (lists of per-step views as in :func:`forward_loop`). ``gH[t]``: incoming
    gradients of the heads ``hs[t]``; ``dK [N, L, C]``: of the final key tape (stored
    transposed, like ``Ks``), updated in place to that of ``Ks[0]``. Writes ``DH[t]`` (the
    total gradient of ``hs[t + 1]``; ``DH[T − 1]`` given), ``DJ[t]`` (of the jump, ``[N, L]``),
    ``DQ1[t]`` (of ``q_t``), ``DU1[t]`` (of ``u``, or of ``w``), for the transposed key tape
    ``DK1[t]`` (of ``k_t``), and ``dH0`` (of ``hs[0]``)."""
    T = len(W[0])
    jpos = -1
    for i in range(len(order)):
        if order[i] == 3:
            jpos = i
    for t in range(T - 1, -1, -1):
        dH = DH[t]
        dp = DH[t - 1] if t > 0 else dH0  # dp = gH[t] + Σ_a act_a · move_aᵀ(dH)
        first = True
        for i in range(len(order)):
            a = order[i]
            if a == 3:
                continue
            if a == 0:  # adjoint of roll(−1) is roll(+1)
                m = torch.roll(dH, 1, -1)
            elif a == 2:
                m = torch.roll(dH, -1, -1)
            else:
                m = dH
            if first:
                torch.addcmul(gH[t], m, W[i][t], out=dp)
                first = False
            else:
                dp.addcmul_(m, W[i][t])
        if first:
            dp.copy_(gH[t])
        if has_jump:
            H = hs[t]
            hw1 = H[:, 1:2]  # [N, 1, L]
            dj = torch.sum(torch.mul(dH, W[jpos][t]), 1, out=DJ[t])  # [N, L]
            dj1 = dj.unsqueeze(1)
            torch.bmm(dj1, Ks[t + 1], out=DQ1[t])  # j = K'ᵀ q
            dK.addcmul_(dj1.transpose(1, 2), q1[t])  # (dK is of Kᵀ)
            if transposed:  # K' = K + k wᵀ, w = p_w H_w − p_e Kᵀ k
                dw = torch.bmm(k1[t], dK.transpose(1, 2), out=DU1[t])  # [N, 1, L]
                dk = torch.bmm(U1[t], dK, out=DK1[t])  # [N, 1, C]
                dp[:, 1:2].addcmul_(dw, PW[t])
                da = torch.mul(dw, NPE[t])  # [N, 1, L]
                dk.add_(torch.bmm(da, Ks[t]))
                dK.addcmul_(da.transpose(1, 2), k1[t])  # a = Kᵀ k
            else:  # K' = K + u H_wᵀ, u = p_w k − p_e K H_w
                du = torch.bmm(hw1, dK, out=DU1[t])  # [N, 1, C]
                dhw = torch.bmm(U1[t], dK.transpose(1, 2))  # [N, 1, L]
                da = torch.mul(du, NPE[t])  # [N, 1, C]
                dK.addcmul_(hw1.transpose(1, 2), da)  # a = K H_w
                dp[:, 1:2].add_(torch.baddbmm(dhw, da, Ks[t].transpose(1, 2)))


def loops(compiled: bool = True):
    """``(forward_loop, backward_loop, is_compiled)``: TorchScript-compiled where that works
    (tried once per process), else the same Python functions."""
    return script_once(forward_loop, backward_loop) if compiled else (forward_loop, backward_loop, False)


def _action_grads(Hs: torch.Tensor, J: Optional[torch.Tensor], DH: torch.Tensor, order: List[int],
                  slab: int = 8) -> torch.Tensor:
    """``[T, N, 2, A]``: ``<move_a(H_t), dH_{t+1}>`` for every step and action, ``slab`` steps
    at a time (small temporaries: large fresh ones cost more than the products on a CPU)."""
    T = DH.shape[0]
    out = DH.new_empty(DH.shape[:3] + (len(order),))
    for t0 in range(0, T, slab):
        H, dH = Hs[t0:min(t0 + slab, T)], DH[t0:t0 + slab]
        for i, a in enumerate(order):
            if a == JUMP:
                assert J is not None
                torch.linalg.vecdot(dH, J[t0:t0 + slab].unsqueeze(2), out=out[t0:t0 + slab, ..., i])
            else:
                torch.linalg.vecdot(_move(H, a), dH, out=out[t0:t0 + slab, ..., i])
    return out


_HEAD = [_native.LONG] * 3 + [_native.INT] + [_native.LONG] * 3 + [_native.PTR, _native.INT, _native.INT, _native.INT]
_SIGNATURES = {  # T, B, Tn, bm, L, C, A, order, has_jump, transposed, unit_keys, pointers, S, pointers, n0, n1
    "nam_tm_heads_fwd": _HEAD + [_native.PTR] * 7 + [_native.LONG] + [_native.PTR] * 4 + [_native.LONG] * 2,
    "nam_tm_heads_bwd": _HEAD + [_native.PTR] * 7 + [_native.LONG] + [_native.PTR] * 12 + [_native.LONG] * 2,
}


def _kernel(x: torch.Tensor, compiled: bool):
    """``(forward, backward)`` of the C kernel (memnets/ops/_native/nam_tm_heads.c) for ``x``'s
    dtype, or ``None``: not on the CPU, not float32/float64, ``compiled=False``, or no C
    compiler (then the TorchScript loops run; the results are the same)."""
    return _native.functions("nam_tm_heads", x, _SIGNATURES) if compiled else None


def _ptr(x: Optional[torch.Tensor]):
    return None if x is None or x.numel() == 0 else x.data_ptr()


_POOL = WorkspacePool()  # the per-step key tapes and the backward's buffers (memnets.ops._workspace)


def _jump_space(T: int, N: int, L: int, C: int, transposed: bool, like: torch.Tensor):
    new = like.new_empty
    Aa = new(T, N, L if transposed else C)
    return new(T + 1, N, L, C), Aa, torch.empty_like(Aa), new(T, N, L)  # Ks, Aa, U, J


_SEGMENT = 16  # the C kernel saves the key tape every this many steps and walks it back in between


def _native_space(T: int, N: int, L: int, C: int, transposed: bool, like: torch.Tensor):
    new = like.new_empty
    Aa = new(T, N, L if transposed else C)
    return new(-(-T // _SEGMENT) + 1, N, L, C), Aa, torch.empty_like(Aa), new(T, N, L)  # Kc, Aa, U, J


def _steps(x: torch.Tensor, dim: Optional[int] = None) -> List[torch.Tensor]:
    """The per-step views ``x[t]`` (with a unit dimension inserted at ``dim`` of each)."""
    return list((x if dim is None else x.unsqueeze(dim + 1)).unbind(0))


def _backward_space(T: int, N: int, L: int, C: int, transposed: bool, has_jump: bool, like: torch.Tensor):
    new = like.new_empty
    if not has_jump:
        return new(T, N, 2, L), None, None
    return new(T, N, 2, L), new(T, N, L), new(T, N, L if transposed else C)  # DH, DJ, DU


def _dims(act: torch.Tensor, bm: bool):
    """``(T, B, Tn)`` of ``act``: ``[B, T, Tn, 2, A]`` (batch-major) or ``[T, N, 2, A]`` (B = 1)."""
    return (act.shape[1], act.shape[0], act.shape[2]) if bm else (act.shape[0], 1, act.shape[1])


class _HeadScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, act, q, k, pw, pe, H0, K0, order, transposed, compiled, bm, unit_keys):
        T, B, Tn = _dims(act, bm)
        N, L = B * Tn, H0.shape[-1]
        has_jump = JUMP in order
        kernel = _kernel(act, compiled)
        if bm and kernel is None:
            raise RuntimeError("the batch-major layout needs the C kernel (memnets.ops._native)")
        ctx.kernel = kernel
        if kernel is not None:
            Hs = act.new_empty((B, T + 1, Tn, 2, L) if bm else (T + 1, N, 2, L))  # returned: not pooled
            lease, K_T = _HeadScan._native_forward(kernel[0], act, q, k, pw, pe, H0, K0, Hs, order, transposed, bm,
                                                   unit_keys)
        else:
            Hs = act.new_empty(T + 1, N, 2, L)
            lease = None
            if has_jump:
                C = K0.shape[1]
                key = (T, N, L, C, transposed, act.dtype, act.device)
                lease = _POOL.lease(key, lambda: _jump_space(T, N, L, C, transposed, act))
            _HeadScan._run(act, q, k, pw, pe, H0, K0, Hs, lease, order, transposed, compiled)
            # a copy: the workspace goes back to the pool (``contiguous`` alone returns a view of it
            # when L or C is 1)
            K_T = lease.space[0][T].transpose(1, 2).clone(memory_format=torch.contiguous_format) if has_jump \
                else K0.clone()
        ctx.save_for_backward(act, q, k, pw, pe, H0, K0, Hs)
        ctx.order, ctx.transposed, ctx.compiled, ctx.has_jump, ctx.bm = order, transposed, compiled, has_jump, bm
        ctx.lease, ctx.unit_keys = lease, unit_keys
        ctx.set_materialize_grads(False)  # backward makes the zeros of an unused output itself
        return Hs, K_T

    @staticmethod
    def _weights(act):
        return [_steps(act[..., i:i + 1]) for i in range(act.shape[-1])]  # [N, 2, 1] per action and step

    @staticmethod
    def _native_forward(fwd, act, q, k, pw, pe, H0, K0, Hs, order, transposed, bm, unit_keys=False):
        """The C kernel: fills ``Hs``; returns the lease of the saved key tapes (every
        :data:`_SEGMENT` steps and the last), ``a``, ``u``/``w`` and the jumps, and the
        final key tape."""
        T, B, Tn = _dims(act, bm)
        N, L, A, C = B * Tn, Hs.shape[-1], act.shape[-1], K0.shape[1]
        (Hs[:, 0] if bm else Hs[0]).copy_(H0.view(B, Tn, 2, L) if bm else H0)
        parts = _native.ranges(N, T * N * L * (3 * C + 2 * A))
        lease = None
        Kc = Aa = U = J = None
        if JUMP in order:
            key = ("native", T, N, L, C, transposed, act.dtype)
            lease = _POOL.lease(key, lambda: _native_space(T, N, L, C, transposed, act))
            Kc, Aa, U, J = lease.space
            Kc[0].copy_(K0.transpose(1, 2))
        work = act.new_empty(len(parts), 2 * L * C + L) if lease is not None else None  # 2 key tapes, a row
        orders = (ctypes.c_int * len(order))(*order)
        args = (T, B, Tn, int(bm), L, C, A, orders, int(lease is not None), int(transposed), int(unit_keys),
                _ptr(act), _ptr(q), _ptr(k), _ptr(pw), _ptr(pe), _ptr(Hs), _ptr(Kc), _SEGMENT, _ptr(Aa), _ptr(U), _ptr(J))
        _native.parallel(lambda i, n0, n1: fwd(*args, _ptr(work[i]) if work is not None else None, n0, n1), parts)
        # a copy: Kc goes back to the pool (``contiguous`` alone returns a view of it when L or C is 1)
        return lease, (Kc[-1].transpose(1, 2).clone(memory_format=torch.contiguous_format) if Kc is not None
                       else K0.clone())

    @staticmethod
    def _native_backward(ctx, gH, gK):
        act, q, k, pw, pe, H0, K0, Hs = ctx.saved_tensors
        order, transposed, has_jump, lease, bm = ctx.order, ctx.transposed, ctx.has_jump, ctx.lease, ctx.bm
        fwd, bwd = ctx.kernel
        T, B, Tn = _dims(act, bm)
        N, L, A, C = B * Tn, Hs.shape[-1], act.shape[-1], K0.shape[1]
        if has_jump and lease.space is None:  # a second backward through the graph: recompute
            lease, _ = _HeadScan._native_forward(fwd, act, q, k, pw, pe, H0, K0, Hs.clone(), order, transposed, bm,
                                                 ctx.unit_keys)
        gH = torch.zeros_like(Hs) if gH is None else gH.contiguous()
        new = act.new_empty
        dact, dH0 = new(act.shape), new(N, 2, L)
        dq = dk = dpw = dpe = dK = Kc = Aa = U = J = None
        if has_jump:
            Kc, Aa, U, J = lease.space
            dq, dk, dpw, dpe = new(q.shape), new(k.shape), new(pw.shape), new(pe.shape)
            dK = (torch.zeros(N, L, C, dtype=act.dtype, device=act.device) if gK is None  # written by the
                  else gK.transpose(1, 2).clone(memory_format=torch.contiguous_format))  # kernel: a copy; of Kᵀ
        parts = _native.ranges(N, T * N * L * (6 * C + 4 * A))
        work = new(len(parts), (L * C if has_jump else 0) + 8 * L + 2 * max(L, C))  # the key tape, scratch rows
        orders = (ctypes.c_int * len(order))(*order)
        args = (T, B, Tn, int(bm), L, C, A, orders, int(has_jump), int(transposed), int(ctx.unit_keys), _ptr(act),
                _ptr(q), _ptr(k),
                _ptr(pw), _ptr(pe), _ptr(Hs), _ptr(Kc), _SEGMENT, _ptr(Aa), _ptr(U), _ptr(J), _ptr(gH), _ptr(dK),
                _ptr(dact), _ptr(dq), _ptr(dk), _ptr(dpw), _ptr(dpe), _ptr(dH0))
        _native.parallel(lambda i, n0, n1: bwd(*args, _ptr(work[i]), n0, n1), parts)
        if has_jump:
            lease.release()
            return dact, dq, dk, dpw, dpe, dH0, dK.transpose(1, 2), None, None, None, None, None
        return dact, None, None, None, None, dH0, gK, None, None, None, None, None

    @staticmethod
    def _run(act, q, k, pw, pe, H0, K0, Hs, lease, order, transposed, compiled):
        fwd, _, _ = loops(compiled)
        Hs[0].copy_(H0)
        W = _HeadScan._weights(act)
        if lease is not None:
            Ks, Aa, U, J = lease.space
            Ks[0].copy_(K0.transpose(1, 2))
            PK = [] if transposed else _steps(pw.unsqueeze(-1) * k.unsqueeze(2))  # p_w k
            fwd(W, _steps(q, 1), _steps(k, 1), PK, _steps(pw, 1), _steps(pe.neg().unsqueeze(-1)), _steps(Hs),
                _steps(Ks), _steps(Aa, 1), _steps(U, 1), _steps(J, 1), order, True, transposed)
        else:
            fwd(W, [], [], [], [], [], _steps(Hs), [], [], [], [], order, False, transposed)

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, gH, gK):
        if ctx.kernel is not None:
            return _HeadScan._native_backward(ctx, gH, gK)
        act, q, k, pw, pe, H0, K0, Hs = ctx.saved_tensors
        order, transposed, has_jump = ctx.order, ctx.transposed, ctx.has_jump
        _, bwd, _ = loops(ctx.compiled)
        T, N, L = act.shape[0], act.shape[1], Hs.shape[-1]
        lease = ctx.lease
        if has_jump and lease.space is None:  # a second backward through the graph: recompute
            C = K0.shape[1]
            lease.space = _POOL.take(lease.key, lambda: _jump_space(T, N, L, C, transposed, act))
            _HeadScan._run(act, q, k, pw, pe, H0, K0, Hs.clone(), lease, order, transposed, ctx.compiled)
        gH = torch.zeros_like(Hs) if gH is None else gH.contiguous()
        new = act.new_empty
        C = K0.shape[1]
        bkey = ("backward", T, N, L, C, transposed, has_jump, act.dtype, act.device)
        bspace = _POOL.take(bkey, lambda: _backward_space(T, N, L, C, transposed, has_jump, act))
        DH, DJ, DU = bspace
        DH[T - 1].copy_(gH[T])
        dH0 = new(N, 2, L)
        W = _HeadScan._weights(act)
        if has_jump:
            Ks, Aa, U, J = lease.space
            dK = (torch.zeros(N, L, C, dtype=Hs.dtype, device=Hs.device) if gK is None  # updated in place:
                  else gK.transpose(1, 2).clone(memory_format=torch.contiguous_format))  # a copy; of Kᵀ
            DQ = new(T, N, C)
            DK = new(T, N, C) if transposed else DQ.new_empty(0)
            bwd(W, _steps(q, 1), _steps(k, 1), _steps(pw, 1), _steps(pe.neg().unsqueeze(-1)), _steps(Hs),
                _steps(Ks), _steps(U, 1), _steps(gH), dK, _steps(DH), _steps(DJ), _steps(DQ, 1), _steps(DU, 1),
                _steps(DK, 1) if transposed else [], dH0, order, True, transposed)
        else:
            bwd(W, [], [], [], [], _steps(Hs), [], [], _steps(gH), act.new_empty(0), _steps(DH), [], [], [], [],
                dH0, order, False, transposed)
        dact = _action_grads(Hs, J if has_jump else None, DH, order)
        dq = dk = dpw = dpe = dK0 = None
        if has_jump:
            dq = DQ
            hw = Hs[:-1, :, 1]  # [T, N, L]
            if transposed:
                dk = DK
                dpw = (hw * DU).sum(-1, keepdim=True)
            else:
                dk = DU * pw
                dpw = (k * DU).sum(-1, keepdim=True)
            dpe = -(Aa * DU).sum(-1, keepdim=True)
            dK0 = dK.transpose(1, 2)
            lease.release()  # every use of the workspace is above
        else:
            dK0 = gK
        _POOL.give(bkey, bspace)  # and of the backward's
        return dact, dq, dk, dpw, dpe, dH0, dK0, None, None, None, None, None



def _check_args(act, q, k, p_w, p_e, h0, key_tape, order: List[int], has_jump: bool, bm: bool) -> None:
    """Shapes, dtypes and devices of :func:`nam_tm_heads`'s arguments, checked before any kernel
    reads them (a kernel trusts its sizes)."""
    def fail(name, want, x):
        got = f"{list(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else repr(x)
        raise ValueError(f"nam_tm_heads: `{name}` expected {want}, got {got}")

    lead = "[B, T, Tn" if bm else "[T, N"
    if not isinstance(act, torch.Tensor) or act.dim() != (5 if bm else 4) or act.shape[-2] != 2:
        fail("act", f"a tensor {lead}, 2, A]", act)
    if act.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        fail("act", "a floating-point tensor", act)
    A = act.shape[-1]
    if len(order) != A or A < 1 or len(set(order)) != A or any(a not in (LEFT, NOOP, RIGHT, JUMP) for a in order):
        raise ValueError(f"nam_tm_heads: `order` expected {A if A else 'one or more'} distinct actions among "
                         f"0 (LEFT), 1 (NOOP), 2 (RIGHT), 3 (JUMP), one per column of `act`, got {order}")
    steps = tuple(act.shape[:3]) if bm else tuple(act.shape[:2])
    N = steps[0] * steps[2] if bm else steps[1]
    if not isinstance(h0, torch.Tensor) or h0.dim() != 3 or tuple(h0.shape[:2]) != (N, 2) or h0.shape[2] < 1:
        fail("h0", f"[N, 2, L] with N = {N} and L >= 1", h0)
    L = h0.shape[2]
    if (not isinstance(key_tape, torch.Tensor) or key_tape.dim() != 3 or key_tape.shape[0] != N
            or key_tape.shape[2] != L):
        fail("key_tape", f"[N, C, L] with N = {N}, L = {L}", key_tape)
    C = key_tape.shape[1]
    if has_jump and C < 1:
        fail("key_tape", "a key width C >= 1 with JUMP", key_tape)
    named = [("p_w", p_w, steps), ("p_e", p_e, steps)]
    if has_jump:
        named += [("q", q, steps + (C,)), ("k", k, steps + (C,))]
    for name, x, shape in named:
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
            fail(name, f"shape {list(shape)}", x)
    for name, x in [("h0", h0), ("key_tape", key_tape)] + [(n, x) for n, x, _ in named]:
        if x.dtype != act.dtype or x.device != act.device:
            fail(name, f"{act.dtype} on {act.device} like `act`", x)


def nam_tm_heads(act: torch.Tensor, q: Optional[torch.Tensor], k: Optional[torch.Tensor], p_w: torch.Tensor,
                 p_e: torch.Tensor, h0: torch.Tensor, key_tape: torch.Tensor, order: List[int],
                 transposed: bool = False, compiled: bool = True, batch_major: bool = False,
                 unit_keys: bool = False):
    """Run the heads and key tape over T steps (N = batch·tapes sequences).

    Args:
        act: action probabilities ``[T, N, 2, A]`` (read head, write head; actions in ``order``).
        q: unit jump queries ``[T, N, C]``; k: unit keys ``[T, N, C]`` (both ``None`` without JUMP).
        p_w, p_e: ``[T, N]``.
        h0: head positions ``[N, 2, L]`` (read, write); key_tape: ``[N, C, L]``.
        order: action indices into (LEFT, NOOP, RIGHT, JUMP), one per column of ``act``.
        transposed: the transposed key tape ``Kᵀ ← WR(Kᵀ, k, H_w, p_w, p_e)``.
        compiled: use the C kernel (on the CPU) or the TorchScript-compiled loops where
            available.
        batch_major: the per-step arguments are ``[B, T, Tn, ...]`` instead of ``[T, N, ...]``
            (``N = B·Tn``, sequence ``n = b·Tn + i``; ``h0`` and ``key_tape`` stay ``[N, ...]``),
            and the heads come back as ``[B, T+1, Tn, 2, L]``: the C kernel reads each
            sequence's steps from nearby memory this way. Elsewhere the same values go through
            the time-major path.
        unit_keys: the key tape is written at (position mode) or with (transposed) the unit
            write head ``μ(H_w)`` instead of ``H_w`` (the NAM-TM's ``normalize_heads="all"``).
            C kernel only: :func:`kernel_available` says where it runs.
    Returns:
        ``(heads [T+1, N, 2, L], key_tape [N, C, L])``: ``heads[t]`` is the position used at
        step t, ``heads[T]`` the final one; the key tape after the last step.
    """
    order = [int(a) for a in order]
    has_jump = JUMP in order
    if has_jump and (q is None or k is None):
        raise ValueError("`q` and `k` are required when `order` includes JUMP")
    _check_args(act, q, k, p_w, p_e, h0, key_tape, order, has_jump, bool(batch_major))
    if act.shape[int(batch_major)] == 0 or h0.shape[0] == 0:  # no step or no sequence: nothing runs
        T, L = act.shape[int(batch_major)], h0.shape[-1]
        if batch_major:
            B, Tn = act.shape[0], act.shape[2]
            heads = h0.view(B, 1, Tn, 2, L).expand(B, T + 1, Tn, 2, L)
        else:
            heads = h0.unsqueeze(0).expand((T + 1,) + h0.shape)
        return heads.clone(), key_tape.clone()
    if use_triton(act):  # the CUDA path: the Triton kernel (memnets.ops.gpu.nam_tm)
        from .gpu.nam_tm import nam_tm_heads_triton
        return nam_tm_heads_triton(act, q, k, p_w, p_e, h0, key_tape, order, transposed, batch_major, unit_keys)
    if unit_keys and has_jump and _kernel(act, compiled) is None:
        raise ValueError("`unit_keys` needs the C kernel (memnets.ops._native), which is not available for "
                         f"{act.dtype} on {act.device.type}; see kernel_available")
    if batch_major and _kernel(act, compiled) is None:  # the time-major path, and back
        B, T, Tn = act.shape[:3]

        def tm(z):
            return None if z is None else z.transpose(0, 1).reshape((T, B * Tn) + z.shape[3:])
        Hs, K_T = nam_tm_heads(tm(act), tm(q), tm(k), tm(p_w), tm(p_e), h0, key_tape, order, transposed, compiled)
        return Hs.view((T + 1, B, Tn) + Hs.shape[2:]).transpose(0, 1), K_T
    if not has_jump:
        q = k = act.new_empty(0)
    return _HeadScan.apply(act.contiguous(), q.contiguous(), k.contiguous(), p_w.unsqueeze(-1).contiguous(),
                           p_e.unsqueeze(-1).contiguous(), h0.contiguous(), key_tape.contiguous(), order,
                           bool(transposed), bool(compiled), bool(batch_major), bool(unit_keys and has_jump))


def kernel_available(x: torch.Tensor) -> bool:
    """Whether the C kernel runs :func:`nam_tm_heads` for tensors like ``x`` (CPU, float32/float64,
    a C compiler, ``MEMNETS_NATIVE`` not 0)."""
    return _kernel(x, True) is not None

