"""Differentiable Neural Computer (docs/maths.md §8; Graves et al. 2016).

An LSTM controller (``controller_layers`` stacked cells) reads ``[x_t ; r^1_{t-1} … r^R_{t-1}]``
and emits the interface vector, split as in docs/maths.md §8: R read keys, R read strengths
``oneplus``, write key, write strength ``oneplus``, erase ``σ``, write vector, R free gates
``σ``, allocation gate ``σ``, write gate ``σ``, R read modes ``softmax`` over
(backward, content, forward). The memory access per step is, in order: retention, usage,
allocation, write weighting, erase/add write, link, precedence, directional and read
weightings, read. The output is ``y_t = W_y h_t + W_r [r^1_t; …; r^R_t]`` (logits).

Everything is batched; the input half of the first controller layer and both output
projections are computed for the whole sequence at once, only the recurrence is per step.
The initial state is all zeros (memory, usage, link, precedence, weightings, reads, LSTM).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._checks import check_input_dtype, check_positive_int, check_shape
from ..ops._amp import float32_under_autocast
from ..ops.addressing import content_weights, erase_add_write, weighted_read
from ..ops.dnc import (DNCRecurrence, dnc_access_fused, dnc_allocation, dnc_directional_weights, dnc_link,
                       dnc_precedence, dnc_read_weights, dnc_retention, dnc_usage, dnc_write_weighting,
                       interface_permutation, interface_sizes)
from ..ops.gpu import use_triton
from ..ops.gpu.dnc import DNCRecurrenceTriton, applies as triton_applies, kernel_form
from ..ops.gpu.graphs import fresh_zeros, graphed_autograd, whole_module
from ..ops.permute import inverse_permutation, permute
from ..registry import register_model
from .packed import PackedSequence, forward_packed
from ..ops._impl import resolve_impl, runs_fused

__all__ = ["DNC", "DNCConfig", "DNCState", "DNCAccessState", "DNCControllerState", "DNCAux"]


@dataclass(frozen=True)
class DNCConfig:
    """Hyper-parameters of :class:`DNC` (defaults: the copy setup of the ``dnc`` package README)."""

    input_size: int
    output_size: int
    memory_slots: int = 16
    word_size: int = 20
    read_heads: int = 4
    controller: str = "lstm"
    controller_size: int = 64
    controller_layers: int = 1


class DNCControllerState(NamedTuple):
    h: torch.Tensor  # [B, layers, C]
    c: torch.Tensor  # [B, layers, C]


class DNCAccessState(NamedTuple):
    memory: torch.Tensor  # [B, N, W]
    usage: torch.Tensor  # [B, N]
    link: torch.Tensor  # [B, N, N]
    precedence: torch.Tensor  # [B, N]
    read_weights: torch.Tensor  # [B, R, N]
    write_weights: torch.Tensor  # [B, N]


class DNCState(NamedTuple):
    """Nested DNC state: controller, memory access and the last read vectors ``[B, R, W]``."""

    controller: DNCControllerState
    access: DNCAccessState
    reads: torch.Tensor  # [B, R, W]


class DNCAux(NamedTuple):
    """Per-step traces returned by ``forward(..., return_aux=True)``."""

    read_weights: torch.Tensor  # [B, T, R, N]
    write_weights: torch.Tensor  # [B, T, N]
    usage: torch.Tensor  # [B, T, N]
    link: torch.Tensor  # [B, T, N, N]
    read_modes: torch.Tensor  # [B, T, R, 3]


def oneplus(x: torch.Tensor) -> torch.Tensor:
    """``1 + softplus(x)`` ∈ [1, ∞) (docs/maths.md §8)."""
    return 1 + F.softplus(x)


@register_model("dnc")
class DNC(nn.Module):
    """Differentiable Neural Computer (docs/maths.md §8).

    Args:
        input_size, output_size: features of ``x_t`` and ``y_t`` (logits).
        memory_slots: N. word_size: W. read_heads: R.
        controller: ``"lstm"`` (the only kind). controller_size: C. controller_layers: stacked cells.
        impl: ``"auto"`` (default; = ``"fused"``), ``"fused"`` (``forward`` runs the whole
            recurrence as one autograd Function with a hand-derived backward,
            :class:`~memnets.ops.dnc.recurrence.DNCRecurrence`; ``step`` and
            ``forward(..., return_aux=True)`` use the same equations regrouped per step,
            :func:`~memnets.ops.dnc.step.dnc_access_fused`) or ``"reference"`` (one
            :mod:`memnets.ops.dnc.equations` call per equation). Both give the same values and
            gradients (tested in float64). ``"fast"``, the old name of ``"fused"``, is
            accepted with a FutureWarning. ``model.impl`` holds the resolved value. On the CUDA
            path (:func:`memnets.ops.gpu.use_triton`) with one controller layer, ``"fused"``'s
            ``forward`` runs the recurrence as Triton kernels
            (:class:`memnets.ops.gpu.dnc.DNCRecurrenceTriton`, two launches per time step each way).

    ``forward(x [B, T, input_size], state=None, return_aux=False)`` returns
    ``(y [B, T, output_size], state)`` and with ``return_aux`` also a :class:`DNCAux`.
    """

    def __init__(self, input_size: int, output_size: int, memory_slots: int = 16, word_size: int = 20,
                 read_heads: int = 4, controller: str = "lstm", controller_size: int = 64,
                 controller_layers: int = 1, impl: str = "auto") -> None:
        super().__init__()
        self.impl = resolve_impl("DNC", impl, {"fast": "fused"})
        for name, v in (("input_size", input_size), ("output_size", output_size), ("memory_slots", memory_slots),
                        ("word_size", word_size), ("read_heads", read_heads), ("controller_size", controller_size),
                        ("controller_layers", controller_layers)):
            check_positive_int(name, v)
        if controller != "lstm":
            raise ValueError(f"`controller` expected 'lstm', got {controller!r}")
        self.config = DNCConfig(input_size, output_size, memory_slots, word_size, read_heads, controller,
                                controller_size, controller_layers)
        W, R, C = word_size, read_heads, controller_size
        self.ctrl_x = nn.Linear(input_size, 4 * C)
        self.ctrl_rec = nn.ModuleList(
            [nn.Linear(R * W + C, 4 * C, bias=False)]
            + [nn.Linear(2 * C, 4 * C) for _ in range(controller_layers - 1)]
        )
        # read keys, read strengths, write key, write strength, erase, write vector,
        # free gates, allocation gate, write gate, read modes
        self._sizes = interface_sizes(R, W)
        self.interface = nn.Linear(C, sum(self._sizes))
        # the interface rows in the fused recurrence's order (not saved: a function of R and W)
        perm = interface_permutation(R, W)
        self.register_buffer("_interface_perm", perm, persistent=False)
        self.register_buffer("_interface_inv", inverse_permutation(perm), persistent=False)
        self.out_h = nn.Linear(C, output_size)
        self.out_r = nn.Linear(R * W, output_size, bias=False)
        with torch.no_grad():  # forget-gate bias 1
            self.ctrl_x.bias[C:2 * C].fill_(1.0)
            for lin in self.ctrl_rec[1:]:
                lin.bias[C:2 * C].fill_(1.0)

    def init_state(self, batch_size: int, device=None, dtype=None) -> DNCState:
        """All-zero initial state for ``batch_size`` sequences."""
        check_positive_int("batch_size", batch_size)
        cfg = self.config
        dev, dt = device or self.interface.weight.device, dtype or self.interface.weight.dtype
        B, N, W, R, C, Lc = batch_size, cfg.memory_slots, cfg.word_size, cfg.read_heads, cfg.controller_size, \
            cfg.controller_layers
        shapes = [(B, Lc, C), (B, Lc, C), (B, N, W), (B, N), (B, N, N), (B, N), (B, R, N), (B, N), (B, R, W)]
        h, c, mem, usage, link, prec, wr, ww, reads = fresh_zeros([(s, dt, dev) for s in shapes])  # one fill
        return DNCState(DNCControllerState(h, c), DNCAccessState(mem, usage, link, prec, wr, ww), reads)

    def _check_state(self, state: DNCState, B: int) -> None:
        cfg = self.config
        N, W, R, C, Lc = cfg.memory_slots, cfg.word_size, cfg.read_heads, cfg.controller_size, cfg.controller_layers
        if not isinstance(state, DNCState):
            raise TypeError(f"`state` expected a DNCState, got {type(state).__name__}")
        check_shape("state.controller.h", state.controller.h, ["B", "layers", "C"], [B, Lc, C])
        check_shape("state.controller.c", state.controller.c, ["B", "layers", "C"], [B, Lc, C])
        a = state.access
        check_shape("state.access.memory", a.memory, ["B", "N", "W"], [B, N, W])
        check_shape("state.access.usage", a.usage, ["B", "N"], [B, N])
        check_shape("state.access.link", a.link, ["B", "N", "N"], [B, N, N])
        check_shape("state.access.precedence", a.precedence, ["B", "N"], [B, N])
        check_shape("state.access.read_weights", a.read_weights, ["B", "R", "N"], [B, R, N])
        check_shape("state.access.write_weights", a.write_weights, ["B", "N"], [B, N])
        check_shape("state.reads", state.reads, ["B", "R", "W"], [B, R, W])

    def _controller(self, gx: torch.Tensor, reads: torch.Tensor, ctrl: DNCControllerState):
        B = gx.shape[0]
        hs, cs = [], []
        inp = reads.reshape(B, -1)  # [B, R*W]
        for layer, lin in enumerate(self.ctrl_rec):
            z = lin(torch.cat([inp, ctrl.h[:, layer]], dim=-1)) + (gx if layer == 0 else 0)
            i, f, g, o = z.chunk(4, dim=-1)
            c = torch.sigmoid(f) * ctrl.c[:, layer] + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
            cs.append(c)
            inp = h
        return inp, DNCControllerState(torch.stack(hs, 1), torch.stack(cs, 1))

    def _access(self, xi: torch.Tensor, a: DNCAccessState):
        """Memory access for one step from the interface vector ``xi [B, |interface|]`` (docs/maths.md §8)."""
        cfg = self.config
        B, R, W = xi.shape[0], cfg.read_heads, cfg.word_size
        (k_r, b_r, k_w, b_w, erase, v, free, g_a, g_w, modes) = torch.split(xi, self._sizes, dim=-1)
        k_r = k_r.reshape(B, R, W)  # [B, R, W]
        read_modes = torch.softmax(modes.reshape(B, R, 3), dim=-1)  # [B, R, 3]
        psi = dnc_retention(torch.sigmoid(free), a.read_weights)
        usage = dnc_usage(a.usage, a.write_weights, psi)
        alloc = dnc_allocation(usage)
        c_w = content_weights(a.memory, k_w, oneplus(b_w).squeeze(-1))
        w_w = dnc_write_weighting(c_w, alloc, torch.sigmoid(g_w).squeeze(-1), torch.sigmoid(g_a).squeeze(-1))
        memory = erase_add_write(a.memory, w_w, torch.sigmoid(erase), v)
        link = dnc_link(a.link, a.precedence, w_w)
        precedence = dnc_precedence(a.precedence, w_w)
        fwd, bwd = dnc_directional_weights(link, a.read_weights)
        c_r = content_weights(memory, k_r, oneplus(b_r))
        w_r = dnc_read_weights(c_r, fwd, bwd, read_modes)
        reads = weighted_read(memory, w_r)  # [B, R, W]
        return reads, DNCAccessState(memory, usage, link, precedence, w_r, w_w), read_modes

    def _access_fused(self, xi: torch.Tensor, a: DNCAccessState, offdiag: torch.Tensor):
        """:meth:`_access` with the equations regrouped into fewer ops (same values;
        :func:`memnets.ops.dnc.dnc_access_fused`)."""
        cfg = self.config
        reads, access, modes = dnc_access_fused(xi, cfg.read_heads, cfg.word_size, *a, offdiag)
        return reads, DNCAccessState(*access), modes

    def _cell(self, gx: torch.Tensor, state: DNCState, offdiag: torch.Tensor | None = None):
        h, ctrl = self._controller(gx, state.reads, state.controller)
        if runs_fused(self.impl):
            if offdiag is None:
                offdiag = self._offdiag(gx)
            reads, access, modes = self._access_fused(self.interface(h), state.access, offdiag)
        else:
            reads, access, modes = self._access(self.interface(h), state.access)
        return h, DNCState(ctrl, access, reads), modes

    def _offdiag(self, ref: torch.Tensor) -> torch.Tensor:
        n = self.config.memory_slots
        return 1 - torch.eye(n, dtype=ref.dtype, device=ref.device)

    def _readout(self, h: torch.Tensor, reads: torch.Tensor) -> torch.Tensor:
        return self.out_h(h) + self.out_r(reads.flatten(-2))  # reads [..., R, W] -> [..., R*W]

    def _check_dtype(self, name: str, x: torch.Tensor) -> None:
        check_input_dtype(name, x, next(self.parameters()).dtype)

    def _scan_applies(self, x: torch.Tensor, state: DNCState) -> bool:
        """The whole-sequence Function runs in one dtype, the parameters' (``forward`` has turned
        autocast off by then); a state of another dtype takes the per-step path, with a warning
        once."""
        dtype = self.interface.weight.dtype
        ok = x.dtype == dtype and all(t.dtype == dtype for t in (*state.controller, *state.access, state.reads))
        if not ok and not getattr(self, "_warned_slow", False):
            self._warned_slow = True
            warnings.warn(f"DNC: the state's dtype differs from the parameters' ({dtype}); running the "
                          "per-step path instead of the fused one (convert the state with .to)", stacklevel=3)
        return ok

    def _forward_graphed(self, key: tuple, x: torch.Tensor, state: DNCState):
        """:meth:`_forward_scan` graphed whole on CUDA (:func:`memnets.ops.gpu.graphs.graphed_autograd`:
        the input projection, the recurrence's graphs and the readout as one graph forward, and
        the backward, which recomputes the forward, as another): on by default on the CUDA
        path, ``MEMNETS_MODULE_GRAPHS=0`` turns it off. Its backward runs the recurrence's
        forward kernels a second time, but a training step of this size waits on the host's
        launches around the loops, not on the kernels (on an H200, the step graphed whole took
        1.81 ms against 3.74 ms launched from Python, docs/bench.md)."""
        leaves, spec = tree_flatten(state)

        def whole(x, *leaves):
            y, new = self._forward_scan(x, tree_unflatten(list(leaves), spec))
            return (y, *tree_flatten(new)[0])

        outs = graphed_autograd(key, whole, (x, *leaves), module=self)
        return outs[0], tree_unflatten(list(outs[1:]), spec)

    def _forward_scan(self, x: torch.Tensor, state: DNCState, lengths: torch.Tensor | None = None):
        """The whole sequence through :class:`~memnets.ops.dnc.recurrence.DNCRecurrence` (fused path).
        ``lengths`` ``[B]``: each sequence's final state is its state after its own step
        ``lengths[b]`` (the CPU recurrence only; a packed batch in one call)."""
        cfg = self.config
        R, W = cfg.read_heads, cfg.word_size
        upper = [p for lin in self.ctrl_rec[1:] for p in (lin.weight, lin.bias)]
        ctrl, a = state.controller, state.access
        if lengths is None and use_triton(x) and triton_applies(ctrl.h, a.memory, upper):
            # on the CUDA path, one controller layer: Triton kernels (memnets.ops.gpu.dnc), the
            # interface rows gathered inside its graphed forward and backward
            rec, dims, w_xi, b_xi = DNCRecurrenceTriton, (R, W, True), self.interface.weight, self.interface.bias
        else:
            rec, dims = DNCRecurrence, (R, W) if lengths is None else (R, W, lengths)
            perm, inv = self._interface_perm, self._interface_inv
            w_xi = permute(self.interface.weight, 0, perm, inv)  # backward: one gather by the inverse
            b_xi = permute(self.interface.bias, 0, perm, inv)
        HR, h, c, mem, usage, link, prec, wr, ww = rec.apply(  # HR: [r_t | h_t] of every step
            dims, x, self.ctrl_x.weight, self.ctrl_x.bias, w_xi, b_xi, ctrl.h, ctrl.c, a.memory, a.usage,
            a.link, a.precedence, a.read_weights, a.write_weights, state.reads, self.ctrl_rec[0].weight, *upper)
        w_out = torch.cat([self.out_r.weight, self.out_h.weight], 1)  # the readout as one matmul
        y = F.linear(HR, w_out, self.out_h.bias).transpose(0, 1)  # [B, T, output_size]
        last = HR[-1] if lengths is None else HR[lengths - 1, torch.arange(HR.shape[1], device=HR.device)]
        state = DNCState(DNCControllerState(h, c), DNCAccessState(mem, usage, link, prec, wr, ww),
                         last[:, :R * W].unflatten(-1, (R, W)))
        return y, state

    def _start(self, x: torch.Tensor, state: DNCState | None) -> DNCState:
        """``x`` checked (``[B, T, input_size]``, T ≥ 1, the parameters' dtype) and the state a
        call starts from (a fresh one when ``state`` is None, else ``state`` checked)."""
        check_shape("x", x, ["B", "T", "input_size"], [None, None, self.config.input_size])
        self._check_dtype("x", x)
        B, T = x.shape[:2]
        if T == 0:
            raise ValueError(f"`x` expected a sequence of length T >= 1, got {list(x.shape)}")
        state = self.init_state(B, x.device, x.dtype) if state is None else state
        self._check_state(state, B)
        return state

    def _forward_to_ends(self, x: torch.Tensor, state: DNCState | None, lengths: torch.Tensor):
        """:meth:`forward` of a padded batch on the fused CPU path with each sequence's final
        state taken after its own step ``lengths[b]`` (a packed batch in one call)."""
        return self._forward_scan(x, self._start(x, state), lengths.to(torch.int64))

    @float32_under_autocast
    def step(self, x_t: torch.Tensor, state: DNCState | None = None):
        """One time step: ``x_t [B, input_size] -> (y_t [B, output_size], state)`` (float32 under
        autocast, as :meth:`forward`)."""
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.config.input_size])
        self._check_dtype("x_t", x_t)
        B = x_t.shape[0]
        state = self.init_state(B, x_t.device, x_t.dtype) if state is None else state
        self._check_state(state, B)
        h, state, _ = self._cell(self.ctrl_x(x_t), state)
        return self._readout(h, state.reads), state

    @float32_under_autocast
    def forward(self, x: torch.Tensor, state: DNCState | None = None, return_aux: bool = False):
        """Run a sequence ``x [B, T, input_size]``; returns ``(y [B, T, output_size], state[, aux])``.

        Under autocast the whole recurrence runs in float32 with autocast off (``x`` and the
        state cast up, :mod:`memnets.ops._amp`), so the fused path applies there too; outputs
        and state are float32. ``x`` may be a ``torch.nn.utils.rnn.PackedSequence``: ``y`` is
        packed alike and each sequence's state is its own after its last step
        (:mod:`memnets.memories.packed`; on the CPU's fused path one call over the padded
        batch, else one call per distinct length)."""
        if isinstance(x, PackedSequence):  # sequences of different lengths (memnets.memories.packed)
            if (runs_fused(self.impl) and not return_aux and not use_triton(x.data)
                    and (state is None or self._scan_applies(x.data, state))):
                return forward_packed(self._forward_to_ends, x, state, lengths="lengths")
            return forward_packed(self.forward, x, state, return_aux=return_aux)
        cfg = self.config
        state = self._start(x, state)
        B, T = x.shape[:2]
        if runs_fused(self.impl) and not return_aux and self._scan_applies(x, state):
            # this module and what its forward depends on (the form of the kernels' time loop included)
            key = ("dnc.module", id(self), self.impl,
                   *kernel_form(cfg.controller_size, cfg.read_heads, cfg.word_size))
            if use_triton(x) and whole_module(x, key=key, module=self):
                return self._forward_graphed(key, x, state)
            return self._forward_scan(x, state)
        gx = self.ctrl_x(x).unbind(1)  # T x [B, 4C]
        offdiag = self._offdiag(x)
        hs, rs, trace = [], [], []
        for t in range(T):
            h, state, modes = self._cell(gx[t], state, offdiag)
            hs.append(h)
            rs.append(state.reads)
            if return_aux:
                a = state.access
                trace.append((a.read_weights, a.write_weights, a.usage, a.link, modes))
        if T:
            y = self._readout(torch.stack(hs, 1), torch.stack(rs, 1))  # [B, T, output_size]
        else:
            y = x.new_zeros(B, 0, cfg.output_size)
        if not return_aux:
            return y, state
        N, R = cfg.memory_slots, cfg.read_heads
        if T:
            aux = DNCAux(*(torch.stack(z, 1) for z in zip(*trace)))
        else:
            aux = DNCAux(*(x.new_zeros(B, 0, *e) for e in ((R, N), (N,), (N,), (N, N), (R, 3))))
        return y, state, aux
