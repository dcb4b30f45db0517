"""Deterministic data streams for a run: seeds, batch order and the task's data by epoch.

Everything is a pure function of the config and the epoch number, so a resumed run (or
another process of a distributed run) regenerates exactly the same samples in the same order
without saving any data. Evaluation splits do not depend on the run seed, so every model in
one table is scored on the same samples (docs/maths.md §10). The data themselves come from
the run's task (:mod:`memnets.train.task`); :func:`train_epoch_data` and :func:`eval_splits`
ask it.
"""
from __future__ import annotations

import zlib
from typing import Any

import torch

from .config import RunConfig

__all__ = ["derive_seed", "train_epoch_data", "epoch_order", "eval_splits", "batch_indices"]


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from any printable parts (stable across processes and Python versions)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def epoch_order(cfg: RunConfig, epoch: int) -> torch.Tensor:
    """A permutation ``[train_size]`` of the epoch's samples."""
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "order", epoch))
    return torch.randperm(cfg.task.train_size, generator=g)


def batch_indices(order: torch.Tensor, batch: int, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """Sample indices of global batch ``batch`` that process ``rank`` of ``world`` handles."""
    return order[batch * batch_size:(batch + 1) * batch_size][rank::world]


def train_epoch_data(cfg: RunConfig, epoch: int) -> Any:
    """The training samples of ``epoch`` of ``cfg``'s task (an ``NSPBatch`` of ``task.train_size``
    samples for the algorithmic tasks; :meth:`memnets.train.task.Task.train_data` otherwise)."""
    from .task import get_task

    task = get_task(cfg.task.name)
    if task.family == "nsp":
        from .families.nsp import train_epoch_data as nsp_data

        return nsp_data(cfg, epoch)
    return task.train_data(cfg, epoch)


def eval_splits(cfg: RunConfig) -> dict[str, Any]:
    """Every evaluation split of ``cfg``'s task (``task.eval_size`` samples each; independent of ``seed``)."""
    from .task import get_task

    return get_task(cfg.task.name).eval_splits(cfg)
