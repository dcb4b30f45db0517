"""Reusable buffers for the hand-written recurrences.

At the small sizes these memories usually run at, allocating a fresh ``[T, ...]`` buffer on
every call costs more than filling it: large allocations come straight from the operating
system, and every page is faulted in again on first write. A :class:`WorkspacePool` keeps a
few buffers per key (shape, dtype, device, ...) and hands them out again. A buffer handed to
an autograd node is held by a :class:`Lease` until the node's backward has run or the graph
is freed, so no two live graphs ever share one.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch

__all__ = ["WorkspacePool", "Lease"]


class WorkspacePool:
    """A bounded pool of workspaces (any objects with an ``nbytes`` size, or tuples of tensors).

    ``keys``: distinct keys kept (least recently used dropped first); ``per_key``: workspaces
    kept per key; ``max_bytes``: larger workspaces are never kept.
    """

    def __init__(self, keys: int = 4, per_key: int = 2, max_bytes: int = 256 * 2 ** 20) -> None:
        self.keys, self.per_key, self.max_bytes = keys, per_key, max_bytes
        self._spaces: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _nbytes(space: Any) -> int:
        if isinstance(space, (tuple, list)):
            return sum(getattr(t, "nbytes", 0) for t in space)
        return int(getattr(space, "nbytes", 0))

    def take(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A pooled workspace for ``key``, else ``make()``: made outside inference mode, so
        that a workspace first made inside ``torch.inference_mode()`` (an evaluation) is an
        ordinary tensor that a later training call can write and save for its backward."""
        with self._lock:
            spaces = self._spaces.get(key)
            if spaces:
                self._spaces.move_to_end(key)
                return spaces.pop()
        with torch.inference_mode(False):
            return make()

    def give(self, key: Hashable, space: Any) -> None:
        """Return ``space`` to the pool (dropped if too large or the pool is full)."""
        if space is None or self._nbytes(space) > self.max_bytes:
            return
        with self._lock:
            spaces = self._spaces.setdefault(key, [])
            self._spaces.move_to_end(key)
            if len(spaces) < self.per_key:
                spaces.append(space)
            while len(self._spaces) > self.keys:
                self._spaces.popitem(last=False)

    def clear(self) -> None:
        """Drop every pooled workspace."""
        with self._lock:
            self._spaces.clear()

    def lease(self, key: Hashable, make: Callable[[], Any]) -> "Lease":
        """A workspace held by the returned :class:`Lease` until it is released or freed."""
        return Lease(self, key, self.take(key, make))


class Lease:
    """Holds one workspace of a pool; gives it back on :meth:`release` or when freed."""

    __slots__ = ("pool", "key", "space")

    def __init__(self, pool: WorkspacePool, key: Hashable, space: Any) -> None:
        self.pool, self.key, self.space = pool, key, space

    def release(self) -> None:
        space, self.space = self.space, None
        if space is not None:
            self.pool.give(self.key, space)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
