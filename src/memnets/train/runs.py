"""Load a finished (or interrupted) ``memnets train`` run back into Python, for every task family.

    import memnets
    run = memnets.load_run("runs/ntm-copy")      # best weights; checkpoint="last" for the last
    run.model, run.config, run.results, run.task  # nn.Module (eval mode), RunConfig, dict, Task
    run.evaluate()                                # {split: metrics} of the loaded weights

The model is rebuilt from ``config.json`` by the run's task (:mod:`memnets.train.task`) and
gets ``checkpoints/best.safetensors`` (the reported evaluation) or the weights named by
``checkpoints/last.json``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

__all__ = ["Run", "RunError", "load_run", "read_config", "weights_path"]


class RunError(ValueError):
    """A directory that is not a readable run (the message says why)."""


@dataclass
class Run:
    """A run loaded by :func:`load_run`: ``model`` (weights loaded, eval mode), ``config``
    (:class:`~memnets.train.config.RunConfig`), ``results`` (``results.json``; None for a run
    that has not finished), ``task`` (:class:`~memnets.train.task.Task`), ``run_dir``, ``checkpoint``
    (the weights file loaded)."""

    run_dir: Path
    model: torch.nn.Module
    config: Any
    results: dict | None
    task: Any
    checkpoint: Path

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def family(self) -> str:
        return self.task.family

    def evaluate(self, eval_size: int | None = None, device: str | torch.device = "cpu") -> dict[str, dict]:
        """``{split: metrics}`` of the loaded model on the task's evaluation splits (``eval_size``
        samples each; default the run's)."""
        from .env import DistInfo

        cfg = self.config
        if eval_size:
            cfg = replace(cfg, task=replace(cfg.task, eval_size=eval_size))
        model = self.model.to(device)
        return {name: self.task.evaluate(model, data, cfg, device=torch.device(device), info=DistInfo())
                for name, data in self.task.eval_splits(cfg).items()}


def read_config(run_dir: str | Path):
    """The RunConfig of ``run_dir/config.json``; RunError naming the file if missing or malformed."""
    from .config import ConfigError, config_from_dict

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise RunError(f"{run_dir} is not a run directory (no config.json)")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object, got {type(data).__name__}")
        return config_from_dict(data)
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError and ConfigError are ValueErrors
        raise RunError(f"{path} is malformed: {e}") from e


def weights_path(run_dir: str | Path, checkpoint: str = "best") -> Path:
    """``checkpoints/best.safetensors`` (``"best"``) or the weights ``last.json`` names (``"last"``);
    RunError when the file is missing."""
    ck = Path(run_dir) / "checkpoints"
    if checkpoint not in ("best", "last"):
        raise RunError(f"`checkpoint` expected 'best' or 'last', got {checkpoint!r}")
    if checkpoint == "best":
        path = ck / "best.safetensors"
    else:
        ptr = ck / "last.json"
        try:
            path = ck / str(json.loads(ptr.read_text())["weights"]) if ptr.is_file() else ck / "missing"
        except (ValueError, KeyError, TypeError) as e:
            raise RunError(f"{ptr} is corrupt ({type(e).__name__}: {e})") from e
    if not path.is_file():
        raise RunError(f"{run_dir} has no {checkpoint} checkpoint ({path})")
    return path


def load_run(path: str | Path, checkpoint: str = "best") -> Run:
    """The trained model, config and results of the run in ``path`` (any task family).

    Raises :class:`RunError` for a directory without ``config.json``, a malformed config, a
    missing checkpoint or weights that do not fit the model, and
    :class:`~memnets.train.checkpoint.CorruptCheckpointError` for an unreadable weights file.
    """
    from .checkpoint import load_weights
    from .task import get_task

    run_dir = Path(path)
    cfg = read_config(run_dir)
    task = get_task(cfg.task.name)
    wpath = weights_path(run_dir, checkpoint)
    torch.manual_seed(cfg.seed)
    try:
        model = task.build_model(cfg)
    except (TypeError, ValueError) as e:
        raise RunError(f"{run_dir / 'config.json'}: the model cannot be built from it ({e})") from e
    try:
        load_weights(wpath, model)  # a corrupt file: CorruptCheckpointError (a ValueError) naming it
    except RuntimeError as e:  # weights of another shape
        raise RunError(f"{wpath} does not fit the model described by {run_dir / 'config.json'}: "
                       f"{str(e).strip().splitlines()[0]}") from e
    task.before_test(model)  # the reported model's final form (e.g. MemN2N with its softmax)
    res_file = run_dir / "results.json"
    try:
        results = json.loads(res_file.read_text()) if res_file.is_file() else None
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {res_file}: {e}") from e
    return Run(run_dir, model.eval(), cfg, results, task, wpath)
