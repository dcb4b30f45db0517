"""Training engine: typed run configs and presets, the loop, atomic checkpoints, DDP (docs/maths.md §12).

``train(load_config("reduce-nam_tm"))`` trains a preset into ``runs/<name>/``; see
:mod:`memnets.train.loop` for the files a run writes (:class:`Trainer`: the engine, in
phases), :mod:`memnets.train.task` for the task interface (:class:`Task`, :func:`get_task`,
:func:`register_task`) and :mod:`memnets.train.runs` for reading a run back (:func:`load_run`).

The names below are imported on first use, so ``import memnets.train.checkpoint`` (the atomic
writer) does not import the training loop, the tasks or the models.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ConfigError": "config", "ModelConfig": "config", "OptimConfig": "config", "RunConfig": "config",
    "ScheduleConfig": "config", "TaskConfig": "config", "apply_overrides": "config",
    "config_from_dict": "config", "config_to_dict": "config", "list_presets": "config", "load_config": "config",
    "RunExistsError": "loop", "Trainer": "loop", "build_model": "loop", "evaluate": "loop", "lr_factor": "loop",
    "train": "loop", "Task": "task", "get_task": "task", "register_task": "task", "Run": "runs", "load_run": "runs",
}

__all__ = ["ConfigError", "ModelConfig", "OptimConfig", "RunConfig", "ScheduleConfig", "TaskConfig",
           "apply_overrides", "config_from_dict", "config_to_dict", "list_presets", "load_config",
           "RunExistsError", "Trainer", "build_model", "evaluate", "lr_factor", "train", "Task", "get_task",
           "register_task", "Run", "load_run"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # a submodule not imported yet (memnets.train.loop, ...)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
