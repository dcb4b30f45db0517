"""One declared precision for the hand-written recurrences under autocast.

The fast paths of memnets (the chunked NAM scan, LSAM's loops, the DNC's whole-sequence
Function, the NAM-TM head loops, the GRU controller) write into buffers of one dtype and
sum many small updates into a memory, so they run in float32 whatever autocast would pick:
:func:`float32_under_autocast` turns autocast off around them and casts their floating
inputs (bfloat16, float16) up to float32. float64 inputs and calls without autocast are left
as they are. The result is float32; later autocast-eligible ops cast it down again as usual.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, TypeVar

import torch

__all__ = ["autocast_device", "to_float32", "float32_under_autocast", "backward_without_autocast", "run_rnn"]

F = TypeVar("F", bound=Callable[..., Any])
_LOW = (torch.float16, torch.bfloat16, torch.float32)


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def autocast_device(*args: Any) -> str | None:
    """The device type whose autocast applies to the tensors in ``args`` (searched through
    tuples, lists, NamedTuples and dicts), or None: autocast off there, or a float64 tensor
    among them (float64 runs as given, autocast never touches it)."""
    dev = None
    for t in _tensors(args):
        if t.dtype == torch.float64:
            return None
        if dev is None and t.is_floating_point():
            dev = t.device.type
    if dev is None or not torch.is_autocast_enabled(dev):
        return None
    return dev


def to_float32(obj: Any) -> Any:
    """``obj`` with every float16 / bfloat16 tensor cast to float32 (through tuples, lists,
    NamedTuples and dicts; other values unchanged)."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in _LOW else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_float32(o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_float32(o) for o in obj)
    if isinstance(obj, dict):
        return {k: to_float32(v) for k, v in obj.items()}
    return obj


def float32_under_autocast(fn: F) -> F:
    """Decorator: when autocast is on for the arguments' device (and none is float64), call
    ``fn`` with autocast off and its bfloat16 / float16 tensor arguments cast to float32."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        dev = autocast_device(args, kwargs)
        if dev is None:
            return fn(*args, **kwargs)
        with torch.autocast(dev, enabled=False):
            return fn(*to_float32(args), **to_float32(kwargs))

    return wrapper  # type: ignore[return-value]


def backward_without_autocast(fn: F) -> F:
    """Decorator for the ``backward`` of an autograd Function whose forward ran with autocast
    off (:func:`float32_under_autocast`): run it with autocast off too, on the device types of
    its incoming gradients. A backward called inside an autocast region (``loss.backward()``
    within ``with torch.autocast(...)``) would otherwise have its matmuls cast down while the
    saved tensors are float32, and fail on the mixed dtypes."""

    @functools.wraps(fn)
    def wrapper(ctx, *grads):
        kinds = {g.device.type for g in grads if isinstance(g, torch.Tensor)}
        on = [k for k in kinds if torch.is_autocast_enabled(k)]
        if not on:
            return fn(ctx, *grads)
        with contextlib.ExitStack() as stack:
            for kind in on:
                stack.enter_context(torch.autocast(kind, enabled=False))
            return fn(ctx, *grads)

    return wrapper  # type: ignore[return-value]


def run_rnn(rnn: torch.nn.Module, x: Any, *args: Any):
    """``rnn(x, *args)`` for a ``torch.nn.LSTM`` / ``GRU``; under CPU autocast it runs in float32
    with autocast off (oneDNN's bfloat16 RNN kernels are missing on CPUs without native
    bfloat16). On CUDA cuDNN's kernels take the autocast dtype as usual."""
    if autocast_device(x, args) == "cpu":
        with torch.autocast("cpu", enabled=False):
            return rnn(to_float32(x), *to_float32(args))
    return rnn(x, *args)
