"""Neural Turing Machine (docs/maths.md §7; Graves et al. 2014) with the stabilisers of seed 002.

A controller (LSTM or feed-forward) reads ``[x_t ; r_{t-1}]``; from its output ``h_t`` each
head emits key ``k = tanh(·)``, strength ``β = softplus(·)``, gate ``g = σ(·)``, shift
``s = softmax(·)`` over ``−n..+n``, sharpening ``γ = 1 + softplus(·)``; write heads also
emit erase ``e = σ(·)`` and add ``a`` (linear). Per step the write heads address and write ``M_{t-1}``
first, then the read heads address and read the fresh ``M_t``; the output is
``y_t = W_o [h_t ; r_t]`` (logits).

Stabilisers (Collier & Beel 2018, seed 002): learned initial controller state, read vectors
and head weightings (softmax of learned logits); memory initialised to the constant 1e-6;
LSTM forget-gate bias 1. Gradient-norm clipping belongs to the training loop.

The learned initial weightings start focused on the first slot (logits ``HEAD_INIT_LOGIT`` there,
0 elsewhere: weight ≈ 0.99), the fixed initial focus of seed 002's plain implementation, which
the learned version then moves. Starting from a diffuse ``softmax(randn)`` focus instead, the
first shift-based writes are smeared over all slots and copy training sits for tens of
thousands of sequences on its plateau (docs/results.md, "NTM copy").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from .._checks import check_input_dtype, check_positive_int, check_shape
from ..ops._impl import resolve_impl, runs_fused
from ..ops.gpu import use_triton
from ..ops.gpu.ntm import applies as ntm_applies, ntm_scan_triton
from ..ops.ntm_access import ntm_access
from ..registry import register_model
from .packed import PackedSequence, forward_packed

__all__ = ["NTM", "NTMConfig", "NTMState", "NTMAux"]

HEAD_INIT_LOGIT = 10.0  # initial weighting logit of slot 0: softmax puts ≈ 0.99 there for N = 128


@dataclass(frozen=True)
class NTMConfig:
    """Hyper-parameters of :class:`NTM` (defaults: the copy task of Graves et al. 2014)."""

    input_size: int
    output_size: int
    memory_slots: int = 128
    word_size: int = 20
    read_heads: int = 1
    write_heads: int = 1
    controller: str = "lstm"
    controller_size: int = 100
    shift_range: int = 1
    memory_init: float = 1e-6
    write_gate_bias: float | None = None


class NTMState(NamedTuple):
    """NTM state (B = batch, N = slots, W = word size, R / Hw = read / write heads, C = controller)."""

    memory: torch.Tensor  # [B, N, W]
    read_weights: torch.Tensor  # [B, R, N]
    write_weights: torch.Tensor  # [B, Hw, N]
    reads: torch.Tensor  # [B, R, W]
    h: torch.Tensor  # [B, C]
    c: torch.Tensor  # [B, C] for the LSTM controller, [B, 0] for the MLP one


class NTMAux(NamedTuple):
    """Per-step traces returned by ``forward(..., return_aux=True)``."""

    read_weights: torch.Tensor  # [B, T, R, N]
    write_weights: torch.Tensor  # [B, T, Hw, N]
    reads: torch.Tensor  # [B, T, R, W]
    erase: torch.Tensor  # [B, T, Hw, W]
    add: torch.Tensor  # [B, T, Hw, W]


@register_model("ntm")
class NTM(nn.Module):
    """Neural Turing Machine (docs/maths.md §7).

    Args:
        input_size: features of ``x_t``.
        output_size: features of ``y_t`` (logits; apply σ for bit outputs).
        memory_slots: N. word_size: W. read_heads: R. write_heads: Hw.
        controller: ``"lstm"`` or ``"mlp"`` (one tanh layer). controller_size: C.
        shift_range: n, shifts ``−n..+n`` are allowed; needs 2n+1 <= memory_slots.
        memory_init: constant every memory cell starts at.
        write_gate_bias: the initial bias of each write head's gate logit (``g = σ(·)`` weighs
            the content weighting against the head's previous weighting). None (default) keeps
            ``nn.Linear``'s random bias; a negative value starts the write heads on location
            (−2: ``g ≈ 0.12``), which took every associative-recall seed tried off the plateau
            where the write head never sharpens (docs/ntm.md, "Associative recall").
        impl: ``"auto"`` (default; = ``"fused"``) or ``"fused"``: each step's memory access is one
            call of a C kernel forward and backward on float32 / float64 CPU tensors
            (:func:`memnets.ops.ntm_access.ntm_access`), and on the CUDA path
            (:func:`memnets.ops.gpu.use_triton`) ``forward`` runs the recurrence as Triton kernels
            (:mod:`memnets.ops.gpu.ntm`); ``"reference"``: the addressing ops of
            :mod:`memnets.ops.addressing`, one per equation, everywhere. Both give the same values
            and gradients (tested in float64). ``model.impl`` holds the resolved value.

    ``forward(x [B, T, input_size], state=None, return_aux=False)`` returns
    ``(y [B, T, output_size], state)`` and with ``return_aux`` also an :class:`NTMAux`.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        memory_slots: int = 128,
        word_size: int = 20,
        read_heads: int = 1,
        write_heads: int = 1,
        controller: str = "lstm",
        controller_size: int = 100,
        shift_range: int = 1,
        memory_init: float = 1e-6,
        write_gate_bias: float | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.impl = resolve_impl("NTM", impl)
        for name, v, lo in (("input_size", input_size, 1), ("output_size", output_size, 1),
                            ("memory_slots", memory_slots, 1), ("word_size", word_size, 1),
                            ("read_heads", read_heads, 1), ("write_heads", write_heads, 1),
                            ("controller_size", controller_size, 1), ("shift_range", shift_range, 0)):
            check_positive_int(name, v, minimum=lo)
        if 2 * shift_range + 1 > memory_slots:
            raise ValueError(f"`shift_range` expected 2*shift_range+1 <= memory_slots = {memory_slots}, "
                             f"got shift_range = {shift_range}")
        if controller not in ("lstm", "mlp"):
            raise ValueError(f"`controller` expected 'lstm' or 'mlp', got {controller!r}")
        if write_gate_bias is not None:
            if isinstance(write_gate_bias, bool) or not isinstance(write_gate_bias, (int, float)) \
                    or not math.isfinite(write_gate_bias):
                raise ValueError(f"`write_gate_bias` expected a finite number or None, got {write_gate_bias!r}")
            write_gate_bias = float(write_gate_bias)
        self.config = NTMConfig(input_size, output_size, memory_slots, word_size, read_heads,
                                write_heads, controller, controller_size, shift_range, float(memory_init),
                                write_gate_bias)
        N, W, R, Hw, C = memory_slots, word_size, read_heads, write_heads, controller_size
        self._lstm = controller == "lstm"
        gates = 4 * C if self._lstm else C
        self.ctrl_x = nn.Linear(input_size, gates)
        self.ctrl_rh = nn.Linear(R * W + (C if self._lstm else 0), gates, bias=False)
        self._p = W + 3 + (2 * shift_range + 1)  # key, β, g, γ, shift
        self.heads = nn.Linear(C, (R + Hw) * self._p + Hw * 2 * W)
        if write_gate_bias is not None:  # each write head's gate logit: after its key and strength
            with torch.no_grad():
                self.heads.bias[R * self._p + W + 1:(R + Hw) * self._p:self._p] = write_gate_bias
        self.out = nn.Linear(C + R * W, output_size)
        # learned initial state (seed 002)
        self.h0 = nn.Parameter(torch.rand(C) * 0.05)
        self.c0 = nn.Parameter(torch.rand(C) * 0.05 if self._lstm else torch.zeros(0))
        self.r0 = nn.Parameter(torch.randn(R, W) * 0.05)
        self.read_w0 = nn.Parameter(self._focused_logits(R, N))
        self.write_w0 = nn.Parameter(self._focused_logits(Hw, N))
        if self._lstm:
            with torch.no_grad():
                self.ctrl_x.bias.zero_()
                self.ctrl_x.bias[C:2 * C].fill_(1.0)  # forget-gate bias 1

    @staticmethod
    def _focused_logits(heads: int, slots: int) -> torch.Tensor:
        """Initial weighting logits ``[heads, slots]``: ``HEAD_INIT_LOGIT`` on slot 0, 0 elsewhere."""
        logits = torch.zeros(heads, slots)
        logits[:, 0] = HEAD_INIT_LOGIT
        return logits

    # ------------------------------------------------------------------ state
    def init_state(self, batch_size: int, device=None, dtype=None) -> NTMState:
        """Initial state for ``batch_size`` sequences (learned parts broadcast over the batch)."""
        check_positive_int("batch_size", batch_size)
        dtype = dtype or self.h0.dtype
        device = device or self.h0.device
        cfg = self.config
        B = batch_size

        def rep(p: torch.Tensor) -> torch.Tensor:
            return p.to(device=device, dtype=dtype).unsqueeze(0).expand(B, *p.shape)

        memory = torch.full((B, cfg.memory_slots, cfg.word_size), cfg.memory_init, device=device, dtype=dtype)
        return NTMState(memory, torch.softmax(rep(self.read_w0), -1), torch.softmax(rep(self.write_w0), -1),
                        rep(self.r0), rep(self.h0), rep(self.c0))

    def _check_state(self, state: NTMState, B: int) -> None:
        cfg = self.config
        N, W, R, Hw, C = cfg.memory_slots, cfg.word_size, cfg.read_heads, cfg.write_heads, cfg.controller_size
        if not isinstance(state, NTMState):
            raise TypeError(f"`state` expected an NTMState, got {type(state).__name__}")
        check_shape("state.memory", state.memory, ["B", "N", "W"], [B, N, W])
        check_shape("state.read_weights", state.read_weights, ["B", "R", "N"], [B, R, N])
        check_shape("state.write_weights", state.write_weights, ["B", "Hw", "N"], [B, Hw, N])
        check_shape("state.reads", state.reads, ["B", "R", "W"], [B, R, W])
        check_shape("state.h", state.h, ["B", "C"], [B, C])
        check_shape("state.c", state.c, ["B", "C"], [B, C if self._lstm else 0])

    # ------------------------------------------------------------------ one step
    def _cell(self, gx: torch.Tensor, state: NTMState):
        """One step given the input part of the controller pre-activation ``gx [B, G]``."""
        cfg = self.config
        R, Hw, W = cfg.read_heads, cfg.write_heads, cfg.word_size
        B = gx.shape[0]
        r_prev = state.reads.reshape(B, R * W)  # [B, R*W]
        if self._lstm:
            z = gx + self.ctrl_rh(torch.cat([r_prev, state.h], dim=-1))
            i, f, g, o = z.chunk(4, dim=-1)
            c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            h = torch.tanh(gx + self.ctrl_rh(r_prev))
            c = state.c
        p = self.heads(h)
        hp = p[:, : (R + Hw) * self._p].reshape(B, R + Hw, self._p)  # [B, R+Hw, P]
        ea = p[:, (R + Hw) * self._p:].reshape(B, Hw, 2 * W)  # [B, Hw, 2W]
        # e = σ; a stays linear (seed 002 squashes it with tanh: the reads, and with them the output
        # logits, then stay small and the copy cost stalls at a few bits with every bit right)
        erase, add = torch.sigmoid(ea[..., :W]), ea[..., W:]
        # the write heads address M_{t-1} and write, the read heads address M_t and read: one C call
        # on the CPU, the ops of memnets.ops.addressing elsewhere (memnets.ops.ntm_access)
        memory, w_r, w_w, reads = ntm_access(hp, erase, add, state.memory, state.read_weights, state.write_weights,
                                             native=None if runs_fused(self.impl) else False)
        return NTMState(memory, w_r, w_w, reads, h, c), erase, add

    def _readout(self, h: torch.Tensor, reads: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([h, reads.flatten(-2)], dim=-1))  # reads [..., R, W] -> [..., R*W]

    def _check_dtype(self, name: str, x: torch.Tensor) -> None:
        check_input_dtype(name, x, next(self.parameters()).dtype)

    def step(self, x_t: torch.Tensor, state: NTMState | None = None):
        """One time step: ``x_t [B, input_size] -> (y_t [B, output_size], state)``."""
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.config.input_size])
        self._check_dtype("x_t", x_t)
        B = x_t.shape[0]
        state = self.init_state(B, x_t.device, x_t.dtype) if state is None else state
        self._check_state(state, B)
        state, _, _ = self._cell(self.ctrl_x(x_t), state)
        return self._readout(state.h, state.reads), state

    def forward(self, x: torch.Tensor, state: NTMState | None = None, return_aux: bool = False):
        """Run a sequence ``x [B, T, input_size]``; returns ``(y [B, T, output_size], state[, aux])``.
        ``x`` may be a ``torch.nn.utils.rnn.PackedSequence``: ``y`` is packed alike and each
        sequence's state is its own after its last step (:mod:`memnets.memories.packed`)."""
        if isinstance(x, PackedSequence):  # sequences of different lengths (memnets.memories.packed)
            return forward_packed(self.forward, x, state, return_aux=return_aux)
        check_shape("x", x, ["B", "T", "input_size"], [None, None, self.config.input_size])
        self._check_dtype("x", x)
        B, T = x.shape[:2]
        if T == 0:
            raise ValueError(f"`x` expected a sequence of length T >= 1, got {list(x.shape)}")
        cfg = self.config
        if (not return_aux and runs_fused(self.impl) and use_triton(x)
                and ntm_applies(cfg.memory_slots, cfg.word_size, cfg.controller_size)):
            # the CUDA path: two kernel launches per time step (memnets.ops.gpu.ntm), the input
            # projection and a fresh start made inside the graphed forward
            if state is not None:
                self._check_state(state, B)
            h, reads, final = ntm_scan_triton(self, x, state)
            return self._readout(h, reads), NTMState(*final)
        state = self.init_state(B, x.device, x.dtype) if state is None else state
        self._check_state(state, B)
        gx = self.ctrl_x(x).unbind(1)  # T x [B, G]: the input part of every step at once
        hs, rs, trace = [], [], []
        for t in range(T):
            state, erase, add = self._cell(gx[t], state)
            hs.append(state.h)
            rs.append(state.reads)
            if return_aux:
                trace.append((state.read_weights, state.write_weights, state.reads, erase, add))
        if T == 0:
            y = x.new_zeros(B, 0, self.config.output_size)
        else:
            y = self._readout(torch.stack(hs, 1), torch.stack(rs, 1))  # [B, T, output_size]
        if not return_aux:
            return y, state
        cfg = self.config
        empty = ((cfg.read_heads, cfg.memory_slots), (cfg.write_heads, cfg.memory_slots),
                 (cfg.read_heads, cfg.word_size), (cfg.write_heads, cfg.word_size),
                 (cfg.write_heads, cfg.word_size))
        if T:
            aux = NTMAux(*(torch.stack(z, 1) for z in zip(*trace)))
        else:
            aux = NTMAux(*(x.new_zeros(B, 0, *e) for e in empty))
        return y, state, aux
