"""Helpers for NamedTuple memory states (nested tuples of tensors).

Every memory in memnets keeps its state as data: a NamedTuple (possibly nested) of tensors
returned by ``forward`` / ``step`` and passed back in. These helpers act on such trees.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["map_state", "detach_state"]


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: Any) -> Any:
    """Apply ``fn`` to every tensor of a (nested) NamedTuple / tuple / list / dict state."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # NamedTuple
        return type(state)(*(map_state(fn, s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_state(fn, v) for k, v in state.items()}
    return state


def detach_state(state: Any) -> Any:
    """Detach every tensor of a state (truncated back-propagation through time)."""
    return map_state(lambda t: t.detach(), state)
