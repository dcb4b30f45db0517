"""LSAM — Long Short-term Attention Memory (docs/maths.md §2, §12).

Per head, with ``z_t = [x_t : h_{t-1}]``::

    [q_t : k_t : v_t] = W_qkv z_t + b_qkv
    (p_r, p_w)        = σ(W_rw z_t + b_rw)
    M_t               = WR(M_{t-1}, μ(k_t), v_t, p_w, p_w)
    h_t               = RD(M_t, μ(q_t), p_r)

:class:`LSAMCell` is the one-step reference written with :func:`memnets.ops.nam_write` /
:func:`memnets.ops.nam_read`. :class:`LSAM` is the ``torch.nn.LSTM``-shaped layer stack: the
input part of every projection is one matmul over the whole sequence, only the ``h_{t-1}``
part runs per step, and a bidirectional layer runs both directions in the same batched step.

Projection rows are laid out ``[q (D) | k (D) | v (D) | p_r (H) | p_w (H)]``; q, k, v are cut
into H contiguous heads of width ``d = D / H``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_input_dtype, check_positive_int, check_shape, check_tensor
from ..ops import merge_heads, nam_read, nam_write, split_heads, unit
from ..ops._amp import float32_under_autocast
from ..registry import register_model
from . import _lsam_loops

__all__ = ["LSAMCell", "LSAMCellState", "LSAM", "LSAMState", "lsam_scan", "lsam_scan_reference",
           "lsam_cell_step"]


class LSAMCellState(NamedTuple):
    """State of :class:`LSAMCell`: ``memory`` ``[B, H, d, d]`` (M_t) and ``h`` ``[B, D]``."""

    memory: torch.Tensor
    h: torch.Tensor


class LSAMState(NamedTuple):
    """State of :class:`LSAM` (like ``(h_n, c_n)`` of ``torch.nn.LSTM``).

    ``memory``: ``[L*dirs, B, H/dirs, d, d]`` — NAM memories per layer and direction
    (index ``l*dirs + j``, direction 0 forward, 1 backward), ``d = hidden_size / num_heads``.
    ``h``: ``[L*dirs, B, hidden_size/dirs]`` — last read vectors. For the backward direction
    the state given to ``forward`` is the one entering at the *last* time step and the
    returned one is after the first time step, as in ``torch.nn.LSTM``.
    """

    memory: torch.Tensor
    h: torch.Tensor


def _head_major_index(Dp: int, Hp: int, device) -> torch.Tensor:
    """Row permutation from ``[q | k | v | p_r | p_w]`` to per-head blocks ``[q_i k_i v_i r_i w_i]``."""
    d = Dp // Hp
    heads = torch.arange(Hp, device=device)
    rows = torch.arange(d, device=device)
    q = heads[:, None] * d + rows[None, :]  # [H', d]
    idx = torch.cat([q, Dp + q, 2 * Dp + q, (3 * Dp + heads)[:, None], (3 * Dp + Hp + heads)[:, None]], 1)
    return idx.reshape(-1)  # [H' * (3d + 2)]


_EPS = 1e-6  # μ's eps, as in memnets.ops.unit
_SEGMENT = 32  # steps between exact memory copies kept for the backward pass


class _LSAMRecurrence(torch.autograd.Function):
    """The per-step part of :func:`lsam_scan` with a hand-written backward (docs/maths.md §2).

    Forward, per step (N = dirs·B·H' memories, rows of ``g`` in per-head blocks)::

        g = gx_t + h_{t-1} W_hhᵀ;  (q, k) = μ(.);  (p_r, p_w) = σ(.)
        (a_q, a_k) = (M q, M k);  u = p_w (v − a_k);  M ← M + u kᵀ
        h_t = p_r (a_q + u (q·k))          # = RD(WR(M, k, v, p_w, p_w), q, p_r)

    The loops themselves are :mod:`memnets.memories._lsam_loops` (compiled by TorchScript
    where available). The memory is updated in place in one buffer, kept transposed (``Mᵀ``,
    so that the row-vector products ``(q, k) Mᵀ`` read it row-major): no ``[N, d, d]`` tensor
    is allocated per step. ``w_hh`` is ``[dirs, G, D']`` (rows in per-head blocks). Backward
    walks the steps in reverse and recovers ``M_{t-1} = M_t − u_t k_tᵀ`` in place; an exact
    copy kept every :data:`_SEGMENT` steps resets that buffer, so rounding drift is bounded by
    a few ulps per segment while memory is O(T / _SEGMENT) memories. The weight gradient
    ``Σ_t h_{t-1}ᵀ dg_t`` is one matmul after the loop. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, gx, w_hh, M0, h0, compiled=True):
        fwd, _, _ = _lsam_loops.loops(compiled)
        T, dirs, B, _ = gx.shape
        Dp, N, d = w_hh.shape[2], M0.shape[0], M0.shape[-1]
        X = M0.transpose(1, 2).contiguous()  # Mᵀ, updated in place
        new = gx.new_empty
        out, QK, NRM, P, CQ = new(T, dirs, B, Dp), new(T, N, 2, d), new(T, N, 2, 1), new(T, N, 2), new(T, N)
        E, U, R, ckpts = new(T, N, d), new(T, N, d), new(T, N, d), new((T - 1) // _SEGMENT, N, d, d)
        fwd(gx, w_hh, X, h0, out, QK, NRM, P, CQ, E, U, R, ckpts, _SEGMENT, _EPS)
        ctx.save_for_backward(w_hh, h0, out, X, ckpts, QK, NRM, P, CQ, E, U, R)
        ctx.compiled = compiled
        return out, X.transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, dout, dM):
        w_hh, h0, out, X_T, ckpts, QK, NRM, P, CQ, E, U, R = ctx.saved_tensors  # X = Mᵀ, ckpts too
        _, bwd, _ = _lsam_loops.loops(ctx.compiled)
        T, dirs, B, Dp = out.shape
        N, d = X_T.shape[0], X_T.shape[-1]
        G = w_hh.shape[1]
        dM = torch.zeros_like(X_T) if dM is None else dM.contiguous().clone()
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        S = P * (1 - P)  # σ' for all steps: [T, N, 2]
        INV = 1.0 / NRM  # [T, N, 2, 1] (NRM holds max(‖x‖, eps))
        QKM = QK * (NRM > _EPS)  # μ's projection only where ‖x‖ > eps: [T, N, 2, d]
        QKS = torch.cat([QK[:, :, 1:], QK[:, :, :1]], 2)  # (k, q): [T, N, 2, d]
        work = X_T.transpose(1, 2).contiguous()  # M_T, reversed in place to M_0
        dgx = out.new_empty(T, dirs, B, G)
        dh = bwd(w_hh, work, dM, out.new_zeros(N, d), dout, dgx, ckpts, QK, U, P, CQ, R, E, QKS, QKM, INV, S,
                 _SEGMENT)
        dw = None
        if ctx.needs_input_grad[1]:
            hprev = torch.cat([h0.unsqueeze(0), out[:-1]], 0)  # [T, dirs, B, D']
            if dirs == 1:  # Σ_t dg_tᵀ h_{t-1}: one 2-D matmul
                dw = torch.mm(dgx.view(T * B, G).t(), hprev.view(T * B, Dp)).unsqueeze(0)  # [1, G, D']
            else:
                dg = dgx.permute(1, 3, 0, 2).reshape(dirs, G, T * B)  # [dirs, G, T*B]
                dw = torch.bmm(dg, hprev.transpose(0, 1).reshape(dirs, T * B, Dp))  # [dirs, G, D']
        return dgx, dw, dM, dh.view(dirs, B, Dp), None


@float32_under_autocast
def lsam_scan(x: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor, bias: torch.Tensor,
              memory: torch.Tensor, h: torch.Tensor, num_heads: int, compiled: bool = True):
    """Run one LSAM layer (all its directions at once) over a sequence — the fast path.

    Args:
        x: ``[T, B, F]`` time-major input.
        weight_ih ``[dirs, G, F]``, weight_hh ``[dirs, G, D']``, bias ``[dirs, G]``: the
            :class:`LSAMCell` parameters of each direction (rows ``q | k | v | p_r | p_w``).
        memory: ``[dirs, B, H', d, d]``; h: ``[dirs, B, D']`` initial states.
        num_heads: H' heads per direction.
        compiled: use the TorchScript-compiled loops where available (``False``: the same
            loops as plain Python).
    Returns:
        ``(out [T, B, dirs*D'], memory [dirs, B, H', d, d], h [dirs, B, D'])``; direction 1
        runs from t = T-1 down to 0. Under autocast the whole layer runs in float32 with
        autocast off (inputs cast up; :mod:`memnets.ops._amp`) and returns float32.

    The input projection of every step and direction is one matmul; per step only
    ``h_{t-1} W_hhᵀ`` (one batched matmul over directions) and the NAM update remain, with a
    hand-written backward (:class:`_LSAMRecurrence`). Rows are permuted to per-head blocks
    so that a step needs views only.
    """
    T, B, Fi = x.shape
    dirs, G, Dp = weight_hh.shape
    Hp = num_heads
    d = Dp // Hp
    idx = _head_major_index(Dp, Hp, x.device)
    w_ih = weight_ih.index_select(1, idx)  # [dirs, G, F], head-major rows
    w_hh = weight_hh.index_select(1, idx)  # [dirs, G, D'], head-major rows
    b = bias.index_select(1, idx)  # [dirs, G]
    gx = F.linear(x, w_ih.reshape(dirs * G, Fi), b.reshape(dirs * G))  # [T, B, dirs*G]
    gx = gx.unflatten(-1, (dirs, G)).transpose(1, 2)  # [T, dirs, B, G]
    if dirs == 2:
        gx = torch.stack([gx[:, 0], gx[:, 1].flip(0)], dim=1)  # backward direction reversed in time
    M0 = memory.reshape(dirs * B * Hp, d, d)  # [N, d, d]
    out, M = _LSAMRecurrence.apply(gx.contiguous(), w_hh, M0, h.contiguous(), bool(compiled))
    h_T = out[-1]  # [dirs, B, D']
    if dirs == 2:
        out = torch.cat([out[:, 0], out[:, 1].flip(0)], dim=-1)  # [T, B, 2D']
    else:
        out = out[:, 0]  # [T, B, D']
    return out, M.view(dirs, B, Hp, d, d), h_T


def lsam_cell_step(x_t, memory, h, weight_ih, weight_hh, bias, num_heads):
    """One LSAM step (docs/maths.md §2) with :func:`nam_write` / :func:`nam_read`, plain autograd.

    x_t ``[B, F]``, memory ``[B, H, d, d]``, h ``[B, D]``, weight_ih ``[3D+2H, F]``,
    weight_hh ``[3D+2H, D]``, bias ``[3D+2H]`` -> ``(memory, h)`` after the step.
    """
    D, H = h.shape[-1], num_heads
    z = torch.cat([x_t, h], dim=-1)  # [B, F + D]
    g = F.linear(z, torch.cat([weight_ih, weight_hh], dim=1), bias)
    q, k, v, a_r, a_w = g.split([D, D, D, H, H], dim=-1)
    q = unit(split_heads(q, H))  # [B, H, d]
    k = unit(split_heads(k, H))  # [B, H, d]
    v = split_heads(v, H)  # [B, H, d]
    p_r, p_w = torch.sigmoid(a_r), torch.sigmoid(a_w)  # [B, H]
    memory = nam_write(memory, k, v, p_w, p_w)
    return memory, merge_heads(nam_read(memory, q, p_r))  # [B, H, d, d], [B, D]


def lsam_scan_reference(x, weight_ih, weight_hh, bias, memory, h, num_heads):
    """:func:`lsam_scan` as a loop of :func:`lsam_cell_step` (same signature and results;
    plain autograd, so also twice differentiable)."""
    dirs, outs, mems, hs = weight_hh.shape[0], [], [], []
    for j in range(dirs):
        xs = x if j == 0 else x.flip(0)
        M, hj, ys = memory[j], h[j], []
        for x_t in xs.unbind(0):
            M, hj = lsam_cell_step(x_t, M, hj, weight_ih[j], weight_hh[j], bias[j], num_heads)
            ys.append(hj)
        y = torch.stack(ys, 0)  # [T, B, D']
        outs.append(y if j == 0 else y.flip(0))
        mems.append(M)
        hs.append(hj)
    return torch.cat(outs, -1), torch.stack(mems, 0), torch.stack(hs, 0)


def _init_uniform(t: torch.Tensor, fan_in: int) -> None:
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(t, -bound, bound)


class LSAMCell(nn.Module):
    """One LSAM step straight from docs/maths.md §2 (the reference for :class:`LSAM`).

    Args:
        input_size: width of ``x_t``.
        hidden_size: D, width of ``h_t``; divisible by ``num_heads``.
        num_heads: H, number of NAM memories of size ``d × d``, ``d = D / H``.

    Parameters: ``weight_ih [3D+2H, input_size]``, ``weight_hh [3D+2H, D]``, ``bias [3D+2H]``
    (rows ``q | k | v | p_r | p_w``).
    """

    def __init__(self, input_size: int, hidden_size: int, num_heads: int):
        super().__init__()
        check_positive_int("input_size", input_size)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_heads", num_heads)
        if hidden_size % num_heads:
            raise ValueError(f"`hidden_size`={hidden_size} must be divisible by `num_heads`={num_heads}")
        self.input_size, self.hidden_size, self.num_heads = input_size, hidden_size, num_heads
        G = 3 * hidden_size + 2 * num_heads
        self.weight_ih = nn.Parameter(torch.empty(G, input_size))
        self.weight_hh = nn.Parameter(torch.empty(G, hidden_size))
        self.bias = nn.Parameter(torch.empty(G))
        for p in self.parameters():
            _init_uniform(p, input_size + hidden_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def init_state(self, batch_size: int, device=None, dtype=None) -> LSAMCellState:
        """Zero memory ``[B, H, d, d]`` and zero ``h`` ``[B, D]`` (M_0 = 0, h_0 = 0)."""
        check_positive_int("batch_size", batch_size)
        dtype = dtype or self.weight_ih.dtype
        d = self.head_dim
        return LSAMCellState(
            torch.zeros(batch_size, self.num_heads, d, d, device=device, dtype=dtype),
            torch.zeros(batch_size, self.hidden_size, device=device, dtype=dtype),
        )

    def step(self, x_t: torch.Tensor, state: LSAMCellState | None = None):
        """``x_t [B, input_size]`` -> ``(h_t [B, D], LSAMCellState)``."""
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.input_size])
        B, D, H, d = x_t.shape[0], self.hidden_size, self.num_heads, self.head_dim
        if state is None:
            state = self.init_state(B, x_t.device, x_t.dtype)
        check_shape("state.memory", state.memory, ["B", "H", "d", "d"], [B, H, d, d])
        check_shape("state.h", state.h, ["B", "D"], [B, D])
        memory, h = lsam_cell_step(x_t, state.memory, state.h, self.weight_ih, self.weight_hh, self.bias, H)
        return h, LSAMCellState(memory, h)

    def forward(self, x: torch.Tensor, state: LSAMCellState | None = None):
        """Loop :meth:`step` over ``x [B, T, input_size]`` -> ``(y [B, T, D], state)``."""
        check_shape("x", x, ["B", "T", "input_size"], [None, None, self.input_size])
        ys = []
        for t in range(x.shape[1]):
            y, state = self.step(x[:, t], state)
            ys.append(y)
        return torch.stack(ys, dim=1), state


