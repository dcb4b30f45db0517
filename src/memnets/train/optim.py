"""The optimiser of a run, built from :class:`~memnets.train.config.OptimConfig` (docs/maths.md §12).

``optim.kind`` picks it:

* ``"adamw"``: :class:`torch.optim.AdamW`, decoupled weight decay
  (``θ ← θ − lr·wd·θ`` beside the Adam step; the library's default, the CPU presets).
* ``"adam"``: :class:`torch.optim.Adam` with ``weight_decay`` as an L2 penalty (``wd·θ`` is
  added to the gradient before the moment estimates), as in the authors' code
  (``torch.optim.Adam(..., weight_decay=5e-5)``); the ``paper/*`` presets use it.
* ``"sgd"``: plain :class:`torch.optim.SGD` (no momentum; ``weight_decay`` as an L2 penalty,
  ``betas`` unused), as End-to-End Memory Networks were trained (the ``babi/*`` presets).
"""
from __future__ import annotations

from typing import Iterable

import torch

from .config import OptimConfig

__all__ = ["OPTIMIZERS", "make_optimizer"]

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam,
                                                       "sgd": torch.optim.SGD}


def make_optimizer(optim_cfg: OptimConfig, params: Iterable) -> torch.optim.Optimizer:
    """``optim_cfg.kind``'s optimiser over ``params`` with its ``lr``, ``betas`` and ``weight_decay``.

    Example::

        opt = make_optimizer(cfg.optim, model.parameters())
    """
    kind = getattr(optim_cfg, "kind", "adamw")
    if kind not in OPTIMIZERS:
        raise ValueError(f"`optim.kind` expected one of {sorted(OPTIMIZERS)}, got {kind!r}")
    if kind == "sgd":
        return torch.optim.SGD(params, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay)
    return OPTIMIZERS[kind](params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                            weight_decay=optim_cfg.weight_decay)
