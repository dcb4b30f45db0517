"""One NTM step's memory access (docs/maths.md §7): address, write, address, read.

:func:`ntm_access` takes what the controller emits in a step — each head's raw parameters
(key, strength, gate, sharpening, shift logits), the write heads' erase and add vectors — and
the state the step starts from, and returns the new memory, the read and write weightings and
the reads: the write heads address ``M_{t-1}`` and erase/add into it, then the read heads
address the fresh ``M_t`` and read it (Graves et al. 2014, in the order of seed 002).

:func:`ntm_access_reference` composes it from the ops of :mod:`memnets.ops.addressing`, one
tensor op per equation. On float32 / float64 CPU tensors :func:`ntm_access` runs it as one C
call per step forward and one backward (``memnets/ops/_native/ntm.c``, the :class:`NTMAccess`
autograd Function) instead of the sixty-odd tensor ops of the reference and their hundred-odd
backward nodes, each of which cost more in dispatch than its arithmetic on a ``128 × 20``
memory. ``MEMNETS_NATIVE=0`` (or no C compiler) runs the reference. ``tests/test_ntm_access.py``
holds the one to the other (values and every gradient, float64 and float32) and runs gradcheck.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _native
from ._amp import backward_without_autocast, to_float32
from .._checks import check_tensor
from .addressing import circular_shift, content_weights, erase_add_write, interpolate, sharpen, weighted_read

__all__ = ["NTMAccessOut", "ntm_access", "ntm_access_reference", "address", "head_params", "NTMAccess", "EPS"]

EPS = 1e-6  # under the square root of the cosine's norms, as memnets.ops.addressing

_L, _D, _P = _native.LONG, ctypes.c_double, _native.PTR
_SIGNATURES = {  # B, N, W, R, Hw, S, eps, b0, b1, then the buffers
    "ntm_access_fwd": [_L] * 6 + [_D] + [_L] * 2 + [_P] * 12,
    "ntm_access_bwd": [_L] * 6 + [_D] + [_L] * 2 + [_P] * 21,
}
#: multiply-adds of a call per thread below which the batch rows are not split over threads
MIN_WORK = 1 << 20


class NTMAccessOut(NamedTuple):
    memory: torch.Tensor  # M_t [B, N, W]
    read_weights: torch.Tensor  # [B, R, N]
    write_weights: torch.Tensor  # [B, Hw, N]
    reads: torch.Tensor  # [B, R, W]


def head_params(p: torch.Tensor, W: int):
    """``(key, β, g, γ, s)`` from the heads' raw parameters ``p [..., W + 3 + S]``: ``tanh``,
    ``softplus``, ``σ``, ``1 + softplus`` and a softmax over the S shifts."""
    return (torch.tanh(p[..., :W]), F.softplus(p[..., W]), torch.sigmoid(p[..., W + 1]),
            1 + F.softplus(p[..., W + 2]), torch.softmax(p[..., W + 3:], dim=-1))


def address(memory: torch.Tensor, p: torch.Tensor, w_prev: torch.Tensor) -> torch.Tensor:
    """Heads' weightings ``[B, H, N]`` from their raw parameters ``p [B, H, W + 3 + S]`` and
    previous weightings: content, interpolation, shift, sharpening (docs/maths.md §7, in order)."""
    key, beta, gate, gamma, shift = head_params(p, memory.shape[-1])
    w = content_weights(memory, key, beta, EPS)
    return sharpen(circular_shift(interpolate(w, w_prev, gate), shift), gamma)


def ntm_access_reference(hp: torch.Tensor, erase: torch.Tensor, add: torch.Tensor, memory: torch.Tensor,
                         read_weights: torch.Tensor, write_weights: torch.Tensor) -> NTMAccessOut:
    """:func:`ntm_access` as tensor ops (the arguments are the same)."""
    R = read_weights.shape[1]
    w_w = address(memory, hp[:, R:], write_weights)
    memory = erase_add_write(memory, w_w, erase, add)
    w_r = address(memory, hp[:, :R], read_weights)
    return NTMAccessOut(memory, w_r, w_w, weighted_read(memory, w_r))


def _kernel(x: torch.Tensor):
    return _native.functions("ntm", x, _SIGNATURES)


def _check(hp, erase, add, memory, read_weights, write_weights) -> int:
    """Checks the arguments' shapes against each other; returns S, the number of shifts."""
    for name, t in (("hp", hp), ("erase", erase), ("add", add), ("memory", memory),
                    ("read_weights", read_weights), ("write_weights", write_weights)):
        check_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"`{name}` expected 3 dims (batch first), got {list(t.shape)}")
    B, N, W = memory.shape
    R, Hw = read_weights.shape[1], write_weights.shape[1]
    S = hp.shape[-1] - W - 3
    want = {"hp": (B, R + Hw, hp.shape[-1]), "erase": (B, Hw, W), "add": (B, Hw, W), "read_weights": (B, R, N),
            "write_weights": (B, Hw, N)}
    names = {"hp": "[B, R + Hw, W + 3 + S]", "erase": "[B, Hw, W]", "add": "[B, Hw, W]",
             "read_weights": "[B, R, N]", "write_weights": "[B, Hw, N]"}
    got = {"hp": hp, "erase": erase, "add": add, "read_weights": read_weights, "write_weights": write_weights}
    for name, t in got.items():
        if tuple(t.shape) != want[name]:
            raise ValueError(f"`{name}` expected {names[name]} = {list(want[name])} for memory [B, N, W] = "
                             f"{[B, N, W]}, got {list(t.shape)}")
    if S < 1 or S % 2 != 1 or S > N:
        raise ValueError(f"`hp` expected an odd number S of shift logits, 1 <= S <= N = {N}, after the W + 3 = "
                         f"{W + 3} others, got S = {S}")
    return S


