"""The DNC recurrence over a whole sequence as one autograd Function (docs/maths.md §8; the fast path).

:class:`DNCRecurrence` runs every time step of the LSTM controller (all layers) and of the
memory access — retention, usage, sort-based allocation, content weightings, write weighting,
erase/add write, temporal link, precedence, directional and read weightings, read — without
autograd, into preallocated ``[T, ...]`` buffers, and walks the steps in reverse in a
hand-derived backward. What does not depend on the recurrence is batched over the sequence:
the input half of the first controller layer (one matmul before the loop, its gradients
after), and outside the Function the readout and the row permutation of the interface
layer. Inside, the backward first computes every local
derivative that depends on forward values only, for all steps at once (gate derivatives,
the allocation Jacobian with the sort permutation held constant, the retention products,
…), so that the reverse loop is a short chain of multiplies and small matmuls; the recurrent
weight gradients are one matmul each after the loop.

At the DNC's usual sizes every op is tiny, so the fixed costs matter: the ``[T, ...]``
buffers and their per-step views are kept in a small pool of workspaces (per shape, dtype and
device) and reused by the next call of the same shape instead of being allocated, faulted in
and sliced again. A forward workspace goes back to the pool when its backward has run (a
second backward through the same graph, with ``retain_graph=True``, recomputes the forward
from the saved inputs) or when the graph is freed; :func:`clear_workspaces` empties the pool.

The per-equation reference is ``DNC(impl="reference")``; tests hold both equal in float64
(values, final state, gradients of every parameter, the input and the initial state) and
run ``gradcheck`` on this Function. Not twice differentiable.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.autograd.function import once_differentiable

from ..ops._workspace import WorkspacePool

__all__ = ["DNCRecurrence", "interface_permutation", "interface_layout", "clear_workspaces"]

_EPS = 1e-6  # inside every norm's square root, as in memnets.ops.addressing


def interface_layout(R: int, W: int) -> dict[str, int]:
    """Offsets of the permuted interface vector: keys ``(R+1)·W`` (R read keys, then the write
    key), strengths ``R+1`` (read, then write), write vector ``W``, then the σ block
    (erase ``W``, free gates ``R``, allocation gate, write gate) and the read modes ``3R``,
    mode-major (π₀ of every head, then π₁, then π₂: a softmax over a dim of 3 that is not the
    last is cheaper on CPU)."""
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
    """Row indices taking the DNC interface layer (docs/maths.md §8 order: read keys, read strengths,
    write key, write strength, erase, write vector, free gates, allocation gate, write gate,
    read modes) to the layout of :func:`interface_layout`."""
    sizes = [R * W, R, W, 1, W, W, R, 1, 1, 3 * R]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    k_r, b_r, k_w, b_w, erase, v, free, g_a, g_w, modes = (
        torch.arange(s, s + n, device=device) for s, n in zip(starts, sizes))
    modes = modes.view(R, 3).t().reshape(-1)  # head-major -> mode-major
    return torch.cat([k_r, k_w, b_r, b_w, v, erase, free, g_a, g_w, modes])


# ---------------------------------------------------------------------------------------------
# workspace pool

_POOL = WorkspacePool(keys=4, per_key=2, max_bytes=256 * 2 ** 20)  # memnets.ops._workspace


def clear_workspaces() -> None:
    """Drop every pooled workspace of :class:`DNCRecurrence`."""
    _POOL.clear()


def _nbytes(ns: SimpleNamespace) -> int:
    total = 0
    for v in vars(ns).values():
        for t in (v if isinstance(v, list) else [v]):
            if isinstance(t, torch.Tensor) and t._base is None:
                total += t.numel() * t.element_size()
    return total


def _unbind(x: torch.Tensor):
    return x.unbind(0)


# ---------------------------------------------------------------------------------------------
# forward


def _forward_space(T, B, C, N, W, R, Lc, dtype, device) -> SimpleNamespace:
    """The forward buffers (everything the backward needs) and their per-step views."""
    kw = {"dtype": dtype, "device": device}
    RW, lay, G4 = R * W, interface_layout(R, W), 4 * C
    inw = [RW] + [C] * (Lc - 1)
    f = SimpleNamespace()
    # controller: X[l][t] = input of layer l at step t ([r_{t-1}; h^0_{t-1}] or [h^{l-1}_t; h^l_{t-1}]);
    # step t writes h^l_t into X[l][t+1][:, inw:]
    f.X = [torch.empty(T + 1, B, inw[layer] + C, **kw) for layer in range(Lc)]
    f.A = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]  # (σ(i), σ(f), σ(2g), σ(o))
    f.CB = [torch.empty(T + 1, B, C, **kw) for _ in range(Lc)]
    f.TC = [torch.empty(T, B, C, **kw) for _ in range(Lc)]
    f.GX = torch.empty(T, B, G4, **kw)  # x W_xᵀ + b_x, the g block scaled by 2
    # access
    f.XI = torch.empty(T, B, lay["size"], **kw)
    f.SP = torch.empty(T, B, R + 1, **kw)  # softplus of the strengths
    f.SG = torch.empty(T, B, W + R + 2, **kw)  # σ block: erase, free, g_a, g_w
    f.PI = torch.empty(T, B, 3, R, **kw)  # read modes, mode-major
    f.KH = torch.empty(T, B, R + 1, W, **kw)  # β-scaled unit keys
    f.RHO = torch.empty(T, B, R + 1, **kw)
    f.KEEPR = torch.empty(T, B, R, N, **kw)
    f.PSI = torch.empty(T, B, N, **kw)
    f.UB = torch.empty(T, B, N, **kw)
    f.U = torch.empty(T + 1, B, N, **kw)
    f.SU = torch.empty(T, B, N, **kw)
    f.PHI = torch.empty(T, B, N, dtype=torch.long, device=device)
    f.EX = torch.empty(T, B, N, **kw)
    f.EX[:, :, 0] = 1
    f.S0W = torch.empty(T, B, N, 1, **kw)
    f.CW = torch.empty(T, B, N, **kw)
    f.DI = torch.empty(T, B, 2, N, **kw)  # (allocation − content, inner) of the write weighting
    f.WW = torch.empty(T + 1, B, N, **kw)
    f.KEEPM = torch.empty(T, B, N, W, **kw)
    f.MEM = torch.empty(T + 1, B, N, W, **kw)
    f.DEC = torch.empty(T, B, N, N, **kw)  # w_i + w_j
    f.LL = torch.empty(T + 1, B, N, 2 * N, **kw)  # [L_t | L_tᵀ]
    f.SW = torch.empty(T, B, 1, **kw)
    f.PREC = torch.empty(T + 1, B, N, **kw)
    f.BF = torch.empty(T, B, R, 2 * N, **kw)  # (backward | forward) weightings
    f.CR = torch.empty(T, B, R, N, **kw)
    f.NRM = torch.empty(T + 1, B, N, **kw)
    f.S0R = torch.empty(T, B, R, N, **kw)
    f.WR = torch.empty(T + 1, B, R, N, **kw)
    f.RD = torch.empty(T, B, R, W, **kw)
    f.alloc = torch.empty(B, N, **kw)
    f.ones_rn, f.ones_nw = torch.ones(B, R, N, **kw), torch.ones(B, N, W, **kw)
    f.offdiag = 1 - torch.eye(N, **kw)
    f.eps, f.one, f.two = (torch.tensor(v, **kw) for v in (_EPS, 1.0, 2.0))
    f.scale = torch.ones(G4, **kw)
    f.scale[2 * C:3 * C] = 2  # tanh(g) = 2 σ(2 g) − 1: one sigmoid for all four gates
    f.nbytes = _nbytes(f)

    ub = _unbind
    f.LNK = f.LL[..., :N]
    f.GXv = ub(f.GX)
    f.Xv = [ub(x) for x in f.X]
    f.Hv = [ub(f.X[layer][:, :, inw[layer]:]) for layer in range(Lc)]
    f.Xin = [None] + [ub(f.X[layer][:, :, :C]) for layer in range(1, Lc)]
    f.Av = [ub(a) for a in f.A]
    f.Ai, f.Af, f.Ag, f.Ao = ([ub(a[..., k * C:(k + 1) * C]) for a in f.A] for k in range(4))
    f.CBv, f.TCv = [ub(c) for c in f.CB], [ub(c) for c in f.TC]
    f.XIv = ub(f.XI)
    f.xi_keys = ub(f.XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
    f.xi_str = ub(f.XI[..., lay["str"]:lay["v"]])
    f.v_row = ub(f.XI[..., lay["v"]:lay["sig"]].unsqueeze(-2))
    f.xi_sig = ub(f.XI[..., lay["sig"]:lay["modes"]])
    f.xi_modes = ub(f.XI[..., lay["modes"]:].unflatten(-1, (3, R)))
    f.SPv, f.SGv = ub(f.SP), ub(f.SG)
    f.e_row = ub(f.SG[..., :W].unsqueeze(-2))
    f.free_col = ub(f.SG[..., W:W + R].unsqueeze(-1))
    f.g_a, f.g_w = ub(f.SG[..., W + R:W + R + 1]), ub(f.SG[..., W + R + 1:])
    f.PIv, f.PI0, f.PI1, f.PI2 = ub(f.PI), *(ub(f.PI[:, :, k].unsqueeze(-1)) for k in range(3))
    f.KHv, f.RHOv = ub(f.KH), ub(f.RHO)
    f.KHr, f.KHw = ub(f.KH[:, :, :R]), ub(f.KH[:, :, R].unsqueeze(-1))
    f.KEEPRv, f.PSIv, f.UBv, f.Uv = ub(f.KEEPR), ub(f.PSI), ub(f.UB), ub(f.U)
    f.SUv, f.PHIv, f.EXv = ub(f.SU), ub(f.PHI), ub(f.EX)
    f.SUh, f.EXt = ub(f.SU[..., :-1]), ub(f.EX[..., 1:])
    f.S0Wv, f.S0Ws, f.CWv = ub(f.S0W), ub(f.S0W.squeeze(-1)), ub(f.CW)
    f.DIFF, f.INNER = ub(f.DI[:, :, 0]), ub(f.DI[:, :, 1])
    f.WWv, f.WWcol, f.WWrow = ub(f.WW), ub(f.WW.unsqueeze(-1)), ub(f.WW.unsqueeze(-2))
    f.KEEPMv, f.MEMv, f.MEMT = ub(f.KEEPM), ub(f.MEM), ub(f.MEM.transpose(-1, -2))
    f.DECv, f.LNKv, f.LNKTs, f.LLv = ub(f.DEC), ub(f.LNK), ub(f.LL[..., N:]), ub(f.LL)
    f.SWv, f.PRECv, f.PRECrow = ub(f.SW), ub(f.PREC), ub(f.PREC.unsqueeze(-2))
    f.BFv, f.BWDv, f.FWDv, f.CRv = ub(f.BF), ub(f.BF[..., :N]), ub(f.BF[..., N:]), ub(f.CR)
    f.NRMv, f.NRMrow = ub(f.NRM), ub(f.NRM.unsqueeze(-2))
    f.S0Rv, f.WRv, f.RDv = ub(f.S0R), ub(f.WR), ub(f.RD)
    f.RDin = ub(f.X[0][1:, :, :RW])
    f.bv = None  # views for the backward, made at the first backward
    return f


def _run_forward(f, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, ws, bs):
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


# ---------------------------------------------------------------------------------------------
# backward


def _backward_views(f, R, W, Lc) -> SimpleNamespace:
    """Per-step views of forward buffers used by the backward (made once per workspace)."""
    ub = _unbind
    T, B, N = f.SU.shape
    C = f.TC[0].shape[-1]
    lay = interface_layout(R, W)
    v = SimpleNamespace()
    v.sf = [ub(a[..., C:2 * C]) for a in f.A]
    v.xi_keys = ub(f.XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
    v.PIv, v.PI1 = ub(f.PI), ub(f.PI[:, :, 1].unsqueeze(-1))
    v.CRv, v.MEMv, v.MEMT, v.WRT = ub(f.CR), ub(f.MEM), ub(f.MEM.transpose(-1, -2)), ub(f.WR.transpose(-1, -2))
    v.NRMv, v.NRMrow = ub(f.NRM), ub(f.NRM.unsqueeze(-2))
    v.LLTv, v.LNKv, v.DECv = ub(f.LL.transpose(-1, -2)), ub(f.LNK), ub(f.DEC)
    v.WWrow, v.PRECv, v.KEEPMv = ub(f.WW.unsqueeze(-2)), ub(f.PREC), ub(f.KEEPM)
    v.DIv, v.CWv = ub(f.DI), ub(f.CW)
    v.KHr, v.KHw = ub(f.KH[:, :, :R]), ub(f.KH[:, :, R:R + 1])
    v.WRv, v.PHIv = ub(f.WR), ub(f.PHI)
    v.free_col = ub(f.SG[..., W:W + R].unsqueeze(-1))
    return v


def _backward_space(T, B, C, N, W, R, Lc, dtype, device) -> SimpleNamespace:
    """Buffers of the backward: local derivatives of every step, gradient buffers, views."""
    kw = {"dtype": dtype, "device": device}
    RW, lay, G4 = R * W, interface_layout(R, W), 4 * C
    g = SimpleNamespace()
    g.GF = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]  # gate derivative factors
    g.ODT = [torch.empty(T, B, C, **kw) for _ in range(Lc)]  # σ(o) (1 − tanh² c)
    g.SGD = torch.empty(T, B, W + R + 2, **kw)
    g.RSP, g.BR, g.NBR3 = (torch.empty(T, B, R + 1, **kw) for _ in range(3))
    g.CWC = torch.empty(T, B, 1, **kw)
    g.JC = torch.empty(T, B, N, N, **kw)  # scratch of the allocation Jacobian
    g.JS = torch.empty(T, B, N, N, **kw)
    g.upper = torch.ones(N, N, **kw).triu_(1)
    g.Q = torch.empty(T, B, N, N, **kw)  # p_{t-1}[j] − L_{t-1}[i, j]
    g.OMSW = torch.empty(T, B, 1, **kw)
    g.FU, g.FW = torch.empty(T, B, N, **kw), torch.empty(T, B, N, **kw)
    g.NOTH, g.RGT = torch.empty(T, B, R, N, **kw), torch.empty(T, B, R, N, **kw)
    g.NEGN3 = torch.empty(T + 1, B, N, **kw)
    g.S0RN = torch.empty(T, B, R, N, **kw)  # (k̂ · M_t[i]) (−n_t[i]³): d n_t folded with ∂n/∂M
    g.S0WN = torch.empty(T, B, N, **kw)  # (k̂_w · M_{t-1}[i]) (−n_{t-1}[i]³)
    g.BCF = torch.empty(T, B, R, 3, N, **kw)  # (backward, content, forward) weightings
    g.PI02 = torch.empty(T, B, R, 2, 1, **kw)
    g.Z = torch.empty(T, B, 3 * R, N, **kw)  # [π0 w^r_{t-1}; d w^r_t; π2 w^r_{t-1}]
    g.VE = torch.empty(T, B, 1, 2 * W, **kw)  # [v | −e]
    g.GXI = torch.empty(T, B, lay["size"], **kw)
    g.GZ = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]
    g.EXT0 = torch.empty(T, B, RW + C, **kw)  # grads of (r_t, h^0_t)
    g.GH = [g.EXT0[..., RW:]] + [torch.empty(T, B, C, **kw) for _ in range(1, Lc)]
    g.GKH = torch.empty(B, R + 1, W, **kw)
    g.GFB = torch.empty(B, R, 2 * N, **kw)  # (d backward | d forward)
    g.GMM = torch.empty(B, N, 2 * W, **kw)  # [dM_t | dM_t ∘ M_{t-1}]
    g.nbytes = _nbytes(g)

    ub = _unbind
    g.ctrl = [(ub(gf[..., :3 * C].unflatten(-1, (3, C))), ub(gf[..., 3 * C:]), ub(odt))
              for gf, odt in zip(g.GF, g.ODT)]
    g.SGDv, g.RSPv, g.BRcol, g.NBR3v, g.CWCv = ub(g.SGD), ub(g.RSP), ub(g.BR.unsqueeze(-1)), ub(g.NBR3), ub(g.CWC)
    g.Qv, g.JSv, g.OMSWv, g.FUv, g.FWv, g.NOTHv = ub(g.Q), ub(g.JS), ub(g.OMSW), ub(g.FU), ub(g.FW), ub(g.NOTH)
    g.BCFv, g.PI02v, g.S0RNv, g.S0WNv = ub(g.BCF.view(T, B * R, 3, N)), ub(g.PI02), ub(g.S0RN), ub(g.S0WN)
    g.Zmid, g.ZXT, g.ZY = ub(g.Z[:, :, R:2 * R]), ub(g.Z[:, :, :2 * R].transpose(-1, -2)), ub(g.Z[:, :, R:])
    g.VEv = ub(g.VE)
    g.GRv = ub(g.EXT0[..., :RW].unflatten(-1, (R, W)))
    g.EXT0v = ub(g.EXT0)
    g.GHv = [ub(x) for x in g.GH]
    g.GZv = [ub(x) for x in g.GZ]
    g.GZ3 = [ub(x[..., :3 * C].unflatten(-1, (3, C))) for x in g.GZ]
    g.GZo = [ub(x[..., 3 * C:]) for x in g.GZ]
    g.GXIv = ub(g.GXI)
    g.g_keys = ub(g.GXI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
    g.g_str = ub(g.GXI[..., lay["str"]:lay["v"]])
    g.g_ve = ub(g.GXI[..., lay["v"]:lay["free"]])
    g.g_free = ub(g.GXI[..., lay["free"]:lay["ga"]])
    g.g_gates = ub(g.GXI[..., lay["ga"]:lay["modes"]])
    g.g_sig = ub(g.GXI[..., lay["sig"]:lay["modes"]])
    g.g_modes = ub(g.GXI[..., lay["modes"]:].unflatten(-1, (3, R)))
    g.GFB4 = g.GFB.view(B, R, 2, N)
    g.GKHr, g.GKHw = g.GKH[:, :R], g.GKH[:, R]
    g.GMMa, g.GMMb = g.GMM[..., :W], g.GMM[..., W:]
    return g


def _allocation_jacobian(g, su: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
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


def _run_backward(f, g, R, W, x, w_x, w_xi, ws, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww, need_dx=True):
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
    _allocation_jacobian(g, f.SU, f.EX).mul_((g_w * g_a).unsqueeze(-1))  # ∂w^w/∂a = g_w g_a
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
    for layer in range(Lc):
        g.GH[layer][T - 1] += dhT[:, layer]
    gc = [dcT[:, layer].clone() for layer in range(Lc)]
    init_h = [None] * Lc  # grads of the initial h^l (l >= 1)
    gM, gu, gL, gp, gwr, gww = dM.clone(), du.clone(), dL.clone(), dp.clone(), dwr.clone(), dww.clone()
    gn = torch.zeros_like(f.NRM[0])  # d n_t ∂n_t/∂|M_t[i]|², i.e. times −n³
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


class DNCRecurrence(torch.autograd.Function):
    """``apply(dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0,
    reads0, w0, w1, b1, …)``.

    dims = (R, W). x ``[B, T, F]``: the input sequence; w_x ``[4C, F]``, b_x ``[4C]``: the input
    half of the first LSTM layer.
    w_xi ``[I, C]``, b_xi ``[I]``: the interface layer, rows permuted by
    :func:`interface_permutation`. Initial state: h0, c0 ``[B, layers, C]``, mem0 ``[B, N, W]``,
    usage0 ``[B, N]``, link0 ``[B, N, N]``, prec0 ``[B, N]``, wr0 ``[B, R, N]``, ww0 ``[B, N]``,
    reads0 ``[B, R, W]``. w0 ``[4C, R·W + C]``: the recurrent weight of layer 0 (acting on
    ``[r_{t-1}; h_{t-1}]``); w_l ``[4C, 2C]``, b_l ``[4C]`` for the layers above (acting on
    ``[h^{l-1}_t; h^l_{t-1}]``).

    Returns ``(HR [T, B, R·W + C], h [B, layers, C], c [B, layers, C], memory, usage, link,
    precedence, read_weights, write_weights)``: ``[r_t | h_t]`` of every step (the read vectors
    and the top controller layer's output, what the readout sees), then the final state.
    """

    @staticmethod
    def forward(ctx, dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
                *upper):
        R, W = dims
        B, T = x.shape[:2]
        G4 = w_x.shape[0]
        C, N, Lc = G4 // 4, mem0.shape[1], 1 + len(upper) // 2
        ws = [w0] + list(upper[0::2])
        bs = [None] + list(upper[1::2])
        key = ("fwd", T, B, C, N, W, R, Lc, x.dtype, x.device)
        ctx.lease = _POOL.lease(key, lambda: _forward_space(T, B, C, N, W, R, Lc, x.dtype, x.device))
        f = ctx.lease.space
        with torch.inference_mode():  # cheaper dispatch than no_grad; the buffers are ordinary tensors
            _run_forward(f, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0,
                         ws, bs)
        with torch.no_grad():
            X = f.X
            if Lc == 1:
                HR = X[0][1:].clone()  # [r_t | h_t]
            else:
                HR = torch.cat([f.RD.view(T, B, R * W), X[Lc - 1][1:, :, C:]], -1)
            hT = torch.stack([X[layer][T, :, (R * W if layer == 0 else C):] for layer in range(Lc)], 1)
            cT = torch.stack([f.CB[layer][T] for layer in range(Lc)], 1)
            out = (HR, hT, cT, f.MEM[T].clone(), f.U[T].clone(),
                   f.LNK[T].clone(memory_format=torch.contiguous_format), f.PREC[T].clone(), f.WR[T].clone(),
                   f.WW[T].clone())
        ctx.dims = (R, W, Lc, key)
        ctx.save_for_backward(x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
                              *upper)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww):
        R, W, Lc, key = ctx.dims
        x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0, *upper = ctx.saved_tensors
        ws = [w0] + list(upper[0::2])
        B, T = x.shape[:2]
        C, N = w_x.shape[0] // 4, mem0.shape[1]
        f = ctx.lease.space
        if f is None:  # a second backward through the same graph: recompute the forward
            f = ctx.lease.space = _POOL.take(key, lambda: _forward_space(T, B, C, N, W, R, Lc, x.dtype, x.device))
            with torch.inference_mode():
                _run_forward(f, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0,
                             reads0, ws, [None] + list(upper[1::2]))
        bkey = ("bwd",) + key[1:]
        g = _POOL.take(bkey, lambda: _backward_space(T, B, C, N, W, R, Lc, x.dtype, x.device))
        if f.bv is None:
            f.bv = _backward_views(f, R, W, Lc)
        with torch.inference_mode():
            grads = _run_backward(f, g, R, W, x, w_x, w_xi, ws, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww,
                                  need_dx=ctx.needs_input_grad[1])
        grads = [None if d is None else d.clone() for d in grads]  # ordinary tensors (none aliasing the workspace)
        _POOL.give(bkey, g)
        ctx.lease.release()
        return (None, *grads)