@register_model("lsam")
class LSAM(nn.Module):
    """Multi-layer (bi)directional LSAM shaped like ``torch.nn.LSTM`` (docs/maths.md §2, §12).

    Args:
        input_size: width of the input features.
        hidden_size: D, width of the output (also when bidirectional: each direction then
            has width D/2 and H/2 heads, outputs concatenated ``[forward : backward]``).
        num_heads: H, total heads per layer (even when bidirectional); head width D/H.
        num_layers: stacked layers; layer l > 0 reads the output of layer l-1.
        bidirectional: half the heads run forward in time, half backward.
        batch_first: ``x`` is ``[B, T, F]`` (True) or ``[T, B, F]``.
        dropout: dropout on the outputs of every layer except the last (training only).
        impl: "fused" (per-step recurrence with a hand-written backward) or "reference"
            (a loop of :func:`lsam_cell_step` under plain autograd: slower, twice differentiable).

    Parameters per layer ``l`` (``dirs`` = 2 if bidirectional else 1, ``D' = D/dirs``,
    ``H' = H/dirs``, ``G = 3D' + 2H'``): ``weight_ih_l{l} [dirs, G, in_l]``,
    ``weight_hh_l{l} [dirs, G, D']``, ``bias_l{l} [dirs, G]``; direction j of layer l is
    exactly an :class:`LSAMCell` (D', H') with ``weight_ih = weight_ih_l{l}[j]`` etc.

    ``forward(x, state=None) -> (output [B, T, D], LSAMState)``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_heads: int, num_layers: int = 1,
                 bidirectional: bool = False, batch_first: bool = True, dropout: float = 0.0,
                 impl: str = "fused"):
        super().__init__()
        if impl not in ("fused", "reference"):
            raise ValueError(f"`impl` expected 'fused' or 'reference', got {impl!r}")
        self.impl = impl
        check_positive_int("input_size", input_size)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_layers", num_layers)
        dirs = 2 if bidirectional else 1
        if num_heads % dirs or hidden_size % num_heads:
            raise ValueError(
                f"`num_heads`={num_heads} must divide `hidden_size`={hidden_size}"
                + (" and be even (bidirectional)" if bidirectional else ""))
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"`dropout` expected a float in [0, 1), got {dropout!r}")
        self.input_size, self.hidden_size, self.num_heads = input_size, hidden_size, num_heads
        self.num_layers, self.bidirectional, self.batch_first = num_layers, bidirectional, batch_first
        self.dropout, self.num_directions = float(dropout), dirs
        Dp, Hp = hidden_size // dirs, num_heads // dirs
        G = 3 * Dp + 2 * Hp
        for l in range(num_layers):
            in_l = input_size if l == 0 else hidden_size
            for name, shape in ((f"weight_ih_l{l}", (dirs, G, in_l)), (f"weight_hh_l{l}", (dirs, G, Dp)),
                                (f"bias_l{l}", (dirs, G))):
                p = nn.Parameter(torch.empty(shape))
                _init_uniform(p, in_l + Dp)
                self.register_parameter(name, p)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def layer_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weight_ih [dirs, G, in], weight_hh [dirs, G, D'], bias [dirs, G])`` of a layer."""
        return (getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}"),
                getattr(self, f"bias_l{layer}"))

    def init_state(self, batch_size: int, device=None, dtype=None) -> LSAMState:
        """Zero :class:`LSAMState` for ``batch_size`` sequences."""
        check_positive_int("batch_size", batch_size)
        dtype = dtype or self.weight_ih_l0.dtype
        n, dirs, d = self.num_layers * self.num_directions, self.num_directions, self.head_dim
        return LSAMState(
            torch.zeros(n, batch_size, self.num_heads // dirs, d, d, device=device, dtype=dtype),
            torch.zeros(n, batch_size, self.hidden_size // dirs, device=device, dtype=dtype),
        )

    def _check_state(self, state: LSAMState, B: int, dtype: torch.dtype) -> None:
        if not (isinstance(state, tuple) and len(state) == 2):
            raise TypeError(f"`state` expected an LSAMState(memory, h), got {type(state).__name__}")
        n, dirs, d = self.num_layers * self.num_directions, self.num_directions, self.head_dim
        check_shape("state.memory", state.memory, ["L*dirs", "B", "H/dirs", "d", "d"],
                    [n, B, self.num_heads // dirs, d, d])
        check_shape("state.h", state.h, ["L*dirs", "B", "D/dirs"], [n, B, self.hidden_size // dirs])
        if state.memory.dtype != dtype or state.h.dtype != dtype:
            raise TypeError(f"`state` expected dtype {dtype} like `x`, got {state.memory.dtype} / {state.h.dtype}")

    def forward(self, x: torch.Tensor, state: LSAMState | None = None):
        """``x [B, T, input_size]`` (or ``[T, B, ·]``) -> ``(output [B, T, D], LSAMState)``."""
        check_tensor("x", x)
        sym = ["B", "T", "input_size"] if self.batch_first else ["T", "B", "input_size"]
        check_shape("x", x, sym, [None, None, self.input_size])
        check_input_dtype("x", x, self.weight_ih_l0.dtype)
        xt = x.transpose(0, 1) if self.batch_first else x  # [T, B, F]
        T, B = xt.shape[0], xt.shape[1]
        if T == 0 or B == 0:
            raise ValueError(f"`x` expected non-empty batch and time dims, got {list(x.shape)}")
        # under autocast the state is kept in the parameters' dtype (the scans run in float32)
        sdtype = self.weight_ih_l0.dtype if torch.is_autocast_enabled(x.device.type) else x.dtype
        if state is None:
            state = self.init_state(B, x.device, sdtype)
        else:
            self._check_state(state, B, sdtype)
        dirs, Hp = self.num_directions, self.num_heads // self.num_directions
        mems, hs = [], []
        inp = xt
        for l in range(self.num_layers):
            w_ih, w_hh, b = self.layer_weights(l)
            sl = slice(l * dirs, (l + 1) * dirs)
            scan = lsam_scan if self.impl == "fused" else lsam_scan_reference
            out, M_T, h_T = scan(inp, w_ih, w_hh, b, state.memory[sl], state.h[sl], Hp)
            mems.append(M_T)
            hs.append(h_T)
            inp = out  # [T, B, D]
            if self.dropout and self.training and l < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        y = inp.transpose(0, 1) if self.batch_first else inp
        return y, LSAMState(torch.cat(mems, 0), torch.cat(hs, 0))

    def step(self, x_t: torch.Tensor, state: LSAMState | None = None):
        """One token: ``x_t [B, input_size]`` -> ``(y_t [B, D], LSAMState)`` (unidirectional only)."""
        if self.bidirectional:
            raise ValueError("`step` needs a unidirectional LSAM (bidirectional=False)")
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.input_size])
        x = x_t.unsqueeze(1) if self.batch_first else x_t.unsqueeze(0)
        y, state = self.forward(x, state)
        return (y[:, 0] if self.batch_first else y[0]), state
