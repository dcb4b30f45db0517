"""The buffers of :class:`~memnets.ops.dnc.recurrence.DNCRecurrence` as explicit workspace objects.

A :class:`ForwardWorkspace` holds the ``[T, ...]`` buffers the forward fills (everything the
backward needs) and their per-step views; a :class:`BackwardWorkspace` the local derivatives
of every step and the gradient buffers of the backward; :class:`BackwardViews` the per-step
views of forward buffers that only the backward reads (made at the first backward of a
forward workspace). At the DNC's usual sizes every op is tiny, so the fixed costs matter:
workspaces are kept in :data:`POOL` (a :class:`memnets.ops._workspace.WorkspacePool`, per
shape, dtype and device) and reused by the next call of the same shape instead of being
allocated, faulted in and sliced again. :func:`clear_workspaces` empties the pool.
"""
from __future__ import annotations

import torch

from .._workspace import WorkspacePool
from .layout import interface_layout

__all__ = ["ForwardWorkspace", "BackwardWorkspace", "BackwardViews", "POOL", "clear_workspaces", "EPS"]

EPS = 1e-6  # inside every norm's square root, as in memnets.ops.addressing

POOL = WorkspacePool(keys=4, per_key=2, max_bytes=256 * 2 ** 20)


def clear_workspaces() -> None:
    """Drop every pooled workspace of :class:`~memnets.ops.dnc.recurrence.DNCRecurrence`."""
    POOL.clear()


def _nbytes(space) -> int:
    """Bytes of the tensors a workspace owns (views of them are not counted again)."""
    total = 0
    for v in vars(space).values():
        for t in (v if isinstance(v, list) else [v]):
            if isinstance(t, torch.Tensor) and t._base is None:
                total += t.numel() * t.element_size()
    return total


def _unbind(x: torch.Tensor):
    return x.unbind(0)


