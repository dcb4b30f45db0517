"""The DNC recurrence as Triton kernels (docs/maths.md §8): the whole time loop in one launch
forward and one backward, or two launches per time step each way.

Forward, per step ``t`` (one LSTM controller layer; B batch rows, N slots of width W, R read
heads; ``X_t = [r_{t-1} | h_{t-1}]``)::

    z_t = (x_t W_xᵀ + b_x) + X_t W_0ᵀ               # one cuBLAS addmm (the input half before the loop)
    one Triton program per batch row:                # everything else of the step
        LSTM pointwise: c_t, h_t; interface ξ_t = W_ξ h_t + b_ξ (rows in
        :func:`memnets.ops.dnc.interface_layout` order), its split and nonlinearities;
        retention, usage, allocation (sort-free: slot j's free-list predecessors are the
        slots of smaller usage, ties broken by slot order, as a stable sort), write content
        weighting on M_{t-1}, write weighting, erase/add write, temporal link, precedence,
        forward/backward weightings, read content weighting on M_t, read modes, reads r_t

Every step's state (memory, usage, link, precedence, weightings, c, ``[r_t | h_t]``) and its
interface vector and pre-activations are kept for the backward (a few kilobytes per batch row
and step at the DNC's sizes).

Backward, per step in reverse: one Triton program per batch row recomputes the step's local
values from what was kept and walks the hand-derived backward of
:mod:`memnets.ops.dnc.backward` (reads, read modes, read content, directional weightings,
link, precedence, write, write weighting, allocation, write content, usage, retention, the
interface's nonlinearities, ``W_ξᵀ dξ``, the LSTM pointwise), writing ``dz_t`` and ``dξ_t``;
one matmul ``dX_t = dz_t W_0`` follows (the gradient of ``[r_{t-1} | h_{t-1}]``). The weight
gradients (``W_x``, ``b_x``, ``W_0``, ``W_ξ``, ``b_ξ``) and ``dx`` are matmuls after the loop.

**The whole loop in one kernel.** Every batch row is one program and depends on no other, so
``forward_seq`` runs the time loop inside the program: each step it adds its own row of
``X_t W_0ᵀ`` to the input part (a row-by-matrix product, :mod:`memnets.ops.gpu.rows`), then
does the step as above; ``backward_seq`` likewise walks the steps back, each followed by its
row of ``dz_t W_0``. One launch each way instead of 2T, and the state stays with its program
from step to step. Each program reads all of ``W_0`` every step, so this is the form where
``W_0`` is small (:func:`time_loop_in_kernel`; the gpu-check DNC at LSTM 64 takes it, the one at
LSTM 256 keeps the per-step form); ``MEMNETS_TIME_LOOP=kernel`` / ``steps`` chooses.

:class:`DNCRecurrenceTriton` has the signature and results of
:class:`memnets.ops.dnc.DNCRecurrence` for one controller layer (:func:`applies`);
``DNC.forward`` runs it where :func:`memnets.ops.gpu.use_triton` says so (CUDA), and the tests
run it on the CPU through Triton's interpreter against ``DNC(impl="reference")``, float32 and
float64.
"""
from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..dnc.layout import interface_layout, interface_permutation
from ..permute import inverse_permutation
from . import lazy_kernels, rows, warps_from_env
from .graphs import fresh_copies, graphed, zeros_for_none
from .._amp import backward_without_autocast

__all__ = ["DNCRecurrenceTriton", "EPS", "WARPS_ENV", "applies", "kernel_form", "launches_per_step"]

EPS = 1e-6  # inside every norm's square root, as memnets.ops.addressing
MAX_SLOTS = 64  # one program holds the N × N link matrix and [R, N, N] products in registers
MAX_WORD = 128
ALLOC3D_MAX = 16  # slot blocks up to this size take the allocation's backward as one [N, N, N] product


