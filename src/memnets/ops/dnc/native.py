"""The DNC's memory access per step in C (``memnets/ops/_native/dnc.c``), forward.

:func:`~memnets.ops.dnc.forward.run_forward` runs the LSTM controller and the interface layer
of each step with PyTorch, then one call of :func:`access_step` does the rest of the step for
every batch row: the forty-odd tensor ops of the access (retention, usage, sort-based
allocation, content and write weightings, erase/add write, link, precedence, directional and
read weightings, reads) on tensors of a few hundred numbers each, where each op's dispatch
cost more than its arithmetic. It writes the same workspace buffers the ops write, so the
backward (:mod:`memnets.ops.dnc.backward`) is unchanged. Used on float32 / float64 CPU tensors
where the kernel compiles; ``MEMNETS_NATIVE=0`` runs the ops. ``tests/test_native.py`` holds
every buffer to the ops' in float64; the DNC's own tests run through it.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

import torch

from .. import _native
from .layout import interface_layout
from .workspace import EPS, ForwardWorkspace

__all__ = ["kernel", "access_step"]

_NAMES = ("XI", "SP", "SG", "PI", "KH", "RHO", "KEEPR", "PSI", "UB", "U", "SU", "PHI", "EX", "S0W", "CW", "DI",
          "WW", "KEEPM", "MEM", "DEC", "LL", "SW", "PREC", "BF", "CR", "NRM", "S0R", "WR", "RD")
_SIGNATURES = {  # B, N, W, R, I, XW, t, eps, b0, b1, the buffers of _NAMES, X[0], the allocation's scratch
    "dnc_access_fwd": [_native.LONG] * 7 + [ctypes.c_double] + [_native.LONG] * 2 + [_native.PTR] * (len(_NAMES) + 2),
}


def kernel(x: torch.Tensor) -> Optional[Callable]:
    """The C access step for ``x``'s dtype, or ``None`` (not a float32 / float64 CPU tensor, or
    no C compiler here, or ``MEMNETS_NATIVE=0``)."""
    fns = _native.functions("dnc", x, _SIGNATURES)
    return None if fns is None else fns[0]


def _shapes(T: int, B: int, N: int, W: int, R: int) -> dict:
    return {"XI": (T, B, interface_layout(R, W)["size"]), "SP": (T, B, R + 1), "SG": (T, B, W + R + 2),
            "PI": (T, B, 3, R), "KH": (T, B, R + 1, W), "RHO": (T, B, R + 1), "KEEPR": (T, B, R, N),
            "PSI": (T, B, N), "UB": (T, B, N), "U": (T + 1, B, N), "SU": (T, B, N), "PHI": (T, B, N),
            "EX": (T, B, N), "S0W": (T, B, N, 1), "CW": (T, B, N), "DI": (T, B, 2, N), "WW": (T + 1, B, N),
            "KEEPM": (T, B, N, W), "MEM": (T + 1, B, N, W), "DEC": (T, B, N, N), "LL": (T + 1, B, N, 2 * N),
            "SW": (T, B, 1), "PREC": (T + 1, B, N), "BF": (T, B, R, 2 * N), "CR": (T, B, R, N),
            "NRM": (T + 1, B, N), "S0R": (T, B, R, N), "WR": (T + 1, B, R, N), "RD": (T, B, R, W)}


def access_pointers(f: ForwardWorkspace, R: int, W: int) -> list:
    """The data pointers :func:`access_step` passes, after checking every buffer of ``f``
    (shape, dtype, contiguity: the kernel trusts them)."""
    T, B, N = f.SU.shape
    want, dt = _shapes(T, B, N, W, R), f.XI.dtype
    ptrs = []
    for name in _NAMES:
        buf = getattr(f, name)
        kind = torch.int64 if name == "PHI" else dt
        if tuple(buf.shape) != want[name] or buf.dtype != kind or not buf.is_contiguous() or buf.device.type != "cpu":
            raise ValueError(f"dnc native step: `{name}` expected a contiguous {kind} CPU tensor of shape "
                             f"{list(want[name])}, got {buf.dtype} {list(buf.shape)} on {buf.device}")
        ptrs.append(buf.data_ptr())
    X0 = f.X[0]
    if X0.dim() != 3 or X0.shape[:2] != (T + 1, B) or X0.shape[2] < R * W or X0.dtype != dt or not X0.is_contiguous():
        raise ValueError(f"dnc native step: `X[0]` expected a contiguous {dt} tensor [{T + 1}, {B}, >= {R * W}], "
                         f"got {X0.dtype} {list(X0.shape)}")
    if tuple(f.alloc.shape) != (B, N) or f.alloc.dtype != dt or not f.alloc.is_contiguous():
        raise ValueError(f"dnc native step: `alloc` expected [{B}, {N}] {dt}, "
                         f"got {f.alloc.dtype} {list(f.alloc.shape)}")
    return ptrs + [X0.data_ptr(), f.alloc.data_ptr()]


def access_step(step: Callable, f: ForwardWorkspace, R: int, W: int, t: int, ptrs: list) -> None:
    """Step ``t``'s memory access for every batch row (``ptrs`` from :func:`access_pointers`)."""
    T, B, N = f.SU.shape
    step(B, N, W, R, f.XI.shape[-1], f.X[0].shape[-1], t, EPS, 0, B, *ptrs)