def _scratch(N: int, W: int, H: int, S: int) -> int:
    """The numbers of scratch per batch row (``ntm_scratch`` in ``ntm_t.h``)."""
    return N * W + (2 * H + 6) * N + 2 * H * W + 2 * H + 4 * S


def _slots_last(m: torch.Tensor) -> torch.Tensor:
    """``m [B, N, W]`` as the kernel stores a memory: ``[B, W, N]`` contiguous (no copy when ``m``
    is already the transposed view of such a tensor, as every memory the kernel returns is)."""
    return m.transpose(1, 2).contiguous()


def _split(B: int, work: int):
    return _native.ranges(B, work, MIN_WORK)


class NTMAccess(torch.autograd.Function):
    """``apply(kernels, hp, erase, add, memory, read_weights, write_weights)`` →
    ``(memory, read_weights, write_weights, reads)`` through the C kernel ``kernels`` (the pair
    :func:`_kernel` returns): tensors of one float dtype on the CPU, shapes as
    :func:`ntm_access` (which checks them). The memory goes in and out as the kernel keeps it,
    ``[B, W, N]`` contiguous, seen as ``[B, N, W]`` (:func:`_slots_last`)."""

    @staticmethod
    def forward(ctx, kernels, hp, erase, add, memory, read_weights, write_weights):
        B, N, W = memory.shape
        R, Hw, S = read_weights.shape[1], write_weights.shape[1], hp.shape[-1] - W - 3
        ins = (hp.contiguous(), erase.contiguous(), add.contiguous(), _slots_last(memory),
               read_weights.contiguous(), write_weights.contiguous())
        m1t, wr1, ww1 = torch.empty_like(ins[3]), torch.empty_like(ins[4]), torch.empty_like(ins[5])
        reads, aux = hp.new_empty(B, R, W), hp.new_empty(B, R + Hw, 4 * N)
        scratch = hp.new_empty(B, _scratch(N, W, R + Hw, S))  # every buffer held until the kernel returns
        ptrs = ([_native.pointer("ntm", name, t, memory.dtype, "cpu") for name, t in zip(_INPUTS, ins)]
                + [t.data_ptr() for t in (m1t, wr1, ww1, reads, aux, scratch)])
        fwd = kernels[0]
        _native.parallel(lambda i, b0, b1: fwd(B, N, W, R, Hw, S, EPS, b0, b1, *ptrs),
                         _split(B, B * N * W * (2 * R + 2 * Hw + 2)))
        m1 = m1t.transpose(1, 2)  # [B, N, W], stored slots last as the next step reads it
        ctx.save_for_backward(*ins[:3], memory, *ins[4:], m1, wr1, ww1, aux)
        ctx.kernels, ctx.dims = kernels, (B, N, W, R, Hw, S)
        return m1, wr1, ww1, reads

    @staticmethod
    @once_differentiable
    @backward_without_autocast
    def backward(ctx, g_m1, g_wr1, g_ww1, g_reads):
        hp, erase, add, memory, wr0, ww0, m1, wr1, ww1, aux = ctx.saved_tensors
        B, N, W, R, Hw, S = ctx.dims
        # every buffer held (here, not in the list of pointers) until the kernel returns
        saved = (hp, erase, add, _slots_last(memory), wr0, ww0, _slots_last(m1), wr1, ww1, aux)
        grads = (_slots_last(g_m1), g_wr1.contiguous(), g_ww1.contiguous(), g_reads.contiguous())
        outs = [torch.empty_like(t) for t in saved[:6]]
        scratch = hp.new_empty(B, _scratch(N, W, R + Hw, S))
        ptrs = ([t.data_ptr() for t in saved] + [_native.pointer("ntm", n, g, hp.dtype, "cpu") for n, g in zip(
            _GRADS, grads)] + [t.data_ptr() for t in outs] + [scratch.data_ptr()])
        bwd = ctx.kernels[1]
        _native.parallel(lambda i, b0, b1: bwd(B, N, W, R, Hw, S, EPS, b0, b1, *ptrs),
                         _split(B, B * N * W * (4 * R + 4 * Hw + 4)))
        outs[3] = outs[3].transpose(1, 2)  # the memory's gradient [B, N, W]
        return (None, *outs)


