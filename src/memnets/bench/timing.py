"""Timing helpers for benchmarks: warm-up, repeated runs, median wall time."""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

__all__ = ["time_fn", "fwd_bwd", "paired", "pytorch_path"]


def time_fn(fn: Callable[[], object], *, warmup: int = 1, repeat: int = 3, min_time: float = 0.0,
            stat: str = "median") -> float:
    """Wall time of ``fn()`` in seconds over ``repeat`` runs after ``warmup`` runs.

    ``stat="median"`` (default) or ``"min"`` (the least disturbed run: more robust when other
    jobs share the machine and only slow runs down).
    """
    if stat not in ("median", "min"):
        raise ValueError(f"`stat` expected 'median' or 'min', got {stat!r}")
    for _ in range(warmup):
        fn()
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start_all) < min_time:
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if len(times) >= 50:
            break
    return min(times) if stat == "min" else statistics.median(times)


def paired(base: Callable[[], None], ours: Callable[[], None], repeat: int) -> tuple[float, float, float]:
    """Median wall seconds of ``base`` and ``ours`` run alternately after one warm-up each,
    and the ratio of their median process CPU times (less sensitive to a loaded machine)."""
    base()
    ours()
    tb, to, cb, co = [], [], [], []
    for _ in range(repeat):
        for fn, wall, cpu in ((base, tb, cb), (ours, to, co)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(tb), statistics.median(to), statistics.median(co) / statistics.median(cb)


def fwd_bwd(fn: Callable[[], object], params: list[torch.Tensor]) -> Callable[[], None]:
    """Wrap ``fn`` (returning a tensor or tuple of tensors) as forward + backward of their sum."""

    def run() -> None:
        for p in params:
            p.grad = None
        out = fn()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        loss.backward()

    return run


def pytorch_path(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` with the C kernels off (``MEMNETS_NATIVE=0``): the PyTorch path they replace."""
    def run() -> None:
        old = os.environ.get("MEMNETS_NATIVE")
        os.environ["MEMNETS_NATIVE"] = "0"
        try:
            fn()
        finally:
            if old is None:
                del os.environ["MEMNETS_NATIVE"]
            else:
                os.environ["MEMNETS_NATIVE"] = old
    return run
