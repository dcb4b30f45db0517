"""The Neural Turing Machine's time loop as Triton kernels (docs/maths.md §7): the whole loop
in one launch each way, or two launches per time step forward and two backward.

Forward, per step ``t`` (one program per sequence ``b`` of the batch)::

    z_t = gx_t + [r_{t-1} ; h_{t-1}] W_rhᵀ          # one cuBLAS addmm for the whole batch
    controller: LSTM (c_t, h_t) or tanh (h_t)       # one Triton program per sequence does
    p_t = W_h h_t + b_h                             #   everything from here to the reads,
    write heads: address M_{t-1}, erase, add → M_t  #   the memory [N, W] in registers
    read heads: address M_t, read r_t

Addressing is the NTM's (content → interpolation → circular shift → sharpening,
:mod:`memnets.ops.addressing`), with the same eps and the same softplus threshold as the
PyTorch path. The heads' linear layer is one pass over ``W_h`` in tiles of rows, its output
``p_t`` stored in the step's row of a buffer that the heads then read their parameters from; the
circular shift is one gather from a scratch row per program (no ``N × N`` matrix). Saved for
the backward: every step's memory, weightings, cell state, ``[r ; h]``, controller
pre-activations, ``p_t``, and each head's content weighting ``w^c`` and shifted weighting
``w̃`` (so the backward recomputes no softmax over the slots). Backward, per step in reverse:
one program per sequence walks the step back (reads, read addressing, write, write
addressing) writing ``dp_t``, then ``dh_t = W_hᵀ dp_t`` in one pass over ``W_h`` and the
controller's backward, writing ``dz_t``; one matmul ``d[r ; h]_{t-1} = dz_t W_rh`` follows. The
weight gradients are matmuls after the loop.

Where ``W_rh`` and the memory are small (:func:`time_loop_in_kernel`, :mod:`memnets.ops.gpu.rows`),
``forward_seq`` and ``backward_seq`` run the whole loop in one launch each way: each program
does its own row of the per-step product (``[r ; h]_{t-1} W_rhᵀ`` forward, ``dz_t W_rh``
backward) between the steps, which are the step kernels' bodies. The gpu-check NTM (128 × 20)
keeps the per-step form by default: there the one-kernel backward spills registers.
``MEMNETS_TIME_LOOP=kernel`` / ``steps`` chooses.

:func:`ntm_scan_triton` runs it for :class:`memnets.memories.ntm.NTM` where
:func:`memnets.ops.gpu.use_triton` says so (CUDA); the tests run it on the CPU through Triton's
interpreter against the NTM's step-by-step PyTorch path, float32 and float64.
"""
from __future__ import annotations

import functools

import torch

from . import lazy_kernels, rows, warps_from_env
from .graphs import fresh_copies, graphed, zeros_for_none
from .._amp import backward_without_autocast

__all__ = ["NTMScanTriton", "ntm_scan_triton", "applies", "time_loop_in_kernel", "MAX_SLOTS", "WARPS_ENV"]

EPS = 1e-6  # cosine's eps (memnets.ops.addressing)
SHARP_EPS = 1e-12  # sharpening's eps
MAX_SLOTS = 256  # one program holds the [N, W] memory, its gradient and [N, shifts] gathers in registers
MAX_WIDTH = 256  # word size and controller width


def _p2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


