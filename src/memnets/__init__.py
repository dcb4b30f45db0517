"""memnets: differentiable neural memories in PyTorch.

NAM (LSAM, NAM Turing Machine, NAM few-shot, NAM attention), NTM, DNC, End-to-End Memory
Networks and fast-weight / delta-rule linear attention, sharing one state API:
``init_state``, ``step``, ``forward(x, state=None) -> (y, state)`` with NamedTuple states.

Public classes are imported lazily, so ``import memnets`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    # NAM family (docs/maths.md §2-§5)
    "LSAM": "memnets.memories.lsam",
    "LSAMCell": "memnets.memories.lsam",
    "NAMTuringMachine": "memnets.memories.nam_tm",
    "NAMFewShotClassifier": "memnets.memories.fewshot",
    "CosineClassifier": "memnets.memories.fewshot",
    # attention family and baselines (docs/maths.md §5, §6, §10)
    "TransformerEncoder": "memnets.models.transformer",
    "UniversalTransformer": "memnets.models.transformer",
    "LSTMAttentionBaseline": "memnets.models.lstm_baseline",
    # classic memory-augmented networks (docs/maths.md §7-§9)
    "NTM": "memnets.memories.ntm",
    "DNC": "memnets.memories.dnc",
    "MemN2N": "memnets.memories.memn2n",
    # registry and state helpers
    "build_model": "memnets.registry",
    "available_models": "memnets.registry",
    "count_parameters": "memnets.registry",
    "register_model": "memnets.registry",
    "detach_state": "memnets.state",
    "map_state": "memnets.state",
    # a trained run of `memnets train`, any task family: model, config, results
    "load_run": "memnets.train.runs",
}
_SUBMODULES = {"ops", "attention", "memories", "models", "tasks", "train", "bench", "viz", "registry", "state", "pretrained", "capacity", "datadir"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        mod = importlib.import_module(f"memnets.{name}")
        globals()[name] = mod
        return mod
    raise AttributeError(f"module 'memnets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__ + ["__version__"]
