"""Save and load any registered model in one line, with no pickle execution.

``model.save_pretrained(dir)`` writes ``config.json`` (the registered model name and the
constructor arguments, captured when the model was built) and ``model.safetensors`` (the
weights); ``Model.from_pretrained(dir)`` or :func:`load_pretrained` rebuilds the model from the
JSON and loads the weights with safetensors, so loading never executes code from the file.

Layering: this module sits above :mod:`memnets.registry` (it imports the registry to find a
model class by name); the registry only refers back from the ``save_pretrained`` /
``from_pretrained`` methods it gives registered classes, which import this module when called.
Files are written with :func:`memnets.train.checkpoint.atomic_save`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .registry import get_model_class
from .train.checkpoint import atomic_save, atomic_write_text

__all__ = ["save_pretrained", "load_pretrained", "model_config", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_FORMAT = "memnets.pretrained/1"


def _jsonable(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    raise TypeError(
        f"save_pretrained: constructor argument `{path}` of type {type(value).__name__} "
        "cannot be stored as JSON; build the model from plain values (numbers, strings, lists)"
    )


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__dtype__"}:
            return getattr(torch, value["__dtype__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def model_config(model: torch.nn.Module) -> dict[str, Any]:
    """``{"model": registered name, "kwargs": constructor arguments}`` of a registered model."""
    cfg = getattr(model, "_memnets_config", None)
    if cfg is None:
        raise TypeError(
            f"{type(model).__name__} was not built through a class registered with "
            "memnets.registry.register_model, so its constructor arguments are unknown"
        )
    name, kwargs = cfg
    return {"format": _FORMAT, "model": name, "kwargs": _jsonable(kwargs, "kwargs")}


def save_pretrained(model: torch.nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for ``model`` into ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model_config(model)
    # safetensors refuses shared storage; clone to contiguous, independent tensors.
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    atomic_save(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": _FORMAT}))
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True))
    return directory


def load_pretrained(directory: str | os.PathLike, *, map_location: str | torch.device = "cpu",
                    expected: type | None = None) -> torch.nn.Module:
    """Rebuild the model saved in ``directory`` and load its weights (strict)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: expected a file written by save_pretrained")
    try:
        config = json.loads(cfg_path.read_text())
        name, kwargs = config["model"], _from_json(config["kwargs"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg_path}: not a memnets pretrained config ({e})") from None
    cls = get_model_class(name)
    if expected is not None and not issubclass(cls, expected):
        raise ValueError(f"{cfg_path}: holds a {cls.__name__!r} model, not {expected.__name__!r}")
    model = cls(**kwargs)
    try:
        state = load_file(str(w_path), device=str(map_location))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"{w_path}: corrupt or truncated safetensors file ({e})") from None
    model.load_state_dict(state, strict=True)
    return model
