"""Pieces the task families share: the unknown-option check of ``validate``, the sum of an
evaluation's counts over the DDP processes and the name of the selection-key part that
decided the reported evaluation."""
from __future__ import annotations

import torch

__all__ = ["check_options", "all_reduce_sum", "decided_by_part"]


def check_options(task: str, *groups: tuple[str, dict, dict]) -> None:
    """ConfigError for the first key of ``given`` missing from ``known``, for each ``(where,
    known, given)`` of ``groups`` (``where``: ``"task.options"`` or ``"model.options"``)."""
    from ..config import ConfigError

    for where, known, given in groups:
        for k in given:
            if k not in known:
                raise ConfigError(f"unknown option `{where}.{k}` of the {task!r} task (known: {', '.join(known)})")


def all_reduce_sum(tot: torch.Tensor, info, device) -> torch.Tensor:
    """``tot`` (a CPU tensor of counts) summed over the processes under DDP (``info.enabled``;
    reduced on ``device``), else ``tot`` itself."""
    if info.enabled:
        import torch.distributed as dist

        tot = tot.to(device)
        dist.all_reduce(tot)
        tot = tot.cpu()
    return tot


def decided_by_part(keys: list[tuple], chosen: tuple, parts) -> str:
    """The first of ``parts`` (names of the leading elements of the selection keys) at which
    ``chosen`` alone among ``keys`` has its key prefix; ``"select_ties"`` when none."""
    for i, what in enumerate(parts):
        if sum(k[:i + 1] == chosen[:i + 1] for k in keys) == 1:
            return what
    return "select_ties"