class ForwardWorkspace:
    """The forward buffers of T steps (batch B, controller C x ``Lc`` layers, N slots of width
    W, R read heads) and their per-step views; ``nbytes`` is its size for the pool."""

    def __init__(self, T: int, B: int, C: int, N: int, W: int, R: int, Lc: int, dtype: torch.dtype,
                 device) -> None:
        kw = {"dtype": dtype, "device": device}
        RW, lay, G4 = R * W, interface_layout(R, W), 4 * C
        inw = [RW] + [C] * (Lc - 1)
        # controller: X[l][t] = input of layer l at step t ([r_{t-1}; h^0_{t-1}] or [h^{l-1}_t; h^l_{t-1}]);
        # step t writes h^l_t into X[l][t+1][:, inw:]
        self.X = [torch.empty(T + 1, B, inw[layer] + C, **kw) for layer in range(Lc)]
        self.A = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]  # (σ(i), σ(f), σ(2g), σ(o))
        self.CB = [torch.empty(T + 1, B, C, **kw) for _ in range(Lc)]
        self.TC = [torch.empty(T, B, C, **kw) for _ in range(Lc)]
        self.GX = torch.empty(T, B, G4, **kw)  # x W_xᵀ + b_x, the g block scaled by 2
        # access
        self.XI = torch.empty(T, B, lay["size"], **kw)
        self.SP = torch.empty(T, B, R + 1, **kw)  # softplus of the strengths
        self.SG = torch.empty(T, B, W + R + 2, **kw)  # σ block: erase, free, g_a, g_w
        self.PI = torch.empty(T, B, 3, R, **kw)  # read modes, mode-major
        self.KH = torch.empty(T, B, R + 1, W, **kw)  # β-scaled unit keys
        self.RHO = torch.empty(T, B, R + 1, **kw)
        self.KEEPR = torch.empty(T, B, R, N, **kw)
        self.PSI = torch.empty(T, B, N, **kw)
        self.UB = torch.empty(T, B, N, **kw)
        self.U = torch.empty(T + 1, B, N, **kw)
        self.SU = torch.empty(T, B, N, **kw)
        self.PHI = torch.empty(T, B, N, dtype=torch.long, device=device)
        self.EX = torch.empty(T, B, N, **kw)
        self.EX[:, :, 0] = 1
        self.S0W = torch.empty(T, B, N, 1, **kw)
        self.CW = torch.empty(T, B, N, **kw)
        self.DI = torch.empty(T, B, 2, N, **kw)  # (allocation − content, inner) of the write weighting
        self.WW = torch.empty(T + 1, B, N, **kw)
        self.KEEPM = torch.empty(T, B, N, W, **kw)
        self.MEM = torch.empty(T + 1, B, N, W, **kw)
        self.DEC = torch.empty(T, B, N, N, **kw)  # w_i + w_j
        self.LL = torch.empty(T + 1, B, N, 2 * N, **kw)  # [L_t | L_tᵀ]
        self.SW = torch.empty(T, B, 1, **kw)
        self.PREC = torch.empty(T + 1, B, N, **kw)
        self.BF = torch.empty(T, B, R, 2 * N, **kw)  # (backward | forward) weightings
        self.CR = torch.empty(T, B, R, N, **kw)
        self.NRM = torch.empty(T + 1, B, N, **kw)
        self.S0R = torch.empty(T, B, R, N, **kw)
        self.WR = torch.empty(T + 1, B, R, N, **kw)
        self.RD = torch.empty(T, B, R, W, **kw)
        self.alloc = torch.empty(B, N, **kw)
        self.ones_rn, self.ones_nw = torch.ones(B, R, N, **kw), torch.ones(B, N, W, **kw)
        self.offdiag = 1 - torch.eye(N, **kw)
        self.eps, self.one, self.two = (torch.tensor(v, **kw) for v in (EPS, 1.0, 2.0))
        self.scale = torch.ones(G4, **kw)
        self.scale[2 * C:3 * C] = 2  # tanh(g) = 2 σ(2 g) − 1: one sigmoid for all four gates
        self.nbytes = _nbytes(self)

        ub = _unbind
        self.LNK = self.LL[..., :N]
        self.GXv = ub(self.GX)
        self.Xv = [ub(x) for x in self.X]
        self.Hv = [ub(self.X[layer][:, :, inw[layer]:]) for layer in range(Lc)]
        self.Xin = [None] + [ub(self.X[layer][:, :, :C]) for layer in range(1, Lc)]
        self.Av = [ub(a) for a in self.A]
        self.Ai, self.Af, self.Ag, self.Ao = ([ub(a[..., k * C:(k + 1) * C]) for a in self.A] for k in range(4))
        self.CBv, self.TCv = [ub(c) for c in self.CB], [ub(c) for c in self.TC]
        self.XIv = ub(self.XI)
        self.xi_keys = ub(self.XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
        self.xi_str = ub(self.XI[..., lay["str"]:lay["v"]])
        self.v_row = ub(self.XI[..., lay["v"]:lay["sig"]].unsqueeze(-2))
        self.xi_sig = ub(self.XI[..., lay["sig"]:lay["modes"]])
        self.xi_modes = ub(self.XI[..., lay["modes"]:].unflatten(-1, (3, R)))
        self.SPv, self.SGv = ub(self.SP), ub(self.SG)
        self.e_row = ub(self.SG[..., :W].unsqueeze(-2))
        self.free_col = ub(self.SG[..., W:W + R].unsqueeze(-1))
        self.g_a, self.g_w = ub(self.SG[..., W + R:W + R + 1]), ub(self.SG[..., W + R + 1:])
        self.PIv, self.PI0, self.PI1, self.PI2 = ub(self.PI), *(ub(self.PI[:, :, k].unsqueeze(-1)) for k in range(3))
        self.KHv, self.RHOv = ub(self.KH), ub(self.RHO)
        self.KHr, self.KHw = ub(self.KH[:, :, :R]), ub(self.KH[:, :, R].unsqueeze(-1))
        self.KEEPRv, self.PSIv, self.UBv, self.Uv = ub(self.KEEPR), ub(self.PSI), ub(self.UB), ub(self.U)
        self.SUv, self.PHIv, self.EXv = ub(self.SU), ub(self.PHI), ub(self.EX)
        self.SUh, self.EXt = ub(self.SU[..., :-1]), ub(self.EX[..., 1:])
        self.S0Wv, self.S0Ws, self.CWv = ub(self.S0W), ub(self.S0W.squeeze(-1)), ub(self.CW)
        self.DIFF, self.INNER = ub(self.DI[:, :, 0]), ub(self.DI[:, :, 1])
        self.WWv, self.WWcol, self.WWrow = ub(self.WW), ub(self.WW.unsqueeze(-1)), ub(self.WW.unsqueeze(-2))
        self.KEEPMv, self.MEMv, self.MEMT = ub(self.KEEPM), ub(self.MEM), ub(self.MEM.transpose(-1, -2))
        self.DECv, self.LNKv, self.LNKTs, self.LLv = ub(self.DEC), ub(self.LNK), ub(self.LL[..., N:]), ub(self.LL)
        self.SWv, self.PRECv, self.PRECrow = ub(self.SW), ub(self.PREC), ub(self.PREC.unsqueeze(-2))
        self.BFv, self.BWDv, self.FWDv, self.CRv = ub(self.BF), ub(self.BF[..., :N]), ub(self.BF[..., N:]), ub(self.CR)
        self.NRMv, self.NRMrow = ub(self.NRM), ub(self.NRM.unsqueeze(-2))
        self.S0Rv, self.WRv, self.RDv = ub(self.S0R), ub(self.WR), ub(self.RD)
        self.RDin = ub(self.X[0][1:, :, :RW])
        self.bv: BackwardViews | None = None  # views for the backward, made at the first backward

    def backward_views(self, R: int, W: int, Lc: int) -> "BackwardViews":
        """The :class:`BackwardViews` of this workspace (made once, at the first backward)."""
        if self.bv is None:
            self.bv = BackwardViews(self, R, W, Lc)
        return self.bv


class BackwardViews:
    """Per-step views of :class:`ForwardWorkspace` buffers used by the backward."""

    def __init__(self, f: ForwardWorkspace, R: int, W: int, Lc: int) -> None:
        ub = _unbind
        T, B, N = f.SU.shape
        C = f.TC[0].shape[-1]
        lay = interface_layout(R, W)
        self.sf = [ub(a[..., C:2 * C]) for a in f.A]
        self.xi_keys = ub(f.XI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
        self.PIv, self.PI1 = ub(f.PI), ub(f.PI[:, :, 1].unsqueeze(-1))
        self.CRv, self.MEMv, self.MEMT = ub(f.CR), ub(f.MEM), ub(f.MEM.transpose(-1, -2))
        self.WRT = ub(f.WR.transpose(-1, -2))
        self.NRMv, self.NRMrow = ub(f.NRM), ub(f.NRM.unsqueeze(-2))
        self.LLTv, self.LNKv, self.DECv = ub(f.LL.transpose(-1, -2)), ub(f.LNK), ub(f.DEC)
        self.WWrow, self.PRECv, self.KEEPMv = ub(f.WW.unsqueeze(-2)), ub(f.PREC), ub(f.KEEPM)
        self.DIv, self.CWv = ub(f.DI), ub(f.CW)
        self.KHr, self.KHw = ub(f.KH[:, :, :R]), ub(f.KH[:, :, R:R + 1])
        self.WRv, self.PHIv = ub(f.WR), ub(f.PHI)
        self.free_col = ub(f.SG[..., W:W + R].unsqueeze(-1))


class BackwardWorkspace:
    """Buffers of the backward: local derivatives of every step, gradient buffers, views."""

    def __init__(self, T: int, B: int, C: int, N: int, W: int, R: int, Lc: int, dtype: torch.dtype,
                 device) -> None:
        kw = {"dtype": dtype, "device": device}
        RW, lay, G4 = R * W, interface_layout(R, W), 4 * C
        self.GF = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]  # gate derivative factors
        self.ODT = [torch.empty(T, B, C, **kw) for _ in range(Lc)]  # σ(o) (1 − tanh² c)
        self.SGD = torch.empty(T, B, W + R + 2, **kw)
        self.RSP, self.BR, self.NBR3 = (torch.empty(T, B, R + 1, **kw) for _ in range(3))
        self.CWC = torch.empty(T, B, 1, **kw)
        self.JC = torch.empty(T, B, N, N, **kw)  # scratch of the allocation Jacobian
        self.JS = torch.empty(T, B, N, N, **kw)
        self.upper = torch.ones(N, N, **kw).triu_(1)
        self.Q = torch.empty(T, B, N, N, **kw)  # p_{t-1}[j] − L_{t-1}[i, j]
        self.OMSW = torch.empty(T, B, 1, **kw)
        self.FU, self.FW = torch.empty(T, B, N, **kw), torch.empty(T, B, N, **kw)
        self.NOTH, self.RGT = torch.empty(T, B, R, N, **kw), torch.empty(T, B, R, N, **kw)
        self.NEGN3 = torch.empty(T + 1, B, N, **kw)
        self.S0RN = torch.empty(T, B, R, N, **kw)  # (k̂ · M_t[i]) (−n_t[i]³): d n_t folded with ∂n/∂M
        self.S0WN = torch.empty(T, B, N, **kw)  # (k̂_w · M_{t-1}[i]) (−n_{t-1}[i]³)
        self.BCF = torch.empty(T, B, R, 3, N, **kw)  # (backward, content, forward) weightings
        self.PI02 = torch.empty(T, B, R, 2, 1, **kw)
        self.Z = torch.empty(T, B, 3 * R, N, **kw)  # [π0 w^r_{t-1}; d w^r_t; π2 w^r_{t-1}]
        self.VE = torch.empty(T, B, 1, 2 * W, **kw)  # [v | −e]
        self.GXI = torch.empty(T, B, lay["size"], **kw)
        self.GZ = [torch.empty(T, B, G4, **kw) for _ in range(Lc)]
        self.EXT0 = torch.empty(T, B, RW + C, **kw)  # grads of (r_t, h^0_t)
        self.GH = [self.EXT0[..., RW:]] + [torch.empty(T, B, C, **kw) for _ in range(1, Lc)]
        self.GKH = torch.empty(B, R + 1, W, **kw)
        self.GFB = torch.empty(B, R, 2 * N, **kw)  # (d backward | d forward)
        self.GMM = torch.empty(B, N, 2 * W, **kw)  # [dM_t | dM_t ∘ M_{t-1}]
        self.nbytes = _nbytes(self)

        ub = _unbind
        self.ctrl = [(ub(gf[..., :3 * C].unflatten(-1, (3, C))), ub(gf[..., 3 * C:]), ub(odt))
                  for gf, odt in zip(self.GF, self.ODT)]
        self.SGDv, self.RSPv, self.BRcol = ub(self.SGD), ub(self.RSP), ub(self.BR.unsqueeze(-1))
        self.NBR3v, self.CWCv = ub(self.NBR3), ub(self.CWC)
        self.Qv, self.JSv, self.OMSWv = ub(self.Q), ub(self.JS), ub(self.OMSW)
        self.FUv, self.FWv, self.NOTHv = ub(self.FU), ub(self.FW), ub(self.NOTH)
        self.BCFv, self.PI02v = ub(self.BCF.view(T, B * R, 3, N)), ub(self.PI02)
        self.S0RNv, self.S0WNv = ub(self.S0RN), ub(self.S0WN)
        self.Zmid, self.ZY = ub(self.Z[:, :, R:2 * R]), ub(self.Z[:, :, R:])
        self.ZXT = ub(self.Z[:, :, :2 * R].transpose(-1, -2))
        self.VEv = ub(self.VE)
        self.GRv = ub(self.EXT0[..., :RW].unflatten(-1, (R, W)))
        self.EXT0v = ub(self.EXT0)
        self.GHv = [ub(x) for x in self.GH]
        self.GZv = [ub(x) for x in self.GZ]
        self.GZ3 = [ub(x[..., :3 * C].unflatten(-1, (3, C))) for x in self.GZ]
        self.GZo = [ub(x[..., 3 * C:]) for x in self.GZ]
        self.GXIv = ub(self.GXI)
        self.g_keys = ub(self.GXI[..., :lay["str"]].unflatten(-1, (R + 1, W)))
        self.g_str = ub(self.GXI[..., lay["str"]:lay["v"]])
        self.g_ve = ub(self.GXI[..., lay["v"]:lay["free"]])
        self.g_free = ub(self.GXI[..., lay["free"]:lay["ga"]])
        self.g_gates = ub(self.GXI[..., lay["ga"]:lay["modes"]])
        self.g_sig = ub(self.GXI[..., lay["sig"]:lay["modes"]])
        self.g_modes = ub(self.GXI[..., lay["modes"]:].unflatten(-1, (3, R)))
        self.GFB4 = self.GFB.view(B, R, 2, N)
        self.GKHr, self.GKHw = self.GKH[:, :R], self.GKH[:, R]
        self.GMMa, self.GMMb = self.GMM[..., :W], self.GMM[..., W:]