_INPUTS = ("hp", "erase", "add", "memory", "read_weights", "write_weights")
_GRADS = ("memory's gradient", "read_weights' gradient", "write_weights' gradient", "reads' gradient")


def ntm_access(hp: torch.Tensor, erase: torch.Tensor, add: torch.Tensor, memory: torch.Tensor,
               read_weights: torch.Tensor, write_weights: torch.Tensor, native: Optional[bool] = None) -> NTMAccessOut:
    """One NTM step's memory access (docs/maths.md §7).

    Args:
        hp: the heads' raw parameters ``[B, R + Hw, W + 3 + S]``, the R read heads first; per
            head the key (tanh), strength (softplus), gate (σ), sharpening (1 + softplus) and
            the S (odd) shift logits (softmax; shifts −S//2 .. +S//2).
        erase: the write heads' erase vectors ``[B, Hw, W]`` in [0, 1]. add: ``[B, Hw, W]``.
        memory: ``M_{t-1} [B, N, W]``. read_weights, write_weights: the previous weightings
            ``[B, R, N]``, ``[B, Hw, N]``.
        native: ``None`` uses the C kernel where it runs (float32 / float64 CPU tensors of one
            dtype), ``False`` the tensor ops of :func:`ntm_access_reference`; ``True`` requires the kernel.
    Returns:
        :class:`NTMAccessOut` ``(memory [B, N, W], read_weights [B, R, N], write_weights
        [B, Hw, N], reads [B, R, W])``.
    """
    _check(hp, erase, add, memory, read_weights, write_weights)
    args = (hp, erase, add, memory, read_weights, write_weights)
    dev = memory.device.type
    if torch.is_autocast_enabled(dev) and memory.dtype != torch.float64:  # float32, autocast off (_amp)
        with torch.autocast(dev, enabled=False):
            return ntm_access(*to_float32(args), native=native)
    kernels = None if native is False else _kernel(memory)
    usable = kernels is not None and all(t.dtype == memory.dtype and t.device == memory.device for t in args)
    if native and not usable:
        raise RuntimeError("ntm_access(native=True): the C kernel does not run here (it needs float32 / float64 "
                           "CPU tensors of one dtype, a C compiler, and MEMNETS_NATIVE not 0)")
    if usable:
        return NTMAccessOut(*NTMAccess.apply(kernels, *args))
    return ntm_access_reference(*args)
