"""The optimiser of a run, built from :class:`~memnets.train.config.OptimConfig` (docs/maths.md §12).

``optim.kind`` picks it:

* ``"adamw"``: :class:`torch.optim.AdamW`, decoupled weight decay
  (``θ ← θ − lr·wd·θ`` beside the Adam step; the library's default, the CPU presets).
* ``"adam"``: :class:`torch.optim.Adam` with ``weight_decay`` as an L2 penalty (``wd·θ`` is
  added to the gradient before the moment estimates), as in the authors' code
  (``torch.optim.Adam(..., weight_decay=5e-5)``); the ``paper/*`` presets use it.
* ``"sgd"``: plain :class:`torch.optim.SGD` (no momentum; ``weight_decay`` as an L2 penalty,
  ``betas`` unused), as End-to-End Memory Networks were trained (the ``babi/*`` presets).

When every parameter is a floating-point CUDA tensor, Adam and AdamW run PyTorch's fused
kernels (``fused=True``: one launch or a few per step, where the default ``foreach`` form issues
a dozen or more, 40 for the NAM-TM); the update is the same up to rounding. On the CPU nothing
changes.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .config import OptimConfig

__all__ = ["OPTIMIZERS", "make_optimizer", "fusable"]

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam,
                                                       "sgd": torch.optim.SGD}


def make_optimizer(optim_cfg: OptimConfig, params: Iterable, fused: bool | None = None) -> torch.optim.Optimizer:
    """``optim_cfg.kind``'s optimiser over ``params`` with its ``lr``, ``betas`` and ``weight_decay``.

    ``fused``: None (default) fuses Adam/AdamW where :func:`fusable` says; True fuses them on any
    device PyTorch has the kernel for (the CPU too; a step dropped on the device,
    :class:`~memnets.train.step_guard.DeviceGuard`, needs it); SGD is never fused here.

    Example::

        opt = make_optimizer(cfg.optim, model.parameters())
    """
    kind = getattr(optim_cfg, "kind", "adamw")
    if kind not in OPTIMIZERS:
        raise ValueError(f"`optim.kind` expected one of {sorted(OPTIMIZERS)}, got {kind!r}")
    params = list(params)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay)
    extra = {"fused": True} if (fusable(params) if fused is None else fused) else {}
    return OPTIMIZERS[kind](params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                            weight_decay=optim_cfg.weight_decay, **extra)


def fusable(params: Iterable) -> bool:
    """Whether Adam/AdamW over ``params`` (tensors, or param-group dicts) run fused: every
    parameter a floating-point CUDA tensor, and at least one."""
    flat = []
    for p in params:
        flat.extend(p["params"] if isinstance(p, dict) else [p])
    return bool(flat) and all(isinstance(p, torch.Tensor) and p.is_cuda and p.is_floating_point() for p in flat)
