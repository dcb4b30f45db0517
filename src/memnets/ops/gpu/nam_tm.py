"""The NAM-TM's tape recurrences as whole-sequence Triton kernels (its CUDA path).

Two scans, each one launch forward and one backward per call, the time loop inside the
kernel and one program per sequence, its state held in registers over the whole sequence (as
the C kernels of :mod:`memnets.ops._native` hold it in cache on the CPU):

* :func:`nam_tape_scan_triton` — the value tape, :func:`memnets.ops.nam_tape.nam_tape_scan`
  (docs/maths.md §1, read after write). One program per (batch, tape), the tape ``S [V, K]``
  (V = tape width, K = tape length) in registers; per step::

      a = S k;   u = p_w v − p_e a;   S' = S + u kᵀ;   o = p_r S' q

  The forward saves ``u`` and ``S`` every :data:`SEGMENT` steps; the backward walks ``S``
  back (``S = S' − u kᵀ``) from those copies, recomputing ``a = S k``, so rounding builds up
  over at most :data:`SEGMENT` steps.

* :func:`nam_tm_heads_triton` — the heads, key tape and jump,
  :func:`memnets.ops.nam_tm_heads.nam_tm_heads` (docs/maths.md §3). One program per sequence
  (batch · tapes), the key tape ``K [C, L]`` and both heads in registers; per step, with
  ``h = H_w`` (``μ(H_w)`` with ``unit_keys``)::

      position key tape   a = K h;    u = p_w k − p_e a;   K' = K + u hᵀ
      transposed          a = Kᵀ k;   w = p_w h − p_e a;   K' = K + k wᵀ
      jump                j = K'ᵀ q
      heads               H'_e = Σ_a act_{e,a} · move_a(H_e)   (e = read, write head)
                          LEFT = roll(H, −1), NOOP = H, RIGHT = roll(H, +1), JUMP = j

  A shift of a head is a product with a 0/1 matrix ``[L, L]`` built once per program (no
  shuffles across lanes; O(L²) per step, small beside the key tape's O(C·L) for tape lengths
  up to a few hundred). The backward walks the key tape back from copies saved every
  :data:`SEGMENT` steps, recomputing ``a`` and the jump; without JUMP among the actions the
  key tape is neither read nor written and only the heads run.

Every buffer a kernel writes is allocated by its autograd Function. Float32 and float64 run in
their own precision; float16/bfloat16 inputs run in float32 and the results are cast back.
The kernels are decorated on first use (:func:`kernels`); on CPU tensors they run through
Triton's interpreter, which needs ``TRITON_INTERPRET=1`` set before Triton is first imported in
the process (Triton's own library is decorated then too). Held to the per-step references in
float32 and float64 through the interpreter, and compiled for sm_90, by
tests/test_triton_nam_tm.py. Not twice differentiable.
"""
from __future__ import annotations

import contextlib
import functools
from typing import List, Optional, Sequence

import torch
from torch.autograd.function import once_differentiable

from . import lazy_kernels
from .graphs import graphed, zeros_for_none
from .._amp import backward_without_autocast

__all__ = ["nam_tape_scan_triton", "nam_tm_heads_triton", "nam_tm_layer_scan_triton", "kernels", "SEGMENT"]

SEGMENT = 16  # steps between the states saved for the backward

