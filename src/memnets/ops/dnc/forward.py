"""The forward of :class:`~memnets.ops.dnc.recurrence.DNCRecurrence`: every step of the DNC
recurrence (docs/maths.md §8) into a :class:`~memnets.ops.dnc.workspace.ForwardWorkspace`."""
from __future__ import annotations

import torch

from .native import access_pointers, access_step, kernel
from .workspace import ForwardWorkspace

__all__ = ["run_forward"]


def run_forward(f: ForwardWorkspace, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0,
                reads0, ws, bs):
    """Fill the forward workspace ``f`` (every step of the recurrence)."""
    B, T = x.shape[:2]
    G4 = w_x.shape[0]
    C, Lc, RW = G4 // 4, len(ws), R * W
    inw = [RW] + [C] * (Lc - 1)
    top = Lc - 1
    X, CB = f.X, f.CB
    X[0][0, :, :RW] = reads0.reshape(B, RW)
    for layer in range(Lc):
        X[layer][0, :, inw[layer]:] = h0[:, layer]
        CB[layer][0] = c0[:, layer]
    f.U[0], f.WW[0], f.MEM[0], f.LNK[0], f.PREC[0], f.WR[0] = usage0, ww0, mem0, link0, prec0, wr0
    torch.linalg.vecdot(mem0, mem0, out=f.NRM[0]).add_(f.eps).rsqrt_()
    x_tb = x.transpose(0, 1).reshape(T * B, -1)
    torch.addmm(b_x * f.scale, x_tb, (w_x * f.scale.unsqueeze(-1)).t(), out=f.GX.view(T * B, G4))
    wT = [(w * f.scale.unsqueeze(-1)).t() for w in ws]
    bs = [None] + [b * f.scale for b in bs[1:]]
    w_xiT = w_xi.t()
    eps, offdiag, alloc, ones_rn, ones_nw = f.eps, f.offdiag, f.alloc, f.ones_rn, f.ones_nw
    GXv, Xv, Hv, Xin, Av, Ai, Af, Ag, Ao, CBv, TCv = (f.GXv, f.Xv, f.Hv, f.Xin, f.Av, f.Ai, f.Af, f.Ag, f.Ao,
                                                       f.CBv, f.TCv)
    XIv, xi_keys, xi_str, v_row, xi_sig, xi_modes = f.XIv, f.xi_keys, f.xi_str, f.v_row, f.xi_sig, f.xi_modes
    SPv, SGv, e_row, free_col, g_a, g_w = f.SPv, f.SGv, f.e_row, f.free_col, f.g_a, f.g_w
    PIv, PI0, PI1, PI2, KHv, RHOv, KHr, KHw = f.PIv, f.PI0, f.PI1, f.PI2, f.KHv, f.RHOv, f.KHr, f.KHw
    KEEPRv, PSIv, UBv, Uv, SUv, PHIv, EXv, SUh, EXt = (f.KEEPRv, f.PSIv, f.UBv, f.Uv, f.SUv, f.PHIv, f.EXv,
                                                        f.SUh, f.EXt)
    S0Wv, S0Ws, CWv, DIFF, INNER, WWv, WWcol, WWrow = (f.S0Wv, f.S0Ws, f.CWv, f.DIFF, f.INNER, f.WWv, f.WWcol,
                                                        f.WWrow)
    KEEPMv, MEMv, MEMT, DECv, LNKv, LNKTs, LLv = f.KEEPMv, f.MEMv, f.MEMT, f.DECv, f.LNKv, f.LNKTs, f.LLv
    SWv, PRECv, PRECrow, BFv, BWDv, FWDv, CRv = f.SWv, f.PRECv, f.PRECrow, f.BFv, f.BWDv, f.FWDv, f.CRv
    NRMv, NRMrow, S0Rv, WRv, RDv, RDin = f.NRMv, f.NRMrow, f.S0Rv, f.WRv, f.RDv, f.RDin
    step = kernel(x)  # the access in C (memnets.ops.dnc.native), else the ops below
    ptrs = access_pointers(f, R, W) if step is not None else None

    for t in range(T):
        # LSTM controller, bottom to top
        for layer in range(Lc):
            a = Av[layer][t]
            torch.addmm(GXv[t] if layer == 0 else bs[layer], Xv[layer][t], wT[layer], out=a)
            a.sigmoid_()
            c = torch.mul(Af[layer][t], CBv[layer][t], out=CBv[layer][t + 1])
            c.sub_(Ai[layer][t]).addcmul_(Ai[layer][t], Ag[layer][t], value=2)  # + σ(i) (2σ(2g) − 1)
            torch.tanh(c, out=TCv[layer][t])
            h = torch.mul(Ao[layer][t], TCv[layer][t], out=Hv[layer][t + 1])
            if layer < top:
                Xin[layer + 1][t].copy_(h)
        # interface
        torch.addmm(b_xi, h, w_xiT, out=XIv[t])
        if step is not None:
            access_step(step, f, R, W, t, ptrs)
            continue
        sp = torch._C._nn.softplus(xi_str[t], 1, 20, out=SPv[t])
        torch.sigmoid(xi_sig[t], out=SGv[t])
        torch._softmax(xi_modes[t], -2, False, out=PIv[t])
        K = xi_keys[t]
        rho = torch.linalg.vecdot(K, K, out=RHOv[t]).add_(eps).rsqrt_()
        torch.mul(K, torch.addcmul(rho, sp, rho).unsqueeze(-1), out=KHv[t])  # β ρ k
        # retention, usage, allocation
        torch.addcmul(ones_rn, free_col[t], WRv[t], value=-1, out=KEEPRv[t])
        psi = torch.prod(KEEPRv[t], 1, out=PSIv[t])
        u_bar = torch.add(Uv[t], WWv[t], out=UBv[t]).addcmul_(Uv[t], WWv[t], value=-1)
        u = torch.mul(u_bar, psi, out=Uv[t + 1])
        torch.sort(u, dim=-1, stable=True, out=(SUv[t], PHIv[t]))
        torch.cumprod(SUh[t], -1, out=EXt[t])
        alloc.scatter_(-1, PHIv[t], torch.addcmul(EXv[t], SUv[t], EXv[t], value=-1))
        # write content weighting on M_{t-1}, write weighting
        torch.bmm(MEMv[t], KHw[t], out=S0Wv[t])
        cw = torch._softmax(torch.mul(S0Ws[t], NRMv[t]), -1, False, out=CWv[t])
        diff = torch.sub(alloc, cw, out=DIFF[t])
        inner = torch.addcmul(cw, diff, g_a[t], out=INNER[t])
        torch.mul(inner, g_w[t], out=WWv[t + 1])
        wcol = WWcol[t + 1]
        # erase/add write
        keep = torch.addcmul(ones_nw, wcol, e_row[t], value=-1, out=KEEPMv[t])
        torch.mul(MEMv[t], keep, out=MEMv[t + 1]).addcmul_(wcol, v_row[t])
        # link, precedence
        dec = torch.add(wcol, WWrow[t + 1], out=DECv[t])  # w_i + w_j
        lnk = torch.addcmul(LNKv[t], LNKv[t], dec, value=-1, out=LNKv[t + 1]).addcmul_(wcol, PRECrow[t]).mul_(offdiag)
        sw = torch.sum(WWv[t + 1], -1, keepdim=True, out=SWv[t])
        torch.addcmul(PRECv[t], PRECv[t], sw, value=-1, out=PRECv[t + 1]).add_(WWv[t + 1])
        # directional weightings: [b | f] = w^r_{t-1} [L | Lᵀ]
        LNKTs[t + 1].copy_(lnk.transpose(1, 2))
        torch.bmm(WRv[t], LLv[t + 1], out=BFv[t])
        # read content weighting on M_t, read weighting, read
        mem = MEMv[t + 1]
        torch.linalg.vecdot(mem, mem, out=NRMv[t + 1]).add_(eps).rsqrt_()
        torch.bmm(KHr[t], MEMT[t + 1], out=S0Rv[t])
        torch._softmax(torch.mul(S0Rv[t], NRMrow[t + 1]), -1, False, out=CRv[t])
        wr = torch.mul(BWDv[t], PI0[t], out=WRv[t + 1]).addcmul_(CRv[t], PI1[t]).addcmul_(FWDv[t], PI2[t])
        torch.bmm(wr, mem, out=RDv[t])
        RDin[t].copy_(RDv[t].view(B, RW))

