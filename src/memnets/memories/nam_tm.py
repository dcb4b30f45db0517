"""NAM Turing Machine (docs/maths.md §3, §12): differentiable tapes read and written with NAM.

Per tape (value tape ``T`` and key tape ``K``, ``[C, L]``, column i = cell i; read and
write head positions ``H_r, H_w ∈ R^L``, starting at ``e₁``), one step does, in order::

    T'     = WR(T, H_w, v, p_w, p_e)              # write value (p_e = p_w by default)
    R      = RD(T', H_r, p_r)                      # read sees the fresh write
    K'     = WR(K, H_w, μ(W_k x), p_w, p_e)        # write key
    H_JUMP = K'ᵀ q_jump                            # raw, no softmax
    H'     = Σ_a p_a · move_a(H)  for each head with its own action probabilities
             move: LEFT = roll⁻¹(H), NO-OP = H, RIGHT = roll(H) (e_i → e_{i+1}), JUMP = H_JUMP

Each head moves itself (the **fix** of docs/maths.md §12). The tape length L is chosen per call and
no parameter depends on it. The controller (bidirectional GRU by default) reads the layer
input and emits, for all steps up front, per tape: read and write action softmaxes,
σ(p_r, p_w[, p_e]) and the unit jump query; values ``W_v x`` and keys ``μ(W_k x)`` come from
the input too, so only the tape operations run per step. Output ``W_o [r¹; …; r^T]``.
"""
from __future__ import annotations

import contextlib

from typing import NamedTuple, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .._checks import check_positive_int, check_shape, check_tensor
from ..ops import nam_read, nam_scan, nam_write, unit
from ..ops import nam_tape
from ..ops.gru import gru_module_forward
from ..ops.nam_tm_heads import kernel_available, nam_tm_heads
from ..registry import register_model
from ..ops._amp import backward_without_autocast, run_rnn
from ..ops._impl import runs_fused
from ..ops.gpu import on_cuda_path, use_triton
from ..ops.gpu.graphs import fresh_zeros, graphed_autograd, whole_module
from ..ops.gpu.nam_tm import nam_tm_layer_scan_triton, unit_backward, unit_forward
from .packed import forward_packed

__all__ = ["NAMTuringMachine", "NAMTMState", "NAMTMAux", "nam_tm_step", "move_head", "ACTIONS"]

ACTIONS = ("LEFT", "NOOP", "RIGHT", "JUMP")


class NAMTMState(NamedTuple):
    """Tapes and heads of every layer (Ly layers, Tn tapes of width C, length L).

    ``tape``, ``key_tape``: ``[Ly, B, Tn, C, L]``; ``h_r``, ``h_w``: ``[Ly, B, Tn, L]``.
    """

    tape: torch.Tensor
    key_tape: torch.Tensor
    h_r: torch.Tensor
    h_w: torch.Tensor


class NAMTMAux(NamedTuple):
    """Per-step diagnostics of the last layer: head positions used at step t
    (``read_pos``, ``write_pos``: ``[B, T, Tn, L]``) and action probabilities
    (``read_actions``, ``write_actions``: ``[B, T, Tn, A]``, order of ``actions``)."""

    read_pos: torch.Tensor
    write_pos: torch.Tensor
    read_actions: torch.Tensor
    write_actions: torch.Tensor


def head_norms(normalize_heads: bool | str) -> tuple[bool, bool]:
    """``(unit_values, unit_keys)`` of the NAM-TM option ``normalize_heads`` (docs/maths.md §3):
    False — raw heads everywhere; True or "values" — the value tape is written and read at
    μ(H_w), μ(H_r) (the authors' later option); "all" — the key tape is written at μ(H_w) too,
    which keeps its erase a projection and the jump ``K'ᵀq`` bounded."""
    if normalize_heads in (False, None):
        return False, False
    if normalize_heads in (True, "values"):
        return True, False
    if normalize_heads == "all":
        return True, True
    raise ValueError(f"`normalize_heads` expected False, True, 'values' or 'all', got {normalize_heads!r}")


