"""Build any memnets model by name: ``build_model("lsam", input_size=..., ...)``.

Modules register themselves with :func:`register_model`; the registry imports the
modules that define models lazily, so ``available_models()`` lists everything shipped.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable

import torch

__all__ = ["register_model", "build_model", "available_models", "count_parameters", "get_model_class"]

_REGISTRY: dict[str, Callable[..., torch.nn.Module]] = {}

# Modules whose import registers models; missing ones are skipped (optional families).
_MODEL_MODULES = (
    "memnets.memories.lsam",
    "memnets.memories.nam_tm",
    "memnets.memories.fewshot",
    "memnets.memories.ntm",
    "memnets.memories.dnc",
    "memnets.memories.memn2n",
    "memnets.memories.fast_weights",
    "memnets.attention",
    "memnets.models",
)
_loaded = False


def register_model(name: str) -> Callable:
    """Class/function decorator: ``@register_model("lsam")``."""

    def deco(obj: Callable) -> Callable:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not obj:
            raise ValueError(f"model name {name!r} is already registered to {_REGISTRY[key]!r}")
        _REGISTRY[key] = obj
        return obj

    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in _MODEL_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # an optional family not present
            if e.name is None or not mod.startswith(e.name):
                raise
    _loaded = True


def available_models() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_model_class(name: str) -> Callable[..., torch.nn.Module]:
    _load_all()
    key = name.lower()
    if key not in _REGISTRY:
        close = difflib.get_close_matches(key, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} (available: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[key]


def build_model(name: str, **kwargs: Any) -> torch.nn.Module:
    """Instantiate the model registered as ``name`` with keyword arguments."""
    return get_model_class(name)(**kwargs)


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
