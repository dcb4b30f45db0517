"""Build any memnets model by name: ``build_model("lsam", input_size=..., ...)``.

Modules register themselves with :func:`register_model`; the registry imports the
modules that define models lazily, so ``available_models()`` lists everything shipped.

The registry is a bottom layer: at import it needs only torch. :mod:`memnets.pretrained`
builds on it; the ``save_pretrained`` / ``from_pretrained`` methods given to registered
classes import :mod:`memnets.pretrained` only when called.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
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
    "memnets.models.transformer",
    "memnets.models.lstm_baseline",
    "memnets.models.lsam_seq2seq",
    "memnets.models.conv4",
    "memnets.models.seq",
)
_loaded = False


def register_model(name: str) -> Callable:
    """Class/function decorator: ``@register_model("lsam")``."""

    def deco(obj: Callable) -> Callable:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not obj:
            raise ValueError(f"model name {name!r} is already registered to {_REGISTRY[key]!r}")
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module):
            _capture_config(obj, key)
        _REGISTRY[key] = obj
        return obj

    return deco


def _capture_config(cls: type, key: str) -> None:
    """Record the constructor arguments of ``cls`` instances (for ``save_pretrained``) and
    give the class ``save_pretrained`` / ``from_pretrained`` unless it defines its own."""
    init = cls.__init__
    sig = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self) is cls:
            bound = sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            arguments.pop(next(iter(sig.parameters)))  # self
            for pname, param in sig.parameters.items():  # flatten **kwargs
                if param.kind is inspect.Parameter.VAR_KEYWORD and pname in arguments:
                    arguments.update(arguments.pop(pname))
            object.__setattr__(self, "_memnets_config", (key, arguments))

    cls.__init__ = __init__
    if "save_pretrained" not in cls.__dict__:
        def save_pretrained(self, directory):
            """Write ``config.json`` + ``model.safetensors`` (see :mod:`memnets.pretrained`)."""
            from .pretrained import save_pretrained as _save
            return _save(self, directory)
        cls.save_pretrained = save_pretrained
    if "from_pretrained" not in cls.__dict__:
        def from_pretrained(klass, directory, map_location="cpu"):
            """Load a model saved by ``save_pretrained`` (safetensors, no pickle)."""
            from .pretrained import load_pretrained
            return load_pretrained(directory, map_location=map_location, expected=klass)
        cls.from_pretrained = classmethod(from_pretrained)


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
    """Sorted names of every registered model (importing the model modules first)."""
    _load_all()
    return sorted(_REGISTRY)


def get_model_class(name: str) -> Callable[..., torch.nn.Module]:
    """The class registered as ``name`` (case-insensitive); ValueError with suggestions if unknown."""
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
