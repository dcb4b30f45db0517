"""Input validation shared by every public entry point.

Errors name the argument, the expected shape (symbolic and resolved) and what was given,
e.g. ``ValueError: `q` expected [B, T, H, dk] = [4, 8, 2, 16], got [4, 8, 16]``.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["check_tensor", "check_shape", "check_prob", "check_positive_int", "check_input_dtype", "shape_str"]


def shape_str(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"


def check_tensor(name: str, x: object) -> torch.Tensor:
    """Raise TypeError unless ``x`` is a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_shape(
    name: str,
    x: object,
    symbols: Sequence[str],
    expected: Sequence[int | None],
) -> torch.Tensor:
    """Check ``x.shape == expected`` (``None`` entries match anything).

    ``symbols`` names each dimension (``["B", "T", "H", "dk"]``) for the message.
    """
    x = check_tensor(name, x)
    ok = x.dim() == len(expected) and all(e is None or e == s for e, s in zip(expected, x.shape))
    if not ok:
        raise ValueError(
            f"`{name}` expected [{', '.join(symbols)}] = {shape_str(expected)}, "
            f"got {shape_str(list(x.shape))}"
        )
    return x


def check_prob(name: str, x: object, *, check_range: bool = False) -> torch.Tensor:
    """Check that ``x`` is a floating tensor; optionally that its values lie in [0, 1]."""
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"`{name}` expected a floating-point tensor, got {x.dtype}")
    if check_range and x.numel() and not torch.jit.is_tracing():
        lo, hi = float(x.min()), float(x.max())
        if not (lo >= 0.0 and hi <= 1.0):
            raise ValueError(f"`{name}` expected values in [0, 1], got range [{lo:.4g}, {hi:.4g}]")
    return x


def check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` expected an integer >= {minimum}, got {value!r}")
    return value


def check_input_dtype(name: str, x: torch.Tensor, param_dtype: torch.dtype) -> None:
    """TypeError unless ``x`` is floating-point with the parameters' dtype ``param_dtype``
    (any floating dtype is accepted under autocast, which casts inside the ops)."""
    if not x.is_floating_point() or (x.dtype != param_dtype and not torch.is_autocast_enabled(x.device.type)):
        raise TypeError(
            f"`{name}` expected dtype {param_dtype} (the parameters' dtype), got {x.dtype} "
            "(convert the model with .to(dtype) or the input)"
        )