@lazy_kernels
def kernels():
    """``(forward_step, backward_step, forward_seq, backward_seq)``, defined on first use (Triton reads
    ``TRITON_INTERPRET`` when a kernel is defined)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _sig(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    @triton.jit
    def _softplus(x):  # torch's softplus: x itself past the threshold 20
        return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))

    @triton.jit
    def _softplus_grad(x):
        return tl.where(x > 20.0, 1.0, _sig(x))

    @triton.jit
    def _linear(w_ptr, b_ptr, h, out_ptr, P, C, ci, cm, RB: tl.constexpr):
        """``out[p] = W[p] · h + b[p]`` for every ``p < P``, ``RB`` rows of ``W`` at a time."""
        r = tl.arange(0, RB)
        for r0 in range(0, P, RB):
            rows = r0 + r
            rm = rows < P
            Wt = tl.load(w_ptr + rows[:, None] * C + ci[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
            y = tl.sum(Wt * h[None, :], 1) + tl.load(b_ptr + rows, mask=rm, other=0.0)
            tl.store(out_ptr + rows, y, mask=rm)

    @triton.jit
    def _linear_t(w_ptr, d_ptr, P, C, ci, cm, RB: tl.constexpr, BC: tl.constexpr):
        """``Σ_p d[p] W[p, :]`` over every ``p < P``, ``RB`` rows of ``W`` at a time."""
        r = tl.arange(0, RB)
        acc = tl.zeros((RB, BC), dtype=d_ptr.dtype.element_ty)
        for r0 in range(0, P, RB):
            rows = r0 + r
            rm = rows < P
            Wt = tl.load(w_ptr + rows[:, None] * C + ci[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
            acc += Wt * tl.load(d_ptr + rows, mask=rm, other=0.0)[:, None]
        return tl.sum(acc, 0)

    @triton.jit
    def _params(pb, off, W, wi, wm, js, S: tl.constexpr):
        """One head's raw parameters (key, β, g, γ, shift logits) from the step's ``p`` row."""
        kr = tl.load(pb + off + wi, mask=wm, other=0.0)
        br = tl.load(pb + off + W)
        gr = tl.load(pb + off + W + 1)
        yr = tl.load(pb + off + W + 2)
        sr = tl.load(pb + off + W + 3 + js, mask=js < S, other=0.0)
        return kr, br, gr, yr, sr

    @triton.jit
    def _content(M, kr, br, gr, yr, sr, wm, js, S: tl.constexpr):
        """The head's parameters squashed, and the cosine of its key with every row of ``M``."""
        key = tl.where(wm, _tanh(kr), 0.0)
        beta = _softplus(br)
        g = _sig(gr)
        gamma = 1.0 + _softplus(yr)
        sm = js < S
        sl = tl.where(sm, sr, float("-inf"))
        se = tl.where(sm, tl.exp(sl - tl.max(sl, 0)), 0.0)
        s = se / tl.sum(se, 0)
        kn = tl.sqrt(tl.sum(key * key, 0) + 1e-6)
        mn = tl.sqrt(tl.sum(M * M, 1) + 1e-6)
        cos = tl.sum(M * key[None, :], 1) / (kn * mn)
        return key, beta, g, gamma, s, kn, mn, cos

    @triton.jit
    def _gather(scr_ptr, ni, nm, js, N, S: tl.constexpr, sign: tl.constexpr):
        """``X[i, j] = x[(i − sign·(j − S//2)) mod N]`` for the row ``x`` in the scratch row."""
        idx = (ni[:, None] - sign * (js[None, :] - S // 2) + 2 * N) % N
        return tl.load(scr_ptr + idx, mask=nm[:, None] & (js[None, :] < S), other=0.0)

    @triton.jit
    def _address(M, kr, br, gr, yr, sr, wprev, N, wm, ni, nm, js, scr_ptr, S: tl.constexpr):
        """The weighting of one head on memory ``M [BN, BW]``, with its content weighting ``wc``
        and its shifted weighting ``w̃`` (kept for the backward)."""
        key, beta, g, gamma, s, kn, mn, cos = _content(M, kr, br, gr, yr, sr, wm, js, S)
        a = tl.where(nm, beta * cos, float("-inf"))
        ae = tl.where(nm, tl.exp(a - tl.max(a, 0)), 0.0)
        wc = ae / tl.sum(ae, 0)
        wg = g * wc + (1.0 - g) * wprev
        # the circular shift w̃_i = Σ_j s_j wg[(i − j + S//2) mod N], through the scratch row
        tl.debug_barrier()
        tl.store(scr_ptr + ni, wg, mask=nm)
        tl.debug_barrier()
        wt = tl.sum(_gather(scr_ptr, ni, nm, js, N, S, 1) * s[None, :], 1)
        b = tl.where(nm, gamma * tl.log(tl.maximum(wt, 0.0) + 1e-12), float("-inf"))
        be = tl.where(nm, tl.exp(b - tl.max(b, 0)), 0.0)
        return be / tl.sum(be, 0), wc, wt

    @triton.jit
    def _address_bwd(dw, w, wc, wt, M, kr, br, gr, yr, sr, wprev, N, wm, ni, nm, js, scr_ptr, BN: tl.constexpr,
                     S: tl.constexpr):
        """Gradients of one head's weighting ``w`` (with its forward's ``wc`` and ``w̃``):
        ``(dM, d key_raw, dβ_raw, dg_raw, dγ_raw, ds_raw, dw_prev)``."""
        key, beta, g, gamma, s, kn, mn, cos = _content(M, kr, br, gr, yr, sr, wm, js, S)
        wg = g * wc + (1.0 - g) * wprev
        dw = tl.where(nm, dw, 0.0)
        db = w * (dw - tl.sum(w * dw, 0))  # sharpening's softmax
        dgamma = tl.sum(tl.where(nm, db * tl.log(tl.maximum(wt, 0.0) + 1e-12), 0.0), 0)
        dwt = tl.where(nm & (wt >= 0.0), db * gamma / (tl.maximum(wt, 0.0) + 1e-12), 0.0)
        tl.debug_barrier()
        tl.store(scr_ptr + ni, dwt, mask=nm)
        tl.store(scr_ptr + BN + ni, wg, mask=nm)
        tl.debug_barrier()
        dwg = tl.sum(_gather(scr_ptr, ni, nm, js, N, S, -1) * s[None, :], 1)  # Aᵀ dw̃
        # ds_j = Σ_i dw̃_i wg[(i − j + S//2) mod N]
        ds = tl.sum(_gather(scr_ptr + BN, ni, nm, js, N, S, 1) * dwt[:, None], 0)
        dg = tl.sum(dwg * (wc - wprev), 0)
        dwc = g * dwg
        dwprev = (1.0 - g) * dwg
        da = wc * (dwc - tl.sum(wc * dwc, 0))  # content softmax
        dbeta = tl.sum(tl.where(nm, da * cos, 0.0), 0)
        dcos = tl.where(nm, da * beta, 0.0)
        ddot = dcos / (kn * mn)
        dkn = -tl.sum(dcos * cos, 0) / kn
        dmn = -dcos * cos / mn
        dkey = tl.sum(M * ddot[:, None], 0) + dkn * key / kn
        dM = ddot[:, None] * key[None, :] + (dmn / mn)[:, None] * M
        dkr = tl.where(wm, dkey * (1.0 - key * key), 0.0)
        dbr = dbeta * _softplus_grad(br)
        dgr = dg * g * (1.0 - g)
        dyr = dgamma * _softplus_grad(yr)
        dsr = tl.where(js < S, s * (ds - tl.sum(s * ds, 0)), 0.0)
        return dM, dkr, dbr, dgr, dyr, dsr, dwprev

    @triton.jit
    def _store_aux(aux_ptr, row, N, wc, wt, ni, nm):
        """Keep a head's content weighting and shifted weighting (row ``row`` of ``[B·heads, 2, N]``)."""
        tl.store(aux_ptr + row * 2 * N + ni, wc, mask=nm)
        tl.store(aux_ptr + row * 2 * N + N + ni, wt, mask=nm)

    @triton.jit
    def _load_aux(aux_ptr, row, N, ni, nm):
        return (tl.load(aux_ptr + row * 2 * N + ni, mask=nm, other=0.0),
                tl.load(aux_ptr + row * 2 * N + N + ni, mask=nm, other=0.0))

    @triton.jit
    def _controller(z_ptr, cprev_ptr, b, C, ci, cm, LSTM: tl.constexpr):
        if LSTM:
            base = z_ptr + b * 4 * C
            zi = tl.load(base + ci, mask=cm, other=0.0)
            zf = tl.load(base + C + ci, mask=cm, other=0.0)
            zg = tl.load(base + 2 * C + ci, mask=cm, other=0.0)
            zo = tl.load(base + 3 * C + ci, mask=cm, other=0.0)
            cprev = tl.load(cprev_ptr + b * C + ci, mask=cm, other=0.0)
            si, sf, tg, so = _sig(zi), _sig(zf), _tanh(zg), _sig(zo)
            c = sf * cprev + si * tg
            tc = _tanh(c)
            h = so * tc
        else:
            zi = tl.load(z_ptr + b * C + ci, mask=cm, other=0.0)
            h = _tanh(zi)
            si, sf, tg, so, cprev, c, tc = h, h, h, h, h, h, h
        return h, c, si, sf, tg, so, cprev, tc

    @triton.jit
    def forward_step(z_ptr, cprev_ptr, c_ptr, mprev_ptr, m_ptr, wrprev_ptr, wr_ptr, wwprev_ptr, ww_ptr, rh_ptr,
                     wh_ptr, bh_ptr, p_ptr, aux_ptr, scr_ptr, N, W, C, RHW, PT, zb,
                     R: tl.constexpr, HW: tl.constexpr, S: tl.constexpr, LSTM: tl.constexpr,
                     BN: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, RB: tl.constexpr):
        b = tl.program_id(0) + zb
        ci = tl.arange(0, BC)
        cm = ci < C
        ni = tl.arange(0, BN)
        nm = ni < N
        wi = tl.arange(0, BW)
        wm = wi < W
        js = tl.arange(0, BS)
        scr = scr_ptr + b * 2 * BN
        h, c, si, sf, tg, so, cprev, tc = _controller(z_ptr, cprev_ptr, b, C, ci, cm, LSTM)
        if LSTM:
            tl.store(c_ptr + b * C + ci, c, mask=cm)
        tl.store(rh_ptr + b * RHW + R * W + ci, h, mask=cm)
        # every head's parameters p = W_h h + b_h at once, into the step's row (kept for the backward)
        pb = p_ptr + b * PT
        _linear(wh_ptr, bh_ptr, h, pb, PT, C, ci, cm, RB)
        tl.debug_barrier()
        P = W + 3 + S
        moffs = b * N * W + ni[:, None] * W + wi[None, :]
        mmask = nm[:, None] & wm[None, :]
        M = tl.load(mprev_ptr + moffs, mask=mmask, other=0.0)
        keep = tl.zeros_like(M) + 1.0
        add = tl.zeros_like(M)
        for hw in tl.static_range(HW):
            kr, br, gr, yr, sr = _params(pb, (R + hw) * P, W, wi, wm, js, S)
            wprev = tl.load(wwprev_ptr + (b * HW + hw) * N + ni, mask=nm, other=0.0)
            w, wc, wt = _address(M, kr, br, gr, yr, sr, wprev, N, wm, ni, nm, js, scr, S)
            tl.store(ww_ptr + (b * HW + hw) * N + ni, w, mask=nm)
            _store_aux(aux_ptr, b * (R + HW) + R + hw, N, wc, wt, ni, nm)
            eo = (R + HW) * P + hw * 2 * W
            e = _sig(tl.load(pb + eo + wi, mask=wm, other=0.0))
            ad = tl.load(pb + eo + W + wi, mask=wm, other=0.0)
            keep = keep * (1.0 - w[:, None] * e[None, :])
            add += w[:, None] * ad[None, :]
        Mn = tl.where(mmask, M * keep + add, 0.0)
        tl.store(m_ptr + moffs, Mn, mask=mmask)
        for rr in tl.static_range(R):
            kr, br, gr, yr, sr = _params(pb, rr * P, W, wi, wm, js, S)
            wprev = tl.load(wrprev_ptr + (b * R + rr) * N + ni, mask=nm, other=0.0)
            w, wc, wt = _address(Mn, kr, br, gr, yr, sr, wprev, N, wm, ni, nm, js, scr, S)
            tl.store(wr_ptr + (b * R + rr) * N + ni, w, mask=nm)
            _store_aux(aux_ptr, b * (R + HW) + rr, N, wc, wt, ni, nm)
            tl.store(rh_ptr + b * RHW + rr * W + wi, tl.sum(Mn * w[:, None], 0), mask=wm)

    @triton.jit
    def _store_params(dp_ptr, off, W, dkr, dbr, dgr, dyr, dsr, wi, wm, js, S: tl.constexpr):
        tl.store(dp_ptr + off + wi, dkr, mask=wm)
        tl.store(dp_ptr + off + W, dbr)
        tl.store(dp_ptr + off + W + 1, dgr)
        tl.store(dp_ptr + off + W + 2, dyr)
        tl.store(dp_ptr + off + W + 3 + js, dsr, mask=js < S)

    @triton.jit
    def backward_step(z_ptr, cprev_ptr, mprev_ptr, m_ptr, wrprev_ptr, wr_ptr, wwprev_ptr, ww_ptr, p_ptr, aux_ptr,
                      wh_ptr, drh_ptr, drhc_ptr, dm_ptr, dmprev_ptr, dwr_ptr, dwrprev_ptr, dww_ptr,
                      dwwprev_ptr, dc_ptr, dcprev_ptr, dz_ptr, dp_ptr, scr_ptr, N, W, C, RHW, KIN, PT, zb,
                      R: tl.constexpr, HW: tl.constexpr, S: tl.constexpr, LSTM: tl.constexpr,
                      BN: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, RB: tl.constexpr):
        b = tl.program_id(0) + zb
        ci = tl.arange(0, BC)
        cm = ci < C
        ni = tl.arange(0, BN)
        nm = ni < N
        wi = tl.arange(0, BW)
        wm = wi < W
        js = tl.arange(0, BS)
        scr = scr_ptr + b * 2 * BN
        pb = p_ptr + b * PT
        db_ = dp_ptr + b * PT
        P = W + 3 + S
        moffs = b * N * W + ni[:, None] * W + wi[None, :]
        mmask = nm[:, None] & wm[None, :]
        M = tl.load(mprev_ptr + moffs, mask=mmask, other=0.0)
        Mn = tl.load(m_ptr + moffs, mask=mmask, other=0.0)
        dMn = tl.load(dm_ptr + moffs, mask=mmask, other=0.0)
        # reads, then the read heads' addressing on M_t
        for rr in tl.static_range(R):
            dr = tl.load(drh_ptr + b * RHW + rr * W + wi, mask=wm, other=0.0) \
                + tl.load(drhc_ptr + b * KIN + rr * W + wi, mask=wm, other=0.0)
            w = tl.load(wr_ptr + (b * R + rr) * N + ni, mask=nm, other=0.0)
            dMn += w[:, None] * dr[None, :]
            dw = tl.sum(Mn * dr[None, :], 1) + tl.load(dwr_ptr + (b * R + rr) * N + ni, mask=nm, other=0.0)
            kr, br, gr, yr, sr = _params(pb, rr * P, W, wi, wm, js, S)
            wprev = tl.load(wrprev_ptr + (b * R + rr) * N + ni, mask=nm, other=0.0)
            wc, wt = _load_aux(aux_ptr, b * (R + HW) + rr, N, ni, nm)
            dMa, dkr, dbr, dgr, dyr, dsr, dwprev = _address_bwd(dw, w, wc, wt, Mn, kr, br, gr, yr, sr, wprev, N, wm,
                                                                ni, nm, js, scr, BN, S)
            dMn += tl.where(mmask, dMa, 0.0)
            tl.store(dwrprev_ptr + (b * R + rr) * N + ni, dwprev, mask=nm)
            _store_params(db_, rr * P, W, dkr, dbr, dgr, dyr, dsr, wi, wm, js, S)
        # the write: M_t = M_{t-1} ∘ Π_h (1 − w_h e_hᵀ) + Σ_h w_h a_hᵀ
        keep = tl.zeros_like(M) + 1.0
        for hw in tl.static_range(HW):
            w = tl.load(ww_ptr + (b * HW + hw) * N + ni, mask=nm, other=0.0)
            e = _sig(tl.load(pb + (R + HW) * P + hw * 2 * W + wi, mask=wm, other=0.0))
            keep = keep * (1.0 - w[:, None] * e[None, :])
        dM = dMn * keep
        for hw in tl.static_range(HW):
            w = tl.load(ww_ptr + (b * HW + hw) * N + ni, mask=nm, other=0.0)
            eo = (R + HW) * P + hw * 2 * W
            e = _sig(tl.load(pb + eo + wi, mask=wm, other=0.0))
            ad = tl.load(pb + eo + W + wi, mask=wm, other=0.0)
            other = tl.zeros_like(M) + 1.0
            for h2 in tl.static_range(HW):
                if h2 != hw:
                    w2 = tl.load(ww_ptr + (b * HW + h2) * N + ni, mask=nm, other=0.0)
                    e2 = _sig(tl.load(pb + (R + HW) * P + h2 * 2 * W + wi, mask=wm, other=0.0))
                    other = other * (1.0 - w2[:, None] * e2[None, :])
            g_e = dMn * M * other  # d(keep_h) · M, per cell
            dw = tl.sum(dMn * ad[None, :], 1) - tl.sum(g_e * e[None, :], 1) \
                + tl.load(dww_ptr + (b * HW + hw) * N + ni, mask=nm, other=0.0)
            de = -tl.sum(g_e * w[:, None], 0)
            dad = tl.sum(dMn * w[:, None], 0)
            tl.store(db_ + eo + wi, tl.where(wm, de * e * (1.0 - e), 0.0), mask=wm)
            tl.store(db_ + eo + W + wi, tl.where(wm, dad, 0.0), mask=wm)
            kr, br, gr, yr, sr = _params(pb, (R + hw) * P, W, wi, wm, js, S)
            wprev = tl.load(wwprev_ptr + (b * HW + hw) * N + ni, mask=nm, other=0.0)
            wc, wt = _load_aux(aux_ptr, b * (R + HW) + R + hw, N, ni, nm)
            dMa, dkr, dbr, dgr, dyr, dsr, dwprev = _address_bwd(dw, w, wc, wt, M, kr, br, gr, yr, sr, wprev, N, wm,
                                                                ni, nm, js, scr, BN, S)
            dM += tl.where(mmask, dMa, 0.0)
            tl.store(dwwprev_ptr + (b * HW + hw) * N + ni, dwprev, mask=nm)
            _store_params(db_, (R + hw) * P, W, dkr, dbr, dgr, dyr, dsr, wi, wm, js, S)
        tl.store(dmprev_ptr + moffs, dM, mask=mmask)
        # the controller: dh = W_hᵀ dp (every head's dp stored above), plus h's own gradients
        h, c, si, sf, tg, so, cprev, tc = _controller(z_ptr, cprev_ptr, b, C, ci, cm, LSTM)
        tl.debug_barrier()
        dh = _linear_t(wh_ptr, db_, PT, C, ci, cm, RB, BC) + tl.load(drh_ptr + b * RHW + R * W + ci, mask=cm, other=0.0)
        if LSTM:
            dh += tl.load(drhc_ptr + b * KIN + R * W + ci, mask=cm, other=0.0)
            dc = tl.load(dc_ptr + b * C + ci, mask=cm, other=0.0) + dh * so * (1.0 - tc * tc)
            base = dz_ptr + b * 4 * C
            tl.store(base + ci, dc * tg * si * (1.0 - si), mask=cm)
            tl.store(base + C + ci, dc * cprev * sf * (1.0 - sf), mask=cm)
            tl.store(base + 2 * C + ci, dc * si * (1.0 - tg * tg), mask=cm)
            tl.store(base + 3 * C + ci, dh * tc * so * (1.0 - so), mask=cm)
            tl.store(dcprev_ptr + b * C + ci, dc * sf, mask=cm)
        else:
            tl.store(dz_ptr + b * C + ci, dh * (1.0 - h * h), mask=cm)

    # the kernels call these helpers by name: Triton (compiler and interpreter alike) looks a
    # called function up in the kernel's module globals, and the compiler resolves the helpers'
    # ``tl.constexpr`` annotations (strings here: ``from __future__ import annotations``) there too
    row_addmv, row_vecmm = rows.kernels()
    globals().update(triton=triton, tl=tl, _sig=_sig, _tanh=_tanh, _softplus=_softplus, _softplus_grad=_softplus_grad,
                     _linear=_linear, _linear_t=_linear_t, _params=_params, _content=_content, _gather=_gather,
                     _address=_address, _address_bwd=_address_bwd, _controller=_controller,
                     _store_params=_store_params, _store_aux=_store_aux, _load_aux=_load_aux,
                     _forward_step=forward_step, _backward_step=backward_step, _row_addmv=row_addmv,
                     _row_vecmm=row_vecmm)

    @triton.jit(do_not_specialize=["T"])
    def forward_seq(Z, Cs, Ms, Wr, Ww, RH, wh_ptr, bh_ptr, Pp, Aux, scr_ptr, wrh_ptr, T, B, G, K, N, W, C, RHW, PT,
                    R: tl.constexpr, HW: tl.constexpr, S: tl.constexpr, LSTM: tl.constexpr,
                    BN: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, RB: tl.constexpr,
                    BK: tl.constexpr, BJ: tl.constexpr):
        """The whole time loop in one launch: ``Z`` holds ``gx`` and gets each step's row of
        ``[r ; h]_{t-1} W_rhᵀ`` added here, then the step runs as :func:`forward_step`'s body."""
        b = tl.program_id(0).to(tl.int64)
        for t in range(T):
            t0 = tl.full([], 0, tl.int64) + t
            t1 = t0 + 1
            _row_addmv(Z + (t0 * B + b) * G, wrh_ptr, RH + (t0 * B + b) * RHW, G, K, BK, BJ)
            tl.debug_barrier()  # the row's z_t, written by every thread, read by others
            zb = (t0 // T).to(tl.int32)  # 0, unknown to the compiler (memnets.ops.gpu.rows)
            _forward_step(Z + t0 * B * G, Cs + t0 * B * C, Cs + t1 * B * C, Ms + t0 * B * N * W, Ms + t1 * B * N * W,
                          Wr + t0 * B * R * N, Wr + t1 * B * R * N, Ww + t0 * B * HW * N, Ww + t1 * B * HW * N,
                          RH + t1 * B * RHW, wh_ptr, bh_ptr, Pp + t0 * B * PT, Aux + t0 * B * (R + HW) * 2 * N,
                          scr_ptr, N + zb, W + zb, C + zb, RHW, PT, zb, R, HW, S, LSTM, BN, BW, BC, BS, RB)
            tl.debug_barrier()  # the state at t + 1, read by the next step

    @triton.jit(do_not_specialize=["T"])
    def backward_seq(Z, Cs, Ms, Wr, Ww, Pp, Aux, wh_ptr, DRH, drhc_ptr, dMs, dWr, dWw, dCs, dZ, DP, scr_ptr, wrh_ptr,
                     T, B, G, N, W, C, RHW, KIN, PT,
                     R: tl.constexpr, HW: tl.constexpr, S: tl.constexpr, LSTM: tl.constexpr,
                     BN: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, RB: tl.constexpr,
                     BG: tl.constexpr, BJ: tl.constexpr):
        """The whole time loop back in one launch: each step as :func:`backward_step`'s body, then
        the row's ``d[r ; h]_{t-1} = dz_t W_rh`` (the next step's ``drhc_ptr``)."""
        b = tl.program_id(0).to(tl.int64)
        for i in range(T):
            t0 = tl.full([], 0, tl.int64) + (T - 1 - i)
            t1 = t0 + 1
            zb = (t0 // T).to(tl.int32)  # 0, unknown to the compiler (memnets.ops.gpu.rows)
            Bz = B + zb  # the batch size, so that the offsets below are made at each step, not hoisted
            _backward_step(Z + t0 * Bz * G, Cs + t0 * Bz * C, Ms + t0 * Bz * N * W, Ms + t1 * Bz * N * W,
                           Wr + t0 * Bz * R * N, Wr + t1 * Bz * R * N, Ww + t0 * Bz * HW * N, Ww + t1 * Bz * HW * N,
                           Pp + t0 * Bz * PT, Aux + t0 * Bz * (R + HW) * 2 * N, wh_ptr, DRH + t0 * Bz * RHW, drhc_ptr,
                           dMs + t1 * Bz * N * W, dMs + t0 * Bz * N * W, dWr + t1 * Bz * R * N, dWr + t0 * Bz * R * N,
                           dWw + t1 * Bz * HW * N, dWw + t0 * Bz * HW * N, dCs + t1 * Bz * C, dCs + t0 * Bz * C,
                           dZ + t0 * Bz * G, DP + t0 * Bz * PT, scr_ptr, N + zb, W + zb, C + zb, RHW, KIN, PT, zb,
                           R, HW, S, LSTM, BN, BW, BC, BS, RB)
            tl.debug_barrier()  # the row's dz_t, written by every thread, read by others
            _row_vecmm(drhc_ptr + b * KIN, wrh_ptr, dZ + (t0 * B + b) * G, G + zb, KIN + zb, BG, BJ)
            tl.debug_barrier()  # d[r ; h], read by the next step

    return forward_step, backward_step, forward_seq, backward_seq


def applies(memory_slots: int, word_size: int, controller_size: int) -> bool:
    """Whether the kernels take an NTM of these sizes (each up to its limit in registers)."""
    return memory_slots <= MAX_SLOTS and word_size <= MAX_WIDTH and controller_size <= MAX_WIDTH


WARPS_ENV = "MEMNETS_NTM_WARPS"


def _warps(BN: int, BW: int) -> int:
    """Warps per program: by the memory tile ``[BN, BW]``, the largest a program holds, unless
    ``MEMNETS_NTM_WARPS`` names a count (``make gpu-check`` times the NTM at 4 and 8 beside it)."""
    env = warps_from_env(WARPS_ENV)
    if env is not None:
        return env
    n = BN * BW
    # past 2,048 entries, 16: at 128x20 (tile 128x32) on an H100, 16 warps 3.97 ms a training
    # step, 8 warps 4.23, 4 warps 5.33 (make gpu-check, results/gpu-check/2026-11-27-h100.json)
    return 2 if n <= 512 else 4 if n <= 2048 else 16


LOOP_TILE_MAX = 2048  # memory tiles up to this many entries take the one-kernel loop by default


def time_loop_in_kernel(G: int, K: int, N: int, W: int) -> bool:
    """Whether the whole time loop runs in one launch each way (:mod:`memnets.ops.gpu.rows`), for
    a recurrent weight ``W_rh [G, K]`` and a memory of ``N × W``: by default where ``W_rh`` is
    small and the memory's tile has at most :data:`LOOP_TILE_MAX` entries. Past that the step
    alone takes every register a thread has (16 warps, 128 registers), and the loop's backward
    spills under triton 3.6 (at 128 × 20, sm_90: 120 bytes a thread; 8 per step; none under 3.9).
    ``MEMNETS_TIME_LOOP`` overrides."""
    return rows.time_loop_in_kernel(G, K, fits=_p2(N) * _p2(W) <= LOOP_TILE_MAX)


def _row_block(BC: int) -> int:
    """Rows of ``W_h`` per tile of the heads' linear layer: tiles of at most 4,096 entries."""
    return max(1, min(32, 4096 // BC))


def _forward_loop(gx, w_rh, w_h, b_h, M0, wr0, ww0, r0, h0, c0, *, meta, in_kernel=None):
    """The forward time loop on its arguments alone (what :func:`graphed` captures):
    ``(Ms, Wr, Ww, Cs, RH, Z, Pp, Aux)``, every step's state, the heads' parameters ``Pp`` and
    each head's content and shifted weightings ``Aux``, all buffers of its own. ``in_kernel``:
    the whole loop in one launch (None: :func:`time_loop_in_kernel` chooses)."""
    fwd, _, fwd_seq, _ = kernels()
    T, B, G = gx.shape
    N, W = M0.shape[1:]
    R, Hw, C = wr0.shape[1], ww0.shape[1], h0.shape[1]
    Pt = w_h.shape[0]
    lstm = meta["LSTM"]
    K = R * W + (C if lstm else 0)
    gx, w_rh, w_h, b_h = (t.contiguous() for t in (gx, w_rh, w_h, b_h))
    new = gx.new_empty
    Ms, Wr, Ww, Cs = new(T + 1, B, N, W), new(T + 1, B, R, N), new(T + 1, B, Hw, N), new(T + 1, B, C)
    RH, Z, Pp, Aux = new(T + 1, B, R * W + C), new(T, B, G), new(T, B, Pt), new(T, B, R + Hw, 2, N)
    Ms[0], Wr[0], Ww[0], Cs[0] = M0, wr0, ww0, c0
    RH[0, :, : R * W], RH[0, :, R * W:] = r0.reshape(B, R * W), h0
    scratch = new(B, 2 * meta["BN"])  # each program's rows for the circular shift
    if time_loop_in_kernel(G, K, N, W) if in_kernel is None else in_kernel:
        Z.copy_(gx)  # one launch: each program adds its rows of [r ; h]_{t-1} W_rhᵀ
        BK = rows.block(K)
        fwd_seq[(B,)](Z, Cs, Ms, Wr, Ww, RH, w_h, b_h, Pp, Aux, scratch, w_rh, T, B, G, K, N, W, C, R * W + C, Pt,
                      **meta, BK=BK, BJ=rows.tile(BK))
    else:
        for t in range(T):
            torch.addmm(gx[t], RH[t, :, :K], w_rh.t(), out=Z[t])
            fwd[(B,)](Z[t], Cs[t], Cs[t + 1], Ms[t], Ms[t + 1], Wr[t], Wr[t + 1], Ww[t], Ww[t + 1], RH[t + 1],
                      w_h, b_h, Pp[t], Aux[t], scratch, N, W, C, R * W + C, Pt, 0, **meta)
    if not lstm:
        Cs[1:] = c0
    return Ms, Wr, Ww, Cs, RH, Z, Pp, Aux


def _backward_loop(Z, Cs, Ms, Wr, Ww, Pp, Aux, w_rh, w_h, d_rh, dM, dwr, dww, dc, *, meta, K, in_kernel=None):
    """The backward time loop on its arguments alone: ``(dZ, DP, drhc, dM_0, dwr_0, dww_0,
    dc_0)``, all buffers of its own."""
    _, bwd, _, bwd_seq = kernels()
    T, B, G = Z.shape
    N, W = Ms.shape[2:]
    R, C = Wr.shape[2], Cs.shape[2]
    Pt = w_h.shape[0]
    w_rh, w_h = w_rh.contiguous(), w_h.contiguous()
    dMs, dWr, dWw, dCs = (torch.zeros_like(x) for x in (Ms, Wr, Ww, Cs))
    dMs[T], dWr[T], dWw[T], dCs[T] = dM, dwr, dww, dc
    dZ, DP = torch.empty_like(Z), Z.new_zeros(T, B, Pt)
    drhc = Z.new_zeros(B, K)  # d[r ; h]_t through the next step's z
    scratch = Z.new_empty(B, 2 * meta["BN"])  # each program's rows for the circular shift
    if time_loop_in_kernel(G, K, N, W) if in_kernel is None else in_kernel:  # one launch
        BG = rows.block(G)
        bwd_seq[(B,)](Z, Cs, Ms, Wr, Ww, Pp, Aux, w_h, d_rh.contiguous(), drhc, dMs, dWr, dWw, dCs, dZ, DP, scratch,
                      w_rh, T, B, G, N, W, C, R * W + C, K, Pt, **meta, BG=BG, BJ=rows.tile(BG))
        return dZ, DP, drhc, dMs[0], dWr[0], dWw[0], dCs[0]
    for t in range(T - 1, -1, -1):
        bwd[(B,)](Z[t], Cs[t], Ms[t], Ms[t + 1], Wr[t], Wr[t + 1], Ww[t], Ww[t + 1], Pp[t], Aux[t], w_h,
                  d_rh[t], drhc, dMs[t + 1], dMs[t], dWr[t + 1], dWr[t], dWw[t + 1], dWw[t], dCs[t + 1], dCs[t],
                  dZ[t], DP[t], scratch, N, W, C, R * W + C, K, Pt, 0, **meta)
        torch.mm(dZ[t], w_rh, out=drhc)
    return dZ, DP, drhc, dMs[0], dWr[0], dWw[0], dCs[0]


def _fresh_start(B, init, *, lstm, memory_init, like):
    """The learned initial state ``(read logits [R, N], write logits [Hw, N], r0 [R, W], h0 [C],
    c0 [C] (LSTM))`` spread over a batch of ``B``, the memory at ``memory_init``:
    ``(M0, wr0, ww0, r0, h0, c0)`` (expanded views)."""
    wl, wwl, r0, h0 = init[:4]
    N, W = wl.shape[1], r0.shape[1]
    M0 = like.new_full((B, N, W), memory_init)
    c0 = init[4].expand(B, -1) if lstm else like.new_zeros(B, h0.shape[0])
    return (M0, torch.softmax(wl, -1).expand(B, -1, -1), torch.softmax(wwl, -1).expand(B, -1, -1),
            r0.expand(B, -1, -1), h0.expand(B, -1), c0)


def _forward_graph(x, w_x, b_x, w_rh, w_h, b_h, *init, meta, memory_init, in_kernel=None):
    """What :class:`NTMScanTriton` replays forward: the controller's input projection, the
    initial state (spread from the learned one when ``memory_init`` is given) and
    :func:`_forward_loop`."""
    B, T = x.shape[:2]
    gx = torch.addmm(b_x, x.reshape(B * T, -1), w_x.t()).view(B, T, -1).transpose(0, 1)  # [T, B, G]
    if memory_init is not None:
        init = _fresh_start(B, init, lstm=meta["LSTM"], memory_init=memory_init, like=gx)
    return _forward_loop(gx, w_rh, w_h, b_h, *init, meta=meta, in_kernel=in_kernel)


def _backward_graph(x, w_x, w_rh, w_h, Z, Cs, Ms, Wr, Ww, Pp, Aux, RH, d_rh, dM, dwr, dww, dc, *, meta, K, fresh,
                    in_kernel=None):
    """What :class:`NTMScanTriton` replays backward: :func:`_backward_loop`, then the weights'
    gradients, the input projection's, and (``fresh``) the learned initial state's, summed over
    the batch: ``(dx, dw_x, db_x, dw_rh, dw_h, db_h, *initial state's)``."""
    dZ, DP, drhc, dM0, dWr0, dWw0, dC0 = _backward_loop(Z, Cs, Ms, Wr, Ww, Pp, Aux, w_rh, w_h, d_rh, dM, dwr, dww,
                                                        dc, meta=meta, K=K, in_kernel=in_kernel)
    T, B, G = Z.shape
    R, W, C = Wr.shape[2], Ms.shape[3], Cs.shape[2]
    Pt, lstm = w_h.shape[0], meta["LSTM"]
    d_wrh = torch.mm(dZ.reshape(T * B, G).t(), RH[:T, :, :K].reshape(T * B, K))
    d_wh = torch.mm(DP.reshape(T * B, Pt).t(), RH[1:, :, R * W:].reshape(T * B, C))
    d_bh = DP.sum((0, 1))
    dgx = dZ.transpose(0, 1).reshape(B * T, G)
    x2 = x.reshape(B * T, -1)
    grads = [torch.mm(dgx, w_x).view(x.shape), torch.mm(dgx.t(), x2), dgx.sum(0), d_wrh, d_wh, d_bh]
    dr0 = drhc[:, : R * W].reshape(B, R, W)
    dh0 = drhc[:, R * W:] if lstm else torch.zeros_like(Cs[0])
    if not fresh:
        return (*grads, dM0, dWr0, dWw0, dr0, dh0, dC0)
    # the logits' gradients through the start's softmax (the same for every sequence)
    d_wl = torch._softmax_backward_data(dWr0.sum(0), Wr[0, 0], -1, Wr.dtype)
    d_wwl = torch._softmax_backward_data(dWw0.sum(0), Ww[0, 0], -1, Ww.dtype)
    out = (*grads, d_wl, d_wwl, dr0.sum(0), dh0.sum(0))
    return out + ((dC0.sum(0),) if lstm else ())


class NTMScanTriton(torch.autograd.Function):
    """The NTM's recurrence on Triton kernels (module docstring), its input projection included.

    ``forward(x [B, T, F], w_x [G, F], b_x [G], w_rh [G, K], w_h [P, C], b_h [P], M0 [B, N, W],
    wr0 [B, R, N], ww0 [B, Hw, N], r0 [B, R, W], h0 [B, C], c0 [B, C], shifts, lstm)`` with
    ``G = 4C`` (LSTM, ``K = R W + C``) or ``C`` (``K = R W``), ``P = (R + Hw)(W + 3 + shifts) +
    2 Hw W`` -> ``(rh [T, B, R W + C] (each step's reads, then h), M_T, wr_T, ww_T, c_T)``. With
    ``memory_init`` (a number) the start is the learned one, spread over the batch inside: ``M0``
    None, ``wr0 [R, N]`` and ``ww0 [Hw, N]`` the weightings' logits, ``r0 [R, W]``, ``h0 [C]``,
    ``c0 [C]`` (None without LSTM). Forward and backward each run by :func:`graphed`. Every
    buffer it writes is its own."""

    @staticmethod
    def forward(ctx, x, w_x, b_x, w_rh, w_h, b_h, M0, wr0, ww0, r0, h0, c0, shifts: int, lstm: bool,
                memory_init=None):
        fresh = memory_init is not None
        B, T, F_in = x.shape
        R, Hw = wr0.shape[-2], ww0.shape[-2]
        N, W = wr0.shape[-1], r0.shape[-1]
        C = h0.shape[-1]
        S = int(shifts)
        K = R * W + (C if lstm else 0)
        G = 4 * C if lstm else C
        Pt = (R + Hw) * (W + 3 + S) + 2 * Hw * W
        b = () if fresh else (B,)
        want = {"x": (B, T, F_in), "w_x": (G, F_in), "b_x": (G,), "w_rh": (G, K), "w_h": (Pt, C), "b_h": (Pt,),
                "M0": (B, N, W), "wr0": b + (R, N), "ww0": b + (Hw, N), "r0": b + (R, W), "h0": b + (C,),
                "c0": b + (C,)}
        args = dict(x=x, w_x=w_x, b_x=b_x, w_rh=w_rh, w_h=w_h, b_h=b_h, M0=M0, wr0=wr0, ww0=ww0, r0=r0, h0=h0, c0=c0)
        if fresh:
            del args["M0"]
            if not lstm:
                del args["c0"]
        for name, t in args.items():
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want[name]:
                got = list(t.shape) if isinstance(t, torch.Tensor) else repr(t)
                raise ValueError(f"NTM recurrence: `{name}` expected shape {list(want[name])}, got {got}")
            if t.dtype != x.dtype or t.device != x.device:
                raise TypeError(f"NTM recurrence: `{name}` expected {x.dtype} on {x.device} like `x`, "
                                f"got {t.dtype} on {t.device}")
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"NTM recurrence expected float32 or float64, got {x.dtype}")
        if T < 1 or S < 1 or S % 2 == 0 or S > N or not applies(N, W, C):
            raise ValueError(f"NTM recurrence: T={T} >= 1, an odd shift count <= N={N} (got {S}), "
                             f"N <= {MAX_SLOTS}, W and C <= {MAX_WIDTH} expected")
        BN, BW, BC, BS = _p2(N), _p2(W), _p2(C), _p2(S)
        meta = dict(R=R, HW=Hw, S=S, LSTM=bool(lstm), BN=BN, BW=BW, BC=BC, BS=BS, RB=_row_block(BC),
                    num_warps=_warps(BN, BW))
        init = tuple(args[n] for n in ("wr0", "ww0", "r0", "h0") + (("c0",) if lstm else ())) if fresh else \
            (M0, wr0, ww0, r0, h0, c0)
        mi = float(memory_init) if fresh else None
        in_kernel = time_loop_in_kernel(G, K, N, W)  # the loop's form: part of the graphs' keys
        Ms, Wr, Ww, Cs, RH, Z, Pp, Aux = graphed(
            ("ntm.forward", tuple(sorted(meta.items())), mi, in_kernel),
            functools.partial(_forward_graph, meta=meta, memory_init=mi, in_kernel=in_kernel), x, w_x, b_x, w_rh, w_h,
            b_h, *init)
        ctx.save_for_backward(x, w_x, w_rh, w_h, Ms, Wr, Ww, Cs, RH, Z, Pp, Aux)
        ctx.meta, ctx.K, ctx.fresh, ctx.in_kernel = meta, K, fresh, in_kernel
        ctx.set_materialize_grads(False)  # backward makes the zeros of unused outputs itself, in one fill
        # copies, so that the outputs hold none of the per-step buffers: one multi-tensor copy
        return tuple(fresh_copies((RH[1:], Ms[T], Wr[T], Ww[T], Cs[T])))

    @staticmethod
    @backward_without_autocast
    def backward(ctx, d_rh, dM, dwr, dww, dc):
        x, w_x, w_rh, w_h, Ms, Wr, Ww, Cs, RH, Z, Pp, Aux = ctx.saved_tensors
        meta, K, fresh = ctx.meta, ctx.K, ctx.fresh
        T = Z.shape[0]

        # the gradients not given (outputs that took no part in the loss) as zeros, made by one fill
        given = (d_rh, dM, dwr, dww, dc)
        likes = (RH[1:], Ms[T], Wr[T], Ww[T], Cs[T])
        d_rh, dM, dwr, dww, dc = zeros_for_none(given, likes)
        out = graphed(("ntm.backward", tuple(sorted(meta.items())), K, fresh, ctx.in_kernel),
                      functools.partial(_backward_graph, meta=meta, K=K, fresh=fresh, in_kernel=ctx.in_kernel),
                      x, w_x, w_rh, w_h, Z, Cs, Ms, Wr, Ww, Pp, Aux, RH, d_rh, dM, dwr, dww, dc)
        dx = out[0] if ctx.needs_input_grad[0] else None
        if not fresh:
            return (dx, *out[1:], None, None, None)
        d_init = out[6:]
        dc0 = d_init[4] if meta["LSTM"] else None
        return (dx, *out[1:6], None, *d_init[:4], dc0, None, None, None)


def ntm_scan_triton(ntm, x: torch.Tensor, state=None):
    """Run ``ntm`` (:class:`memnets.memories.ntm.NTM`) over ``x [B, T, F]`` from ``state`` (an
    ``NTMState``; None: the learned start, made inside the graphed forward) on the kernels:
    ``(h [B, T, C], reads [B, T, R, W], (memory, read_weights, write_weights, reads, h, c))`` at
    the end. The controller's input projection runs with the recurrence (in the weights' dtype,
    autocast off)."""
    cfg = ntm.config
    B, T = x.shape[:2]
    R, W, C = cfg.read_heads, cfg.word_size, cfg.controller_size
    lstm = cfg.controller == "lstm"
    dt = ntm.ctrl_rh.weight.dtype  # under autocast the loop runs in the weights' dtype, autocast off
    weights = (x.to(dt), ntm.ctrl_x.weight, ntm.ctrl_x.bias, ntm.ctrl_rh.weight, ntm.heads.weight, ntm.heads.bias)
    if state is None:  # the learned start, spread over the batch inside
        init = (None, ntm.read_w0, ntm.write_w0, ntm.r0, ntm.h0, ntm.c0 if lstm else None)
        fresh, c_kept = (cfg.memory_init,), ntm.c0.unsqueeze(0).expand(B, *ntm.c0.shape)
    else:
        c0 = state.c if lstm else x.new_zeros(B, C, dtype=dt)
        init = tuple(t.contiguous().to(dt) for t in (state.memory, state.read_weights, state.write_weights,
                                                     state.reads, state.h, c0))
        fresh, c_kept = (), state.c
    with torch.autocast(x.device.type, enabled=False):
        rh, M, wr, ww, c = NTMScanTriton.apply(*weights, *init, 2 * cfg.shift_range + 1, lstm, *fresh)
    c_last = c if lstm else c_kept
    rh = rh.transpose(0, 1)  # [B, T, R W + C]
    reads, h = rh[..., : R * W].unflatten(-1, (R, W)), rh[..., R * W:]
    return h, reads, (M, wr, ww, reads[:, -1], h[:, -1], c_last)
