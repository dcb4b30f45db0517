"""The hand-derived backward of :class:`~memnets.ops.dnc.recurrence.DNCRecurrence` (docs/maths.md §8).

It first computes every local derivative that depends on forward values only, for all steps at
once (gate derivatives, the allocation Jacobian with the sort permutation held constant, the
retention products, ...), so that the reverse loop is a short chain of multiplies and small
matmuls; the recurrent weight gradients are one matmul each after the loop.
"""
from __future__ import annotations

import torch

from .layout import interface_layout
from .native import backward_pointers, backward_scratch, backward_step, kernel
from .workspace import BackwardWorkspace, ForwardWorkspace

__all__ = ["run_backward", "allocation_jacobian"]


def allocation_jacobian(g: BackwardWorkspace, su: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
    """``g.JS[..., j, k] = ∂a_k/∂s_j`` of the sort-based allocation (docs/maths.md §8) in sorted order
    (s = the usage sorted ascending, ex = ``Π_{i<j} s_i``; the permutation is held constant):
    ``(1 − s_k) Π_{i<k, i≠j} s_i`` for j < k, ``−Π_{i<j} s_i`` for j = k, 0 for j > k
    (products, not quotients: usages are often exactly 0)."""
    c = g.JC
    c.copy_(su.unsqueeze(-2).expand_as(c)).diagonal(dim1=-2, dim2=-1).fill_(1)
    c.cumprod_(-1)  # [j, k] = Π_{i≤k, i≠j} s_i
    js = g.JS
    js[..., 0] = 0
    torch.mul(c[..., :-1], (1 - su[..., 1:]).unsqueeze(-2), out=js[..., 1:]).mul_(g.upper[:, 1:])
    js.diagonal(dim1=-2, dim2=-1).copy_(ex).neg_()
    return js


def run_backward(f: ForwardWorkspace, g: BackwardWorkspace, R, W, x, w_x, w_xi, ws, dHR, dhT, dcT, dM, du, dL,
                 dp, dwr, dww, need_dx=True, lengths=None):
    """Fill ``g`` and return the gradients of every input of the recurrence (docs/maths.md §8), in
    the order of :meth:`DNCRecurrence.forward`'s tensor inputs after ``dims`` (``dx`` None unless
    ``need_dx``); ``f`` holds a completed forward. ``lengths`` ``[B]`` (or None: every sequence
    T long): the final state's gradients of sequence b enter after its step ``lengths[b]``."""
    T, B = dHR.shape[:2]
    C = f.TC[0].shape[-1]
    Lc, N, RW, G4, lay, top = len(ws), f.SU.shape[-1], R * W, 4 * C, interface_layout(R, W), len(ws) - 1
    dt, BR = f.XI.dtype, B * R
    v = f.bv
    SG, XI, RHO, WR, PI = f.SG, f.XI, f.RHO, f.WR, f.PI

    # ---- local derivatives of every step at once
    for layer in range(Lc):
        si, sf, sg, so = f.A[layer].chunk(4, -1)
        gi, gfg, gg, go = g.GF[layer].chunk(4, -1)
        tc, c_prev = f.TC[layer], f.CB[layer][:-1]
        tg = torch.addcmul(f.one.neg(), sg, f.two)  # tanh(g) = 2σ(2g) − 1
        torch.addcmul(si, si, si, value=-1, out=gi).mul_(tg)  # tanh(g) σ'(i)
        torch.addcmul(sf, sf, sf, value=-1, out=gfg).mul_(c_prev)  # c_{t-1} σ'(f)
        torch.addcmul(si, si, tg * tg, value=-1, out=gg)  # σ(i) (1 − tanh² g)
        torch.addcmul(so, so, so, value=-1, out=go).mul_(tc)  # tanh(c) σ'(o)
        torch.addcmul(so, so, tc * tc, value=-1, out=g.ODT[layer])  # σ(o) (1 − tanh² c)
    g_a, g_w = SG[..., W + R:W + R + 1], SG[..., W + R + 1:]
    SGD = torch.addcmul(SG, SG, SG, value=-1, out=g.SGD)
    SGD[..., W + R] *= SG[..., W + R + 1]  # ∂w^w/∂g_a carries the write gate
    SGD[..., :W].neg_()  # ∂M_t/∂e = −w^w M_{t-1}: the sign is applied here
    sp_d = torch.ops.aten.softplus_backward(torch.ones_like(f.SP), XI[..., lay["str"]:lay["v"]], 1.0, 20.0)
    torch.mul(sp_d, RHO, out=g.RSP)  # ∂ξ_str = q ρ softplus'
    torch.addcmul(RHO, f.SP, RHO, out=g.BR)  # β ρ
    torch.mul(g.BR, RHO, out=g.NBR3).mul_(RHO).neg_()  # −β ρ³
    torch.addcmul(g_w, g_w, g_a, value=-1, out=g.CWC)  # g_w (1 − g_a)
    allocation_jacobian(g, f.SU, f.EX).mul_((g_w * g_a).unsqueeze(-1))  # ∂w^w/∂a = g_w g_a
    torch.sub(f.PREC[:-1].unsqueeze(-2), f.LNK[:-1], out=g.Q)
    torch.sub(f.one, f.SW, out=g.OMSW)
    torch.addcmul(f.PSI, f.PSI, f.WW[:-1], value=-1, out=g.FU)  # ψ (1 − w^w_{t-1})
    torch.addcmul(f.PSI, f.PSI, f.U[:-1], value=-1, out=g.FW)  # ψ (1 − u_{t-1})
    keep, noth, rgt = f.KEEPR, g.NOTH, g.RGT  # −Π_{r'≠r} (1 − f_r' w_r')
    noth[:, :, 0] = -1
    torch.cumprod(keep[:, :, :-1], 2, out=noth[:, :, 1:]).neg_()
    rgt[:, :, R - 1] = 1
    for r in range(R - 2, -1, -1):
        torch.mul(rgt[:, :, r + 1], keep[:, :, r + 1], out=rgt[:, :, r])
    noth.mul_(rgt).mul_(f.UB.unsqueeze(2))  # times ū: d u_t = ū ψ → d ψ = d u_t ū
    torch.mul(f.NRM, f.NRM, out=g.NEGN3).mul_(f.NRM).neg_()
    torch.mul(f.S0R, g.NEGN3[1:].unsqueeze(-2), out=g.S0RN)
    torch.mul(f.S0W.squeeze(-1), g.NEGN3[:-1], out=g.S0WN)
    step = kernel(dHR, backward=True)  # the access part of each reverse step in C (memnets.ops.dnc.native)
    if step is None:  # factors the C step takes from the forward's buffers itself
        torch.stack([f.BF[..., :N], f.CR, f.BF[..., N:]], 3, out=g.BCF)
        g.PI02[..., 0, 0] = PI[:, :, 0]
        g.PI02[..., 1, 0] = PI[:, :, 2]
        torch.mul(WR[:-1], PI[:, :, 0].unsqueeze(-1), out=g.Z[:, :, :R])
        torch.mul(WR[:-1], PI[:, :, 2].unsqueeze(-1), out=g.Z[:, :, 2 * R:])
        g.VE[..., 0, :W] = XI[..., lay["v"]:lay["sig"]]
        torch.neg(SG[..., :W], out=g.VE[..., 0, W:])

    # ---- incoming gradients
    if Lc == 1:
        g.EXT0.copy_(dHR)
    else:
        g.EXT0[..., :RW] = dHR[..., :RW]
        g.EXT0[..., RW:] = 0
        for layer in range(1, Lc):
            if layer == top:
                g.GH[layer].copy_(dHR[..., RW:])
            else:
                g.GH[layer].zero_()
    finals = (dM, du, dL, dp, dwr, dww, *dcT.unbind(1))
    if lengths is None:
        for layer in range(Lc):
            g.GH[layer][T - 1] += dhT[:, layer]
        gM, gu, gL, gp, gwr, gww, *gc = [d.clone(memory_format=torch.contiguous_format) for d in finals]
        ends: dict[int, torch.Tensor] = {}
    else:  # each sequence's final state is its state after its own last step: its gradients enter there
        rows = torch.arange(B, device=dhT.device)
        for layer in range(Lc):
            g.GH[layer].index_put_((lengths - 1, rows), dhT[:, layer], accumulate=True)
        gM, gu, gL, gp, gwr, gww, *gc = [torch.zeros(d.shape, dtype=d.dtype, device=d.device) for d in finals]
        ends = {int(e): (lengths == e).nonzero().squeeze(1) for e in lengths.unique()}
    init_h = [None] * Lc  # grads of the initial h^l (l >= 1)
    gn = torch.zeros_like(f.NRM[0])  # d n_t ∂n_t/∂|M_t[i]|², i.e. times −n³
    if step is not None:  # the carried gradients, updated in place by each C step
        carried, scratch = [gM, gu, gL, gp, gwr, gww, gn], backward_scratch(B, N, W, R, gn)  # held to the end
        cptrs = backward_pointers(f, g, R, W, carried, scratch)
    offdiag, GKH, GKHr, GKHw, GFB, GFB4 = f.offdiag, g.GKH, g.GKHr, g.GKHw, g.GFB, g.GFB4
    GMM, GMMa, GMMb = g.GMM, g.GMMa, g.GMMb
    ctrl, GHv, GZv, GZ3, GZo, EXT0v, GXIv = g.ctrl, g.GHv, g.GZv, g.GZ3, g.GZo, g.EXT0v, g.GXIv
    g_keys, g_str, g_ve, g_free, g_gates, g_sig, g_modes = (g.g_keys, g.g_str, g.g_ve, g.g_free, g.g_gates, g.g_sig,
                                                             g.g_modes)
    SGDv, RSPv, BRcol, NBR3v, CWCv, JSv, OMSWv, FUv, FWv, NOTHv, S0RNv, S0WNv = (
        g.SGDv, g.RSPv, g.BRcol, g.NBR3v, g.CWCv, g.JSv, g.OMSWv, g.FUv, g.FWv, g.NOTHv, g.S0RNv, g.S0WNv)
    Qv = g.Qv
    BCFv, PI02v, Zmid, ZXT, ZY, VEv, GRv = g.BCFv, g.PI02v, g.Zmid, g.ZXT, g.ZY, g.VEv, g.GRv
    sfv, xi_keys, PIv, PI1, CRv, MEMv, MEMT, WRT = v.sf, v.xi_keys, v.PIv, v.PI1, v.CRv, v.MEMv, v.MEMT, v.WRT
    NRMv, NRMrow, LLTv, LNKv, DECv, WWrow = v.NRMv, v.NRMrow, v.LLTv, v.LNKv, v.DECv, v.WWrow
    PRECv, KEEPMv, DIv, CWv, KHr, KHw, WRv, free_col, PHIv = (
        v.PRECv, v.KEEPMv, v.DIv, v.CWv, v.KHr, v.KHw, v.WRv, v.free_col, v.PHIv)

    for t in range(T - 1, -1, -1):
        if t + 1 in ends:  # the sequences whose last step is t: their final state's gradients
            idx = ends[t + 1]
            for acc, d in zip((gM, gu, gL, gp, gwr, gww, *gc), finals):
                acc.index_add_(0, idx, d.index_select(0, idx))
        if step is not None:  # the access part in C: the carried gradients updated in place
            backward_step(step, f, R, W, t, cptrs, g.EXT0.shape[-1])
        else:
            mem = MEMv[t + 1]
            # read r_t = w^r_t M_t
            gr = GRv[t]
            gwr.baddbmm_(gr, MEMT[t + 1])
            gM.baddbmm_(WRT[t + 1], gr)
            # read weighting w^r = π0 b + π1 c + π2 f
            gpi = torch.bmm(BCFv[t], gwr.view(BR, N, 1)).view(B, R, 3).transpose(1, 2)  # [B, 3, R]
            g_modes[t].copy_(torch._softmax_backward_data(gpi, PIv[t], -2, dt))  # (its out= ignores strides)
            gcr = torch.mul(gwr, PI1[t])
            torch.mul(gwr.unsqueeze(-2), PI02v[t], out=GFB4)  # (d b | d f)
            Zmid[t].copy_(gwr)
            # read content weighting on M_t
            gs = torch._softmax_backward_data(gcr, CRv[t], -1, dt)
            gn.add_(torch.linalg.vecdot(gs, S0RNv[t], dim=1))
            gS0 = torch.mul(gs, NRMrow[t + 1])
            GKHr.copy_(torch.bmm(gS0, mem))
            gM.baddbmm_(gS0.transpose(1, 2), KHr[t])
            # row norms of M_t
            gM.addcmul_(mem, gn.unsqueeze(-1))
            # directional weightings [b | f] = w^r_{t-1} [L | Lᵀ]
            gwr_prev = torch.bmm(GFB, LLTv[t + 1])
            gL.baddbmm_(ZXT[t], ZY[t])  # + (π2 d w^r)ᵀ w^r_{t-1} + w^r_{t-1}ᵀ (π0 d w^r)
            # link
            G = torch.mul(gL, offdiag)
            gL_prev = torch.addcmul(G, G, DECv[t], value=-1)
            gww.add_(torch.linalg.vecdot(G, Qv[t])).sub_(torch.linalg.vecdot(G, LNKv[t], dim=1))
            gp_link = torch.bmm(WWrow[t + 1], G).squeeze(1)  # Σ_i w_i G_ij
            # precedence
            gww.add_(gp).sub_(torch.linalg.vecdot(gp, PRECv[t]).unsqueeze(-1))
            gp_prev = torch.mul(gp, OMSWv[t]).add_(gp_link)
            # erase/add write
            GMMa.copy_(gM)
            torch.mul(gM, MEMv[t], out=GMMb)
            gww.add_(torch.linalg.vecdot(GMM, VEv[t]))  # Σ_w dM (v − M_{t-1} e)
            g_ve[t].copy_(torch.bmm(WWrow[t + 1], GMM).squeeze(1))  # (d v | d e), the sign of d e in SGD
            gM_prev = torch.mul(gM, KEEPMv[t])
            # write weighting
            g_gates[t].copy_(torch.bmm(DIv[t], gww.unsqueeze(-1)).squeeze(-1))  # (d g_a, d g_w), g_w's factor in SGD
            gcw = torch.mul(gww, CWCv[t])
            phi = PHIv[t]  # allocation, in sorted order: d s = J_s d a[φ]; d u[φ] += d s
            gu.scatter_add_(-1, phi, torch.bmm(JSv[t], torch.gather(gww, -1, phi).unsqueeze(-1)).squeeze(-1))
            # write content weighting on M_{t-1}
            gsw = torch._softmax_backward_data(gcw, CWv[t], -1, dt)
            gn_prev = torch.mul(gsw, S0WNv[t])
            gS0w = torch.mul(gsw, NRMv[t])
            torch.linalg.vecdot(MEMv[t], gS0w.unsqueeze(-1), dim=1, out=GKHw)
            gM_prev.addcmul_(gS0w.unsqueeze(-1), KHw[t])
            # usage and retention
            gu_prev = torch.mul(gu, FUv[t])
            gww_prev = torch.mul(gu, FWv[t])
            gkeep = torch.mul(gu.unsqueeze(1), NOTHv[t])
            torch.linalg.vecdot(gkeep, WRv[t], out=g_free[t])
            gwr_prev.addcmul_(gkeep, free_col[t])
            # keys: k̂ = β ρ k
            K = xi_keys[t]
            q = torch.linalg.vecdot(GKH, K)
            torch.mul(q, RSPv[t], out=g_str[t])
            torch.mul(GKH, BRcol[t], out=g_keys[t]).addcmul_(K, torch.mul(q, NBR3v[t]).unsqueeze(-1))
            g_sig[t].mul_(SGDv[t])
        # interface, then the controller top-down
        gh = torch.addmm(GHv[top][t], GXIv[t], w_xi)
        for layer in range(top, -1, -1):
            gf3, gfo, odt = ctrl[layer][0][t], ctrl[layer][1][t], ctrl[layer][2][t]
            if layer < top:
                gh = GHv[layer][t]
            gcl = gc[layer].addcmul_(gh, odt)
            torch.mul(gcl.unsqueeze(1), gf3, out=GZ3[layer][t])
            torch.mul(gh, gfo, out=GZo[layer][t])
            gc[layer] = torch.mul(gcl, sfv[layer][t])
            if layer == 0:
                if t > 0:
                    EXT0v[t - 1].addmm_(GZv[0][t], ws[0])
                else:
                    g_init0 = torch.mm(GZv[0][0], ws[0])
            else:
                tmp = torch.mm(GZv[layer][t], ws[layer])
                GHv[layer - 1][t].add_(tmp[:, :C])
                if t > 0:
                    GHv[layer][t - 1].add_(tmp[:, C:])
                else:
                    init_h[layer] = tmp[:, C:]
        if step is None:
            gM, gn, gu, gL, gp, gwr, gww = gM_prev, gn_prev, gu_prev, gL_prev, gp_prev, gwr_prev, gww_prev

    gM.addcmul_(f.MEM[0], gn.unsqueeze(-1))
    dh0 = torch.stack([g_init0[:, RW:]] + init_h[1:], 1)
    dc0 = torch.stack(gc, 1)
    dreads0 = g_init0[:, :RW].reshape(B, R, W)
    TB = T * B
    d_upper = []
    dw0 = g.GZ[0].view(TB, G4).t() @ f.X[0][:T].reshape(TB, -1)
    for layer in range(1, Lc):
        d_upper.append(g.GZ[layer].view(TB, G4).t() @ f.X[layer][:T].reshape(TB, -1))
        d_upper.append(g.GZ[layer].sum((0, 1)))
    Htop = f.X[top][1:, :, f.X[top].shape[-1] - C:].reshape(TB, C)
    dw_xi = g.GXI.view(TB, -1).t() @ Htop
    db_xi = g.GXI.sum((0, 1))
    gz0 = g.GZ[0].view(TB, G4)
    x_tb = x.transpose(0, 1).reshape(TB, -1)
    # (W_xᵀ dzᵀ)ᵀ and (x_tbᵀ dz)ᵀ: the small dimension first is several times faster (few input features)
    dx = (w_x.t() @ gz0.t()).t().view(T, B, -1).transpose(0, 1) if need_dx else None
    dw_x = (x_tb.t() @ gz0).t()
    db_x = gz0.sum(0)
    return (dx, dw_x, db_x, dw_xi, db_xi, dh0, dc0, gM, gu, gL, gp, gwr, gww, dreads0, dw0, *d_upper)
