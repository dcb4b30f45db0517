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
The layer recurrences are the ops of :mod:`memnets.ops.lsam` (:func:`lsam_scan`, fused, and
:func:`lsam_scan_reference`), re-exported here.

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
from ..ops.lsam import lsam_cell_step, lsam_scan, lsam_scan_reference
from .packed import PackedSequence, lengths_of, repack, reverse_within, running, sort_state, unpack_sorted, unsort_state
from ..registry import register_model
from ..ops._impl import resolve_impl, runs_fused
from ..ops.gpu.graphs import fresh_zeros

__all__ = ["LSAMCell", "LSAMCellState", "LSAM", "LSAMState", "lsam_scan", "lsam_scan_reference",
           "lsam_cell_step"]


#: The write gate's pre-activation after a packed sequence's end: σ of it is exactly 0 in every
#: floating type the scans run in, so the memory is left as it was (and no gradient flows there).
_CLOSED = -1e6


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
        impl: ``"auto"`` (default; = ``"fused"``), ``"fused"`` (per-step recurrence with a
            hand-written backward, :func:`memnets.ops.lsam.lsam_scan`) or ``"reference"`` (a loop
            of :func:`lsam_cell_step` under plain autograd: slower, twice differentiable).
            ``model.impl`` holds the resolved value.
        device, dtype: where and in which type the parameters are made (as ``torch.nn.LSTM``'s).

    Parameters per layer ``l`` (``dirs`` = 2 if bidirectional else 1, ``D' = D/dirs``,
    ``H' = H/dirs``, ``G = 3D' + 2H'``): ``weight_ih_l{l} [dirs, G, in_l]``,
    ``weight_hh_l{l} [dirs, G, D']``, ``bias_l{l} [dirs, G]``; direction j of layer l is
    exactly an :class:`LSAMCell` (D', H') with ``weight_ih = weight_ih_l{l}[j]`` etc.

    ``forward(x, state=None) -> (output [B, T, D], LSAMState)``; ``x`` may also be a
    ``torch.nn.utils.rnn.PackedSequence`` (sequences of different lengths), as ``torch.nn.LSTM``
    takes it: the output is then packed alike, and each sequence's state is its own after its
    last step (:mod:`memnets.memories.packed`; the backward direction starts at that step). An
    unbatched ``x [T, input_size]`` (whatever ``batch_first`` says) gives ``output [T, D]`` and a
    state without the batch dim (``memory [L*dirs, H/dirs, d, d]``, ``h [L*dirs, D/dirs]``),
    which ``forward`` takes back.
    """

    def __init__(self, input_size: int, hidden_size: int, num_heads: int, num_layers: int = 1,
                 bidirectional: bool = False, batch_first: bool = True, dropout: float = 0.0,
                 impl: str = "auto", device=None, dtype=None):
        super().__init__()
        self.impl = resolve_impl("LSAM", impl)
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
                p = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
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
        """Zero :class:`LSAMState` for ``batch_size`` sequences (on the parameters' device and in their
        dtype unless ``device`` / ``dtype`` say otherwise)."""
        check_positive_int("batch_size", batch_size)
        dtype = dtype or self.weight_ih_l0.dtype
        n, dirs, d = self.num_layers * self.num_directions, self.num_directions, self.head_dim
        device = self.weight_ih_l0.device if device is None else torch.device(device)
        return LSAMState(*fresh_zeros([((n, batch_size, self.num_heads // dirs, d, d), dtype, device),
                                       ((n, batch_size, self.hidden_size // dirs), dtype, device)]))  # one fill

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
        """``x [B, T, input_size]`` (or ``[T, B, ·]``, or a PackedSequence) -> ``(output [B, T, D],
        LSAMState)``."""
        if isinstance(x, PackedSequence):
            return self._forward_packed(x, state)
        check_tensor("x", x)
        if x.dim() == 2:  # unbatched [T, input_size], as torch.nn.LSTM takes it
            check_shape("x", x, ["T", "input_size"], [None, self.input_size])
            if state is not None:
                if not (isinstance(state, tuple) and len(state) == 2):
                    raise TypeError(f"`state` expected an LSAMState(memory, h), got {type(state).__name__}")
                state = LSAMState(state.memory.unsqueeze(1), state.h.unsqueeze(1))
            y, state = self.forward(x.unsqueeze(0) if self.batch_first else x.unsqueeze(1), state)
            return (y[0] if self.batch_first else y[:, 0]), LSAMState(state.memory[:, 0], state.h[:, 0])
        sym = ["B", "T", "input_size"] if self.batch_first else ["T", "B", "input_size"]
        check_shape("x", x, sym, [None, None, self.input_size])
        check_input_dtype("x", x, self.weight_ih_l0.dtype)
        xt = x.transpose(0, 1) if self.batch_first else x  # [T, B, F]
        T, B = xt.shape[0], xt.shape[1]
        if T == 0 or B == 0:
            raise ValueError(f"`x` expected non-empty batch and time dims, got {list(x.shape)}")
        state = self._start_state(state, B, x)
        dirs, Hp = self.num_directions, self.num_heads // self.num_directions
        mems, hs = [], []
        inp = xt
        for l in range(self.num_layers):
            w_ih, w_hh, b = self.layer_weights(l)
            sl = slice(l * dirs, (l + 1) * dirs)
            scan = lsam_scan if runs_fused(self.impl) else lsam_scan_reference
            out, M_T, h_T = scan(inp, w_ih, w_hh, b, state.memory[sl], state.h[sl], Hp)
            mems.append(M_T)
            hs.append(h_T)
            inp = out  # [T, B, D]
            if self.dropout and self.training and l < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        y = inp.transpose(0, 1) if self.batch_first else inp
        # the scan's final memory is a tensor of its own (one layer: no copy); h_T, a step of the output, is copied
        return y, LSAMState(mems[0] if len(mems) == 1 else torch.cat(mems, 0), torch.cat(hs, 0))

    def _start_state(self, state: LSAMState | None, B: int, x: torch.Tensor) -> LSAMState:
        """``state``, checked, or zeros for ``B`` sequences; under autocast the state is kept in
        the parameters' dtype (the scans run in float32), else in ``x``'s."""
        sdtype = self.weight_ih_l0.dtype if torch.is_autocast_enabled(x.device.type) else x.dtype
        if state is None:
            return self.init_state(B, x.device, sdtype)
        self._check_state(state, B, sdtype)
        return state

    def _forward_packed(self, packed: PackedSequence, state: LSAMState | None):
        """:meth:`forward` of a packed batch, one scan per layer and direction over the padded
        batch: the backward direction reads each sequence reversed within its own length (so
        every sequence starts at step 0), and after its end a sequence's write gate is held at
        exactly 0 (a pre-activation of :data:`_CLOSED` through one more input column), so its
        memory stays as its last step left it; its last read ``h`` is its output there."""
        x = unpack_sorted(packed)  # [B, T, F], longest first
        check_shape("x.data", packed.data, ["N", "input_size"], [None, self.input_size])
        check_input_dtype("x", x, self.weight_ih_l0.dtype)
        B = x.shape[0]
        state = sort_state(self._start_state(state, B, x), packed, 1)  # given in the batch's own order
        lengths = lengths_of(packed.batch_sizes)
        valid = running(packed.batch_sizes, x.device)  # [T, B]
        ended = (~valid).to(x.dtype)[..., None]  # [T, B, 1]: the extra input column
        last = (lengths - 1).to(x.device)[None, :, None]  # [1, B, 1]
        dirs, Hp = self.num_directions, self.num_heads // self.num_directions
        Dp = self.hidden_size // dirs
        scan = lsam_scan if runs_fused(self.impl) else lsam_scan_reference
        mems, hs = [], []
        inp = x.transpose(0, 1)  # [T, B, F]
        for l in range(self.num_layers):
            w_ih, w_hh, b = self.layer_weights(l)
            closing = w_ih.new_zeros(1, w_ih.shape[1], 1)  # [1, G, 1]: rows q | k | v | p_r | p_w
            closing[:, 3 * Dp + Hp:] = _CLOSED
            outs = []
            for j in range(dirs):
                i, one = l * dirs + j, slice(j, j + 1)
                src = inp if j == 0 else reverse_within(inp, lengths, time_dim=0)
                out, M, _ = scan(torch.cat([src, ended.to(src.dtype)], -1), torch.cat([w_ih[one], closing], -1),
                                 w_hh[one], b[one], state.memory[i:i + 1], state.h[i:i + 1], Hp)
                hs.append(out.gather(0, last.expand(1, B, Dp)))  # [1, B, D']: the read at each one's last step
                mems.append(M)
                out = out * valid[..., None]  # zeros after each end
                outs.append(out if j == 0 else reverse_within(out, lengths, time_dim=0))
            inp = outs[0] if dirs == 1 else torch.cat(outs, -1)  # [T, B, D]
            if self.dropout and self.training and l < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        final = LSAMState(torch.cat(mems, 0), torch.cat(hs, 0))
        return repack(inp.transpose(0, 1), packed), unsort_state(final, packed, 1)

    def step(self, x_t: torch.Tensor, state: LSAMState | None = None):
        """One token: ``x_t [B, input_size]`` -> ``(y_t [B, D], LSAMState)`` (unidirectional only)."""
        if self.bidirectional:
            raise ValueError("`step` needs a unidirectional LSAM (bidirectional=False)")
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.input_size])
        x = x_t.unsqueeze(1) if self.batch_first else x_t.unsqueeze(0)
        y, state = self.forward(x, state)
        return (y[:, 0] if self.batch_first else y[0]), state
