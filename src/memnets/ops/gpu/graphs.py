"""CUDA-graph replay of the recurrent kernels' time loops.

A time loop on the GPU launches a few kernels per step (a cuBLAS matmul and a Triton program),
and each launch from Python costs some microseconds of CPU time: at the bench's sizes the GPU
waits on Python. :func:`graphed` runs such a loop once eagerly and, the second time it meets the
same shapes, captures it into a ``torch.cuda.CUDAGraph``; from then on a call copies its inputs
into the graph's own buffers, replays every launch of the loop with one call, and returns
copies of the graph's outputs (so nothing a caller holds is overwritten by the next replay).

The loop is a function of its tensor arguments only (``fn(*inputs) -> tuple of tensors``): it
allocates its outputs, launches kernels and never reads a value back to the CPU. Its Python
constants (sizes, block shapes) are part of the cache key the caller passes. A graph replays on
the current stream. At most :data:`MAX_GRAPHS` graphs are kept (least recently used first out);
``MEMNETS_CUDA_GRAPHS=0`` turns replay off. A capture that fails warns once and leaves that key
eager.

On the CPU (tests) :func:`stand_in` swaps the CUDA graph for an eager stand-in with the same
contract — static input buffers, outputs written into the same static buffers on every replay —
so the buffer handling is tested without a GPU; the capture itself needs one.
"""
from __future__ import annotations

import collections
import contextlib
import os
import warnings
from typing import Callable, Hashable, Sequence

import torch

__all__ = ["graphed", "enabled", "stand_in", "clear", "MAX_GRAPHS", "stats"]

MAX_GRAPHS = 16
_CACHE: "collections.OrderedDict[Hashable, _Entry]" = collections.OrderedDict()
_SEEN: "collections.Counter[Hashable]" = collections.Counter()
_FAILED: set = set()
_STAND_IN = [0]
_STATS = collections.Counter()


def enabled(x: torch.Tensor) -> bool:
    """Whether loops on tensors like ``x`` replay from graphs: CUDA tensors (or CPU ones inside
    :func:`stand_in`), ``MEMNETS_CUDA_GRAPHS`` not ``0``, and not while ``torch.compile`` traces."""
    if os.environ.get("MEMNETS_CUDA_GRAPHS", "1") == "0" or torch.compiler.is_compiling():
        return False
    return (x.is_cuda and torch.cuda.is_available()) or (_STAND_IN[0] > 0 and not x.is_cuda)


@contextlib.contextmanager
def stand_in():
    """CPU tensors take the graph path with an eager stand-in for the capture (tests)."""
    _STAND_IN[0] += 1
    try:
        yield
    finally:
        _STAND_IN[0] -= 1


def clear() -> None:
    """Drop every kept graph and what was seen (frees their buffers)."""
    _CACHE.clear()
    _SEEN.clear()
    _FAILED.clear()


def stats() -> dict:
    """Counts since the start: ``captures``, ``replays``, ``eager`` calls, ``evictions``, ``failures``."""
    return dict(_STATS)


class _EagerGraph:
    """The stand-in: ``replay`` reruns the function on the static inputs and writes its results
    into the static outputs, as a CUDA graph's replay does."""

    def __init__(self, fn, static_in):
        self.fn, self.static_in = fn, static_in
        self.static_out = tuple(fn(*static_in))

    def replay(self) -> None:
        for buf, new in zip(self.static_out, self.fn(*self.static_in)):
            buf.copy_(new)


class _CudaGraph:
    def __init__(self, fn, static_in):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton's JIT and module loads, cuBLAS's workspace
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = tuple(fn(*static_in))

    def replay(self) -> None:
        self.graph.replay()


class _Entry:
    def __init__(self, fn, inputs, cuda: bool):
        self.static_in = tuple(torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t) for t in inputs)
        self.graph = (_CudaGraph if cuda else _EagerGraph)(fn, self.static_in)


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device, t.is_contiguous()) for t in inputs)


def graphed(key: Hashable, fn: Callable[..., Sequence[torch.Tensor]], *inputs: torch.Tensor
            ) -> tuple[torch.Tensor, ...]:
    """``fn(*inputs)``, replayed from a CUDA graph once this ``key`` and these input shapes have
    been seen before (module docstring). ``key`` names the loop and every Python value ``fn``
    depends on; the inputs' shapes, dtypes and device are added to it. Returns tensors of the
    caller's own (copies of the graph's outputs)."""
    if not inputs or not enabled(inputs[0]):
        return tuple(fn(*inputs))
    full = (key, _signature(inputs))
    if full in _FAILED:
        _STATS["eager"] += 1
        return tuple(fn(*inputs))
    entry = _CACHE.get(full)
    if entry is None:
        _SEEN[full] += 1
        if _SEEN[full] < 2:  # once: eager (a shape met only once is not worth a capture)
            _STATS["eager"] += 1
            return tuple(fn(*inputs))
        try:
            entry = _Entry(fn, inputs, inputs[0].is_cuda)
        except Exception as e:  # noqa: BLE001 - the loop still runs, without a graph
            _FAILED.add(full)
            _STATS["failures"] += 1
            warnings.warn(f"memnets: CUDA-graph capture of {key!r} failed ({type(e).__name__}: {e}); "
                          "running it without a graph", RuntimeWarning, stacklevel=2)
            return tuple(fn(*inputs))
        _STATS["captures"] += 1
        _CACHE[full] = entry
        while len(_CACHE) > MAX_GRAPHS:
            _CACHE.popitem(last=False)
            _STATS["evictions"] += 1
    else:
        _CACHE.move_to_end(full)
        for buf, t in zip(entry.static_in, inputs):
            buf.copy_(t)
    entry.graph.replay()
    _STATS["replays"] += 1
    return tuple(o.clone() for o in entry.graph.static_out)
