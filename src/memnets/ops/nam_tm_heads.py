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

Without JUMP among the actions the key tape is never read, so it is neither written nor
returned changed, and the heads move by the shifts alone.

The loops (:func:`forward_loop`, :func:`backward_loop`) are written in the subset of Python
that TorchScript compiles, as :mod:`memnets.memories._lsam_loops` is; the Function saves
every step's key tape and walks the steps in reverse with a hand-derived backward. What
depends on forward values only is batched over all steps after the loop: the action-weight
gradients ``<move_a(H_t), dH_{t+1}>``, the jump-query gradients ``K_{t+1} dj_t`` and, for the
position key tape, the gradients of ``k, p_w, p_e``. Held to the per-step reference
(:func:`memnets.memories.nam_tm.nam_tm_step`) in float64 by tests/test_nam_tm_fused.py, with
``gradcheck``. Not twice differentiable.
"""
from __future__ import annotations

import threading
import warnings
from typing import List, Optional

import torch
from torch.autograd.function import once_differentiable

from ._workspace import WorkspacePool

__all__ = ["nam_tm_heads", "forward_loop", "backward_loop", "loops"]

LEFT, NOOP, RIGHT, JUMP = 0, 1, 2, 3


def _move(H: torch.Tensor, j: Optional[torch.Tensor], a: int) -> torch.Tensor:
    if a == 0:
        return torch.roll(H, -1, -1)
    if a == 2:
        return torch.roll(H, 1, -1)
    if a == 1:
        return H
    assert j is not None
    return j.unsqueeze(1)


def forward_loop(act: torch.Tensor, q: torch.Tensor, k: torch.Tensor, pw: torch.Tensor, pe: torch.Tensor,
                 Hs: torch.Tensor, Ks: torch.Tensor, Aa: torch.Tensor, U: torch.Tensor, J: torch.Tensor,
                 order: List[int], has_jump: bool, transposed: bool) -> None:
    """Fill ``Hs [T+1, N, 2, L]`` (``Hs[0]`` given) and, with JUMP, ``Ks [T+1, N, L, C]``
    (the key tapes stored transposed, ``Kᵀ``, so that every product is a row vector times a
    matrix; ``Ks[0]`` given), ``Aa`` (``a``), ``U`` (``u`` or ``w``) and ``J [T, N, L]``.
    act ``[T, N, 2, A]``; q, k ``[T, N, C]``; pw, pe ``[T, N, 1]``."""
    T = act.shape[0]
    acts = act.unsqueeze(-1).unbind(0)  # [N, 2, A, 1] per step
    hss = Hs.unbind(0)
    for t in range(T):
        H = hss[t]
        j: Optional[torch.Tensor] = None
        if has_jump:
            K, hw = Ks[t], H[:, 1]  # K = Kᵀ: [N, L, C]
            if transposed:
                a = torch.bmm(k[t].unsqueeze(1), K.transpose(1, 2), out=Aa[t].unsqueeze(1)).squeeze(1)  # Kᵀ k: [N, L]
                w = torch.mul(hw, pw[t], out=U[t]).addcmul_(a, pe[t], value=-1.0)
                torch.addcmul(K, w.unsqueeze(-1), k[t].unsqueeze(1), out=Ks[t + 1])  # K' = K + k wᵀ
            else:
                a = torch.bmm(hw.unsqueeze(1), K, out=Aa[t].unsqueeze(1)).squeeze(1)  # K H_w: [N, C]
                u = torch.mul(k[t], pw[t], out=U[t]).addcmul_(a, pe[t], value=-1.0)
                torch.addcmul(K, hw.unsqueeze(-1), u.unsqueeze(1), out=Ks[t + 1])  # K' = K + u H_wᵀ
            j = torch.bmm(q[t].unsqueeze(1), Ks[t + 1].transpose(1, 2), out=J[t].unsqueeze(1)).squeeze(1)  # K'ᵀ q
        at = acts[t]
        out = hss[t + 1]
        torch.mul(_move(H, j, order[0]), at[:, :, 0], out=out)
        for i in range(1, len(order)):
            out.addcmul_(_move(H, j, order[i]), at[:, :, i])


def backward_loop(act: torch.Tensor, q: torch.Tensor, k: torch.Tensor, pw: torch.Tensor, pe: torch.Tensor,
                  Hs: torch.Tensor, Ks: torch.Tensor, U: torch.Tensor, gH: torch.Tensor, dK: torch.Tensor,
                  DH: torch.Tensor, DJ: torch.Tensor, DU: torch.Tensor, DK: torch.Tensor,
                  order: List[int], has_jump: bool, transposed: bool) -> torch.Tensor:
    """Reverse pass. ``gH [T+1, N, 2, L]``: incoming gradients of the heads; ``dK [N, C, L]``:
    of the final key tape (stored transposed, like ``Ks``), updated in place to that of ``Ks[0]``. Writes ``DH[t]`` (the total
    gradient of ``H_{t+1}``), ``DJ[t]`` (of the jump), ``DU[t]`` (of ``u``, or of ``w``) and,
    for the transposed key tape, ``DK[t]`` (of ``k_t``). Returns the gradient of ``H_0``."""
    T = act.shape[0]
    acts = act.unsqueeze(-1).unbind(0)
    dH = DH[T - 1].copy_(gH[T])
    jpos = -1
    for i in range(len(order)):
        if order[i] == 3:
            jpos = i
    for t in range(T - 1, -1, -1):
        at = acts[t]
        dprev = torch.zeros_like(dH)
        for i in range(len(order)):
            a = order[i]
            if a == 0:  # adjoint of roll(−1) is roll(+1)
                dprev.addcmul_(torch.roll(dH, 1, -1), at[:, :, i])
            elif a == 2:
                dprev.addcmul_(torch.roll(dH, -1, -1), at[:, :, i])
            elif a == 1:
                dprev.addcmul_(dH, at[:, :, i])
        if has_jump:
            H = Hs[t]
            hw = H[:, 1]
            dj = torch.sum(torch.mul(dH, at[:, :, jpos]), 1, out=DJ[t])  # [N, L]
            dK.addcmul_(dj.unsqueeze(-1), q[t].unsqueeze(1))  # j = K'ᵀ q   (dK is of Kᵀ)
            if transposed:  # K' = K + k wᵀ, w = p_w H_w − p_e Kᵀ k
                dw = torch.bmm(k[t].unsqueeze(1), dK.transpose(1, 2), out=DU[t].unsqueeze(1)).squeeze(1)  # [N, L]
                dk = torch.bmm(U[t].unsqueeze(1), dK, out=DK[t].unsqueeze(1)).squeeze(1)  # [N, C]
                dhw = torch.mul(dw, pw[t])
                da = torch.mul(dw, pe[t]).neg_()  # [N, L]
                dk.add_(torch.bmm(da.unsqueeze(1), Ks[t]).squeeze(1))
                dK.addcmul_(da.unsqueeze(-1), k[t].unsqueeze(1))  # a = Kᵀ k
            else:  # K' = K + u H_wᵀ, u = p_w k − p_e K H_w
                du = torch.bmm(hw.unsqueeze(1), dK, out=DU[t].unsqueeze(1)).squeeze(1)  # [N, C]
                dhw = torch.bmm(U[t].unsqueeze(1), dK.transpose(1, 2)).squeeze(1)  # [N, L]
                da = torch.mul(du, pe[t]).neg_()  # [N, C]
                dK.addcmul_(hw.unsqueeze(-1), da.unsqueeze(1))  # a = K H_w
                dhw.add_(torch.bmm(da.unsqueeze(1), Ks[t].transpose(1, 2)).squeeze(1))
            dprev[:, 1].add_(dhw)
        if t > 0:
            dH = torch.add(dprev, gH[t], out=DH[t - 1])
        else:
            dH = dprev.add_(gH[t])
    return dH


_COMPILED: Optional[tuple] = None
_LOCK = threading.Lock()


def loops(compiled: bool = True):
    """``(forward_loop, backward_loop, is_compiled)``: TorchScript-compiled where that works
    (tried once per process), else the same Python functions."""
    global _COMPILED
    if not compiled:
        return forward_loop, backward_loop, False
    with _LOCK:
        if _COMPILED is None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _COMPILED = (torch.jit.script(forward_loop), torch.jit.script(backward_loop), True)
            except Exception:  # no TorchScript or no sources: plain Python, same results
                _COMPILED = (forward_loop, backward_loop, False)
    return _COMPILED


def _action_grads(Hs: torch.Tensor, J: Optional[torch.Tensor], DH: torch.Tensor, order: List[int]) -> torch.Tensor:
    """``[T, N, 2, A]``: ``<move_a(H_t), dH_{t+1}>`` for every step and action at once."""
    H = Hs[:-1]
    cols = []
    for a in order:
        if a == JUMP:
            assert J is not None
            cols.append(torch.bmm(DH.flatten(0, 1), J.flatten(0, 1).unsqueeze(-1)).view(DH.shape[:3]))
        else:
            cols.append(torch.linalg.vecdot(_move(H, None, a), DH))
    return torch.stack(cols, -1)


_POOL = WorkspacePool()  # the per-step key tapes, reused across calls (memnets.ops._workspace)


def _jump_space(T: int, N: int, L: int, C: int, transposed: bool, like: torch.Tensor):
    new = like.new_empty
    Aa = new(T, N, L if transposed else C)
    return new(T + 1, N, L, C), Aa, torch.empty_like(Aa), new(T, N, L)  # Ks, Aa, U, J


class _HeadScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, act, q, k, pw, pe, H0, K0, order, transposed, compiled):
        T, N, L = act.shape[0], act.shape[1], H0.shape[-1]
        has_jump = JUMP in order
        Hs = act.new_empty(T + 1, N, 2, L)  # returned: never a pooled buffer
        lease = None
        if has_jump:
            C = K0.shape[1]
            key = (T, N, L, C, transposed, act.dtype, act.device)
            lease = _POOL.lease(key, lambda: _jump_space(T, N, L, C, transposed, act))
        _HeadScan._run(act, q, k, pw, pe, H0, K0, Hs, lease, order, transposed, compiled)
        ctx.save_for_backward(act, q, k, pw, pe, H0, K0, Hs)
        ctx.order, ctx.transposed, ctx.compiled, ctx.has_jump = order, transposed, compiled, has_jump
        ctx.lease = lease
        K_T = lease.space[0][T].transpose(1, 2).contiguous() if has_jump else K0.clone()
        return Hs, K_T

    @staticmethod
    def _run(act, q, k, pw, pe, H0, K0, Hs, lease, order, transposed, compiled):
        fwd, _, _ = loops(compiled)
        Hs[0].copy_(H0)
        if lease is not None:
            Ks, Aa, U, J = lease.space
            Ks[0].copy_(K0.transpose(1, 2))
        else:
            Ks = Aa = U = J = act.new_empty(0)
        fwd(act, q, k, pw, pe, Hs, Ks, Aa, U, J, order, lease is not None, transposed)

    @staticmethod
    @once_differentiable
    def backward(ctx, gH, gK):
        act, q, k, pw, pe, H0, K0, Hs = ctx.saved_tensors
        order, transposed, has_jump = ctx.order, ctx.transposed, ctx.has_jump
        _, bwd, _ = loops(ctx.compiled)
        T, N, L = act.shape[0], act.shape[1], Hs.shape[-1]
        lease = ctx.lease
        if has_jump and lease.space is None:  # a second backward through the graph: recompute
            C = K0.shape[1]
            lease.space = _POOL.take(lease.key, lambda: _jump_space(T, N, L, C, transposed, act))
            _HeadScan._run(act, q, k, pw, pe, H0, K0, Hs.clone(), lease, order, transposed, ctx.compiled)
        if has_jump:
            Ks, Aa, U, J = lease.space
        else:
            Ks = Aa = U = J = act.new_empty(0)
        gH = torch.zeros_like(Hs) if gH is None else gH.contiguous()
        C = Ks.shape[3] if has_jump else 0
        dK = (torch.zeros(N, L, C, dtype=Hs.dtype, device=Hs.device) if gK is None
              else gK.transpose(1, 2).contiguous()) if has_jump else act.new_empty(0)  # of Kᵀ
        new = act.new_empty
        DH = new(T, N, 2, L)
        DJ = new(T, N, L) if has_jump else act.new_empty(0)
        DU = torch.empty_like(U) if has_jump else act.new_empty(0)
        DK = new(T, N, C) if has_jump and transposed else act.new_empty(0)
        dH0 = bwd(act, q, k, pw, pe, Hs, Ks, U, gH, dK, DH, DJ, DU, DK, order, has_jump, transposed)
        dact = _action_grads(Hs, J if has_jump else None, DH, order)
        dq = dk = dpw = dpe = dK0 = None
        if has_jump:
            dq = torch.bmm(DJ.reshape(T * N, 1, -1), Ks[1:].reshape(T * N, -1, C)).view(T, N, C)
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
        return dact, dq, dk, dpw, dpe, dH0, dK0, None, None, None


def nam_tm_heads(act: torch.Tensor, q: Optional[torch.Tensor], k: Optional[torch.Tensor], p_w: torch.Tensor,
                 p_e: torch.Tensor, h0: torch.Tensor, key_tape: torch.Tensor, order: List[int],
                 transposed: bool = False, compiled: bool = True):
    """Run the heads and key tape over T steps (time-major, N = batch·tapes).

    Args:
        act: action probabilities ``[T, N, 2, A]`` (read head, write head; actions in ``order``).
        q: unit jump queries ``[T, N, C]``; k: unit keys ``[T, N, C]`` (both ``None`` without JUMP).
        p_w, p_e: ``[T, N]``.
        h0: head positions ``[N, 2, L]`` (read, write); key_tape: ``[N, C, L]``.
        order: action indices into (LEFT, NOOP, RIGHT, JUMP), one per column of ``act``.
        transposed: the transposed key tape ``Kᵀ ← WR(Kᵀ, k, H_w, p_w, p_e)``.
        compiled: use the TorchScript-compiled loops where available.
    Returns:
        ``(heads [T+1, N, 2, L], key_tape [N, C, L])``: ``heads[t]`` is the position used at
        step t, ``heads[T]`` the final one; the key tape after the last step.
    """
    order = [int(a) for a in order]
    has_jump = JUMP in order
    if has_jump and (q is None or k is None):
        raise ValueError("`q` and `k` are required when `order` includes JUMP")
    if not has_jump:
        q = k = act.new_empty(0)
    return _HeadScan.apply(act.contiguous(), q.contiguous(), k.contiguous(), p_w.unsqueeze(-1).contiguous(),
                           p_e.unsqueeze(-1).contiguous(), h0.contiguous(), key_tape.contiguous(), order,
                           bool(transposed), bool(compiled))