def move_head(h: torch.Tensor, act: torch.Tensor, jump: torch.Tensor | None,
              actions: Sequence[str] = ACTIONS) -> torch.Tensor:
    """H' = Σ_a act_a · move_a(H) (docs/maths.md §3). h, jump: ``[..., L]``; act: ``[..., A]``."""
    if "JUMP" in actions and jump is None:
        raise ValueError("`jump` is required when `actions` include 'JUMP'")
    moves = {"LEFT": lambda: torch.roll(h, -1, -1), "NOOP": lambda: h,
             "RIGHT": lambda: torch.roll(h, 1, -1), "JUMP": lambda: jump}
    return sum(act[..., i:i + 1] * moves[a]() for i, a in enumerate(actions))


def nam_tm_step(tape, key_tape, h_r, h_w, v, k, q_jump, p_r, p_w, p_e, act_r, act_w,
                actions: Sequence[str] = ACTIONS, normalize_heads: bool | str = False,
                key_tape_mode: str = "position"):
    """One NAM-TM step for one tape per batch element, from :func:`nam_write` / :func:`nam_read`.

    Args:
        tape, key_tape: ``[..., C, L]``; h_r, h_w: ``[..., L]``.
        v: value ``[..., C]``; k: unit key ``[..., C]``; q_jump: unit query ``[..., C]``.
        p_r, p_w, p_e: ``[...]`` in [0, 1]; act_r, act_w: ``[..., A]`` action probabilities.
        actions: names of the A actions, a subset of ``ACTIONS`` in any order.
        normalize_heads: True or "values" — use μ(H) for the value tape's write and read;
            "all" — and μ(H_w) for the key tape's write as well (:func:`head_norms`).
        key_tape_mode: "position" — ``K' = WR(K, H_w, k, p_w, p_e)`` (docs/maths.md §3); "transposed" —
            ``K'ᵀ = WR(Kᵀ, k, H_w, p_w, p_e)``, the key tape as a NAM memory from keys to
            positions (docs/maths.md §12 option), so ``K'ᵀ k = H_w`` after a full write (Thm 3.1).
    Returns:
        ``(r [..., C], tape, key_tape, h_r, h_w)`` after the step.
    """
    unit_values, unit_keys = head_norms(normalize_heads)
    hw = unit(h_w) if unit_values else h_w
    hr = unit(h_r) if unit_values else h_r
    hk = hw if unit_keys else h_w  # the key tape's head (unit_keys implies unit_values)
    tape = nam_write(tape, hw, v, p_w, p_e)  # write value
    r = nam_read(tape, hr, p_r)  # read (after the write)
    if key_tape_mode == "transposed":
        key_tape = nam_write(key_tape.transpose(-1, -2), k, hk, p_w, p_e).transpose(-1, -2)
    else:
        key_tape = nam_write(key_tape, hk, k, p_w, p_e)  # write key
    jump = nam_read(key_tape.transpose(-1, -2), q_jump) if "JUMP" in actions else None  # [..., L]
    return r, tape, key_tape, move_head(h_r, act_r, jump, actions), move_head(h_w, act_w, jump, actions)


