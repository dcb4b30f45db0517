"""TorchScript compilation of the hand-written loops, tried once per process.

The recurrences with a hand-derived backward (LSAM, the NAM-TM heads, the GRU) run their
per-step loops as TorchScript where it compiles, else as the same Python functions.
"""
from __future__ import annotations

import threading
import warnings
from typing import Callable, Dict, Tuple

import torch

__all__ = ["script_once"]

_CACHE: Dict[Tuple[Callable, ...], tuple] = {}
_LOCK = threading.Lock()


def script_once(*fns: Callable) -> tuple:
    """``(*compiled, True)``: the functions compiled by ``torch.jit.script`` (once per process
    for this tuple of functions), or ``(*fns, False)`` where that fails (no TorchScript, or no
    source files to read)."""
    with _LOCK:
        if fns not in _CACHE:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TorchScript's deprecation notice
                    _CACHE[fns] = (*(torch.jit.script(f) for f in fns), True)
            except Exception:  # plain Python: the same results
                _CACHE[fns] = (*fns, False)
        return _CACHE[fns]