@lazy_kernels
def kernels():
    """``(forward_step, backward_step, forward_seq, backward_seq)``, compiled on first use (Triton
    reads ``TRITON_INTERPRET`` when a kernel is defined, so defining them lazily lets a process
    choose the interpreter before its first DNC step)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _times(a, b):
        return a * b

    # the product reduction's combine function: a global of this module, where both the compiler
    # and Triton's interpreter look a kernel's names up
    globals()["_prod_combine"] = _times

    @triton.jit
    def _layout(R, W):
        """Where each part of the interface vector ξ begins: [k_r (R·W) | k_w (W) | β̂_r (R) | β̂_w |
        v (W) | ê (W) | f̂ (R) | ĝ_a | ĝ_w | modes (3R)]."""
        STR = (R + 1) * W
        V = STR + R + 1
        SIG = V + W
        FREE = SIG + W
        GA = FREE + R
        GW = GA + 1
        MODES = GW + 1
        return STR, V, SIG, FREE, GA, GW, MODES

    @triton.jit
    def _interface(xb, ir, mr, iw, mw, R, W, eps):
        """The interface's parts at ``xb`` through their nonlinearities (docs/maths.md §8): the read
        and write keys, their strengths' pre-activations, the write vector, the erase vector, the
        gates, the read modes, the strengths β = 1 + softplus(β̂) and their derivatives in β̂, the keys'
        inverse norms and the keys scaled by both (k̂ = β k / ‖k‖)."""
        STR, V, SIG, FREE, GA, GW, MODES = _layout(R, W)
        mrw = mr[:, None] & mw[None, :]
        kr = tl.load(xb + ir[:, None] * W + iw[None, :], mask=mrw, other=0.0)  # [BR, BW]
        kw = tl.load(xb + R * W + iw, mask=mw, other=0.0)
        s_r = tl.load(xb + STR + ir, mask=mr, other=0.0)
        s_w = tl.load(xb + STR + R)
        v = tl.load(xb + V + iw, mask=mw, other=0.0)
        e = 1.0 / (1.0 + tl.exp(-tl.load(xb + SIG + iw, mask=mw, other=0.0)))
        ga = 1.0 / (1.0 + tl.exp(-tl.load(xb + GA)))
        gw = 1.0 / (1.0 + tl.exp(-tl.load(xb + GW)))
        m0 = tl.load(xb + MODES + ir, mask=mr, other=0.0)
        m1 = tl.load(xb + MODES + R + ir, mask=mr, other=0.0)
        m2 = tl.load(xb + MODES + 2 * R + ir, mask=mr, other=0.0)
        mx = tl.maximum(tl.maximum(m0, m1), m2)
        e0 = tl.exp(m0 - mx)
        e1 = tl.exp(m1 - mx)
        e2 = tl.exp(m2 - mx)
        es = e0 + e1 + e2
        pi0 = e0 / es
        pi1 = e1 / es
        pi2 = e2 / es
        beta_r = 1.0 + tl.where(s_r > 20.0, s_r, tl.log(1.0 + tl.exp(tl.minimum(s_r, 20.0))))
        beta_w = 1.0 + tl.where(s_w > 20.0, s_w, tl.log(1.0 + tl.exp(tl.minimum(s_w, 20.0))))
        dsp_r = tl.where(s_r > 20.0, 1.0, 1.0 / (1.0 + tl.exp(-s_r)))  # softplus', for the backward
        dsp_w = tl.where(s_w > 20.0, 1.0, 1.0 / (1.0 + tl.exp(-s_w)))
        rho_r = 1.0 / tl.sqrt(tl.sum(kr * kr, 1) + eps)
        rho_w = 1.0 / tl.sqrt(tl.sum(kw * kw, 0) + eps)
        khr = kr * (beta_r * rho_r)[:, None]
        khw = kw * (beta_w * rho_w)
        return kr, kw, v, e, ga, gw, pi0, pi1, pi2, beta_r, beta_w, dsp_r, dsp_w, rho_r, rho_w, khr, khw

    @triton.jit
    def _lstm_gates(zb, ic, mc, C):
        """The LSTM's gates from its pre-activations at ``zb``, [i | f | g | o]: σ, σ, tanh, σ."""
        si = 1.0 / (1.0 + tl.exp(-tl.load(zb + ic, mask=mc, other=0.0)))
        sf = 1.0 / (1.0 + tl.exp(-tl.load(zb + C + ic, mask=mc, other=0.0)))
        tg = 2.0 / (1.0 + tl.exp(-2.0 * tl.load(zb + 2 * C + ic, mask=mc, other=0.0))) - 1.0
        so = 1.0 / (1.0 + tl.exp(-tl.load(zb + 3 * C + ic, mask=mc, other=0.0)))
        return si, sf, tg, so

    @triton.jit
    def _forward_body(Z, CB, X, wxi_ptr, bxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, t64, B, C, N, W, R, I, eps, zb,
                      BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr):
        # the buffers [T(+1), B, ...] of every step; step t64 (int64) reads index t and writes t + 1
        z_ptr = Z + t64 * B * 4 * C
        cp_ptr = CB + t64 * B * C
        c_ptr = cp_ptr + B * C
        x_ptr = X + (t64 + 1) * B * (R * W + C)
        xi_ptr = XI + t64 * B * I
        mp_ptr = MEM + t64 * B * N * W
        m_ptr = mp_ptr + B * N * W
        up_ptr = U + t64 * B * N
        u_ptr = up_ptr + B * N
        lp_ptr = LNK + t64 * B * N * N
        l_ptr = lp_ptr + B * N * N
        pp_ptr = PREC + t64 * B * N
        p_ptr = pp_ptr + B * N
        wrp_ptr = WR + t64 * B * R * N
        wr_ptr = wrp_ptr + B * R * N
        wwp_ptr = WW + t64 * B * N
        ww_ptr = wwp_ptr + B * N
        b = tl.program_id(0) + zb
        ic = tl.arange(0, BC)
        mc = ic < C
        inn = tl.arange(0, BN)
        mn = inn < N
        iw = tl.arange(0, BW)
        mw = iw < W
        ir = tl.arange(0, BR)
        mr = ir < R
        RW = R * W
        XW = RW + C
        # ---- LSTM pointwise
        zb = z_ptr + b * 4 * C
        si, sf, tg, so = _lstm_gates(zb, ic, mc, C)
        c = sf * tl.load(cp_ptr + b * C + ic, mask=mc, other=0.0) + si * tg
        h = tl.where(mc, so * (2.0 / (1.0 + tl.exp(-2.0 * c)) - 1.0), 0.0)
        tl.store(c_ptr + b * C + ic, c, mask=mc)
        xo = x_ptr + b * XW
        tl.store(xo + RW + ic, h, mask=mc)
        # ---- interface ξ = W_ξ h + b_ξ, kept (read back below in parts)
        xb = xi_ptr + b * I
        for i0 in range(0, I, BI):
            ii = i0 + tl.arange(0, BI)
            mi = ii < I
            wt = tl.load(wxi_ptr + ii[:, None] * C + ic[None, :], mask=mi[:, None] & mc[None, :], other=0.0)
            xi = tl.sum(wt * h[None, :], 1) + tl.load(bxi_ptr + ii, mask=mi, other=0.0)
            tl.store(xb + ii, xi, mask=mi)
        tl.debug_barrier()
        STR, V, SIG, FREE, GA, GW, MODES = _layout(R, W)
        mrw = mr[:, None] & mw[None, :]
        kr, kw, v, e, ga, gw, pi0, pi1, pi2, beta_r, beta_w, dsp_r, dsp_w, rho_r, rho_w, khr, khw = \
            _interface(xb, ir, mr, iw, mw, R, W, eps)
        # ---- previous state
        mnw = mn[:, None] & mw[None, :]
        mnn = mn[:, None] & mn[None, :]
        mrn = mr[:, None] & mn[None, :]
        offs_m = b * N * W + inn[:, None] * W + iw[None, :]
        offs_l = b * N * N + inn[:, None] * N + inn[None, :]
        offs_r = b * R * N + ir[:, None] * N + inn[None, :]
        Mp = tl.load(mp_ptr + offs_m, mask=mnw, other=0.0)
        Lp = tl.load(lp_ptr + offs_l, mask=mnn, other=0.0)
        up = tl.load(up_ptr + b * N + inn, mask=mn, other=0.0)
        wwp = tl.load(wwp_ptr + b * N + inn, mask=mn, other=0.0)
        pp = tl.load(pp_ptr + b * N + inn, mask=mn, other=0.0)
        wrp = tl.load(wrp_ptr + offs_r, mask=mrn, other=0.0)
        # ---- retention ψ = Π_r (1 − f_r w^r_{t-1}), usage
        psi = tl.where(mn, 1.0 + 0.0 * up, 0.0 * up)
        for r in range(R):
            fr = 1.0 / (1.0 + tl.exp(-tl.load(xb + FREE + r)))
            psi = psi * (1.0 - fr * tl.load(wrp_ptr + b * R * N + r * N + inn, mask=mn, other=0.0))
        u = (up + wwp - up * wwp) * psi
        tl.store(u_ptr + b * N + inn, u, mask=mn)
        # ---- allocation a_k = (1 − u_k) Π_{i before k} u_i; bf[k, i]: slot i precedes slot k in
        # the free list (smaller usage, ties in slot order: a stable ascending sort)
        bf = ((u[None, :] < u[:, None]) | ((u[None, :] == u[:, None]) & (inn[None, :] < inn[:, None]))) & mnn
        P = tl.reduce(tl.where(bf, u[None, :], 1.0), 1, _prod_combine)
        a = tl.where(mn, (1.0 - u) * P, 0.0)
        # ---- write content weighting on M_{t-1}, write weighting
        nrm_p = 1.0 / tl.sqrt(tl.sum(Mp * Mp, 1) + eps)
        sc = tl.where(mn, tl.sum(Mp * khw[None, :], 1) * nrm_p, float("-inf"))
        ex = tl.exp(sc - tl.max(sc, 0))
        cw = ex / tl.sum(ex, 0)
        ww = gw * (ga * a + (1.0 - ga) * cw)
        tl.store(ww_ptr + b * N + inn, ww, mask=mn)
        # ---- erase/add write, link, precedence
        M = Mp * (1.0 - ww[:, None] * e[None, :]) + ww[:, None] * v[None, :]
        tl.store(m_ptr + offs_m, M, mask=mnw)
        offd = inn[:, None] != inn[None, :]
        L = tl.where(offd, (1.0 - ww[:, None] - ww[None, :]) * Lp + ww[:, None] * pp[None, :], 0.0)
        tl.store(l_ptr + offs_l, L, mask=mnn)
        p = (1.0 - tl.sum(ww, 0)) * pp + ww
        tl.store(p_ptr + b * N + inn, p, mask=mn)
        # ---- forward f[r, i] = Σ_j L[i, j] w[r, j]; backward b[r, j] = Σ_i L[i, j] w[r, i]
        fw = tl.sum(L[None, :, :] * wrp[:, None, :], 2)
        bw = tl.sum(L[None, :, :] * wrp[:, :, None], 1)
        # ---- read content weighting on M_t, read weighting, reads
        nrm = 1.0 / tl.sqrt(tl.sum(M * M, 1) + eps)
        sr = tl.sum(khr[:, None, :] * M[None, :, :], 2) * nrm[None, :]
        sr = tl.where(mn[None, :], sr, float("-inf"))
        exr = tl.exp(sr - tl.max(sr, 1)[:, None])
        cr = exr / tl.sum(exr, 1)[:, None]
        wr = pi0[:, None] * bw + pi1[:, None] * cr + pi2[:, None] * fw
        tl.store(wr_ptr + offs_r, wr, mask=mrn)
        rd = tl.sum(wr[:, :, None] * M[None, :, :], 1)  # [BR, BW]
        tl.store(xo + ir[:, None] * W + iw[None, :], rd, mask=mrw)

    @triton.jit
    def _backward_body(Z, CB, wxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, DHR, dx_ptr,
                       GM, GU, GL, GP, GWR, GWW, GC, GXI, DZ, t64, s, B, C, N, W, R, I, eps, zb,
                       BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr,
                       ALLOC3D: tl.constexpr):
        # forward buffers [T(+1), B, ...] (step t64: index t and t + 1); the carried gradients
        # [2, B, ...]: read index s, write 1 − s
        z_ptr = Z + t64 * B * 4 * C
        cp_ptr = CB + t64 * B * C
        c_ptr = cp_ptr + B * C
        xi_ptr = XI + t64 * B * I
        mp_ptr = MEM + t64 * B * N * W
        m_ptr = mp_ptr + B * N * W
        up_ptr = U + t64 * B * N
        u_ptr = up_ptr + B * N
        lp_ptr = LNK + t64 * B * N * N
        l_ptr = lp_ptr + B * N * N
        pp_ptr = PREC + t64 * B * N
        wrp_ptr = WR + t64 * B * R * N
        wr_ptr = wrp_ptr + B * R * N
        wwp_ptr = WW + t64 * B * N
        ww_ptr = wwp_ptr + B * N
        dhr_ptr = DHR + t64 * B * (R * W + C)
        gxi_ptr = GXI + t64 * B * I
        dz_ptr = DZ + t64 * B * 4 * C
        si_ = s * B
        so_ = (1 - s) * B
        gm_ptr = GM + si_ * N * W
        gm_out = GM + so_ * N * W
        gu_ptr = GU + si_ * N
        gu_out = GU + so_ * N
        gl_ptr = GL + si_ * N * N
        gl_out = GL + so_ * N * N
        gp_ptr = GP + si_ * N
        gp_out = GP + so_ * N
        gwr_ptr = GWR + si_ * R * N
        gwr_out = GWR + so_ * R * N
        gww_ptr = GWW + si_ * N
        gww_out = GWW + so_ * N
        gc_ptr = GC + si_ * C
        gc_out = GC + so_ * C
        b = tl.program_id(0) + zb
        ic = tl.arange(0, BC)
        mc = ic < C
        inn = tl.arange(0, BN)
        mn = inn < N
        iw = tl.arange(0, BW)
        mw = iw < W
        ir = tl.arange(0, BR)
        mr = ir < R
        RW = R * W
        XW = RW + C
        STR, V, SIG, FREE, GA, GW, MODES = _layout(R, W)
        mrw = mr[:, None] & mw[None, :]
        mnw = mn[:, None] & mw[None, :]
        mnn = mn[:, None] & mn[None, :]
        mrn = mr[:, None] & mn[None, :]
        offs_m = b * N * W + inn[:, None] * W + iw[None, :]
        offs_l = b * N * N + inn[:, None] * N + inn[None, :]
        offs_r = b * R * N + ir[:, None] * N + inn[None, :]
        # ---- the step's values, recomputed from what the forward kept
        xb = xi_ptr + b * I
        kr, kw, v, e, ga, gw, pi0, pi1, pi2, beta_r, beta_w, dsp_r, dsp_w, rho_r, rho_w, khr, khw = \
            _interface(xb, ir, mr, iw, mw, R, W, eps)
        Mp = tl.load(mp_ptr + offs_m, mask=mnw, other=0.0)
        M = tl.load(m_ptr + offs_m, mask=mnw, other=0.0)
        Lp = tl.load(lp_ptr + offs_l, mask=mnn, other=0.0)
        L = tl.load(l_ptr + offs_l, mask=mnn, other=0.0)
        up = tl.load(up_ptr + b * N + inn, mask=mn, other=0.0)
        u = tl.load(u_ptr + b * N + inn, mask=mn, other=0.0)
        wwp = tl.load(wwp_ptr + b * N + inn, mask=mn, other=0.0)
        ww = tl.load(ww_ptr + b * N + inn, mask=mn, other=0.0)
        pp = tl.load(pp_ptr + b * N + inn, mask=mn, other=0.0)
        wrp = tl.load(wrp_ptr + offs_r, mask=mrn, other=0.0)
        wr = tl.load(wr_ptr + offs_r, mask=mrn, other=0.0)
        psi = tl.where(mn, 1.0 + 0.0 * up, 0.0 * up)
        for r in range(R):
            fr = 1.0 / (1.0 + tl.exp(-tl.load(xb + FREE + r)))
            psi = psi * (1.0 - fr * tl.load(wrp_ptr + b * R * N + r * N + inn, mask=mn, other=0.0))
        ub = up + wwp - up * wwp
        bf = ((u[None, :] < u[:, None]) | ((u[None, :] == u[:, None]) & (inn[None, :] < inn[:, None]))) & mnn
        P = tl.reduce(tl.where(bf, u[None, :], 1.0), 1, _prod_combine)
        a = tl.where(mn, (1.0 - u) * P, 0.0)
        nrm_p = 1.0 / tl.sqrt(tl.sum(Mp * Mp, 1) + eps)
        dw_ = tl.sum(Mp * khw[None, :], 1)  # k̂_w · M_{t-1}[n]
        sc = tl.where(mn, dw_ * nrm_p, float("-inf"))
        ex = tl.exp(sc - tl.max(sc, 0))
        cw = ex / tl.sum(ex, 0)
        fw = tl.sum(L[None, :, :] * wrp[:, None, :], 2)
        bw = tl.sum(L[None, :, :] * wrp[:, :, None], 1)
        nrm = 1.0 / tl.sqrt(tl.sum(M * M, 1) + eps)
        dr_ = tl.sum(khr[:, None, :] * M[None, :, :], 2)  # k̂_r · M_t[n]
        sr = tl.where(mn[None, :], dr_ * nrm[None, :], float("-inf"))
        exr = tl.exp(sr - tl.max(sr, 1)[:, None])
        cr = exr / tl.sum(exr, 1)[:, None]
        # ---- incoming gradients: of [r_t | h_t] (outputs + the next step's recurrent input), of the state
        hb = b * XW
        gr = tl.load(dhr_ptr + hb + ir[:, None] * W + iw[None, :], mask=mrw, other=0.0) \
            + tl.load(dx_ptr + hb + ir[:, None] * W + iw[None, :], mask=mrw, other=0.0)
        gh = tl.load(dhr_ptr + hb + RW + ic, mask=mc, other=0.0) + tl.load(dx_ptr + hb + RW + ic, mask=mc, other=0.0)
        gM = tl.load(gm_ptr + offs_m, mask=mnw, other=0.0)
        gu = tl.load(gu_ptr + b * N + inn, mask=mn, other=0.0)
        gL = tl.load(gl_ptr + offs_l, mask=mnn, other=0.0)
        gp = tl.load(gp_ptr + b * N + inn, mask=mn, other=0.0)
        gwr = tl.load(gwr_ptr + offs_r, mask=mrn, other=0.0)
        gww = tl.load(gww_ptr + b * N + inn, mask=mn, other=0.0)
        # ---- reads r = w^r M_t
        gwr += tl.sum(gr[:, None, :] * M[None, :, :], 2)
        gM += tl.sum(wr[:, :, None] * gr[:, None, :], 0)
        # ---- read weighting w^r = π0 b + π1 c^r + π2 f, modes softmax over the three
        gpi0 = tl.sum(gwr * bw, 1)
        gpi1 = tl.sum(gwr * cr, 1)
        gpi2 = tl.sum(gwr * fw, 1)
        dot = pi0 * gpi0 + pi1 * gpi1 + pi2 * gpi2
        gm0 = pi0 * (gpi0 - dot)
        gm1 = pi1 * (gpi1 - dot)
        gm2 = pi2 * (gpi2 - dot)
        gbw = pi0[:, None] * gwr
        gcr = pi1[:, None] * gwr
        gfw = pi2[:, None] * gwr
        # ---- read content on M_t: s = (k̂·M_n) n_n, n_n = (|M_n|² + eps)^(-1/2)
        gs = cr * (gcr - tl.sum(cr * gcr, 1)[:, None])
        gsn = gs * nrm[None, :]
        gkh = tl.sum(gsn[:, :, None] * M[None, :, :], 1)  # [BR, BW]
        gM += tl.sum(gsn[:, :, None] * khr[:, None, :], 0) \
            - (tl.sum(gs * dr_, 0) * nrm * nrm * nrm)[:, None] * M
        kg = tl.sum(gkh * kr, 1)
        g_str_r = kg * rho_r * dsp_r  # k̂ = β ρ k
        g_kr = (beta_r * rho_r)[:, None] * gkh - (beta_r * kg * rho_r * rho_r * rho_r)[:, None] * kr
        # ---- directional weightings
        gL += tl.sum(gfw[:, :, None] * wrp[:, None, :], 0) + tl.sum(wrp[:, :, None] * gbw[:, None, :], 0)
        gwrp = tl.sum(gfw[:, :, None] * L[None, :, :], 1) + tl.sum(L[None, :, :] * gbw[:, None, :], 2)
        # ---- link
        offd = inn[:, None] != inn[None, :]
        G = tl.where(offd & mnn, gL, 0.0)
        gLp = G * (1.0 - ww[:, None] - ww[None, :])
        gww += tl.sum(G * (pp[None, :] - Lp), 1) - tl.sum(G * Lp, 0)
        gpp = tl.sum(G * ww[:, None], 0)
        # ---- precedence
        gpp += gp * (1.0 - tl.sum(ww, 0))
        gww += gp - tl.sum(gp * pp, 0)
        # ---- erase/add write
        gMp = gM * (1.0 - ww[:, None] * e[None, :])
        gww += tl.sum(gM * (v[None, :] - Mp * e[None, :]), 1)
        g_v = tl.sum(gM * ww[:, None], 0)
        g_e = -tl.sum(gM * Mp * ww[:, None], 0)
        gww = tl.where(mn, gww, 0.0)
        # ---- write weighting w^w = g_w (g_a a + (1 − g_a) c^w)
        g_gw = tl.sum(gww * (ga * a + (1.0 - ga) * cw), 0)
        g_ga = gw * tl.sum(gww * (a - cw), 0)
        gal = gw * ga * gww
        gcw = gw * (1.0 - ga) * gww
        # ---- allocation: ∂a_k/∂u_k = −Π_{i before k} u_i; ∂a_k/∂u_j = (1 − u_k) Π_{i before k, i ≠ j} u_i
        gau = (1.0 - u) * gal
        gu -= P * gal
        if ALLOC3D:  # E[j, k] = Π_{i before k, i ≠ j} u_i in one [N, N, N] product
            ex3 = bf[None, :, :] & (inn[:, None, None] != inn[None, None, :])
            E3 = tl.reduce(tl.where(ex3, u[None, None, :], 1.0), 2, _prod_combine)
            bt = ((u[:, None] < u[None, :]) | ((u[:, None] == u[None, :]) & (inn[:, None] < inn[None, :]))) & mnn
            gu += tl.sum(tl.where(bt, gau[None, :] * E3, 0.0), 1)  # bt[j, k] = bf[k, j]
        else:  # one slot j at a time
            for j in range(N):
                E = tl.reduce(tl.where(bf & (inn[None, :] != j), u[None, :], 1.0), 1, _prod_combine)
                val = tl.sum(tl.sum(tl.where(bf & (inn[None, :] == j), (gau * E)[:, None], 0.0), 1), 0)
                gu += tl.where(inn == j, val, 0.0)
        # ---- write content on M_{t-1}
        gsw = cw * (gcw - tl.sum(cw * gcw, 0))
        gswn = gsw * nrm_p
        gkhw = tl.sum(gswn[:, None] * Mp, 0)
        gMp += gswn[:, None] * khw[None, :] - (gsw * dw_ * nrm_p * nrm_p * nrm_p)[:, None] * Mp
        kgw = tl.sum(gkhw * kw, 0)
        g_str_w = kgw * rho_w * dsp_w
        g_kw = beta_w * rho_w * gkhw - beta_w * kgw * rho_w * rho_w * rho_w * kw
        # ---- usage u = ū ψ, ū = u_{t-1} + w^w_{t-1} − u_{t-1} w^w_{t-1}
        gub = gu * psi
        gpsi = gu * ub
        gup = gub * (1.0 - wwp)
        gwwp = gub * (1.0 - up)
        # ---- retention ψ = Π_r (1 − f_r w^r_{t-1}[r])
        g_free = tl.zeros([BR], dtype=gpsi.dtype)
        for r in range(R):
            others = tl.where(mn, 1.0 + 0.0 * up, 0.0 * up)
            for q in range(R):
                fq = 1.0 / (1.0 + tl.exp(-tl.load(xb + FREE + q)))
                kq = 1.0 - fq * tl.load(wrp_ptr + b * R * N + q * N + inn, mask=mn, other=0.0)
                others = others * tl.where(q != r, kq, 1.0)
            fr = 1.0 / (1.0 + tl.exp(-tl.load(xb + FREE + r)))
            wrow = tl.load(wrp_ptr + b * R * N + r * N + inn, mask=mn, other=0.0)
            gkeep = gpsi * others
            g_free = tl.where(ir == r, -tl.sum(gkeep * wrow, 0) * fr * (1.0 - fr), g_free)
            gwrp = tl.where(ir[:, None] == r, gwrp - (gkeep * fr)[None, :], gwrp)
        # ---- the interface's gradient, kept; then W_ξᵀ dξ
        gb = gxi_ptr + b * I
        tl.store(gb + ir[:, None] * W + iw[None, :], g_kr, mask=mrw)
        tl.store(gb + RW + iw, g_kw, mask=mw)
        tl.store(gb + STR + ir, g_str_r, mask=mr)
        tl.store(gb + STR + R, g_str_w)
        tl.store(gb + V + iw, g_v, mask=mw)
        tl.store(gb + SIG + iw, g_e * e * (1.0 - e), mask=mw)
        tl.store(gb + FREE + ir, g_free, mask=mr)
        tl.store(gb + GA, g_ga * ga * (1.0 - ga))
        tl.store(gb + GW, g_gw * gw * (1.0 - gw))
        tl.store(gb + MODES + ir, gm0, mask=mr)
        tl.store(gb + MODES + R + ir, gm1, mask=mr)
        tl.store(gb + MODES + 2 * R + ir, gm2, mask=mr)
        tl.debug_barrier()
        for i0 in range(0, I, BI):
            ii = i0 + tl.arange(0, BI)
            mi = ii < I
            wt = tl.load(wxi_ptr + ii[:, None] * C + ic[None, :], mask=mi[:, None] & mc[None, :], other=0.0)
            gh += tl.sum(wt * tl.load(gb + ii, mask=mi, other=0.0)[:, None], 0)
        # ---- LSTM pointwise
        zb = z_ptr + b * 4 * C
        si, sf, tg, so = _lstm_gates(zb, ic, mc, C)
        cp = tl.load(cp_ptr + b * C + ic, mask=mc, other=0.0)
        c = tl.load(c_ptr + b * C + ic, mask=mc, other=0.0)
        tc = 2.0 / (1.0 + tl.exp(-2.0 * c)) - 1.0
        gct = tl.load(gc_ptr + b * C + ic, mask=mc, other=0.0) + gh * so * (1.0 - tc * tc)
        db = dz_ptr + b * 4 * C
        tl.store(db + ic, gct * tg * si * (1.0 - si), mask=mc)
        tl.store(db + C + ic, gct * cp * sf * (1.0 - sf), mask=mc)
        tl.store(db + 2 * C + ic, gct * si * (1.0 - tg * tg), mask=mc)
        tl.store(db + 3 * C + ic, gh * tc * so * (1.0 - so), mask=mc)
        tl.store(gc_out + b * C + ic, gct * sf, mask=mc)
        # ---- gradients of the previous state
        tl.store(gm_out + offs_m, gMp, mask=mnw)
        tl.store(gu_out + b * N + inn, gup, mask=mn)
        tl.store(gl_out + offs_l, gLp, mask=mnn)
        tl.store(gp_out + b * N + inn, gpp, mask=mn)
        tl.store(gwr_out + offs_r, gwrp, mask=mrn)
        tl.store(gww_out + b * N + inn, gwwp, mask=mn)

    @triton.jit(do_not_specialize=["t"])
    def forward_step(Z, CB, X, wxi_ptr, bxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, t, B, C, N, W, R, I, eps,
                     BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr):
        _forward_body(Z, CB, X, wxi_ptr, bxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, t.to(tl.int64), B, C, N, W, R, I,
                      eps, 0, BC, BN, BW, BR, BI)

    @triton.jit(do_not_specialize=["T"])
    def forward_seq(Z, CB, X, w0_ptr, wxi_ptr, bxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, T, B, C, N, W, R, I, eps,
                    BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr,
                    BX: tl.constexpr, BJ: tl.constexpr):
        # the whole time loop: Z holds x_t W_xᵀ + b_x and gets its row's X_t W_0ᵀ added here
        b = tl.program_id(0).to(tl.int64)
        XW = R * W + C
        for t in range(T):
            t64 = tl.full([], 0, tl.int64) + t
            _row_addmv(Z + (t64 * B + b) * 4 * C, w0_ptr, X + (t64 * B + b) * XW, 4 * C, XW, BX, BJ)
            tl.debug_barrier()  # the row's z_t, written by every thread, read by others
            zb = (t64 // T).to(tl.int32)  # 0, unknown to the compiler (see below)
            _forward_body(Z, CB, X, wxi_ptr, bxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, t64, B, C + zb, N + zb, W + zb,
                          R + zb, I + zb, eps, zb, BC, BN, BW, BR, BI)
            tl.debug_barrier()  # the state at t + 1, read by the next step

    @triton.jit(do_not_specialize=["t", "s"])
    def backward_step(Z, CB, wxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, DHR, dx_ptr,
                      GM, GU, GL, GP, GWR, GWW, GC, GXI, DZ, t, s, B, C, N, W, R, I, eps,
                      BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr,
                      ALLOC3D: tl.constexpr):
        _backward_body(Z, CB, wxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, DHR, dx_ptr, GM, GU, GL, GP, GWR, GWW, GC, GXI,
                       DZ, t.to(tl.int64), s, B, C, N, W, R, I, eps, 0, BC, BN, BW, BR, BI, ALLOC3D)

    @triton.jit(do_not_specialize=["T"])
    def backward_seq(Z, CB, wxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, DHR, dx_ptr,
                     GM, GU, GL, GP, GWR, GWW, GC, GXI, DZ, w0_ptr, T, B, C, N, W, R, I, eps,
                     BC: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr,
                     ALLOC3D: tl.constexpr, BG: tl.constexpr, BJ: tl.constexpr):
        # the whole time loop back: after each step the row's dX = dz_t W_0 (the next step's dx_ptr)
        b = tl.program_id(0).to(tl.int64)
        XW = R * W + C
        for i in range(T):
            t64 = tl.full([], 0, tl.int64) + (T - 1 - i)
            zb = (t64 // T).to(tl.int32)  # 0, unknown to the compiler (see forward_seq)
            _backward_body(Z, CB, wxi_ptr, XI, MEM, U, LNK, PREC, WR, WW, DHR, dx_ptr, GM, GU, GL, GP, GWR, GWW, GC,
                           GXI, DZ, t64, i % 2, B, C + zb, N + zb, W + zb, R + zb, I + zb, eps, zb, BC, BN, BW, BR, BI,
                           ALLOC3D)
            tl.debug_barrier()  # the row's dz_t, written by every thread, read by others
            _row_vecmm(dx_ptr + b * XW, w0_ptr, DZ + (t64 * B + b) * 4 * C, 4 * C, XW, BG, BJ)
            tl.debug_barrier()  # dX, read by the next step

    # called functions, and the helpers' names, are looked up in the module's globals
    row_addmv, row_vecmm = rows.kernels()
    globals().update(triton=triton, tl=tl, _forward_body=_forward_body, _backward_body=_backward_body,
                     _layout=_layout, _interface=_interface, _lstm_gates=_lstm_gates,
                     _row_addmv=row_addmv, _row_vecmm=row_vecmm)
    return forward_step, backward_step, forward_seq, backward_seq


_p2 = rows.block


def _blocks(C: int, N: int, W: int, R: int, I: int) -> dict:
    BC = _p2(C)
    return dict(BC=BC, BN=_p2(N), BW=_p2(W), BR=_p2(R), BI=max(2, min(_p2(I), max(2, 4096 // BC))))


WARPS_ENV = "MEMNETS_DNC_WARPS"


def _warps(BN: int, BW: int, BR: int, backward: bool) -> int:
    """Warps per program, sized to the largest [R, N, max(N, W)] tile so that the step stays in
    registers (for sm_90: the default DNC, 16 slots of 20, 4 reads, spills nothing at 4 warps
    forward and 8 backward), unless ``MEMNETS_DNC_WARPS`` names a count for both (``make
    gpu-check`` times the DNC at LSTM 64 at 4 and 16 beside its default)."""
    env = warps_from_env(WARPS_ENV)
    if env is not None:
        return env
    big = BR * BN * max(BN, BW)
    if big <= 512:
        return 2 if big <= 128 else 4
    return 8 if backward or big > 4096 else 4


def launches_per_step(C: int | None = None, R: int | None = None, W: int | None = None) -> dict:
    """Launches per time step of :class:`DNCRecurrenceTriton`: forward (one addmm, one Triton
    kernel) and backward (one Triton kernel, one mm); none for a DNC of controller ``C``, ``R``
    reads of width ``W`` whose time loop runs in one kernel (:func:`time_loop_in_kernel`)."""
    if C is not None and time_loop_in_kernel(C, R, W):
        return {"forward": 0, "backward": 0}
    return {"forward": 2, "backward": 2}


def time_loop_in_kernel(C: int, R: int, W: int) -> bool:
    """Whether the whole time loop runs in one launch each way (:mod:`memnets.ops.gpu.rows`):
    the recurrent weight ``W_0 [4C, R·W + C]`` small enough, or ``MEMNETS_TIME_LOOP`` says so."""
    return rows.time_loop_in_kernel(4 * C, R * W + C)


def kernel_form(C: int, R: int, W: int) -> tuple[bool, int | None]:
    """What, besides the shapes, sets the kernels a DNC of controller ``C`` and ``R`` reads of
    width ``W`` launches: its time loop's form (:func:`time_loop_in_kernel`) and the warps that
    ``MEMNETS_DNC_WARPS`` asks for (None: by the tiles). Part of every graph key of the DNC."""
    return time_loop_in_kernel(C, R, W), warps_from_env(WARPS_ENV)


def applies(h0: torch.Tensor, mem0: torch.Tensor, upper=()) -> bool:
    """Whether the kernels take this DNC: one controller layer (``h0 [B, 1, C]``, no upper
    layers), N ≤ :data:`MAX_SLOTS` slots and words of W ≤ :data:`MAX_WORD`."""
    return len(upper) == 0 and h0.dim() == 3 and h0.shape[1] == 1 and mem0.dim() == 3 \
        and mem0.shape[1] <= MAX_SLOTS and mem0.shape[2] <= MAX_WORD


_NAMES = ("x", "w_x", "b_x", "w_xi", "b_xi", "h0", "c0", "mem0", "usage0", "link0", "prec0", "wr0", "ww0",
          "reads0", "w0")


def _check(dims, tensors, upper) -> None:
    if upper:
        raise ValueError(f"DNC recurrence on Triton takes one controller layer, got {1 + len(upper) // 2}")
    if not isinstance(dims, (tuple, list)) or len(dims) not in (2, 3) or (len(dims) == 3 and dims[2] is not True):
        raise ValueError(f"DNC recurrence expected dims = (R, W) or (R, W, True), got {dims!r}")
    R, W = (int(d) for d in dims[:2])
    x = tensors[0]
    if x.dim() != 3 or tensors[1].dim() != 2 or tensors[7].dim() != 3:
        raise ValueError(f"DNC recurrence expected x [B, T, F], w_x [4C, F], mem0 [B, N, W], got "
                         f"{tuple(x.shape)}, {tuple(tensors[1].shape)}, {tuple(tensors[7].shape)}")
    B, T, F = x.shape
    G4 = tensors[1].shape[0]
    C, N = G4 // 4, tensors[7].shape[1]
    I = interface_layout(R, W)["size"]
    want = {"x": (B, T, F), "w_x": (4 * C, F), "b_x": (4 * C,), "w_xi": (I, C), "b_xi": (I,), "h0": (B, 1, C),
            "c0": (B, 1, C), "mem0": (B, N, W), "usage0": (B, N), "link0": (B, N, N), "prec0": (B, N),
            "wr0": (B, R, N), "ww0": (B, N), "reads0": (B, R, W), "w0": (4 * C, R * W + C)}
    bad = [f"{n} {tuple(t.shape)} (expected {want[n]})" for n, t in zip(_NAMES, tensors) if tuple(t.shape) != want[n]]
    if T < 1 or G4 % 4 or C < 1 or N < 1 or R < 1 or W < 1 or bad:
        raise ValueError("DNC recurrence: inconsistent shapes " + (", ".join(bad) or f"T={T}, 4C={G4}, R={R}, W={W}"))
    if N > MAX_SLOTS or W > MAX_WORD:
        raise ValueError(f"DNC recurrence on Triton takes up to {MAX_SLOTS} slots of width up to {MAX_WORD}, "
                         f"got N={N}, W={W}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"DNC recurrence expected one dtype, float32 or float64, got {sorted(map(str, dtypes))}")
    if len({t.device for t in tensors}) != 1:
        raise ValueError("DNC recurrence: every tensor must be on one device")


def _forward_loop(x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0, *, R, W,
                  in_kernel=None):
    """The forward time loop on its arguments alone (what :func:`graphed` captures): the
    per-step buffers ``(X, CB, Z, XI, MEM, U, LNK, PREC, WR, WW)``, all of its own. ``in_kernel``:
    the whole loop in one launch (None: :func:`time_loop_in_kernel` chooses)."""
    fwd, _, fwd_seq, _ = kernels()
    x, w_x, b_x, w_xi, b_xi, w0 = (t.contiguous() for t in (x, w_x, b_x, w_xi, b_xi, w0))
    B, T, F = x.shape
    C, N, I, RW = w_x.shape[0] // 4, mem0.shape[1], w_xi.shape[0], R * W
    new = x.new_empty
    X, CB, Z, XI = new(T + 1, B, RW + C), new(T + 1, B, C), new(T, B, 4 * C), new(T, B, I)
    MEM, U, LNK = new(T + 1, B, N, W), new(T + 1, B, N), new(T + 1, B, N, N)
    PREC, WR, WW = new(T + 1, B, N), new(T + 1, B, R, N), new(T + 1, B, N)
    X[0, :, :RW] = reads0.reshape(B, RW)
    X[0, :, RW:] = h0[:, 0]
    CB[0] = c0[:, 0]
    MEM[0], U[0], LNK[0], PREC[0], WR[0], WW[0] = mem0, usage0, link0, prec0, wr0, ww0
    GX = torch.addmm(b_x, x.transpose(0, 1).reshape(T * B, F), w_x.t()).view(T, B, 4 * C)
    w0T = w0.t()
    blk = _blocks(C, N, W, R, I)
    nw = _warps(blk["BN"], blk["BW"], blk["BR"], False)
    if time_loop_in_kernel(C, R, W) if in_kernel is None else in_kernel:
        # one launch: each program adds its row of X_t W_0ᵀ to GX itself
        BX = rows.block(RW + C)
        fwd_seq[(B,)](GX, CB, X, w0, w_xi, b_xi, XI, MEM, U, LNK, PREC, WR, WW, T, B, C, N, W, R, I, EPS, **blk,
                      BX=BX, BJ=rows.tile(BX), num_warps=nw)
        return X, CB, GX, XI, MEM, U, LNK, PREC, WR, WW
    for t in range(T):
        torch.addmm(GX[t], X[t], w0T, out=Z[t])
        fwd[(B,)](Z, CB, X, w_xi, b_xi, XI, MEM, U, LNK, PREC, WR, WW, t, B, C, N, W, R, I, EPS, **blk,
                  num_warps=nw)
    return X, CB, Z, XI, MEM, U, LNK, PREC, WR, WW


def _backward_loop(Z, CB, w_xi, XI, MEM, U, LNK, PREC, WR, WW, dHR, w0, dhT, dM, du, dL, dp, dwr, dww, dcT, *,
                   R, W, in_kernel=None):
    """The backward time loop on its arguments alone: ``(DX, DZ, GXI, gM, gu, gL, gp, gwr, gww,
    gc)``, the carried gradients in two buffers each, ``[T % 2]`` the one the last step wrote."""
    _, bwd, _, bwd_seq = kernels()
    T, B, C4 = Z.shape
    C, N, I, RW = C4 // 4, MEM.shape[2], w_xi.shape[0], R * W
    w0 = w0.contiguous()
    # carried gradients of the state, two buffers each (read one, write the other)
    gM, gu, gL = Z.new_empty(2, B, N, W), Z.new_empty(2, B, N), Z.new_empty(2, B, N, N)
    gp, gwr, gww, gc = Z.new_empty(2, B, N), Z.new_empty(2, B, R, N), Z.new_empty(2, B, N), Z.new_empty(2, B, C)
    for buf, g in ((gM, dM), (gu, du), (gL, dL), (gp, dp), (gwr, dwr), (gww, dww), (gc, dcT)):
        buf[0].copy_(g.reshape(buf[0].shape))
    DX = Z.new_zeros(B, RW + C)  # d [r_t | h_t] through the next step's pre-activation
    DX[:, RW:] = dhT
    DZ, GXI = Z.new_empty(T, B, 4 * C), Z.new_empty(T, B, I)
    blk = _blocks(C, N, W, R, I)
    nw = _warps(blk["BN"], blk["BW"], blk["BR"], True)
    if time_loop_in_kernel(C, R, W) if in_kernel is None else in_kernel:
        # one launch: each program makes its row of dz_t W_0 itself
        BG = rows.block(4 * C)
        bwd_seq[(B,)](Z, CB, w_xi, XI, MEM, U, LNK, PREC, WR, WW, dHR, DX, gM, gu, gL, gp, gwr, gww, gc, GXI, DZ, w0,
                      T, B, C, N, W, R, I, EPS, **blk, ALLOC3D=blk["BN"] <= ALLOC3D_MAX, BG=BG, BJ=rows.tile(BG),
                      num_warps=nw)
        return DX, DZ, GXI, gM, gu, gL, gp, gwr, gww, gc
    s = 0
    for t in range(T - 1, -1, -1):
        o = 1 - s
        bwd[(B,)](Z, CB, w_xi, XI, MEM, U, LNK, PREC, WR, WW, dHR, DX, gM, gu, gL, gp, gwr, gww, gc, GXI, DZ,
                  t, s, B, C, N, W, R, I, EPS, **blk, ALLOC3D=blk["BN"] <= ALLOC3D_MAX, num_warps=nw)
        torch.mm(DZ[t], w0, out=DX)
        s = o
    return DX, DZ, GXI, gM, gu, gL, gp, gwr, gww, gc


@functools.lru_cache(maxsize=None)
def _interface_order(R: int, W: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`memnets.ops.dnc.layout.interface_permutation` and its inverse on ``device``, made
    once and kept for the process: graphs that gather by them may hold their addresses."""
    with torch.inference_mode(False):  # kept for the process: ordinary tensors, whatever the caller's mode
        perm = interface_permutation(R, W, device=device)
        return perm, inverse_permutation(perm)


def _forward_graph_perm(x, w_x, b_x, w_xi, b_xi, *rest, R, W, in_kernel=None):
    """:func:`_forward_loop` on the interface layer's rows in their storage order (docs/maths.md
    §8), gathered into the kernels' order inside the graph."""
    perm, _ = _interface_order(R, W, x.device)
    return _forward_loop(x, w_x, b_x, w_xi.index_select(0, perm), b_xi.index_select(0, perm), *rest, R=R, W=W,
                         in_kernel=in_kernel)


def _backward_graph_perm(x, w_x, w_xi, *rest, R, W, in_kernel=None):
    """:func:`_backward_graph` for :func:`_forward_graph_perm`: the interface layer's gradients
    gathered back to its storage order."""
    perm, inv = _interface_order(R, W, x.device)
    out = _backward_graph(x, w_x, w_xi.index_select(0, perm), *rest, R=R, W=W, in_kernel=in_kernel)
    return (*out[:3], out[3].index_select(0, inv), out[4].index_select(0, inv), *out[5:])


def _backward_graph(x, w_x, w_xi, w0, X, Z, CB, XI, MEM, U, LNK, PREC, WR, WW, dHR, dhT, *carried, R, W,
                    in_kernel=None):
    """What :class:`DNCRecurrenceTriton` replays backward: :func:`_backward_loop`, then the
    gradients of the input, the weights and the initial state: ``(dx, dw_x, db_x, dw_xi, db_xi,
    dh0, dc0, dmem0, dusage0, dlink0, dprec0, dwr0, dww0, dreads0, dw0)``, every one contiguous."""
    DX, DZ, GXI, gM, gu, gL, gp, gwr, gww, gc = _backward_loop(Z, CB, w_xi, XI, MEM, U, LNK, PREC, WR, WW, dHR, w0,
                                                               dhT, *carried, R=R, W=W, in_kernel=in_kernel)
    T, B, C4 = Z.shape
    F, C, I, RW, TB = x.shape[2], C4 // 4, w_xi.shape[0], R * W, T * B
    s = T % 2  # the buffer the last step wrote
    dz, gxi = DZ.view(TB, C4), GXI.view(TB, I)
    return ((dz @ w_x).view(T, B, F).transpose(0, 1).contiguous(), dz.t() @ x.transpose(0, 1).reshape(TB, F),
            dz.sum(0), gxi.t() @ X[1:, :, RW:].reshape(TB, C), gxi.sum(0), DX[:, RW:].unsqueeze(1).contiguous(),
            gc[s].unsqueeze(1), gM[s], gu[s], gL[s], gp[s], gwr[s], gww[s], DX[:, :RW].reshape(B, R, W).contiguous(),
            dz.t() @ X[:T].reshape(TB, RW + C))


class DNCRecurrenceTriton(torch.autograd.Function):
    """:class:`memnets.ops.dnc.DNCRecurrence` on Triton kernels (module docstring), one
    controller layer: ``apply(dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0,
    wr0, ww0, reads0, w0)`` -> ``(HR [T, B, R·W + C], h [B, 1, C], c [B, 1, C], memory, usage,
    link, precedence, read_weights, write_weights)``. With ``dims = (R, W, True)`` the interface
    layer's ``w_xi``, ``b_xi`` come in their storage order (docs/maths.md §8) and are gathered
    into the kernels' order (:func:`memnets.ops.dnc.layout.interface_permutation`) inside the
    graphed forward, their gradients gathered back inside the graphed backward. Every buffer it writes is its own; the inputs are
    left unchanged. Not twice differentiable."""

    @staticmethod
    def forward(ctx, dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
                *upper):
        tensors = (x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0)
        _check(dims, tensors, upper)
        R, W = (int(d) for d in dims[:2])
        stored = len(dims) == 3  # w_xi and b_xi in storage order, gathered inside the graph
        fn = _forward_graph_perm if stored else _forward_loop
        form = kernel_form(w_x.shape[0] // 4, R, W)  # the loop's form and the warps: part of the graphs' keys
        in_kernel = form[0]
        X, CB, Z, XI, MEM, U, LNK, PREC, WR, WW = graphed(("dnc.forward", R, W, stored, *form),
                                                          functools.partial(fn, R=R, W=W, in_kernel=in_kernel),
                                                          *tensors)
        T, RW = x.shape[1], R * W
        ctx.dims, ctx.stored, ctx.form = (R, W), stored, form
        ctx.set_materialize_grads(False)  # backward makes the zeros of unused outputs itself, in one fill
        ctx.save_for_backward(x, w_x, w_xi, w0, X, CB, Z, XI, MEM, U, LNK, PREC, WR, WW)
        # copies, so that the outputs hold none of the per-step buffers: one multi-tensor copy (the
        # final h, a strided slice, one copy of its own)
        return tuple(fresh_copies((X[1:], X[T, :, RW:].unsqueeze(1), CB[T].unsqueeze(1), MEM[T], U[T], LNK[T],
                                   PREC[T], WR[T], WW[T])))

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww):
        x, w_x, w_xi, w0, X, CB, Z, XI, MEM, U, LNK, PREC, WR, WW = ctx.saved_tensors
        R, W = ctx.dims
        T = x.shape[1]

        # the gradients not given (outputs that took no part in the loss) as zeros, made by one fill
        given = (dHR, dM, du, dL, dp, dwr, dww, dcT, None if dhT is None else dhT[:, 0])
        likes = (X[1:], MEM[T], U[T], LNK[T], PREC[T], WR[T], WW[T], CB[T], CB[T])
        dHR, *carried, dhT = zeros_for_none(given, likes)
        # the loop and every gradient after it in one graphed function (its weights' products included)
        fn = _backward_graph_perm if ctx.stored else _backward_graph
        grads = graphed(("dnc.backward", R, W, ctx.stored, *ctx.form),
                        functools.partial(fn, R=R, W=W, in_kernel=ctx.form[0]), x, w_x, w_xi, w0, X, Z, CB, XI, MEM,
                        U, LNK, PREC, WR, WW, dHR, dhT, *carried)
        need = ctx.needs_input_grad
        return (None, *(g if n else None for g, n in zip(grads[:5], need[1:6])), *grads[5:14],
                grads[14] if need[15] else None)