def _fused_step(tape, key_tape, heads, v, k, q, p, act, order, normalize_heads, transposed_keys=False):
    """:func:`nam_tm_step` for all tapes at once, both heads stacked (fewer small ops).

    tape, key_tape ``[B, Tn, C, L]``; heads ``[B, Tn, 2, L]`` (read, write); v, k, q
    ``[B, Tn, C]`` (k None: no key write, for action sets without JUMP); p ``[B, Tn, 3]``
    (p_r, p_w, p_e); act ``[B, Tn, 2, A]``; order: indices into (LEFT, NOOP, RIGHT, JUMP)
    of the actions. Contractions are broadcast-and-sum (on CPU
    they beat batched matmuls of this size).
    """
    unit_values, unit_keys = head_norms(normalize_heads)
    h_w = heads[:, :, 1]  # [B, Tn, L]
    hv = unit(heads) if unit_values else heads  # value-tape addresses (read, write)
    if unit_keys:  # the key tape's head (unit_keys implies unit_values)
        h_w = hv[:, :, 1]
    h_read, hv_w = hv[:, :, 0], hv[:, :, 1]
    p_w, p_e = p[..., 1:2], p[..., 2:3]  # [B, Tn, 1]
    u = v * p_w - (tape * hv_w.unsqueeze(-2)).sum(-1) * p_e  # [B, Tn, C]
    tape = torch.addcmul(tape, u.unsqueeze(-1), hv_w.unsqueeze(-2))  # WR(T, H_w, v, p_w, p_e)
    if k is None:  # no JUMP: the key tape is never read, so it is not written either
        pass
    elif transposed_keys:  # Kᵀ ← WR(Kᵀ, k, H_w, p_w, p_e)
        w = h_w * p_w - (key_tape * k.unsqueeze(-1)).sum(-2) * p_e  # [B, Tn, L]
        key_tape = torch.addcmul(key_tape, k.unsqueeze(-1), w.unsqueeze(-2))
    else:  # K ← WR(K, H_w, k, p_w, p_e)
        uk = k * p_w - (key_tape * h_w.unsqueeze(-2)).sum(-1) * p_e  # [B, Tn, C]
        key_tape = torch.addcmul(key_tape, uk.unsqueeze(-1), h_w.unsqueeze(-2))
    r = (tape * h_read.unsqueeze(-2)).sum(-1) * p[..., 0:1]  # [B, Tn, C]
    moves = [torch.roll(heads, -1, -1), heads, torch.roll(heads, 1, -1)]
    if 3 in order:
        jump = (key_tape * q.unsqueeze(-1)).sum(-2)  # K'ᵀ q: [B, Tn, L]
        moves.append(jump.unsqueeze(2).expand_as(heads))
    stacked = torch.stack([moves[i] for i in order], -1)  # [B, Tn, 2, L, A]
    heads = (stacked * act.unsqueeze(-2)).sum(-1)  # [B, Tn, 2, L]
    return r, tape, key_tape, heads


class _Unit(torch.autograd.Function):
    """:func:`memnets.ops.unit` (the same forward ops) with its backward in one step,
    ``dx = (dy − y ⟨y, dy⟩) / max(‖x‖, eps)`` (the projection only where the norm is not
    clamped): a few elementwise passes instead of the autograd graph of ``F.normalize``."""

    @staticmethod
    def forward(ctx, x, eps):
        y, n, free = unit_forward(x, eps)
        ctx.save_for_backward(y, n, free)
        return y

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dy):
        return unit_backward(*ctx.saved_tensors, dy), None


