"""The DNC's memory access per step in C (``memnets/ops/_native/dnc.c``), forward and backward.

:func:`~memnets.ops.dnc.forward.run_forward` runs the LSTM controller and the interface layer
of each step with PyTorch, then one call of :func:`access_step` does the rest of the step for
every batch row: the forty-odd tensor ops of the access (retention, usage, sort-based
allocation, content and write weightings, erase/add write, link, precedence, directional and
read weightings, reads) on tensors of a few hundred numbers each, where each op's dispatch
cost more than its arithmetic. It writes the same workspace buffers the ops write.
:func:`~memnets.ops.dnc.backward.run_backward` likewise calls :func:`backward_step` for the
access part of each reverse step: from the factors it computes for all steps before its loop,
it writes the step's interface gradient and updates the carried gradients of the state in
place; the controller's part stays in PyTorch. Used on float32 / float64 CPU tensors where the
kernel compiles; ``MEMNETS_NATIVE=0`` runs the ops. ``tests/test_native.py`` holds every
forward buffer and every gradient to the ops' in float64 and float32; the DNC's own tests run
through it.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

import torch

from .. import _native
from .layout import interface_layout
from .workspace import EPS, ForwardWorkspace

__all__ = ["kernel", "access_pointers", "access_step", "backward_scratch", "backward_pointers", "backward_step"]

_NAMES = ("XI", "SP", "SG", "PI", "KH", "RHO", "KEEPR", "PSI", "UB", "U", "SU", "PHI", "EX", "S0W", "CW", "DI",
          "WW", "KEEPM", "MEM", "DEC", "LL", "SW", "PREC", "BF", "CR", "NRM", "S0R", "WR", "RD")
#: the forward buffers the backward step reads, then the backward's own
_BWD_F = ("XI", "SG", "PI", "KH", "MEM", "WR", "BF", "CR", "NRM", "LL", "DEC", "WW", "PREC", "KEEPM", "DI", "PHI",
          "CW")
_BWD_G = ("S0RN", "S0WN", "Q", "OMSW", "FU", "FW", "NOTH", "JS", "CWC", "SGD", "RSP", "BR", "NBR3", "EXT0", "GXI")
_SIGNATURES = {  # B, N, W, R, I, XW, t, eps, b0, b1, the buffers of _NAMES, X[0], the allocation's scratch
    "dnc_access_fwd": [_native.LONG] * 7 + [ctypes.c_double] + [_native.LONG] * 2 + [_native.PTR] * (len(_NAMES) + 2),
    # B, N, W, R, I, EW, t, b0, b1, _BWD_F, _BWD_G, the carried gradients (7), the scratch
    "dnc_access_bwd": [_native.LONG] * 9 + [_native.PTR] * (len(_BWD_F) + len(_BWD_G) + 8),
}


def kernel(x: torch.Tensor, backward: bool = False) -> Optional[Callable]:
    """The C access step (forward, or ``backward``) for ``x``'s dtype, or ``None`` (not a
    float32 / float64 CPU tensor, or no C compiler here, or ``MEMNETS_NATIVE=0``)."""
    fns = _native.functions("dnc", x, _SIGNATURES)
    return None if fns is None else fns[1 if backward else 0]


def _scratch_width(N: int, W: int, R: int) -> int:
    return N * W + N * N + 2 * R * N + (R + 1) * W + 5 * N


def backward_scratch(B: int, N: int, W: int, R: int, like: torch.Tensor) -> torch.Tensor:
    """The backward step's scratch: per row the state's gradients before the step and a few rows."""
    return like.new_empty(B, _scratch_width(N, W, R))


def backward_pointers(f: ForwardWorkspace, g, R: int, W: int, carried: list, work: torch.Tensor) -> list:
    """The data pointers of :func:`backward_step` after checking every buffer: ``carried`` the
    state's gradients ``(gM [B,N,W], gu [B,N], gL [B,N,N], gp [B,N], gwr [B,R,N], gww [B,N],
    gn [B,N])``, contiguous, updated in place by each step."""
    T, B, N = f.SU.shape
    fwd = dict(zip(_NAMES, access_pointers(f, R, W)))  # the forward's buffers, checked
    dt, I = f.XI.dtype, f.XI.shape[-1]
    want = {"S0RN": (T, B, R, N), "S0WN": (T, B, N), "Q": (T, B, N, N), "OMSW": (T, B, 1), "FU": (T, B, N),
            "FW": (T, B, N), "NOTH": (T, B, R, N), "JS": (T, B, N, N), "CWC": (T, B, 1), "SGD": (T, B, W + R + 2),
            "RSP": (T, B, R + 1), "BR": (T, B, R + 1), "NBR3": (T, B, R + 1), "GXI": (T, B, I),
            "EXT0": (T, B, _wide(g.EXT0, R * W))}
    carried_shapes = [(B, N, W), (B, N), (B, N, N), (B, N), (B, R, N), (B, N), (B, N)]
    return ([fwd[n] for n in _BWD_F] + [_ptr(n, getattr(g, n), want[n], dt) for n in _BWD_G]
            + [_ptr(f"carried gradient {i}", c, shape, dt) for i, (c, shape) in enumerate(zip(carried, carried_shapes))]
            + [_ptr("scratch", work, (B, _scratch_width(N, W, R)), dt)])


def backward_step(step: Callable, f: ForwardWorkspace, R: int, W: int, t: int, ptrs: list, EW: int) -> None:
    """The access part of reverse step ``t`` for every batch row (``ptrs`` from
    :func:`backward_pointers`)."""
    T, B, N = f.SU.shape
    step(B, N, W, R, f.XI.shape[-1], EW, t, 0, B, *ptrs)


def _shapes(T: int, B: int, N: int, W: int, R: int) -> dict:
    return {"XI": (T, B, interface_layout(R, W)["size"]), "SP": (T, B, R + 1), "SG": (T, B, W + R + 2),
            "PI": (T, B, 3, R), "KH": (T, B, R + 1, W), "RHO": (T, B, R + 1), "KEEPR": (T, B, R, N),
            "PSI": (T, B, N), "UB": (T, B, N), "U": (T + 1, B, N), "SU": (T, B, N), "PHI": (T, B, N),
            "EX": (T, B, N), "S0W": (T, B, N, 1), "CW": (T, B, N), "DI": (T, B, 2, N), "WW": (T + 1, B, N),
            "KEEPM": (T, B, N, W), "MEM": (T + 1, B, N, W), "DEC": (T, B, N, N), "LL": (T + 1, B, N, 2 * N),
            "SW": (T, B, 1), "PREC": (T + 1, B, N), "BF": (T, B, R, 2 * N), "CR": (T, B, R, N),
            "NRM": (T + 1, B, N), "S0R": (T, B, R, N), "WR": (T + 1, B, R, N), "RD": (T, B, R, W)}


def _ptr(name: str, buf: torch.Tensor, shape: tuple, dtype: torch.dtype) -> int:
    return _native.pointer("dnc", name, buf, dtype, "cpu", shape)


def _wide(buf: torch.Tensor, least: int) -> int:
    """The width of a buffer whose rows begin with ``least`` numbers the kernel uses (the reads)."""
    if buf.dim() != 3 or buf.shape[2] < least:
        raise ValueError(f"dnc native step: expected rows of at least {least} numbers, got {list(buf.shape)}")
    return buf.shape[2]


def access_pointers(f: ForwardWorkspace, R: int, W: int) -> list:
    """The data pointers :func:`access_step` passes, after checking every buffer of ``f``
    (shape, dtype, contiguity: the kernel trusts them)."""
    T, B, N = f.SU.shape
    want, dt = _shapes(T, B, N, W, R), f.XI.dtype
    ptrs = [_ptr(n, getattr(f, n), want[n], torch.int64 if n == "PHI" else dt) for n in _NAMES]
    return ptrs + [_ptr("X[0]", f.X[0], (T + 1, B, _wide(f.X[0], R * W)), dt), _ptr("alloc", f.alloc, (B, N), dt)]


def access_step(step: Callable, f: ForwardWorkspace, R: int, W: int, t: int, ptrs: list) -> None:
    """Step ``t``'s memory access for every batch row (``ptrs`` from :func:`access_pointers`)."""
    T, B, N = f.SU.shape
    step(B, N, W, R, f.XI.shape[-1], f.X[0].shape[-1], t, EPS, 0, B, *ptrs)
