"""Deterministic data streams for a run: training epochs, batch order and evaluation splits.

Everything is a pure function of the config and the epoch number, so a resumed run (or
another process of a distributed run) regenerates exactly the same samples in the same order
without saving any data. Evaluation splits do not depend on the run seed, so every model in
one table is scored on the same samples (docs/maths.md §10).
"""
from __future__ import annotations

import zlib

import torch

from ..tasks.nsp import NSPBatch, make_split, window_width
from .config import RunConfig

__all__ = ["derive_seed", "train_epoch_data", "epoch_order", "eval_splits", "batch_indices"]


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from any printable parts (stable across processes and Python versions)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def train_epoch_data(cfg: RunConfig, epoch: int) -> NSPBatch:
    """The ``task.train_size`` training samples of ``epoch`` (the same set every epoch when
    ``task.fresh_each_epoch`` is false). Window width: ``window_width(task, train_digits[1])``."""
    lo, hi = cfg.task.train_digits
    e = epoch if cfg.task.fresh_each_epoch else 0
    return make_split(cfg.task.name, lo, hi, cfg.task.train_size, derive_seed(cfg.seed, "train", e),
                      window_width(cfg.task.name, hi))


def epoch_order(cfg: RunConfig, epoch: int) -> torch.Tensor:
    """A permutation ``[train_size]`` of the epoch's samples."""
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "order", epoch))
    return torch.randperm(cfg.task.train_size, generator=g)


def batch_indices(order: torch.Tensor, batch: int, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """Sample indices of global batch ``batch`` that process ``rank`` of ``world`` handles."""
    return order[batch * batch_size:(batch + 1) * batch_size][rank::world]


def eval_splits(cfg: RunConfig) -> dict[str, NSPBatch]:
    """Every split of ``task.splits`` with ``task.eval_size`` samples (independent of ``seed``)."""
    return {name: make_split(cfg.task.name, lo, hi, cfg.task.eval_size, derive_seed("eval", cfg.task.name, name))
            for name, (lo, hi) in cfg.task.splits.items()}