def _unit(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """μ(x) along the last dim (:func:`memnets.ops.unit`), by :class:`_Unit` outside autocast."""
    if torch.is_autocast_enabled(x.device.type):
        return unit(x, eps=eps)
    return _Unit.apply(x, eps)


def _scan_chunk(T: int) -> int:
    """The value tape's chunk length: T split into equal chunks of at most 32 steps (on a
    CPU the chunk's quadratic part costs more than the extra chunk-to-chunk steps beyond
    that, and equal chunks need no padding)."""
    n = -(-T // 32)
    return -(-T // n)


class _NAMTMLayer(nn.Module):
    """One NAM-TM layer: controller, value/key projections, tape loop and output W_o."""

    def __init__(self, input_size, hidden_size, num_tapes, actions, controller, bidirectional,
                 normalize_heads, separate_erase, key_tape_mode, with_output=True, impl="auto"):
        super().__init__()
        self.impl = impl
        self.transposed_keys = key_tape_mode == "transposed"
        C, A = hidden_size // num_tapes, len(actions)
        self.num_tapes, self.width, self.actions = num_tapes, C, tuple(actions)
        self.order = [ACTIONS.index(a) for a in actions]
        self.normalize_heads, self.separate_erase = normalize_heads, separate_erase
        self.unit_values, self.unit_keys = head_norms(normalize_heads)
        rnn = nn.GRU if controller == "gru" else nn.LSTM
        hc = hidden_size // 2 if bidirectional else hidden_size
        self.controller = rnn(input_size, hc, batch_first=True, bidirectional=bidirectional)
        # jump query only with JUMP, so that the "No Jmp" model has no parameter without gradient
        self.n_ctrl = 2 * A + (3 if separate_erase else 2) + (C if "JUMP" in actions else 0)
        self.control = nn.Linear(hc * (2 if bidirectional else 1), num_tapes * self.n_ctrl)
        self.value = nn.Linear(input_size, hidden_size)
        self.key = nn.Linear(input_size, hidden_size) if "JUMP" in actions else None
        # only the last layer's reads are output; earlier layers hand on their value tape
        self.out = nn.Linear(hidden_size, hidden_size) if with_output else None

    def _controller(self, x, fused: bool, lengths):
        """The controller's outputs ``[B, T, ·]``; with ``lengths``, each sequence's own
        (a reverse direction starting at its end)."""
        fast = fused and isinstance(self.controller, nn.GRU) and not on_cuda_path(x)  # on CUDA: cuDNN's GRU
        if lengths is None:
            return gru_module_forward(self.controller, x) if fast else run_rnn(self.controller, x)[0]
        if fast:
            return gru_module_forward(self.controller, x, lengths=lengths)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(run_rnn(self.controller, packed)[0], batch_first=True,
                                   total_length=x.shape[1])[0]

    def _hold_after_end(self, act, p, lengths):
        """Past each sequence's end: no write (p = 0, so the tapes stay exactly as they are) and
        both heads NO-OP (act one-hot, so they stay where they are): the final state is each
        sequence's own after its last step."""
        B, T = p.shape[:2]
        valid = (torch.arange(T, device=p.device) < lengths.to(p.device)[:, None])  # [B, T]
        noop = torch.zeros(len(self.actions), dtype=act.dtype, device=act.device)
        noop[self.actions.index("NOOP")] = 1
        return torch.where(valid[..., None, None, None], act, noop), p * valid[..., None, None].to(p.dtype)

    def forward(self, x, tape, key_tape, h_r, h_w, lengths=None):
        if runs_fused(self.impl) and use_triton(x) and lengths is None:
            key = self._graph_key()
            if whole_module(x, key=key, module=self):
                return self._forward_graphed(key, x, tape, key_tape, h_r, h_w)
        B, T, _ = x.shape
        Tn, C, A = self.num_tapes, self.width, len(self.actions)
        fused = runs_fused(self.impl)
        gpu = fused and use_triton(x)  # the CUDA path with Triton: both scans are Triton kernels
        # μ(H_w) on the key tape runs in the C and Triton kernels only; elsewhere the step loop below
        loop = not fused or (not gpu and self.unit_keys and self.key is not None and not kernel_available(
            x.new_empty(0, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)))
        hc = self._controller(x, fused, lengths)
        if gpu and lengths is None:  # the CUDA path: everything from here to the reads in one function, graphed
            return self._forward_triton(x, hc, tape, key_tape, h_r, h_w)
        ctrl = self.control(hc).view(B, T, Tn, self.n_ctrl)  # [B, T, Tn, n_ctrl]
        n_p = 3 if self.separate_erase else 2
        # one split (its backward is one cat, where each slice's would be a zero-filled copy)
        z, p, q = ctrl.split([2 * A, n_p, self.n_ctrl - 2 * A - n_p], -1)
        z = z.unflatten(-1, (2, A))
        # the same softmax; on a CPU, over a leading dim of a few actions it is several times faster
        act = F.softmax(z.movedim(-1, 0), 0).movedim(0, -1) if fused else F.softmax(z, dim=-1)  # [B, T, Tn, 2, A]
        p = torch.sigmoid(p)  # [B, T, Tn, n_p]
        if not self.separate_erase:
            p = torch.cat([p, p[..., 1:2]], -1)  # p_e = p_w
        if lengths is not None:  # a packed batch: nothing moves after a sequence's end
            act, p = self._hold_after_end(act, p, lengths)
        unit_ = _unit if fused else unit
        q = unit_(q) if "JUMP" in self.actions else ctrl.new_zeros(B, T, Tn, C)  # [B, T, Tn, C]
        v = self.value(x).view(B, T, Tn, C)
        heads = torch.stack([h_r, h_w], 2)  # [B, Tn, 2, L]
        if not loop:
            return self._forward_fused(x, tape, key_tape, heads, act, p, q, v)
        k = unit(self.key(x).view(B, T, Tn, C)).unbind(1) if self.key is not None else [None] * T
        reads, pos = [], []
        steps = zip(v.unbind(1), k, q.unbind(1), p.unbind(1), act.unbind(1))
        for v_t, k_t, q_t, p_t, act_t in steps:  # per-step views: one backward op instead of T selects
            pos.append(heads)
            r, tape, key_tape, heads = _fused_step(tape, key_tape, heads, v_t, k_t, q_t, p_t, act_t, self.order,
                                                   self.normalize_heads, self.transposed_keys)
            reads.append(r)
        y = self.out(torch.stack(reads, 1).flatten(2)) if self.out is not None else None  # [B, T, Tn*C]
        pos = torch.stack(pos, 1)  # [B, T, Tn, 2, L]
        aux = NAMTMAux(pos[..., 0, :], pos[..., 1, :], act[..., 0, :], act[..., 1, :])
        return y, (tape, key_tape, heads[:, :, 0], heads[:, :, 1]), aux

    def _graph_key(self) -> tuple:
        """The key of this layer's graphs: it and every Python value its forward depends on."""
        return ("nam_tm.module", id(self), self.impl, tuple(self.order), self.normalize_heads, self.separate_erase,
                self.transposed_keys)

    def _forward_graphed(self, key, x, tape, key_tape, h_r, h_w):
        """The CUDA path as two CUDA graphs: the whole layer (cuDNN's controller, the
        projections, both tape kernels and ``W_o``) replayed as one graph forward, and its
        backward (the layer recomputed and differentiated) as one more, by
        :func:`memnets.ops.gpu.graphs.graphed_autograd`: a few launches a call instead of the
        controller's, the layer function's graphs and the ops around them."""
        def layer(x, tape, key_tape, h_r, h_w):
            y, fin, aux = self.forward(x, tape, key_tape, h_r, h_w)
            return ((y,) if y is not None else ()) + tuple(fin) + tuple(aux)

        outs = graphed_autograd(key, layer, (x, tape, key_tape, h_r, h_w), module=self)
        y, rest = (outs[0], outs[1:]) if self.out is not None else (None, outs)
        return y, tuple(rest[:4]), NAMTMAux(*rest[4:])

    def _forward_triton(self, x, hc, tape, key_tape, h_r, h_w):
        """The CUDA path: from the controller's output ``hc`` to the reads by
        :func:`memnets.ops.gpu.nam_tm.nam_tm_layer_scan_triton` (the control, value and key
        projections and the same step as :func:`_fused_step`), whose forward and backward each
        replay as one CUDA graph. It runs in float32 under autocast (the tapes, as in
        :meth:`_forward_fused`, and here the three projections too)."""
        T = x.shape[1]
        heads = torch.stack([h_r, h_w], 2)  # [B, Tn, 2, L]
        dev = x.device.type
        f32 = torch.is_autocast_enabled(dev) and x.dtype != torch.float64
        with torch.autocast(dev, enabled=False) if f32 else contextlib.nullcontext():
            if f32:
                tape, key_tape, heads = tape.float(), key_tape.float(), heads.float()
            key = (self.key.weight, self.key.bias) if self.key is not None else None
            r, tape, key_tape, Hs, act = nam_tm_layer_scan_triton(
                hc, x, (self.control.weight, self.control.bias), (self.value.weight, self.value.bias), key,
                tape, key_tape, heads, self.order, 3 if self.separate_erase else 2,
                unit_values=self.unit_values, unit_keys=self.unit_keys, transposed=self.transposed_keys)
        y = self.out(r.flatten(2)) if self.out is not None else None  # [B, T, Tn*C]
        pos, final = Hs[:, :T], Hs[:, T]
        aux = NAMTMAux(pos[..., 0, :], pos[..., 1, :], act[..., 0, :], act[..., 1, :])
        return y, (tape, key_tape, final[:, :, 0], final[:, :, 1]), aux

    def _forward_fused(self, x, tape, key_tape, heads, act, p, q, v):
        """The same step as :func:`_fused_step`, for all steps: heads and key tape by
        :func:`memnets.ops.nam_tm_heads.nam_tm_heads`, then the value tape, addressed by the
        head sequence, by one :func:`memnets.ops.nam_scan` (read after write) in chunks of at
        most 32 steps (:func:`_scan_chunk`). Keys, jump queries and normalised heads go through
        :class:`_Unit` (μ with a one-step backward).

        Under autocast the tape recurrences run in float32 (autocast off, inputs cast up):
        their hand-written loops write into float32 buffers, and a tape summed over many
        steps in bfloat16 would lose the small writes. The projections around them stay
        under autocast."""
        B, T, _ = x.shape
        Tn, C, L = self.num_tapes, self.width, tape.shape[-1]
        N = B * Tn
        dev = x.device.type
        f32 = torch.is_autocast_enabled(dev) and x.dtype != torch.float64
        jump = self.key is not None
        k = _unit(self.key(x).view(B, T, Tn, C)) if jump else None
        if f32:
            act, p, q, v, tape, key_tape, heads = (z.float() for z in (act, p, q, v, tape, key_tape, heads))
            k = k.float() if jump else None

        p_r, p_w, p_e = p.unbind(-1)
        with torch.autocast(dev, enabled=False) if f32 else contextlib.nullcontext():
            # batch-major throughout: [B, T, Tn, ...] (the kernels read each sequence's steps nearby)
            Hs, key_tape = nam_tm_heads(act, q if jump else None, k, p_w, p_e, heads.reshape(N, 2, L),
                                        key_tape.reshape(N, C, L), self.order, self.transposed_keys,
                                        batch_major=True, unit_keys=self.unit_keys)
            pos, final = Hs.split([T, 1], 1)  # [B, T, Tn, 2, L]: positions used at step t; split: one cat back
            hv = _unit(pos) if self.unit_values else pos
            h_read, hv_w = hv.unbind(-2)  # views of one tensor: the C kernel reads them in place
            if nam_tape.available(v) or use_triton(v):  # the value tape step by step, in C or Triton
                r, tape = nam_tape.nam_tape_scan(h_read, hv_w, v, p_w, p_e, p_r, tape)
            else:
                r, tape = nam_scan(h_read, hv_w, v, p_w, p_e, p_r, initial_state=tape, chunk_size=_scan_chunk(T))
        y = self.out(r.flatten(2)) if self.out is not None else None
        final = final.reshape(B, Tn, 2, L)
        aux = NAMTMAux(pos[..., 0, :], pos[..., 1, :], act[..., 0, :], act[..., 1, :])
        return y, (tape, key_tape.view(B, Tn, C, L), final[:, :, 0], final[:, :, 1]), aux


@register_model("nam_tm")
class NAMTuringMachine(nn.Module):
    """Multi-tape NAM Turing Machine (docs/maths.md §3, §12).

    Args:
        input_size: width of ``x``.
        hidden_size: D = num_tapes · C (C = tape width); output width.
        num_tapes: Tn tapes, each with its own read/write head and key tape.
        tape_length: default L when neither ``state`` nor ``tape_length`` is given to forward.
        actions: head moves, a subset of ("LEFT", "NOOP", "RIGHT", "JUMP"); without "JUMP"
            it is the paper's "No Jmp" ablation (then no jump query, no key projection, and
            the key tape, never read, stays as given).
        controller: "gru" or "lstm"; bidirectional_controller: run it in both directions
            (hidden_size/2 per direction).
        num_layers: layer l > 0 re-reads the same input and, from a fresh start
            (``state=None``), starts from layer l-1's final value tape (docs/maths.md §12); the output
            is the last layer's (only it has ``W_o``). A given ``state`` sets every layer's
            starting tape: layer l continues from ``state.tape[l]``, its own final tape of the
            previous call, so a long input can run in pieces layer by layer.
        normalize_heads: True or "values" — the value tape is accessed at μ(H) (later option of
            the authors' code); "all" — the key tape is written at μ(H_w) too (docs/maths.md §3:
            without it a head of norm above √2 makes the key tape's erase expand, and the jump
            feeds that back into the heads). "all" runs in the C kernel on the CPU and in the
            Triton kernel on CUDA; elsewhere the per-step loop runs.
        separate_erase: a separate erase gate p_e (else p_e = p_w).
        key_tape_mode: "position" (docs/maths.md §3) or "transposed" (``WR(Kᵀ, k, H_w, p_w, p_e)``,
            a later option of the authors' code); see :func:`nam_tm_step`.
        impl: "auto" or "fused" — the controller GRU, heads and key tape as hand-differentiated
            whole-sequence recurrences (:mod:`memnets.ops.gru`, :mod:`memnets.ops.nam_tm_heads`)
            and the value tape read after write at the head positions: on the CPU as C kernels
            (:mod:`memnets.ops._native`; :func:`memnets.ops.nam_tape.nam_tape_scan`); on CUDA
            as whole-sequence Triton kernels (:mod:`memnets.ops.gpu.nam_tm`, one launch per
            scan) after cuDNN's ``nn.GRU``; elsewhere as TorchScript loops and one
            :func:`memnets.ops.nam_scan`; "reference" — the
            per-step cell, one autograd graph per step. All compute the same function.

    ``forward(x [B, T, input_size], state=None, tape_length=None, return_aux=False)
    -> (y [B, T, D], NAMTMState[, NAMTMAux])``. The controller runs over each call's input
    from a zero state; the tapes and heads carry over through ``state``. ``x`` may be a
    ``torch.nn.utils.rnn.PackedSequence`` (the model needs the NOOP action): ``y`` comes back
    packed alike and each sequence's state is its own after its last step, as if each ran alone
    (:mod:`memnets.memories.packed`).
    """

    def __init__(self, input_size: int, hidden_size: int, num_tapes: int = 1, tape_length: int = 32,
                 actions: Sequence[str] = ACTIONS, controller: str = "gru",
                 bidirectional_controller: bool = True, num_layers: int = 1,
                 normalize_heads: bool | str = False, separate_erase: bool = False, key_tape_mode: str = "position",
                 impl: str = "auto"):
        super().__init__()
        if impl not in ("auto", "fused", "reference"):
            raise ValueError(f"`impl` expected 'auto', 'fused' or 'reference', got {impl!r}")
        for name, val in (("input_size", input_size), ("hidden_size", hidden_size),
                          ("num_tapes", num_tapes), ("tape_length", tape_length), ("num_layers", num_layers)):
            check_positive_int(name, val)
        if hidden_size % num_tapes:
            raise ValueError(f"`hidden_size`={hidden_size} must be divisible by `num_tapes`={num_tapes}")
        if bidirectional_controller and hidden_size % 2:
            raise ValueError(f"`hidden_size`={hidden_size} must be even with a bidirectional controller")
        actions = tuple(actions)
        if not actions or len(set(actions)) != len(actions) or any(a not in ACTIONS for a in actions):
            raise ValueError(f"`actions` expected distinct names among {ACTIONS}, got {actions!r}")
        if key_tape_mode not in ("position", "transposed"):
            raise ValueError(f"`key_tape_mode` expected 'position' or 'transposed', got {key_tape_mode!r}")
        head_norms(normalize_heads)  # checks the value
        if controller not in ("gru", "lstm"):
            raise ValueError(f"`controller` expected 'gru' or 'lstm', got {controller!r}")
        self.input_size, self.hidden_size, self.num_tapes = input_size, hidden_size, num_tapes
        self.tape_length, self.actions, self.num_layers = tape_length, actions, num_layers
        self.width = hidden_size // num_tapes
        self.layers = nn.ModuleList(
            _NAMTMLayer(input_size, hidden_size, num_tapes, actions, controller, bidirectional_controller,
                        normalize_heads, separate_erase, key_tape_mode, with_output=l == num_layers - 1, impl=impl)
            for l in range(num_layers))

    @property
    def impl(self) -> str:
        return self.layers[0].impl

    @impl.setter
    def impl(self, value: str) -> None:
        if value not in ("auto", "fused", "reference"):
            raise ValueError(f"`impl` expected 'auto', 'fused' or 'reference', got {value!r}")
        for layer in self.layers:
            layer.impl = value

    def init_state(self, batch_size: int, device=None, dtype=None, tape_length: int | None = None) -> NAMTMState:
        """Empty tapes ``[Ly, B, Tn, C, L]`` and both heads at cell 1 (``e₁``), on the parameters'
        device and in their dtype unless ``device`` / ``dtype`` say otherwise."""
        check_positive_int("batch_size", batch_size)
        L = check_positive_int("tape_length", self.tape_length if tape_length is None else tape_length)
        dtype = dtype or self.layers[0].value.weight.dtype
        device = self.layers[0].value.weight.device if device is None else torch.device(device)
        shape = (self.num_layers, batch_size, self.num_tapes)
        # two ops in all: one multi-tensor fill of zeros, then both heads' first cells (h_r and h_w
        # are the two halves of one tensor)
        tape, key_tape, heads = fresh_zeros([((*shape, self.width, L), dtype, device)] * 2
                                            + [((2, *shape, L), dtype, device)])
        heads[..., 0] = 1.0
        return NAMTMState(tape, key_tape, heads[0], heads[1])

    def forward(self, x: torch.Tensor, state: NAMTMState | None = None, tape_length: int | None = None,
                return_aux: bool = False):
        if isinstance(x, PackedSequence):  # sequences of different lengths (memnets.memories.packed)
            if "NOOP" not in self.actions:
                raise ValueError(f"`x`: a PackedSequence needs the NOOP action (it holds the heads after each "
                                 f"sequence's end), this model's actions are {self.actions}: pad the batch "
                                 "instead (torch.nn.utils.rnn.pad_packed_sequence)")
            return forward_packed(self._forward, x, state, state_dim=1, lengths="lengths", return_aux=return_aux,
                                  tape_length=tape_length)
        return self._forward(x, state, tape_length, return_aux)

    def _forward(self, x: torch.Tensor, state: NAMTMState | None = None, tape_length: int | None = None,
                 return_aux: bool = False, lengths: torch.Tensor | None = None):
        """:meth:`forward` of a padded batch; ``lengths`` ``[B]``: each sequence's final state is
        its state after its own step ``lengths[b]`` (a packed batch)."""
        check_tensor("x", x)
        check_shape("x", x, ["B", "T", "input_size"], [None, None, self.input_size])
        B = x.shape[0]
        if B == 0 or x.shape[1] == 0:
            raise ValueError(f"`x` expected non-empty batch and time dims, got {list(x.shape)}")
        handed = state is None  # a fresh start: each later layer takes its predecessor's tape
        if state is None:
            state = self.init_state(B, x.device, x.dtype, tape_length)
        else:
            L = state.tape.shape[-1] if isinstance(state, tuple) and len(state) == 4 else None
            if L is None:
                raise TypeError(f"`state` expected a NAMTMState, got {type(state).__name__}")
            if tape_length is not None and tape_length != L:
                raise ValueError(f"`tape_length`={tape_length} differs from the state's tape length {L}")
            Ly, Tn, C = self.num_layers, self.num_tapes, self.width
            check_shape("state.tape", state.tape, ["Ly", "B", "Tn", "C", "L"], [Ly, B, Tn, C, L])
            check_shape("state.key_tape", state.key_tape, ["Ly", "B", "Tn", "C", "L"], [Ly, B, Tn, C, L])
            check_shape("state.h_r", state.h_r, ["Ly", "B", "Tn", "L"], [Ly, B, Tn, L])
            check_shape("state.h_w", state.h_w, ["Ly", "B", "Tn", "L"], [Ly, B, Tn, L])
        finals, tape = [], state.tape[0]
        for l, layer in enumerate(self.layers):
            if l and not handed:
                tape = state.tape[l]  # a given state: every layer continues from its own tape
            y, fin, aux = layer(x, tape, state.key_tape[l], state.h_r[l], state.h_w[l], lengths=lengths)
            finals.append(fin)
            tape = fin[0]  # the next layer starts from this layer's value tape
        # one layer: its states as views with a layer dim (no copy); several: stacked
        new = NAMTMState(*(parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts, 0) for parts in zip(*finals)))
        return (y, new, aux) if return_aux else (y, new)

    def step(self, x_t: torch.Tensor, state: NAMTMState | None = None):
        """One token ``x_t [B, input_size]`` -> ``(y_t [B, D], state)``: :meth:`forward` on a
        length-1 sequence (a bidirectional controller then sees only this token)."""
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.input_size])
        y, state = self.forward(x_t.unsqueeze(1), state)
        return y[:, 0], state
