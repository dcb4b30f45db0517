"""Training engine: typed run configs and presets, the loop, atomic checkpoints, DDP (docs/maths.md §12).

``train(load_config("reduce-nam_tm"))`` trains a preset into ``runs/<name>/``; see
:mod:`memnets.train.loop` for the files a run writes.
"""
from __future__ import annotations

from .config import (ConfigError, ModelConfig, OptimConfig, RunConfig, ScheduleConfig, TaskConfig,
                     apply_overrides, config_from_dict, config_to_dict, list_presets, load_config)
from .loop import RunExistsError, build_model, evaluate, lr_factor, train

__all__ = ["ConfigError", "ModelConfig", "OptimConfig", "RunConfig", "ScheduleConfig", "TaskConfig",
           "apply_overrides", "config_from_dict", "config_to_dict", "list_presets", "load_config",
           "RunExistsError", "build_model", "evaluate", "lr_factor", "train"]