LEFT, NOOP, RIGHT, JUMP = 0, 1, 2, 3


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _warps(block: int, dtype: torch.dtype) -> int:
    """Warps for a program whose largest tile has ``block`` elements: as few as keep some 32
    words of each tile per thread (a time loop is bound by its latency, and every reduction
    across warps costs a barrier), one to eight."""
    words = block * (2 if dtype == torch.float64 else 1)
    return min(8, _pow2(-(-words // 1024)))


@lazy_kernels
def kernels():
    """The Triton kernels, defined on first use (Triton reads ``TRITON_INTERPRET`` when a
    function is decorated), once per mode: a namespace of ``tape_fwd``, ``tape_bwd``,
    ``heads_fwd``, ``heads_bwd``."""
    import triton
    import triton.language as tl

    @triton.jit
    def tape_fwd(q, k, v, pw, pe, pr, S0, o, ST, Sc, U, T, H, K, V,
                 sqb, sqt, sqh, skb, skt, skh,
                 HAS_PR: tl.constexpr, SEG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)  # sequence b·H + h
        NS = tl.num_programs(0).to(tl.int64)
        b = n // H
        h = n % H
        ik = tl.arange(0, BK)
        iv = tl.arange(0, BV)
        mk = ik < K
        mv = iv < V
        m2 = mv[:, None] & mk[None, :]
        KV = K * V
        off2 = iv[:, None] * K + ik[None, :]  # S [V, K], row-major like initial_state
        qb = q + b * sqb + h * sqh
        kb = k + b * skb + h * skh
        rb = b * T * H + h  # the row of step t: rb + t·H
        S = tl.load(S0 + n * KV + off2, mask=m2, other=0.0)
        # each step's inputs are loaded one step ahead, while the step before computes
        kk = tl.load(kb + ik, mask=mk, other=0.0)
        qq = tl.load(qb + ik, mask=mk, other=0.0)
        vv = tl.load(v + rb * V + iv, mask=mv, other=0.0)
        p_w = tl.load(pw + rb)
        p_e = tl.load(pe + rb)
        if HAS_PR:
            p_r = tl.load(pr + rb)
        for t in range(T):
            row = rb + t * H
            t1 = tl.minimum(t + 1, T - 1)
            r1 = rb + t1 * H
            kn = tl.load(kb + t1 * skt + ik, mask=mk, other=0.0)
            qn = tl.load(qb + t1 * sqt + ik, mask=mk, other=0.0)
            vn = tl.load(v + r1 * V + iv, mask=mv, other=0.0)
            pwn = tl.load(pw + r1)
            pen = tl.load(pe + r1)
            if (t % SEG == 0) & (t > 0):  # S_t, for the backward
                tl.store(Sc + ((t // SEG) * NS + n) * KV + off2, S, mask=m2)
            a = tl.sum(S * kk[None, :], 1)  # S k
            u = p_w * vv - p_e * a
            tl.store(U + row * V + iv, u, mask=mv)
            S = S + u[:, None] * kk[None, :]
            oo = tl.sum(S * qq[None, :], 1)  # S' q
            if HAS_PR:
                oo = oo * p_r
                p_r = tl.load(pr + r1)
            tl.store(o + row * V + iv, oo, mask=mv)
            kk, qq, vv, p_w, p_e = kn, qn, vn, pwn, pen
        tl.store(ST + n * KV + off2, S, mask=m2)
        tl.store(Sc + (((T + SEG - 1) // SEG) * NS + n) * KV + off2, S, mask=m2)

    @triton.jit
    def tape_bwd(q, k, v, pw, pe, pr, Sc, U, go, gS, dq, dk, dv, dpw, dpe, dpr, dS0, T, H, K, V,
                 sqb, sqt, sqh, skb, skt, skh,
                 HAS_PR: tl.constexpr, SEG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)
        NS = tl.num_programs(0).to(tl.int64)
        b = n // H
        h = n % H
        ik = tl.arange(0, BK)
        iv = tl.arange(0, BV)
        mk = ik < K
        mv = iv < V
        m2 = mv[:, None] & mk[None, :]
        KV = K * V
        off2 = iv[:, None] * K + ik[None, :]
        qb = q + b * sqb + h * sqh
        kb = k + b * skb + h * skh
        rb = b * T * H + h
        dS = tl.load(gS + n * KV + off2, mask=m2, other=0.0)  # of S_T, then of S_t
        S = tl.load(Sc + (((T + SEG - 1) // SEG) * NS + n) * KV + off2, mask=m2, other=0.0)  # S_T
        r0 = rb + (T - 1) * H  # the inputs of step T − 1; then each step's, one step ahead
        kk = tl.load(kb + (T - 1) * skt + ik, mask=mk, other=0.0)
        qq = tl.load(qb + (T - 1) * sqt + ik, mask=mk, other=0.0)
        vv = tl.load(v + r0 * V + iv, mask=mv, other=0.0)
        u = tl.load(U + r0 * V + iv, mask=mv, other=0.0)
        g = tl.load(go + r0 * V + iv, mask=mv, other=0.0)
        p_w = tl.load(pw + r0)
        p_e = tl.load(pe + r0)
        if HAS_PR:
            p_r = tl.load(pr + r0)
        for tt in range(T):
            t = T - 1 - tt
            row = rb + t * H
            t1 = tl.maximum(t - 1, 0)
            r1 = rb + t1 * H
            kn = tl.load(kb + t1 * skt + ik, mask=mk, other=0.0)
            qn = tl.load(qb + t1 * sqt + ik, mask=mk, other=0.0)
            vn = tl.load(v + r1 * V + iv, mask=mv, other=0.0)
            un = tl.load(U + r1 * V + iv, mask=mv, other=0.0)
            gn = tl.load(go + r1 * V + iv, mask=mv, other=0.0)
            pwn = tl.load(pw + r1)
            pen = tl.load(pe + r1)
            if ((t + 1) % SEG == 0) & (t + 1 < T):  # S_{t+1}, saved: the walk back starts afresh
                S = tl.load(Sc + (((t + 1) // SEG) * NS + n) * KV + off2, mask=m2, other=0.0)
            if HAS_PR:  # o = p_r S' q
                tl.store(dpr + row, tl.sum(g * tl.sum(S * qq[None, :], 1), 0))
                g = g * p_r
                p_r = tl.load(pr + r1)
            dqq = tl.sum(S * g[:, None], 0)  # S'ᵀ dr
            dS = dS + g[:, None] * qq[None, :]
            du = tl.sum(dS * kk[None, :], 1)  # S' = S + u kᵀ
            dkk = tl.sum(dS * u[:, None], 0)
            S = S - u[:, None] * kk[None, :]  # S_t
            a = tl.sum(S * kk[None, :], 1)
            tl.store(dv + row * V + iv, p_w * du, mask=mv)  # u = p_w v − p_e a
            tl.store(dpw + row, tl.sum(vv * du, 0))
            tl.store(dpe + row, -tl.sum(a * du, 0))
            da = -p_e * du
            dS = dS + da[:, None] * kk[None, :]  # a = S k
            dkk = dkk + tl.sum(S * da[:, None], 0)
            tl.store(dq + row * K + ik, dqq, mask=mk)
            tl.store(dk + row * K + ik, dkk, mask=mk)
            kk, qq, vv, u, g, p_w, p_e = kn, qn, vn, un, gn, pwn, pen
        tl.store(dS0 + n * KV + off2, dS, mask=m2)

    @triton.jit
    def _shifts(il, L):
        """The heads' moves on a tape of L cells as 0/1 matrices: (SL H)[l] = roll(H, −1)[l] = H[l + 1],
        (SR H)[l] = roll(H, +1)[l] = H[l − 1]."""
        lo = il[:, None]
        hi = il[None, :]
        valid = (lo < L) & (hi < L)
        SL = tl.where(valid & (hi == (lo + 1) % L), 1.0, 0.0)
        SR = tl.where(valid & (hi == (lo + L - 1) % L), 1.0, 0.0)
        return SL, SR

    @triton.jit
    def _action(wa, A, P: tl.constexpr):
        """The read and the write head's weights of action P, of the A at ``wa`` (none: P < 0)."""
        if P >= 0:
            r = tl.load(wa + P)
            w = tl.load(wa + A + P)
        else:
            r = 0.0
            w = 0.0
        return r, w

    @triton.jit
    def heads_fwd(act, q, k, pw, pe, H0, K0, Hs, KT, Kc, U, T, Tn, L, C,
                  s_b, s_t, h_b, h_t,
                  A: tl.constexpr, PL: tl.constexpr, PN: tl.constexpr, PR: tl.constexpr, PJ: tl.constexpr,
                  TRANSPOSED: tl.constexpr, UNIT_KEYS: tl.constexpr, SEG: tl.constexpr,
                  BL: tl.constexpr, BC: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)  # sequence b·Tn + i
        NS = tl.num_programs(0).to(tl.int64)
        b = n // Tn
        i = n % Tn
        il = tl.arange(0, BL)
        ml = il < L
        SL, SR = _shifts(il, L)
        hr = tl.load(H0 + n * 2 * L + il, mask=ml, other=0.0)
        hw = tl.load(H0 + n * 2 * L + L + il, mask=ml, other=0.0)
        h0 = b * h_b + i
        tl.store(Hs + h0 * 2 * L + il, hr, mask=ml)
        tl.store(Hs + h0 * 2 * L + L + il, hw, mask=ml)
        # each step's inputs are loaded one step ahead, while the step before computes
        sb = b * s_b + i  # the row of step t of act, q, k, p_w, p_e, U: sb + t·s_t
        wa = act + sb * 2 * A
        lr, lw = _action(wa, A, PL)
        nr_, nw_ = _action(wa, A, PN)
        rr, rw = _action(wa, A, PR)
        jr, jw = _action(wa, A, PJ)
        if PJ >= 0:
            ic = tl.arange(0, BC)
            mc = ic < C
            m2 = mc[:, None] & ml[None, :]
            LC = L * C
            off2 = ic[:, None] * L + il[None, :]  # K [C, L], row-major like key_tape
            Kt = tl.load(K0 + n * LC + off2, mask=m2, other=0.0)
            kk = tl.load(k + sb * C + ic, mask=mc, other=0.0)
            qq = tl.load(q + sb * C + ic, mask=mc, other=0.0)
            p_w = tl.load(pw + sb)
            p_e = tl.load(pe + sb)
        for t in range(T):
            srow = sb + t * s_t
            s1 = sb + tl.minimum(t + 1, T - 1) * s_t
            wa1 = act + s1 * 2 * A
            nr = hr * 0.0
            nw = hw * 0.0
            if PJ >= 0:
                kn = tl.load(k + s1 * C + ic, mask=mc, other=0.0)
                qn = tl.load(q + s1 * C + ic, mask=mc, other=0.0)
                pwn = tl.load(pw + s1)
                pen = tl.load(pe + s1)
                if (t % SEG == 0) & (t > 0):  # K_t, for the backward
                    tl.store(Kc + ((t // SEG) * NS + n) * LC + off2, Kt, mask=m2)
                hk = hw
                if UNIT_KEYS:  # μ(H_w) = H_w / max(‖H_w‖, eps)
                    hk = hw / tl.maximum(tl.sqrt(tl.sum(hw * hw, 0)), tl.full([], 1e-6, hw.dtype))  # exact in float64
                if TRANSPOSED:  # a = Kᵀ k; w = p_w h − p_e a; K' = K + k wᵀ
                    a = tl.sum(Kt * kk[:, None], 0)
                    w = p_w * hk - p_e * a
                    tl.store(U + srow * L + il, w, mask=ml)
                    Kt = Kt + kk[:, None] * w[None, :]
                else:  # a = K h; u = p_w k − p_e a; K' = K + u hᵀ
                    a = tl.sum(Kt * hk[None, :], 1)
                    u = p_w * kk - p_e * a
                    tl.store(U + srow * C + ic, u, mask=mc)
                    Kt = Kt + u[:, None] * hk[None, :]
                j = tl.sum(Kt * qq[:, None], 0)  # K'ᵀ q
                nr += jr * j
                nw += jw * j
                jr, jw = _action(wa1, A, PJ)
                kk, qq, p_w, p_e = kn, qn, pwn, pen
            if PL >= 0:
                nr += lr * tl.sum(SL * hr[None, :], 1)
                nw += lw * tl.sum(SL * hw[None, :], 1)
                lr, lw = _action(wa1, A, PL)
            if PN >= 0:
                nr += nr_ * hr
                nw += nw_ * hw
                nr_, nw_ = _action(wa1, A, PN)
            if PR >= 0:
                nr += rr * tl.sum(SR * hr[None, :], 1)
                nw += rw * tl.sum(SR * hw[None, :], 1)
                rr, rw = _action(wa1, A, PR)
            hr = nr
            hw = nw
            hrow = b * h_b + (t + 1) * h_t + i
            tl.store(Hs + hrow * 2 * L + il, hr, mask=ml)
            tl.store(Hs + hrow * 2 * L + L + il, hw, mask=ml)
        if PJ >= 0:
            tl.store(KT + n * LC + off2, Kt, mask=m2)
            tl.store(Kc + (((T + SEG - 1) // SEG) * NS + n) * LC + off2, Kt, mask=m2)

    @triton.jit
    def heads_bwd(act, q, k, pw, pe, Hs, Kc, U, gH, gK, dact, dq, dk, dpw, dpe, dH0, dK0, T, Tn, L, C,
                  s_b, s_t, h_b, h_t,
                  A: tl.constexpr, PL: tl.constexpr, PN: tl.constexpr, PR: tl.constexpr, PJ: tl.constexpr,
                  TRANSPOSED: tl.constexpr, UNIT_KEYS: tl.constexpr, SEG: tl.constexpr,
                  BL: tl.constexpr, BC: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)
        NS = tl.num_programs(0).to(tl.int64)
        b = n // Tn
        i = n % Tn
        il = tl.arange(0, BL)
        ml = il < L
        SL, SR = _shifts(il, L)
        sb = b * s_b + i
        hb = b * h_b + i  # the row of H_t: hb + t·h_t
        hT = hb + T * h_t
        dnr = tl.load(gH + hT * 2 * L + il, mask=ml, other=0.0)  # of H_{t+1} (read, write)
        dnw = tl.load(gH + hT * 2 * L + L + il, mask=ml, other=0.0)
        # the inputs of step T − 1; then each step's, one step ahead
        s0 = sb + (T - 1) * s_t
        h0 = hb + (T - 1) * h_t
        hr = tl.load(Hs + h0 * 2 * L + il, mask=ml, other=0.0)
        hw = tl.load(Hs + h0 * 2 * L + L + il, mask=ml, other=0.0)
        gr = tl.load(gH + h0 * 2 * L + il, mask=ml, other=0.0)
        gw = tl.load(gH + h0 * 2 * L + L + il, mask=ml, other=0.0)
        wa = act + s0 * 2 * A
        lr, lw = _action(wa, A, PL)
        nr_, nw_ = _action(wa, A, PN)
        rr, rw = _action(wa, A, PR)
        jr, jw = _action(wa, A, PJ)
        if PJ >= 0:
            ic = tl.arange(0, BC)
            mc = ic < C
            m2 = mc[:, None] & ml[None, :]
            LC = L * C
            off2 = ic[:, None] * L + il[None, :]
            dK = tl.load(gK + n * LC + off2, mask=m2, other=0.0)  # of K_T, then of K_t
            Kt = tl.load(Kc + (((T + SEG - 1) // SEG) * NS + n) * LC + off2, mask=m2, other=0.0)  # K_T
            kk = tl.load(k + s0 * C + ic, mask=mc, other=0.0)
            qq = tl.load(q + s0 * C + ic, mask=mc, other=0.0)
            p_w = tl.load(pw + s0)
            p_e = tl.load(pe + s0)
            if TRANSPOSED:
                uu = tl.load(U + s0 * L + il, mask=ml, other=0.0)
            else:
                uu = tl.load(U + s0 * C + ic, mask=mc, other=0.0)
        for tt in range(T):
            t = T - 1 - tt
            srow = sb + t * s_t
            t1 = tl.maximum(t - 1, 0)
            s1 = sb + t1 * s_t
            h1 = hb + t1 * h_t
            wa1 = act + s1 * 2 * A
            da_ = dact + srow * 2 * A
            hrn = tl.load(Hs + h1 * 2 * L + il, mask=ml, other=0.0)
            hwn = tl.load(Hs + h1 * 2 * L + L + il, mask=ml, other=0.0)
            grn = tl.load(gH + h1 * 2 * L + il, mask=ml, other=0.0)
            gwn = tl.load(gH + h1 * 2 * L + L + il, mask=ml, other=0.0)
            dr = gr  # gH_t + Σ_a act_a move_aᵀ(dH_{t+1}) (+ the key tape's part)
            dw = gw
            if PL >= 0:  # the gradient of act: <move_a(H), dH'> = <H, move_aᵀ(dH')>; LEFTᵀ = RIGHT
                tr = tl.sum(SL * dnr[:, None], 0)
                tw = tl.sum(SL * dnw[:, None], 0)
                tl.store(da_ + PL, tl.sum(hr * tr, 0))
                tl.store(da_ + A + PL, tl.sum(hw * tw, 0))
                dr += lr * tr
                dw += lw * tw
                lr, lw = _action(wa1, A, PL)
            if PN >= 0:
                tl.store(da_ + PN, tl.sum(hr * dnr, 0))
                tl.store(da_ + A + PN, tl.sum(hw * dnw, 0))
                dr += nr_ * dnr
                dw += nw_ * dnw
                nr_, nw_ = _action(wa1, A, PN)
            if PR >= 0:
                tr = tl.sum(SR * dnr[:, None], 0)
                tw = tl.sum(SR * dnw[:, None], 0)
                tl.store(da_ + PR, tl.sum(hr * tr, 0))
                tl.store(da_ + A + PR, tl.sum(hw * tw, 0))
                dr += rr * tr
                dw += rw * tw
                rr, rw = _action(wa1, A, PR)
            if PJ >= 0:
                kn = tl.load(k + s1 * C + ic, mask=mc, other=0.0)
                qn = tl.load(q + s1 * C + ic, mask=mc, other=0.0)
                pwn = tl.load(pw + s1)
                pen = tl.load(pe + s1)
                if TRANSPOSED:
                    un = tl.load(U + s1 * L + il, mask=ml, other=0.0)
                else:
                    un = tl.load(U + s1 * C + ic, mask=mc, other=0.0)
                if ((t + 1) % SEG == 0) & (t + 1 < T):  # K_{t+1}, saved
                    Kt = tl.load(Kc + (((t + 1) // SEG) * NS + n) * LC + off2, mask=m2, other=0.0)
                j = tl.sum(Kt * qq[:, None], 0)  # K_{t+1}ᵀ q
                tl.store(da_ + PJ, tl.sum(j * dnr, 0))
                tl.store(da_ + A + PJ, tl.sum(j * dnw, 0))
                dj = jr * dnr + jw * dnw
                jr, jw = _action(wa1, A, PJ)
                tl.store(dq + srow * C + ic, tl.sum(Kt * dj[None, :], 1), mask=mc)
                dK = dK + qq[:, None] * dj[None, :]
                hk = hw
                if UNIT_KEYS:
                    nrm = tl.sqrt(tl.sum(hw * hw, 0))
                    eps = tl.full([], 1e-6, hw.dtype)  # a bare 1e-6 is a float32 constant: exact in float64
                    den = tl.maximum(nrm, eps)
                    hk = hw / den
                if TRANSPOSED:  # K' = K + k wᵀ, w = p_w h − p_e a, a = Kᵀ k
                    dkk = tl.sum(dK * uu[None, :], 1)
                    dwv = tl.sum(dK * kk[:, None], 0)
                    Kt = Kt - kk[:, None] * uu[None, :]  # K_t
                    a = tl.sum(Kt * kk[:, None], 0)
                    dhk = p_w * dwv
                    tl.store(dpw + srow, tl.sum(hk * dwv, 0))
                    tl.store(dpe + srow, -tl.sum(a * dwv, 0))
                    dav = -p_e * dwv
                    dK = dK + kk[:, None] * dav[None, :]
                    dkk = dkk + tl.sum(Kt * dav[None, :], 1)
                else:  # K' = K + u hᵀ, u = p_w k − p_e a, a = K h
                    du = tl.sum(dK * hk[None, :], 1)
                    dhk = tl.sum(dK * uu[:, None], 0)
                    Kt = Kt - uu[:, None] * hk[None, :]  # K_t
                    a = tl.sum(Kt * hk[None, :], 1)
                    dkk = p_w * du
                    tl.store(dpw + srow, tl.sum(kk * du, 0))
                    tl.store(dpe + srow, -tl.sum(a * du, 0))
                    dav = -p_e * du
                    dK = dK + dav[:, None] * hk[None, :]
                    dhk = dhk + tl.sum(Kt * dav[:, None], 0)
                tl.store(dk + srow * C + ic, dkk, mask=mc)
                if UNIT_KEYS:  # dH_w += (dμ − μ <μ, dμ>) / max(‖H_w‖, eps), the projection where not clamped
                    s = tl.where(nrm >= eps, tl.sum(hk * dhk, 0), 0.0)
                    dw += (dhk - hk * s) / den
                else:
                    dw += dhk
                kk, qq, p_w, p_e, uu = kn, qn, pwn, pen, un
            dnr = dr
            dnw = dw
            hr, hw, gr, gw = hrn, hwn, grn, gwn
        tl.store(dH0 + n * 2 * L + il, dnr, mask=ml)
        tl.store(dH0 + n * 2 * L + L + il, dnw, mask=ml)
        if PJ >= 0:
            tl.store(dK0 + n * LC + off2, dK, mask=m2)

    @triton.jit
    def _unit_rows(x, sx, y, n, f, r, mr, C, EPS: tl.constexpr, BC: tl.constexpr):
        """Rows ``r`` of ``x`` (row stride ``sx``, ``C`` columns) to ``y = μ(x) [., C]``, with
        ``n = max(‖x‖, EPS)`` and ``f`` 1 where the norm was not clamped, 0 where it was. ``EPS``
        a compile-time constant made in the data's type (a float argument would be float32)."""
        ic = tl.arange(0, BC)
        mc = mr[:, None] & (ic < C)[None, :]
        v = tl.load(x + r[:, None] * sx + ic[None, :], mask=mc, other=0.0)
        nrm = tl.sqrt(tl.sum(v * v, 1))
        eps = tl.full([], EPS, nrm.dtype)
        den = tl.maximum(nrm, eps)
        tl.store(y + r[:, None] * C + ic[None, :], v / den[:, None], mask=mc)
        tl.store(n + r, den, mask=mr)
        tl.store(f + r, tl.where(nrm >= eps, 1.0, 0.0).to(den.dtype), mask=mr)

    @triton.jit
    def _unit_rows_backward(y, n, f, dy, dx, sdx, r, mr, C, BC: tl.constexpr):
        """:func:`_unit_rows`'s backward into ``dx`` (row stride ``sdx``): ``dx = (dy − y ⟨y, dy⟩)
        / n``, the projection only where the norm was not clamped."""
        ic = tl.arange(0, BC)
        mc = mr[:, None] & (ic < C)[None, :]
        yy = tl.load(y + r[:, None] * C + ic[None, :], mask=mc, other=0.0)
        g = tl.load(dy + r[:, None] * C + ic[None, :], mask=mc, other=0.0)
        s = tl.sum(yy * g, 1) * tl.load(f + r, mask=mr, other=0.0)
        tl.store(dx + r[:, None] * sdx + ic[None, :], (g - yy * s[:, None]) / tl.load(n + r, mask=mr, other=1.0)[:, None],
                 mask=mc)

    @triton.jit
    def gates_fwd(ctrl, kraw, act, p, q, nq, fq, k, nk, fk, M, A, C, NC, EPS: tl.constexpr,
                  NP: tl.constexpr, JUMP: tl.constexpr, BR: tl.constexpr, BA: tl.constexpr, BP: tl.constexpr,
                  BC: tl.constexpr):
        """Rows ``m`` of the control projection ``ctrl [M, NC]`` (M = B·T·Tn; per row the read and
        write actions' logits, the gates' logits, the jump query) and of the keys ``kraw [M, C]``:
        ``act [M, 2, A]`` (a softmax per head), ``p [NP, M]`` (σ), and with JUMP ``q = μ(query)``,
        ``k = μ(kraw)`` with their clamped norms ``nq``, ``nk`` and 1/0 where the norm was not
        clamped (``fq``, ``fk``), what :func:`unit_forward` gives."""
        r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
        mr = r < M
        ia = tl.arange(0, BA)
        ma = mr[:, None] & (ia < A)[None, :]
        for e in tl.static_range(2):  # the read head's actions, then the write head's
            z = tl.load(ctrl + r[:, None] * NC + e * A + ia[None, :], mask=ma, other=-float("inf"))
            z = tl.exp(z - tl.where(mr, tl.max(z, 1), 0.0)[:, None])  # 0 where masked
            tl.store(act + (r[:, None] * 2 + e) * A + ia[None, :], z / tl.where(mr, tl.sum(z, 1), 1.0)[:, None],
                     mask=ma)
        ip = tl.arange(0, BP)
        mp = mr[:, None] & (ip < NP)[None, :]
        z = tl.load(ctrl + r[:, None] * NC + 2 * A + ip[None, :], mask=mp, other=0.0)
        tl.store(p + ip[None, :] * M + r[:, None], 1.0 / (1.0 + tl.exp(-z)), mask=mp)
        if JUMP:
            _unit_rows(ctrl + 2 * A + NP, NC, q, nq, fq, r, mr, C, EPS, BC)
            _unit_rows(kraw, C, k, nk, fk, r, mr, C, EPS, BC)

    @triton.jit
    def gates_bwd(dact_h, dact_o, act, p, dpr, dpw, dpe, dpw_h, dpe_h, dq, q, nq, fq, dk, k, nk, fk, dc, dk2,
                  M, A, C, NC,
                  NP: tl.constexpr, JUMP: tl.constexpr, BR: tl.constexpr, BA: tl.constexpr, BC: tl.constexpr):
        """:func:`gates_fwd`'s backward: the control projection's output gradient ``dc [M, NC]``
        (the softmaxes', the sigmoids' and, with JUMP, μ's backward, side by side as the
        projection's rows hold them) and, with JUMP, the keys' ``dk2 [M, C]`` (μ's backward);
        the actions' gradient is ``dact_h + dact_o`` (the heads' kernel's and the caller's), the
        gates' the tape kernel's plus, with JUMP, the heads' (both to p_w when NP = 2)."""
        r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
        mr = r < M
        ia = tl.arange(0, BA)
        ma = mr[:, None] & (ia < A)[None, :]
        for e in tl.static_range(2):
            off = (r[:, None] * 2 + e) * A + ia[None, :]
            g = tl.load(dact_h + off, mask=ma, other=0.0) + tl.load(dact_o + off, mask=ma, other=0.0)
            y = tl.load(act + off, mask=ma, other=0.0)
            tl.store(dc + r[:, None] * NC + e * A + ia[None, :], y * (g - tl.sum(g * y, 1)[:, None]), mask=ma)
        g_w = tl.load(dpw + r, mask=mr, other=0.0)
        g_e = tl.load(dpe + r, mask=mr, other=0.0)
        if JUMP:
            g_w += tl.load(dpw_h + r, mask=mr, other=0.0)
            g_e += tl.load(dpe_h + r, mask=mr, other=0.0)
        p_r = tl.load(p + r, mask=mr, other=0.0)
        p_w = tl.load(p + M + r, mask=mr, other=0.0)
        row = dc + r * NC + 2 * A
        tl.store(row, tl.load(dpr + r, mask=mr, other=0.0) * (p_r * (1 - p_r)), mask=mr)
        if NP == 2:  # p_e = p_w: both gradients go to p_w
            tl.store(row + 1, (g_w + g_e) * (p_w * (1 - p_w)), mask=mr)
        else:
            p_e = tl.load(p + 2 * M + r, mask=mr, other=0.0)
            tl.store(row + 1, g_w * (p_w * (1 - p_w)), mask=mr)
            tl.store(row + 2, g_e * (p_e * (1 - p_e)), mask=mr)
        if JUMP:
            _unit_rows_backward(q, nq, fq, dq, dc + 2 * A + NP, NC, r, mr, C, BC)
            _unit_rows_backward(k, nk, fk, dk, dk2, C, r, mr, C, BC)

    # called functions are looked up in the module's globals
    globals().update(triton=triton, tl=tl, _shifts=_shifts, _action=_action, _unit_rows=_unit_rows,
                     _unit_rows_backward=_unit_rows_backward)

    class _K:
        pass
    ns = _K()
    ns.tape_fwd, ns.tape_bwd, ns.heads_fwd, ns.heads_bwd = tape_fwd, tape_bwd, heads_fwd, heads_bwd
    ns.gates_fwd, ns.gates_bwd = gates_fwd, gates_bwd
    return ns


def _device(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"the NAM-TM Triton kernels take float16/bfloat16/float32/float64 tensors, got {dtype}")


# ---------------------------------------------------------------------------------------------
# the value tape


class TapeScan(torch.autograd.Function):
    """``(o, S_T) = scan(q, k, v, p_w, p_e, p_r, S_0)`` by :func:`kernels` ``tape_fwd`` /
    ``tape_bwd``: one dtype (float32 or float64), one device; ``q``, ``k`` ``[B, T, H, K]`` with
    unit last stride (views with other strides are read in place), everything else contiguous,
    ``p_r`` may be ``None`` (= 1)."""

    @staticmethod
    def forward(ctx, q, k, v, pw, pe, pr, S0):
        o, ST, Sc, U = _tape_forward(q, k, v, pw, pe, pr, S0)
        ctx.save_for_backward(q, k, v, pw, pe, pr, Sc, U)
        ctx.set_materialize_grads(False)  # backward makes the zeros of an unused output itself
        return o, ST

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, go, gS):
        q, k, v, pw, pe, pr, Sc, U = ctx.saved_tensors
        B, _, H, K = q.shape
        V = v.shape[-1]
        go, gS = zeros_for_none((go, gS), (v, ((B, H, V, K), q.dtype, q.device)))  # one fill for both
        return _tape_backward(q, k, v, pw, pe, pr, Sc, U, go, gS)


def _tape_forward(q, k, v, pw, pe, pr, S0):
    """The value tape's forward kernel: ``(o, S_T, Sc, U)``, the last two what the backward reads
    (:class:`TapeScan`'s arguments)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    new = q.new_empty
    o, ST, U = new(B, T, H, V), new(B, H, V, K), new(B, T, H, V)
    Sc = new(-(-T // SEGMENT) + 1, B * H, V, K)  # slot s: S_{s·SEGMENT}; the last: S_T
    BK, BV = _pow2(K), _pow2(V)
    with _device(q):
        kernels().tape_fwd[(B * H,)](q, k, v, pw, pe, pr if pr is not None else pw, S0, o, ST, Sc, U,
                                      T, H, K, V, *q.stride()[:3], *k.stride()[:3],
                                      HAS_PR=pr is not None, SEG=SEGMENT, BK=BK, BV=BV,
                                      num_warps=_warps(BK * BV, q.dtype))
    return o, ST, Sc, U


def _tape_backward(q, k, v, pw, pe, pr, Sc, U, go, gS):
    """The value tape's backward kernel: ``(dq, dk, dv, dpw, dpe, dpr, dS0)`` (``dpr`` None
    without ``pr``); ``go``, ``gS`` contiguous."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    new = q.new_empty
    dq, dk, dv = new(B, T, H, K), new(B, T, H, K), new(B, T, H, V)
    dpw, dpe = new(B, T, H), new(B, T, H)
    dpr = new(B, T, H) if pr is not None else None
    dS0 = new(B, H, V, K)
    BK, BV = _pow2(K), _pow2(V)
    with _device(q):
        kernels().tape_bwd[(B * H,)](q, k, v, pw, pe, pr if pr is not None else pw, Sc, U, go, gS,
                                      dq, dk, dv, dpw, dpe, dpr if dpr is not None else dpw, dS0,
                                      T, H, K, V, *q.stride()[:3], *k.stride()[:3],
                                      HAS_PR=pr is not None, SEG=SEGMENT, BK=BK, BV=BV,
                                      num_warps=_warps(BK * BV, q.dtype))
    return dq, dk, dv, dpw, dpe, dpr, dS0


def nam_tape_scan_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_w: torch.Tensor,
                         p_e: torch.Tensor, p_r: Optional[torch.Tensor], initial_state: Optional[torch.Tensor]):
    """:func:`memnets.ops.nam_tape.nam_tape_scan` by the Triton kernel (module docstring).

    Args:
        q, k: ``[B, T, H, dk]``; v: ``[B, T, H, dv]``; p_w, p_e: ``[B, T, H]``; p_r: ``[B, T, H]``
            or ``None`` (= 1); initial_state: ``[B, H, dv, dk]`` (``None``: zeros). One floating dtype and device
            (float16/bfloat16 run in float32).
    Returns:
        ``(outputs [B, T, H, dv], final_state [B, H, dv, dk])`` in the inputs' dtype.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError("nam_tape_scan: `q` and `v` expected [B, T, H, d] tensors, got "
                         f"{getattr(q, 'shape', q)} and {getattr(v, 'shape', v)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if initial_state is None:
        initial_state = q.new_zeros(B, H, V, K)
    for name, x, shape in (("k", k, (B, T, H, K)), ("v", v, (B, T, H, V)), ("p_w", p_w, (B, T, H)),
                           ("p_e", p_e, (B, T, H)), ("p_r", p_r, (B, T, H)),
                           ("initial_state", initial_state, (B, H, V, K))):
        if x is None and name == "p_r":
            continue
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != q.dtype or x.device != q.device:
            got = f"{list(x.shape)}, {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else repr(x)
            raise ValueError(f"nam_tape_scan: `{name}` expected shape {list(shape)}, {q.dtype} on {q.device}, "
                             f"got {got}")
    dt = _compute_dtype(q.dtype)
    if B * T * H * K * V == 0:
        return q.new_zeros(B, T, H, V), initial_state.clone()
    q, k, v, p_w, p_e, p_r, S0 = (None if x is None else x.to(dt) for x in (q, k, v, p_w, p_e, p_r, initial_state))
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    o, S = TapeScan.apply(q, k, *(None if x is None else x.contiguous() for x in (v, p_w, p_e, p_r, S0)))
    return o.to(initial_state.dtype), S.to(initial_state.dtype)


# ---------------------------------------------------------------------------------------------
# the heads, the key tape and the jump


class HeadScan(torch.autograd.Function):
    """``(Hs, K_T) = heads(act, q, k, p_w, p_e, H0, K0)`` by :func:`kernels` ``heads_fwd`` /
    ``heads_bwd``. Contiguous tensors of one dtype (float32/float64) and device: ``act``
    ``[T, N, 2, A]`` or, batch-major, ``[B, T, Tn, 2, A]`` (and the per-step ``q, k [.., C]``,
    ``p_w, p_e`` alike); ``H0 [N, 2, L]``; ``K0 [N, C, L]``; ``Hs [T+1, N, 2, L]`` or
    ``[B, T+1, Tn, 2, L]``. Without JUMP in ``order``, ``q`` and ``k`` are not read."""

    @staticmethod
    def forward(ctx, act, q, k, pw, pe, H0, K0, order, transposed, bm, unit_keys):
        meta = _heads_meta(act, H0, K0, order, transposed, bm, unit_keys)
        Hs, KT, Kc, U = _heads_forward(meta, act, q, k, pw, pe, H0, K0)
        ctx.save_for_backward(act, q, k, pw, pe, Hs, Kc, U)
        ctx.meta = meta
        ctx.set_materialize_grads(False)  # backward makes the zeros of an unused output itself
        return Hs, KT

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, gH, gK):
        act, q, k, pw, pe, Hs, Kc, U = ctx.saved_tensors
        meta = ctx.meta
        N, L, C, has_jump = meta[3], meta[4], meta[5], meta[-1]
        if not has_jump:
            (gH,) = zeros_for_none((gH,), (Hs,))
        else:
            gH, gK = zeros_for_none((gH, gK), (Hs, ((N, C, L), act.dtype, act.device)))  # one fill for both
        dact, dq, dk, dpw, dpe, dH0, dK0 = _heads_backward(meta, act, q, k, pw, pe, Hs, Kc, U, gH, gK)
        return dact, dq, dk, dpw, dpe, dH0, dK0, None, None, None, None


def _heads_meta(act, H0, K0, order, transposed, bm, unit_keys) -> tuple:
    """The heads kernels' sizes and options: ``(T, B, Tn, N, L, C, A, pos, transposed,
    unit_keys, bm, has_jump)``."""
    T, B, Tn = (act.shape[1], act.shape[0], act.shape[2]) if bm else (act.shape[0], 1, act.shape[1])
    N, L, C, A = B * Tn, H0.shape[-1], K0.shape[1], act.shape[-1]
    pos = [order.index(a) if a in order else -1 for a in (LEFT, NOOP, RIGHT, JUMP)]
    return (T, B, Tn, N, L, C, A, pos, bool(transposed), bool(unit_keys), bool(bm), JUMP in order)


def _heads_forward(meta, act, q, k, pw, pe, H0, K0):
    """The heads' forward kernel: ``(Hs, K_T, Kc, U)``, the last two what the backward reads
    (None without JUMP, and then ``K_T`` is a copy of ``K0``)."""
    T, B, Tn, N, L, C, A, pos, transposed, unit_keys, bm, has_jump = meta
    new = act.new_empty
    Hs = new((B, T + 1, Tn, 2, L) if bm else (T + 1, N, 2, L))
    if has_jump:
        KT, Kc = new(N, C, L), new(-(-T // SEGMENT) + 1, N, C, L)
        U = new(act.shape[:-2] + (L if transposed else C,))
    else:
        KT = Kc = U = None
    s_b, s_t = (T * Tn, Tn) if bm else (0, N)
    h_b, h_t = ((T + 1) * Tn, Tn) if bm else (0, N)
    BL, BC = _pow2(L), _pow2(C)
    warps = _warps(max(BL * BC, BL * BL) if has_jump else BL * BL, act.dtype)
    dummy = act
    with _device(act):
        kernels().heads_fwd[(N,)](act, q if has_jump else dummy, k if has_jump else dummy, pw, pe, H0,
                                   K0, Hs, KT if has_jump else dummy, Kc if has_jump else dummy,
                                   U if has_jump else dummy, T, Tn, L, C, s_b, s_t, h_b, h_t,
                                   A=A, PL=pos[0], PN=pos[1], PR=pos[2], PJ=pos[3],
                                   TRANSPOSED=transposed, UNIT_KEYS=unit_keys, SEG=SEGMENT,
                                   BL=BL, BC=BC, num_warps=warps)
    return Hs, (KT if has_jump else K0.clone()), Kc, U


def _heads_backward(meta, act, q, k, pw, pe, Hs, Kc, U, gH, gK):
    """The heads' backward kernel: ``(dact, dq, dk, dpw, dpe, dH0, dK0)`` from contiguous
    ``gH``, ``gK``; without JUMP ``dq … dpe`` are None and ``dK0`` is ``gK``."""
    T, B, Tn, N, L, C, A, pos, transposed, unit_keys, bm, has_jump = meta
    new = act.new_empty
    dact, dH0 = new(act.shape), new(N, 2, L)
    if has_jump:
        dq, dk, dpw, dpe, dK0 = new(q.shape), new(k.shape), new(pw.shape), new(pe.shape), new(N, C, L)
    s_b, s_t = (T * Tn, Tn) if bm else (0, N)
    h_b, h_t = ((T + 1) * Tn, Tn) if bm else (0, N)
    BL, BC = _pow2(L), _pow2(C)
    warps = _warps(max(BL * BC, BL * BL) if has_jump else BL * BL, act.dtype)
    d = act  # stands for the pointers a kernel without JUMP does not touch
    with _device(act):
        kernels().heads_bwd[(N,)](act, q if has_jump else d, k if has_jump else d, pw, pe, Hs,
                                   Kc if has_jump else d, U if has_jump else d, gH, gK if has_jump else d,
                                   dact, dq if has_jump else d, dk if has_jump else d,
                                   dpw if has_jump else d, dpe if has_jump else d, dH0,
                                   dK0 if has_jump else d, T, Tn, L, C, s_b, s_t, h_b, h_t,
                                   A=A, PL=pos[0], PN=pos[1], PR=pos[2], PJ=pos[3],
                                   TRANSPOSED=transposed, UNIT_KEYS=unit_keys, SEG=SEGMENT,
                                   BL=BL, BC=BC, num_warps=warps)
    if has_jump:
        return dact, dq, dk, dpw, dpe, dH0, dK0
    return dact, None, None, None, None, dH0, gK


def nam_tm_heads_triton(act: torch.Tensor, q: Optional[torch.Tensor], k: Optional[torch.Tensor],
                        p_w: torch.Tensor, p_e: torch.Tensor, h0: torch.Tensor, key_tape: torch.Tensor,
                        order: List[int], transposed: bool = False, batch_major: bool = False,
                        unit_keys: bool = False):
    """:func:`memnets.ops.nam_tm_heads.nam_tm_heads` by the Triton kernel (module docstring):
    the same arguments (``compiled`` aside) and results, every option (``transposed``,
    ``batch_major``, ``unit_keys``, any action ``order``, with or without JUMP)."""
    order = [int(a) for a in order]
    has_jump = JUMP in order
    if not isinstance(act, torch.Tensor) or act.dim() != (5 if batch_major else 4) or act.shape[-2] != 2:
        raise ValueError(f"nam_tm_heads: `act` expected {'[B, T, Tn' if batch_major else '[T, N'}, 2, A], "
                         f"got {getattr(act, 'shape', act)}")
    A = act.shape[-1]
    if len(order) != A or A < 1 or len(set(order)) != A or any(a not in (LEFT, NOOP, RIGHT, JUMP) for a in order):
        raise ValueError(f"nam_tm_heads: `order` expected {A} distinct actions among 0..3, got {order}")
    if has_jump and (q is None or k is None):
        raise ValueError("`q` and `k` are required when `order` includes JUMP")
    steps = tuple(act.shape[:3]) if batch_major else tuple(act.shape[:2])
    N = steps[0] * steps[2] if batch_major else steps[1]
    if not isinstance(h0, torch.Tensor) or h0.dim() != 3 or tuple(h0.shape[:2]) != (N, 2) or h0.shape[2] < 1:
        raise ValueError(f"nam_tm_heads: `h0` expected [N, 2, L] with N = {N}, got {getattr(h0, 'shape', h0)}")
    L = h0.shape[2]
    if not isinstance(key_tape, torch.Tensor) or key_tape.dim() != 3 or key_tape.shape[0] != N \
            or key_tape.shape[2] != L or (has_jump and key_tape.shape[1] < 1):
        raise ValueError(f"nam_tm_heads: `key_tape` expected [N, C, L] with N = {N}, L = {L}, "
                         f"got {getattr(key_tape, 'shape', key_tape)}")
    C = key_tape.shape[1]
    named = [("h0", h0, (N, 2, L)), ("key_tape", key_tape, (N, C, L)), ("p_w", p_w, steps), ("p_e", p_e, steps)]
    if has_jump:
        named += [("q", q, steps + (C,)), ("k", k, steps + (C,))]
    for name, x, shape in named:
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != act.dtype \
                or x.device != act.device:
            got = f"{list(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else repr(x)
            raise ValueError(f"nam_tm_heads: `{name}` expected shape {list(shape)}, {act.dtype} on {act.device}, "
                             f"got {got}")
    dt = _compute_dtype(act.dtype)
    T = steps[1 if batch_major else 0]
    if T == 0 or N == 0:  # no step or no sequence: the heads stay where they are
        if batch_major:
            heads = h0.view(steps[0], 1, steps[2], 2, L).expand(steps[0], T + 1, steps[2], 2, L)
        else:
            heads = h0.unsqueeze(0).expand((T + 1,) + h0.shape)
        return heads.clone(), key_tape.clone()

    def c(x):
        return x.to(dt).contiguous()
    if has_jump:
        qq, kk = c(q), c(k)
    else:
        qq = kk = act.new_empty(0, dtype=dt)
    Hs, KT = HeadScan.apply(c(act), qq, kk, c(p_w), c(p_e), c(h0), c(key_tape), order, bool(transposed),
                            bool(batch_major), bool(unit_keys and has_jump))
    return Hs.to(act.dtype), KT.to(act.dtype)


# ---------------------------------------------------------------------------------------------
# a layer's whole tape machinery, forward and backward each one graph


def unit_forward(x: torch.Tensor, eps: float):
    """μ(x) along the last dim (:func:`memnets.ops.unit`'s ops), with what its one-step backward
    reads: ``(y, n, free)`` with ``n = max(‖x‖, eps)`` and ``free = ‖x‖ >= eps``. The NAM-TM's
    μ (:class:`memnets.memories.nam_tm._Unit`) and its layer function on CUDA both use it."""
    norm = torch.linalg.vector_norm(x, 2, -1, keepdim=True)
    n = norm.clamp_min(eps)
    return x / n, n, norm >= eps


def unit_backward(y: torch.Tensor, n: torch.Tensor, free: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``dx = (dy − y ⟨y, dy⟩) / n``, the projection only where the norm was not clamped."""
    s = torch.linalg.vecdot(y, dy).unsqueeze(-1).mul_(free)
    return torch.mul(y, s).neg_().add_(dy).div_(n)


GATE_ROWS = 16  # rows (one step of one tape each) per program of the gates' kernels


def _gate_blocks(M: int, A: int, C: int) -> dict:
    return dict(BR=GATE_ROWS, BA=_pow2(A), BC=_pow2(max(C, 1)), num_warps=1 if M <= 4096 else 2)


def _gates_forward(ctrl: torch.Tensor, kraw: Optional[torch.Tensor], A: int, n_p: int, C: int, eps: float):
    """The gates' kernel on the control projection ``ctrl [B, T, Tn, NC]`` and the keys ``kraw
    [B, T, Tn, C]`` (None without JUMP, ``C`` then 0): ``(act [B, T, Tn, 2, A], p [n_p, B, T, Tn],
    q, nq, fq, k, nk, fk)``, the last six None without JUMP (:func:`_layer_forward`)."""
    jump = kraw is not None
    lead, NC = ctrl.shape[:-1], ctrl.shape[-1]
    M = lead.numel()
    if not ctrl.is_contiguous() or NC != 2 * A + n_p + C or (jump and (
            kraw.shape != lead + (C,) or not kraw.is_contiguous() or kraw.dtype != ctrl.dtype
            or kraw.device != ctrl.device)):
        raise ValueError(f"nam_tm gates: `ctrl` expected contiguous [..., {2 * A + n_p + C}] and `kraw` "
                         f"[..., {C}] of its dtype and device, got {tuple(ctrl.shape)} and "
                         f"{None if kraw is None else (tuple(kraw.shape), kraw.dtype)}")
    new = ctrl.new_empty
    act, p = new(lead + (2, A)), new((n_p,) + lead)
    outs = [new(lead + (n,)) for _ in range(2) for n in (C, 1, 1)] if jump else [None] * 6
    d = ctrl  # stands for the pointers a kernel without JUMP does not touch
    blk = _gate_blocks(M, A, C)
    with _device(ctrl):
        kernels().gates_fwd[(-(-M // GATE_ROWS),)](ctrl, kraw if jump else d, act, p,
                                                   *[o if jump else d for o in outs], M, A, C, NC, eps,
                                                   NP=n_p, JUMP=jump, BP=_pow2(n_p), **blk)
    return (act, p, *outs)


def _gates_backward(dact_h, dact_o, act, p, dpr, dpw, dpe, dpw_h, dpe_h, q, nq, fq, dq, k, nk, fk, dk, C: int):
    """:func:`_gates_forward`'s backward: ``(dc [B, T, Tn, NC], dk2 [B, T, Tn, C] or None)``, the
    control projection's and the keys' output gradients (:func:`_layer_backward`)."""
    jump = q is not None
    n_p, A = p.shape[0], act.shape[-1]
    lead = act.shape[:-2]
    M = lead.numel()
    NC = 2 * A + n_p + C
    ins = [dact_h, dact_o, act, dpr, dpw, dpe] + ([dpw_h, dpe_h, q, nq, fq, dq, k, nk, fk, dk] if jump else [])
    for t in ins + [p]:
        if not t.is_contiguous() or t.dtype != act.dtype or t.device != act.device:
            raise ValueError(f"nam_tm gates backward: expected contiguous {act.dtype} tensors on {act.device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
    dc = act.new_empty(lead + (NC,))
    dk2 = act.new_empty(lead + (C,)) if jump else None
    d = act
    with _device(act):
        kernels().gates_bwd[(-(-M // GATE_ROWS),)](dact_h, dact_o, act, p, dpr, dpw, dpe,
                                                   *([dpw_h, dpe_h, dq, q, nq, fq, dk, k, nk, fk, dc, dk2] if jump
                                                     else [d] * 10 + [dc, d]),
                                                   M, A, C, NC, NP=n_p, JUMP=jump, **_gate_blocks(M, A, C))
    return dc, dk2


def _layer_saved(cfg) -> List[str]:
    """Names of what :func:`_layer_forward` returns after its five outputs, for the backward."""
    A, n_p, order, jump, unit_values, unit_keys, transposed, eps = cfg
    return (["p"] + (["q", "nq", "fq", "k", "nk", "fk", "Kc", "U"] if jump else [])
            + (["hv", "nh", "fh"] if unit_values else []) + ["Sc", "Ut"])


def _layer_forward(cfg, hc, x, w_c, b_c, w_v, b_v, *rest):
    """The layer's tape machinery forward, from the controller's output ``hc`` and the layer's
    input ``x``: ``(r, S_T, K_T, Hs, act, v, *saved)`` (:func:`nam_tm_layer_scan_triton`;
    ``saved`` as :func:`_layer_saved` names them)."""
    A, n_p, order, jump, unit_values, unit_keys, transposed, eps = cfg
    (w_k, b_k, tape, key_tape, heads) = rest if jump else (None, None, *rest)
    B, T = hc.shape[:2]
    Tn, C, L = tape.shape[1:]
    N = B * Tn
    x2 = x.reshape(B * T, -1)
    ctrl = torch.addmm(b_c, hc.reshape(B * T, -1), w_c.t()).view(B, T, Tn, -1)  # the control projection
    v = torch.addmm(b_v, x2, w_v.t()).view(B, T, Tn, C)  # values
    kraw = torch.addmm(b_k, x2, w_k.t()).view(B, T, Tn, C) if jump else None  # keys before μ
    # the actions' softmaxes [B, T, Tn, 2, A], the gates [n_p, B, T, Tn] (p_r, p_w[, p_e]), with
    # JUMP μ of the jump queries and of the keys: one kernel
    act, p, q, nq, fq, k, nk, fk = _gates_forward(ctrl, kraw, A, n_p, C if jump else 0, eps)
    p_r, p_w = p[0], p[1]
    p_e = p[2] if n_p == 3 else p_w
    saved = {"p": p}
    if jump:
        saved.update(q=q, nq=nq, fq=fq, k=k, nk=nk, fk=fk)
    else:
        q = k = act
    meta = _heads_meta(act, heads, key_tape.reshape(N, C, L), list(order), transposed, True, unit_keys)
    Hs, KT, Kc, U = _heads_forward(meta, act, q, k, p_w, p_e, heads.reshape(N, 2, L), key_tape.reshape(N, C, L))
    if jump:
        saved["Kc"], saved["U"] = Kc, U
    hv = Hs[:, :T]  # [B, T, Tn, 2, L]: the positions used at step t
    if unit_values:
        hv, saved["nh"], saved["fh"] = unit_forward(hv, eps)
        saved["hv"] = hv
    r, ST, saved["Sc"], saved["Ut"] = _tape_forward(hv[..., 0, :], hv[..., 1, :], v, p_w, p_e, p_r, tape)
    return (r, ST, KT.view(B, Tn, C, L), Hs, act, v, *(saved[n] for n in _layer_saved(cfg)))


def _layer_backward(cfg, hc, x, w_c, w_v, *rest):
    """The gradients of :func:`_layer_forward`'s inputs from what it saved and its outputs'
    gradients (every one given): ``(dhc, dx, dw_c, db_c, dw_v, db_v, [dw_k, db_k,] dtape,
    dkey_tape, dheads)``."""
    A, n_p, order, jump, unit_values, unit_keys, transposed, eps = cfg
    w_k, rest = (rest[0], rest[1:]) if jump else (None, rest)
    act, Hs, v = rest[:3]
    names = _layer_saved(cfg)
    sv = dict(zip(names, rest[3:3 + len(names)]))
    dr, dST, dKT, dHs, dact_out = rest[3 + len(names):]
    B, T1, Tn, _, L = Hs.shape
    T, N, C = T1 - 1, B * Tn, v.shape[-1]
    p = sv["p"]
    p_r, p_w = p[0], p[1]
    p_e = p[2] if n_p == 3 else p_w
    hv = sv["hv"] if unit_values else Hs[:, :T]
    dqr, dkw, dv, dpw, dpe, dpr, dS0 = _tape_backward(hv[..., 0, :], hv[..., 1, :], v, p_w, p_e, p_r,
                                                      sv["Sc"], sv["Ut"], dr, dST)
    dhv = torch.stack([dqr, dkw], -2)  # [B, T, Tn, 2, L]
    if unit_values:
        dhv = unit_backward(hv, sv["nh"], sv["fh"], dhv)
    gH = dHs.clone()
    gH[:, :T] += dhv
    q, k = (sv["q"], sv["k"]) if jump else (act, act)
    meta = _heads_meta(act, gH.new_empty(N, 2, L), gH.new_empty(N, C, L), list(order), transposed, True, unit_keys)
    dact, dq, dk, dpw_h, dpe_h, dH0, dK0 = _heads_backward(meta, act, q, k, p_w, p_e, Hs, sv.get("Kc"), sv.get("U"),
                                                            gH, dKT.reshape(N, C, L))
    # the softmaxes', the sigmoids' and μ's backward, one kernel: the control projection's output
    # gradient and, with JUMP, the keys'
    dc, dk2 = _gates_backward(dact, dact_out.contiguous(), act, p, dpr, dpw, dpe, dpw_h, dpe_h,
                              sv.get("q"), sv.get("nq"), sv.get("fq"), dq, sv.get("k"), sv.get("nk"), sv.get("fk"),
                              dk, C if jump else 0)
    # the projections' backward: control (from hc), values and keys (from x)
    dc = dc.view(B * T, -1)
    hc2, x2 = hc.reshape(B * T, -1), x.reshape(B * T, -1)
    dv2 = dv.reshape(B * T, -1)
    dx = torch.mm(dv2, w_v)
    grads = [torch.mm(dc, w_c).view(hc.shape), None, torch.mm(dc.t(), hc2), dc.sum(0), torch.mm(dv2.t(), x2),
             dv2.sum(0)]
    if jump:
        dk2 = dk2.view(B * T, -1)
        dx = dx.addmm_(dk2, w_k)
        grads += [torch.mm(dk2.t(), x2), dk2.sum(0)]
    grads[1] = dx.view(x.shape)
    return (*grads, dS0, dK0.view(B, Tn, C, L), dH0.view(B, Tn, 2, L))


class LayerScan(torch.autograd.Function):
    """:func:`nam_tm_layer_scan_triton`'s forward and backward, each run by :func:`graphed`
    (one CUDA-graph replay once its shapes were seen twice)."""

    @staticmethod
    def forward(ctx, cfg, hc, x, w_c, b_c, w_v, b_v, w_k, b_k, tape, key_tape, heads):
        jump = cfg[3]
        ins = (hc, x, w_c, b_c, w_v, b_v) + ((w_k, b_k) if jump else ()) + (tape, key_tape, heads)
        r, ST, KT, Hs, act, *saved = graphed(("nam_tm.layer", cfg), functools.partial(_layer_forward, cfg), *ins)
        ctx.save_for_backward(hc, x, w_c, w_v, w_k, act, Hs, *saved)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)  # unused outputs' zeros: one fill in the backward
        return r, ST, KT, Hs, act

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dr, dST, dKT, dHs, dact):
        cfg = ctx.cfg
        jump = cfg[3]
        hc, x, w_c, w_v, w_k, act, Hs, v, *saved = ctx.saved_tensors
        B, T1, Tn, _, L = Hs.shape
        C = v.shape[-1]
        sizes = ((B, T1 - 1, Tn, C), (B, Tn, C, L), (B, Tn, C, L), tuple(Hs.shape), tuple(act.shape))
        grads = zeros_for_none((dr, dST, dKT, dHs, dact), [(s, v.dtype, v.device) for s in sizes])
        ins = (hc, x, w_c, w_v) + ((w_k,) if jump else ()) + (act, Hs, v, *saved, *grads)
        out = graphed(("nam_tm.layer.backward", cfg), functools.partial(_layer_backward, cfg), *ins)
        dhc, dx, dw_c, db_c, dw_v, db_v = out[:6]
        dw_k, db_k = out[6:8] if jump else (None, None)
        dS0, dK0, dH0 = out[-3:]
        need = ctx.needs_input_grad
        return (None, dhc, dx if need[2] else None, dw_c, db_c, dw_v, db_v, dw_k, db_k, dS0, dK0, dH0)


def nam_tm_layer_scan_triton(hc: torch.Tensor, x: torch.Tensor, control: Sequence[torch.Tensor],
                             value: Sequence[torch.Tensor], key: Optional[Sequence[torch.Tensor]],
                             tape: torch.Tensor, key_tape: torch.Tensor, heads: torch.Tensor, order: Sequence[int],
                             n_p: int, unit_values: bool = False, unit_keys: bool = False, transposed: bool = False,
                             eps: float = 1e-6):
    """A NAM-TM layer on CUDA from its controller's output to the reads (docs/maths.md §3): the
    control, value and key projections, action softmaxes, gates σ(p), unit jump queries and keys,
    the heads and key tape (:func:`nam_tm_heads_triton`'s kernel), μ of the heads where asked, and
    the value tape (:func:`nam_tape_scan_triton`'s kernel). Its forward and its backward are each
    one function of tensors run by :func:`memnets.ops.gpu.graphs.graphed`: replayed as one CUDA
    graph each, instead of the few dozen small ops around the two kernels. Float16/bfloat16
    inputs (autocast's) run in float32 throughout, the projections included.

    Args:
        hc: ``[B, T, H]`` the controller's output; x: ``[B, T, F]`` the layer's input.
        control: ``(weight [Tn·n, H], bias [Tn·n])`` with ``n = 2A + n_p (+ C with JUMP)``: per
            tape the read and write actions' logits, the gates' logits (p_r, p_w[, p_e]; ``n_p``
            2 means p_e = p_w) and, with JUMP, the jump query.
        value: ``(weight [Tn·C, F], bias [Tn·C])``; key: the same for the keys (with JUMP; else None).
        tape, key_tape: ``[B, Tn, C, L]``; heads: ``[B, Tn, 2, L]`` (read, write) at the start.
        order: the actions, indices into (LEFT, NOOP, RIGHT, JUMP).
        unit_values: the value tape at μ(H); unit_keys: the key tape at μ(H_w) (with JUMP);
        transposed: the transposed key tape.
    Returns:
        ``(r [B, T, Tn, C], tape [B, Tn, C, L], key_tape [B, Tn, C, L], Hs [B, T+1, Tn, 2, L]
        (the heads used at each step, then the final ones), act [B, T, Tn, 2, A])``.
    """
    order = tuple(int(a) for a in order)
    A, jump = len(order), JUMP in order
    if A < 1 or len(set(order)) != A or any(a not in (LEFT, NOOP, RIGHT, JUMP) for a in order):
        raise ValueError(f"nam_tm_layer_scan: `order` expected distinct actions among 0..3, got {list(order)}")
    if n_p not in (2, 3):
        raise ValueError(f"nam_tm_layer_scan: `n_p` expected 2 or 3, got {n_p!r}")
    if not isinstance(tape, torch.Tensor) or tape.dim() != 4:
        raise ValueError(f"nam_tm_layer_scan: `tape` expected [B, Tn, C, L], got {getattr(tape, 'shape', tape)}")
    B, Tn, C, L = tape.shape
    if not isinstance(hc, torch.Tensor) or hc.dim() != 3 or hc.shape[0] != B:
        raise ValueError(f"nam_tm_layer_scan: `hc` expected [B={B}, T, H], got {getattr(hc, 'shape', hc)}")
    T, H = hc.shape[1:]
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[:2]) != (B, T):
        raise ValueError(f"nam_tm_layer_scan: `x` expected [B={B}, T={T}, F], got {getattr(x, 'shape', x)}")
    F_in = x.shape[2]
    pairs = [("control", control, Tn * (2 * A + n_p + (C if jump else 0)), H), ("value", value, Tn * C, F_in)]
    if jump:
        pairs.append(("key", key, Tn * C, F_in))
    named = [("x", x, (B, T, F_in)), ("key_tape", key_tape, (B, Tn, C, L)), ("heads", heads, (B, Tn, 2, L))]
    for name, pair, rows, cols in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"nam_tm_layer_scan: `{name}` expected (weight, bias), got {type(pair).__name__}")
        named += [(f"{name} weight", pair[0], (rows, cols)), (f"{name} bias", pair[1], (rows,))]
    for name, t, shape in named:
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.device != tape.device \
                or not t.is_floating_point():
            got = f"{list(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else repr(t)
            raise ValueError(f"nam_tm_layer_scan: `{name}` expected shape {list(shape)}, floating point on "
                             f"{tape.device}, got {got}")
    if B * T * Tn * C * L == 0:
        raise ValueError(f"nam_tm_layer_scan: empty input (B={B}, T={T}, Tn={Tn}, C={C}, L={L})")
    dt = torch.float64 if tape.dtype == torch.float64 else _compute_dtype(tape.dtype)

    def c(t):
        return None if t is None else t.to(dt).contiguous()
    cfg = (A, int(n_p), order, jump, bool(unit_values), bool(unit_keys and jump), bool(transposed), float(eps))
    w_k, b_k = (c(key[0]), c(key[1])) if jump else (None, None)
    outs = LayerScan.apply(cfg, c(hc), c(x), c(control[0]), c(control[1]), c(value[0]), c(value[1]), w_k, b_k,
                           c(tape), c(key_tape), c(heads))
    return outs if dt == tape.dtype else tuple(o.to(tape.dtype) for o in outs)
