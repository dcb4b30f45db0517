"""The DNC recurrence over a whole sequence as one autograd Function (SPEC §8; the fast path).

:class:`DNCRecurrence` runs every time step of the LSTM controller (all layers) and of the
memory access — retention, usage, sort-based allocation, content weightings, write weighting,
erase/add write, temporal link, precedence, directional and read weightings, read — without
autograd, into preallocated ``[T, ...]`` buffers, and walks the steps in reverse in a
hand-derived backward. What does not depend on the recurrence stays outside as plain batched
autograd ops: the input half of the first controller layer (``gx``), the readout, the row
permutation of the interface layer. Inside, the backward first computes every local
derivative that depends on forward values only, for all steps at once (gate derivatives,
the allocation Jacobian with the sort permutation held constant, the retention products,
…), so that the reverse loop is a short chain of multiplies and small matmuls; the recurrent
weight gradients are one matmul each after the loop.

The per-equation reference is ``DNC(impl="reference")``; tests hold both equal in float64
(values, final state, gradients of every parameter, the input and the initial state) and
run ``gradcheck`` on this Function. Not twice differentiable.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = ["DNCRecurrence", "interface_permutation", "interface_layout"]

_EPS = 1e-6  # inside every norm's square root, as in memnets.ops.addressing


def interface_layout(R: int, W: int) -> dict[str, int]:
    """Offsets of the permuted interface vector: keys ``(R+1)·W`` (R read keys, then the write
    key), strengths ``R+1`` (read, then write), write vector ``W``, then the σ block
    (erase ``W``, free gates ``R``, allocation gate, write gate) and the read modes ``3R``."""
    o = {"keys": 0, "str": (R + 1) * W}
    o["v"] = o["str"] + R + 1
    o["sig"] = o["v"] + W  # erase
    o["free"] = o["sig"] + W
    o["ga"] = o["free"] + R
    o["gw"] = o["ga"] + 1
    o["modes"] = o["gw"] + 1
    o["size"] = o["modes"] + 3 * R
    return o


def interface_permutation(R: int, W: int, device=None) -> torch.Tensor:
    """Row indices taking the DNC interface layer (SPEC §8 order: read keys, read strengths,
    write key, write strength, erase, write vector, free gates, allocation gate, write gate,
    read modes) to the layout of :func:`interface_layout`."""
    sizes = [R * W, R, W, 1, W, W, R, 1, 1, 3 * R]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    k_r, b_r, k_w, b_w, erase, v, free, g_a, g_w, modes = (
        torch.arange(s, s + n, device=device) for s, n in zip(starts, sizes))
    return torch.cat([k_r, k_w, b_r, b_w, v, erase, free, g_a, g_w, modes])


class DNCRecurrence(torch.autograd.Function):
    """``apply(dims, gx, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
    w1, b1, …)``.

    dims = (R, W). gx ``[T, B, 4C]``: the input half of the first LSTM layer, bias included.
    w_xi ``[I, C]``, b_xi ``[I]``: the interface layer, rows permuted by
    :func:`interface_permutation`. Initial state: h0, c0 ``[B, layers, C]``, mem0 ``[B, N, W]``,
    usage0 ``[B, N]``, link0 ``[B, N, N]``, prec0 ``[B, N]``, wr0 ``[B, R, N]``, ww0 ``[B, N]``,
    reads0 ``[B, R, W]``. w0 ``[4C, R·W + C]``: the recurrent weight of layer 0 (acting on
    ``[r_{t-1}; h_{t-1}]``); w_l ``[4C, 2C]``, b_l ``[4C]`` for the layers above (acting on
    ``[h^{l-1}_t; h^l_{t-1}]``).

    Returns ``(H [T, B, C], reads [T, B, R·W], h [B, layers, C], c [B, layers, C], memory,
    usage, link, precedence, read_weights, write_weights)``: the top controller layer's output
    and the read vectors of every step, then the final state.
    """

    @staticmethod
    def forward(ctx, dims, gx, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0, *upper):
        R, W = dims
        T, B, G4 = gx.shape
        C, N, Lc = G4 // 4, mem0.shape[1], 1 + len(upper) // 2
        RW, lay = R * W, interface_layout(R, W)
        ws = [w0] + list(upper[0::2])
        bs = [None] + list(upper[1::2])
        inw = [RW] + [C] * (Lc - 1)
        new = gx.new_empty
        with torch.no_grad():
            # ---- controller buffers: X[l][t] = input of layer l at step t ([r_{t-1}; h_{t-1}] or
            # [h^{l-1}_t; h^l_{t-1}]); step t writes h^l_t into X[l][t+1][:, inw:]
            X = [new(T + 1, B, inw[l] + C) for l in range(Lc)]
            Z = [new(T, B, G4) for _ in range(Lc)]
            A = [new(T, B, G4) for _ in range(Lc)]  # (σ(i), σ(f), tanh(g), σ(o))
            CB = [new(T + 1, B, C) for _ in range(Lc)]
            TC = [new(T, B, C) for _ in range(Lc)]
            X[0][0, :, :RW] = reads0.reshape(B, RW)
            for layer in range(Lc):
                X[layer][0, :, inw[layer]:] = h0[:, layer]
                CB[layer][0] = c0[:, layer]
            # ---- access buffers
            XI = new(T, B, lay["size"])
            SG = new(T, B, W + R + 2)  # σ block: erase, free, g_a, g_w
            PI = new(T, B, R, 3)
            KH = new(T, B, R + 1, W)  # β-scaled unit keys
            RHO = new(T, B, R + 1)
            KEEPR = new(T, B, R, N)
            PSI = new(T, B, N)
            UB = new(T, B, N)
            U = new(T + 1, B, N)
            SU = new(T, B, N)
            PHI = torch.empty(T, B, N, dtype=torch.long, device=gx.device)
            EX = new(T, B, N)
            EX[:, :, 0] = 1
            S0W = new(T, B, N, 1)
            CW = new(T, B, N)
            DI = new(T, B, 2, N)  # (allocation − content, inner) of the write weighting
            WW = new(T + 1, B, N)
            KEEPM = new(T, B, N, W)
            MEM = new(T + 1, B, N, W)
            DEC = new(T, B, N, N)
            LNK = new(T + 1, B, N, N)
            SW = new(T, B, 1)
            PREC = new(T + 1, B, N)
            FWD, CR, BWD = new(T, B, R, N), new(T, B, R, N), new(T, B, R, N)
            NRM = new(T + 1, B, N)
            S0R = new(T, B, R, N)
            WR = new(T + 1, B, R, N)
            RD = new(T, B, R, W)
            U[0], WW[0], MEM[0], LNK[0], PREC[0], WR[0] = usage0, ww0, mem0, link0, prec0, wr0
            torch.linalg.vecdot(mem0, mem0, out=NRM[0]).add_(_EPS).rsqrt_()
            offdiag = 1 - torch.eye(N, dtype=gx.dtype, device=gx.device)
            one = gx.new_ones(1, 1, 1)
            alloc = new(B, N)
            SP = []

            # ---- per-step views, made once
            ub = torch.Tensor.unbind
            gx_ = ub(gx)
            Xv = [ub(x) for x in X]
            Hv = [ub(X[layer][:, :, inw[layer]:]) for layer in range(Lc)]
            Xin = [None] + [ub(X[layer][:, :, :C]) for layer in range(1, Lc)]
            Zv, Zg = [ub(z) for z in Z], [ub(z[..., 2 * C:3 * C]) for z in Z]
            Av = [ub(a) for a in A]
            Ai, Af, Ag, Ao = ([ub(a[..., k * C:(k + 1) * C]) for a in A] for k in range(4))
            CBv, TCv = [ub(c) for c in CB], [ub(c) for c in TC]
            XIv = ub(XI)
            xi_keys = ub(XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
            xi_str = ub(XI[..., lay["str"]:lay["v"]])
            v_row = ub(XI[..., lay["v"]:lay["sig"]].unsqueeze(-2))
            xi_sig = ub(XI[..., lay["sig"]:lay["modes"]])
            xi_modes = ub(XI[..., lay["modes"]:].unflatten(-1, (R, 3)))
            SGv = ub(SG)
            e_row = ub(SG[..., :W].unsqueeze(-2))
            free_col = ub(SG[..., W:W + R].unsqueeze(-1))
            g_a = ub(SG[..., W + R:W + R + 1])
            g_w = ub(SG[..., W + R + 1:])
            PIv, PI0, PI1, PI2 = ub(PI), ub(PI[..., 0:1]), ub(PI[..., 1:2]), ub(PI[..., 2:3])
            KHv, RHOv = ub(KH), ub(RHO)
            KHr, KHw = ub(KH[:, :, :R]), ub(KH[:, :, R].unsqueeze(-1))
            KEEPRv, PSIv, UBv, Uv = ub(KEEPR), ub(PSI), ub(UB), ub(U)
            SUv, PHIv, EXv = ub(SU), ub(PHI), ub(EX)
            SUh, EXt = ub(SU[..., :-1]), ub(EX[..., 1:])
            S0Wv, S0Ws, CWv = ub(S0W), ub(S0W.squeeze(-1)), ub(CW)
            DIFF, INNER = ub(DI[:, :, 0]), ub(DI[:, :, 1])
            WWv, WWcol, WWrow = ub(WW), ub(WW.unsqueeze(-1)), ub(WW.unsqueeze(-2))
            KEEPMv, MEMv, MEMT = ub(KEEPM), ub(MEM), ub(MEM.transpose(-1, -2))
            DECv, LNKv, LNKT = ub(DEC), ub(LNK), ub(LNK.transpose(-1, -2))
            SWv, PRECv, PRECrow = ub(SW), ub(PREC), ub(PREC.unsqueeze(-2))
            BWDv, CRv, FWDv = ub(BWD), ub(CR), ub(FWD)
            NRMv, NRMrow = ub(NRM), ub(NRM.unsqueeze(-2))
            S0Rv, WRv, RDv = ub(S0R), ub(WR), ub(RD)
            RDin = ub(X[0][1:, :, :RW])
            wT = [w.t() for w in ws]
            w_xiT = w_xi.t()
            top = Lc - 1

            for t in range(T):
                # LSTM controller, bottom to top
                for layer in range(Lc):
                    torch.addmm(gx_[t] if layer == 0 else bs[layer], Xv[layer][t], wT[layer], out=Zv[layer][t])
                    torch.sigmoid(Zv[layer][t], out=Av[layer][t])
                    torch.tanh(Zg[layer][t], out=Ag[layer][t])
                    c = torch.mul(Af[layer][t], CBv[layer][t], out=CBv[layer][t + 1])
                    c.addcmul_(Ai[layer][t], Ag[layer][t])
                    torch.tanh(c, out=TCv[layer][t])
                    h = torch.mul(Ao[layer][t], TCv[layer][t], out=Hv[layer][t + 1])
                    if layer < top:
                        Xin[layer + 1][t].copy_(h)
                # interface
                torch.addmm(b_xi, h, w_xiT, out=XIv[t])
                sp = F.softplus(xi_str[t])
                SP.append(sp)
                torch.sigmoid(xi_sig[t], out=SGv[t])
                torch._softmax(xi_modes[t], -1, False, out=PIv[t])
                K = xi_keys[t]
                rho = torch.linalg.vecdot(K, K, out=RHOv[t]).add_(_EPS).rsqrt_()
                torch.mul(K, torch.addcmul(rho, sp, rho).unsqueeze(-1), out=KHv[t])  # β ρ k
                # retention, usage, allocation
                torch.addcmul(one, free_col[t], WRv[t], value=-1, out=KEEPRv[t])
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
                keep = torch.addcmul(one, wcol, e_row[t], value=-1, out=KEEPMv[t])
                torch.mul(MEMv[t], keep, out=MEMv[t + 1]).addcmul_(wcol, v_row[t])
                # link, precedence
                dec = torch.add(wcol, WWrow[t + 1], out=DECv[t])
                torch.sub(offdiag, dec, out=dec)  # offdiag − w_i − w_j
                lnk = torch.mul(LNKv[t], dec, out=LNKv[t + 1]).addcmul_(wcol, PRECrow[t]).mul_(offdiag)
                sw = torch.sum(WWv[t + 1], -1, keepdim=True, out=SWv[t])
                torch.addcmul(PRECv[t], PRECv[t], sw, value=-1, out=PRECv[t + 1]).add_(WWv[t + 1])
                # directional weightings
                fwd = torch.bmm(WRv[t], LNKT[t + 1], out=FWDv[t])
                bwd = torch.bmm(WRv[t], lnk, out=BWDv[t])
                # read content weighting on M_t
                mem = MEMv[t + 1]
                torch.linalg.vecdot(mem, mem, out=NRMv[t + 1]).add_(_EPS).rsqrt_()
                torch.bmm(KHr[t], MEMT[t + 1], out=S0Rv[t])
                torch._softmax(torch.mul(S0Rv[t], NRMrow[t + 1]), -1, False, out=CRv[t])
                wr = torch.mul(bwd, PI0[t], out=WRv[t + 1]).addcmul_(CRv[t], PI1[t]).addcmul_(fwd, PI2[t])
                torch.bmm(wr, mem, out=RDv[t])
                RDin[t].copy_(RDv[t].view(B, RW))

            H = X[top][1:, :, inw[top]:].contiguous()
            reads = RD.view(T, B, RW).clone()
            hT = torch.stack([X[layer][T, :, inw[layer]:] for layer in range(Lc)], 1)
            cT = torch.stack([CB[layer][T] for layer in range(Lc)], 1)
            out = (H, reads, hT, cT, MEM[T].clone(), U[T].clone(), LNK[T].clone(), PREC[T].clone(),
                   WR[T].clone(), WW[T].clone())
        ctx.dims = (R, W, Lc)
        ctx.save_for_backward(w_xi, w0, *upper)
        ctx.buf = (X, A, CB, TC, XI, torch.stack(SP), SG, PI, KH, RHO, KEEPR, PSI, UB, U, SU, PHI, EX, S0W, CW, DI,
                   WW, KEEPM, MEM, DEC, LNK, SW, PREC, torch.stack([BWD, CR, FWD], 3), NRM, S0R, WR)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dH, dRD, dhT, dcT, dM, du, dL, dp, dwr, dww):
        R, W, Lc = ctx.dims
        w_xi, w0, *upper = ctx.saved_tensors
        ws = [w0] + list(upper[0::2])
        (X, A, CB, TC, XI, SP, SG, PI, KH, RHO, KEEPR, PSI, UB, U, SU, PHI, EX, S0W, CW, DI, WW, KEEPM, MEM, DEC,
         LNK, SW, PREC, BCF, NRM, S0R, WR) = ctx.buf
        T, B, C = dH.shape
        N, RW, G4, lay, top = MEM.shape[2], R * W, 4 * C, interface_layout(R, W), Lc - 1
        inw = [RW] + [C] * (Lc - 1)
        dt = XI.dtype
        ub = torch.Tensor.unbind
        offdiag = 1 - torch.eye(N, dtype=dt, device=XI.device)

        # ---- local derivatives of every step at once
        ctrl = []
        for layer in range(Lc):
            a, c, tc = A[layer], CB[layer], TC[layer]
            si, sf, tg, so = a.chunk(4, -1)
            gf = torch.cat([tg * si * (1 - si), c[:-1] * sf * (1 - sf), si * (1 - tg * tg), tc * so * (1 - so)], -1)
            odt = so * (1 - tc * tc)
            ctrl.append((ub(gf[..., :3 * C].unflatten(-1, (3, C))), ub(gf[..., 3 * C:]), ub(odt), ub(sf)))
        SGD = SG * (1 - SG)
        SGD[..., W + R] *= SG[..., W + R + 1]  # ∂w^w/∂g_a carries the write gate
        g_a, g_w = SG[..., W + R:W + R + 1], SG[..., W + R + 1:]
        sp_d = torch.ops.aten.softplus_backward(torch.ones_like(SP), XI[..., lay["str"]:lay["v"]], 1.0, 20.0)
        RSP = sp_d * RHO  # ∂ξ_str: q ρ softplus'
        BR = (1 + SP) * RHO
        NBR3 = -BR * RHO * RHO
        CWC = g_w * (1 - g_a)
        # allocation Jacobian ∂a[n]/∂u[m] (sort permutation held constant), times g_w g_a
        s, ex = SU, EX
        strict = torch.ones(N, N, dtype=torch.bool, device=XI.device).triu(1)  # [j, i]: i > j
        prods = torch.where(strict, s.unsqueeze(-2), torch.ones((), dtype=dt, device=XI.device)).cumprod(-1)
        between = F.pad(prods[..., :-1], (1, 0), value=1.0)  # [j, k] = Π_{j<i<k} s_i
        js = (between * ex.unsqueeze(-1) * (1 - s).unsqueeze(-2)) * strict  # [j, k] = ∂a_k/∂s_j, j < k
        js = js - torch.diag_embed(ex)  # ∂a_j/∂s_j = −Π_{i<j} s_i
        P = F.one_hot(PHI, N).to(dt)  # [k, n] = 1 iff φ_k = n
        JO = P.transpose(-1, -2) @ js.transpose(-1, -2) @ P  # [n, m] = ∂a[n]/∂u[m]
        JO.mul_((g_w * g_a).unsqueeze(-1))
        mprev = MEM[:-1]
        wcol = WW[1:].unsqueeze(-1)
        e, v = SG[..., :W], XI[..., lay["v"]:lay["sig"]]
        ZWE = torch.stack([wcol.expand(T, B, N, W), -(wcol * mprev)], 3)  # [T, B, N, 2, W]
        VME = v.unsqueeze(-2) - mprev * e.unsqueeze(-2)
        Q = PREC[:-1].unsqueeze(-2) - LNK[:-1]
        OMSW = 1 - SW
        FU = PSI * (1 - WW[:-1])
        FW = PSI * (1 - U[:-1])
        lft = torch.cumprod(F.pad(KEEPR[:, :, :-1], (0, 0, 1, 0), value=1.0), 2)
        rgt = torch.cumprod(F.pad(KEEPR[:, :, 1:], (0, 0, 0, 1), value=1.0).flip(2), 2).flip(2)
        NOTH = -(lft * rgt)  # −Π_{r'≠r} (1 − f_r' w_r')
        NEGN3 = -NRM * NRM * NRM
        LLT = torch.cat([LNK[1:], LNK[1:].transpose(-1, -2)], -2)  # [T, B, 2N, N]
        CAT1, CAT2 = DI.new_empty(T, B, 2 * R, N), DI.new_empty(T, B, 2 * R, N)
        CAT1[:, :, R:] = WR[:-1]
        CAT2[:, :, :R] = WR[:-1]

        # ---- gradient buffers
        GXI = XI.new_zeros(T, B, lay["size"])
        GZ = [XI.new_empty(T, B, G4) for _ in range(Lc)]
        EXT0 = torch.cat([dRD, dH if Lc == 1 else torch.zeros_like(dH)], -1)  # grads of (r_t, h^0_t)
        EXT0[T - 1, :, RW:] += dhT[:, 0]
        GH = [EXT0[..., RW:]] + [torch.zeros_like(dH) for _ in range(1, Lc)]
        if Lc > 1:
            GH[top] += dH
            for layer in range(1, Lc):
                GH[layer][T - 1] += dhT[:, layer]
        gc = [dcT[:, layer].clone() for layer in range(Lc)]
        init_h = [None] * Lc  # grads of the initial h^l (l >= 1)
        gM, gu, gL, gp, gwr, gww = dM.clone(), du.clone(), dL.clone(), dp.clone(), dwr.clone(), dww.clone()
        gn = torch.zeros_like(NRM[0])
        GKH = XI.new_empty(B, R + 1, W)
        GFB = XI.new_empty(B, R, 2 * N)

        # ---- per-step views
        GRv = ub(EXT0[..., :RW].unflatten(-1, (R, W)))
        EXT0v = ub(EXT0)
        GHv = [ub(g) for g in GH]
        GZv = [ub(g) for g in GZ]
        GZ3 = [ub(g[..., :3 * C].unflatten(-1, (3, C))) for g in GZ]
        GZo = [ub(g[..., 3 * C:]) for g in GZ]
        GXIv = ub(GXI)
        g_keys = ub(GXI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
        g_str = ub(GXI[..., lay["str"]:lay["v"]])
        g_ve = ub(GXI[..., lay["v"]:lay["free"]].unflatten(-1, (2, W)))
        g_free = ub(GXI[..., lay["free"]:lay["ga"]])
        g_gates = ub(GXI[..., lay["ga"]:lay["modes"]])
        g_sig = ub(GXI[..., lay["sig"]:lay["modes"]])
        g_modes = ub(GXI[..., lay["modes"]:].unflatten(-1, (R, 3)))
        xi_keys = ub(XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
        PIv, PI0, PI1, PI2 = ub(PI), ub(PI[..., 0:1]), ub(PI[..., 1:2]), ub(PI[..., 2:3])
        BCFv, CRv = ub(BCF), ub(BCF[..., 1, :])
        MEMv, MEMT, WRT = ub(MEM), ub(MEM.transpose(-1, -2)), ub(WR.transpose(-1, -2))
        S0Rv, NRMv, NRMrow, NEGN3v = ub(S0R), ub(NRM), ub(NRM.unsqueeze(-2)), ub(NEGN3)
        LLTv, CAT1v, CAT2v = ub(LLT), ub(CAT1), ub(CAT2)
        CAT1T, CAT1f, CAT2b = ub(CAT1.transpose(-1, -2)), ub(CAT1[:, :, :R]), ub(CAT2[:, :, R:])
        GFf, GFb = GFB[..., :N], GFB[..., N:]
        Qv, LNKv, DECv, WWcol = ub(Q), ub(LNK), ub(DEC), ub(WW.unsqueeze(-1))
        PRECv, OMSWv, VMEv, ZWEv, KEEPMv = ub(PREC), ub(OMSW), ub(VME), ub(ZWE), ub(KEEPM)
        DIv, CWCv, JOv, CWv, S0Wv = ub(DI), ub(CWC), ub(JO), ub(CW), ub(S0W.squeeze(-1))
        KHr, KHw = ub(KH[:, :, :R]), ub(KH[:, :, R:R + 1])
        UBv, FUv, FWv, NOTHv, WRv = ub(UB), ub(FU), ub(FW), ub(NOTH), ub(WR)
        free_col = ub(SG[..., W:W + R].unsqueeze(-1))
        RSPv, BRcol, NBR3v, SGDv = ub(RSP), ub(BR.unsqueeze(-1)), ub(NBR3), ub(SGD)
        GKHr, GKHw = GKH[:, :R], GKH[:, R]

        for t in range(T - 1, -1, -1):
            mem = MEMv[t + 1]
            # read r_t = w^r_t M_t
            gr = GRv[t]
            gwr.baddbmm_(gr, MEMT[t + 1])
            gM.baddbmm_(WRT[t + 1], gr)
            # read weighting w^r = π0 b + π1 c + π2 f
            gpi = torch.linalg.vecdot(BCFv[t], gwr.unsqueeze(-2))  # [B, R, 3]
            g_modes[t].copy_(torch._softmax_backward_data(gpi, PIv[t], -1, dt))  # (its out= ignores strides)
            gcr = torch.mul(gwr, PI1[t])
            torch.mul(gwr, PI2[t], out=CAT1f[t])
            torch.mul(gwr, PI0[t], out=CAT2b[t])
            torch.mul(gwr, PI2[t], out=GFf)
            torch.mul(gwr, PI0[t], out=GFb)
            # read content weighting on M_t
            gs = torch._softmax_backward_data(gcr, CRv[t], -1, dt)
            gn.add_(torch.linalg.vecdot(gs, S0Rv[t], dim=1))
            gS0 = torch.mul(gs, NRMrow[t + 1])
            GKHr.copy_(torch.bmm(gS0, mem))
            gM.baddbmm_(gS0.transpose(1, 2), KHr[t])
            # row norms of M_t
            gM.addcmul_(mem, torch.mul(gn, NEGN3v[t + 1]).unsqueeze(-1))
            # directional weightings f = L w^r_{t-1}, b = Lᵀ w^r_{t-1}
            gwr_prev = torch.bmm(GFB, LLTv[t])
            gL.baddbmm_(CAT1T[t], CAT2v[t])
            # link
            G = torch.mul(gL, offdiag)
            gL_prev = torch.mul(G, DECv[t])
            gww.add_(torch.linalg.vecdot(G, Qv[t])).sub_(torch.linalg.vecdot(G, LNKv[t], dim=1))
            gp_link = torch.linalg.vecdot(G, WWcol[t + 1], dim=1)
            # precedence
            gww.add_(gp).sub_(torch.linalg.vecdot(gp, PRECv[t]).unsqueeze(-1))
            gp_prev = torch.mul(gp, OMSWv[t]).add_(gp_link)
            # erase/add write
            gww.add_(torch.linalg.vecdot(gM, VMEv[t]))
            torch.linalg.vecdot(gM.unsqueeze(2), ZWEv[t], dim=1, out=g_ve[t])
            gM_prev = torch.mul(gM, KEEPMv[t])
            # write weighting
            torch.linalg.vecdot(gww.unsqueeze(1), DIv[t], out=g_gates[t])
            gcw = torch.mul(gww, CWCv[t])
            gu.unsqueeze(1).baddbmm_(gww.unsqueeze(1), JOv[t])
            # write content weighting on M_{t-1}
            gsw = torch._softmax_backward_data(gcw, CWv[t], -1, dt)
            gn_prev = torch.mul(gsw, S0Wv[t])
            gS0w = torch.mul(gsw, NRMv[t])
            torch.linalg.vecdot(MEMv[t], gS0w.unsqueeze(-1), dim=1, out=GKHw)
            gM_prev.addcmul_(gS0w.unsqueeze(-1), KHw[t])
            # usage and retention
            gpsi = torch.mul(gu, UBv[t])
            gu_prev = torch.mul(gu, FUv[t])
            gww_prev = torch.mul(gu, FWv[t])
            gkeep = torch.mul(gpsi.unsqueeze(1), NOTHv[t])
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
                gf3, gfo, odt, sf = (x[t] for x in ctrl[layer])
                if layer < top:
                    gh = GHv[layer][t]
                gcl = gc[layer].addcmul_(gh, odt)
                torch.mul(gcl.unsqueeze(1), gf3, out=GZ3[layer][t])
                torch.mul(gh, gfo, out=GZo[layer][t])
                gc[layer] = torch.mul(gcl, sf)
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
            gM, gn, gu, gL, gp, gwr, gww = gM_prev, gn_prev, gu_prev, gL_prev, gp_prev, gwr_prev, gww_prev

        gM.addcmul_(MEM[0], torch.mul(gn, NEGN3[0]).unsqueeze(-1))
        dh0 = torch.stack([g_init0[:, RW:]] + init_h[1:], 1)
        dc0 = torch.stack(gc, 1)
        dreads0 = g_init0[:, :RW].reshape(B, R, W)
        TB = T * B
        d_upper = []
        dw0 = GZ[0].view(TB, G4).t() @ X[0][:T].reshape(TB, -1)
        for layer in range(1, Lc):
            d_upper.append(GZ[layer].view(TB, G4).t() @ X[layer][:T].reshape(TB, -1))
            d_upper.append(GZ[layer].sum((0, 1)))
        Htop = X[top][1:, :, inw[top]:].reshape(TB, C)
        dw_xi = GXI.view(TB, -1).t() @ Htop
        db_xi = GXI.sum((0, 1))
        return (None, GZ[0], dw_xi, db_xi, dh0, dc0, gM, gu, gL, gp, gwr, gww, dreads0, dw0, *d_upper)
