"""Typed run configuration: frozen dataclasses, TOML presets and dotted overrides (SPEC §12).

A run is described by :class:`RunConfig` (model, task, optimiser, schedule, loop settings).
Presets are TOML files shipped in ``memnets/configs/`` (``memnets configs ls``); a preset
or any TOML file is loaded with :func:`load_config`, then changed with dotted overrides such
as ``optim.lr=3e-4`` or ``model.options.num_heads=2``. Values are parsed as TOML literals
(``3e-4``, ``true``, ``[5, 10]``, ``"x"``; a bare word is taken as a string) and checked
against the field's type; an unknown key is rejected with the closest known key.

Defaults are the authors' training settings (SPEC §12) except the optimiser: AdamW (the
authors used Adam with L2 weight decay, ``optim.kind = "adam"``, as the ``paper/*`` presets do),
lr 1e-4, weight decay 5e-5,
lr × 0.98 per epoch, gradient clip 0.5, batch 128, 25,600 fresh samples per epoch, model
selection by the best OD-easy sequence accuracy (ties: ID accuracy, then validation loss).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ModelConfig", "TaskConfig", "OptimConfig", "ScheduleConfig", "RunConfig", "ConfigError",
    "load_config", "apply_overrides", "config_to_dict", "config_from_dict", "list_presets",
    "preset_path", "flatten",
]


class ConfigError(ValueError):
    """A bad config file, preset name, key or value (the message names it)."""


@dataclass(frozen=True)
class ModelConfig:
    """The task model: :class:`memnets.models.seq.SequenceTaskModel` ``(backbone, d_model, **options)``."""

    backbone: str = "transformer"
    d_model: int = 64
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskConfig:
    """Masked-completion task (:mod:`memnets.tasks.nsp`) and its splits (digit ranges, inclusive)."""

    name: str = "reduce"
    train_digits: tuple[int, int] = (1, 10)
    train_size: int = 25600
    eval_size: int = 2048
    splits: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"id": (5, 10), "od_easy": (11, 13), "od_hard": (14, 16)})
    fresh_each_epoch: bool = True


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser settings; ``grad_clip`` is a global-norm bound (0 disables).

    ``kind``: ``adamw`` (:class:`torch.optim.AdamW`, decoupled weight decay) or ``adam``
    (:class:`torch.optim.Adam`, ``weight_decay`` as an L2 penalty added to the gradient, as the
    authors trained); built by :func:`memnets.train.optim.make_optimizer`.

    ``nan_policy``: what a non-finite loss or gradient does to a training step: ``raise``
    (stop with :class:`~memnets.train.nan_guard.NonFiniteError` naming the step and the
    tensor; the last checkpoint stays) or ``skip`` (drop that update and go on).
    """

    kind: str = "adamw"
    lr: float = 1e-4
    weight_decay: float = 5e-5
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 0.5
    nan_policy: str = "raise"


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule: ``exp`` (lr × gamma^epoch), ``constant`` or ``cosine`` (over all steps),
    after ``warmup_steps`` of linear warm-up."""

    kind: str = "exp"
    gamma: float = 0.98
    warmup_steps: int = 0


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; ``memnets train`` resolves and saves it as ``config.json``.

    ``batch_size`` is the global batch (split across DDP processes). ``checkpoint_every``:
    also checkpoint every that many optimiser steps (0: at epoch ends only). ``log_every``:
    steps between training records in ``metrics.jsonl``. ``select_split``: the split whose
    sequence accuracy picks the reported epoch; evaluations tied on it (all zeros included) are
    ranked by the ID sequence accuracy, then by the lower ``select_split`` loss
    (:func:`memnets.train.loop.selection_key`); ``select_ties``: which of several evaluations
    equal in all three is reported, the ``first`` or the ``last`` (the most trained model).
    ``amp``: ``auto`` (bf16 autocast on CUDA
    only), ``bf16`` or ``none``. ``threads``: torch intra-op threads (0: torch's default).
    ``time_limit_min``: stop at the first epoch end past this wall time (0: no limit; a run
    stopped this way is not reproducible step for step).
    """

    name: str = "run"
    description: str = ""
    seed: int = 0
    epochs: int = 100
    batch_size: int = 128
    select_split: str = "od_easy"
    select_ties: str = "first"
    eval_every: int = 1
    checkpoint_every: int = 0
    log_every: int = 20
    device: str = "auto"
    amp: str = "auto"
    threads: int = 0
    tensorboard: bool = False
    time_limit_min: float = 0.0
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        _validate(self)


_CHOICES = {
    ("schedule", "kind"): ("exp", "constant", "cosine"),
    ("amp",): ("auto", "bf16", "none"),
    ("select_ties",): ("first", "last"),
    ("task", "name"): ("fib", "addition", "palindrome", "reduce"),
    ("optim", "nan_policy"): ("raise", "skip"),
    ("optim", "kind"): ("adamw", "adam"),
}

_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")


def _validate(cfg: RunConfig) -> None:
    for path, choices in _CHOICES.items():
        obj: Any = cfg
        for p in path:
            obj = getattr(obj, p)
        if obj not in choices:
            raise ConfigError(f"`{'.'.join(path)}` expected one of {list(choices)}, got {obj!r}")
    if not _DEVICE.fullmatch(cfg.device):
        raise ConfigError(f"`device` expected auto, cpu, cuda, cuda:N or mps, got {cfg.device!r}")
    for key in ("epochs", "batch_size", "eval_every", "log_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"`{key}` expected an integer >= 1, got {getattr(cfg, key)}")
    lo, hi = cfg.task.train_digits
    if not 1 <= lo <= hi:
        raise ConfigError(f"`task.train_digits` expected [lo, hi] with 1 <= lo <= hi, got {[lo, hi]}")
    for name, (lo, hi) in cfg.task.splits.items():
        if not 1 <= lo <= hi:
            raise ConfigError(f"`task.splits.{name}` expected [lo, hi] with 1 <= lo <= hi, got {[lo, hi]}")
    if cfg.select_split not in cfg.task.splits:
        raise ConfigError(f"`select_split` expected one of {sorted(cfg.task.splits)}, got {cfg.select_split!r}")
    if cfg.task.train_size < cfg.batch_size:
        raise ConfigError(f"`task.train_size` ({cfg.task.train_size}) must be >= `batch_size` ({cfg.batch_size})")


# ----------------------------------------------------------------------------- conversion

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert a plain (TOML/JSON) ``value`` to type ``tp``; raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` expected a table, got {value!r}")
        return _build(tp, value, key + ".")
    if tp is Any:
        return _plain_value(key, value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{key}` expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` expected a number, got {value!r}")
        try:
            f = float(value)
        except OverflowError:
            f = math.inf
        if not math.isfinite(f):
            raise ConfigError(f"`{key}` expected a finite number, got {value!r}")
        return f
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` expected a string, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"`{key}` expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        _, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` expected a table, got {value!r}")
        return {k: _coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    raise ConfigError(f"`{key}`: unsupported type {tp}")  # pragma: no cover


def _plain_value(key: str, v: Any) -> Any:
    """A free-form value (``model.options``): numbers, strings, booleans, lists, tables only."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"`{key}` expected a finite number, got {v!r}")
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_plain_value(f"{key}[{i}]", x) for i, x in enumerate(v))
    if isinstance(v, dict):
        return {k: _plain_value(f"{key}.{k}", x) for k, x in v.items()}
    raise ConfigError(f"`{key}` expected a number, string, boolean, list or table, got {type(v).__name__} {v!r}")


def _unknown(key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean `{close[0]}`?" if close else ""
    return ConfigError(f"unknown config key `{key}`{hint}")


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    hints = _hints(cls)
    kwargs = {}
    for k, v in data.items():
        if k not in hints:
            raise _unknown(prefix + k, [prefix + h for h in hints] + flatten_keys(cls, prefix))
        kwargs[k] = _coerce(prefix + k, v, hints[k])
    return cls(**kwargs)


def flatten_keys(cls: type, prefix: str = "") -> list[str]:
    """All dotted keys of dataclass ``cls`` (for suggestions)."""
    out = []
    for k, tp in _hints(cls).items():
        out.append(prefix + k)
        if dataclasses.is_dataclass(tp):
            out += flatten_keys(tp, prefix + k + ".")
    return out


def config_from_dict(data: dict) -> RunConfig:
    """A :class:`RunConfig` from nested plain data (a parsed TOML file or ``config.json``)."""
    return _build(RunConfig, data)


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    return x


def config_to_dict(cfg: RunConfig) -> dict:
    """Nested plain data (JSON/TOML-ready) of ``cfg``; ``config_from_dict`` inverts it."""
    return _plain(cfg)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


# ----------------------------------------------------------------------------- presets

def _preset_root():
    return resources.files("memnets") / "configs"


def list_presets() -> list[str]:
    """Names of the shipped presets (``configs/<name>.toml``, sub-folders joined with ``/``;
    ``configs/suites/`` holds suites of runs, not presets)."""
    root = Path(str(_preset_root()))
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.toml")
                  if p.relative_to(root).parts[0] != "suites")


def preset_path(name: str) -> Path:
    """The file of preset ``name``; ConfigError with a suggestion when there is none."""
    p = Path(str(_preset_root())) / f"{name}.toml"
    if not p.is_file():
        names = list_presets()
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"no preset or file named {name!r}{hint} (see `memnets configs ls`)")
    return p


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``key=value`` strings (dotted keys) to ``cfg``; type-checked, unknown keys rejected."""
    data = config_to_dict(cfg)
    known = flatten_keys(RunConfig)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} expected the form key=value (e.g. optim.lr=3e-4)")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        node, cls = data, RunConfig
        for i, p in enumerate(parts[:-1]):
            hints = _hints(cls) if cls is not None else {}
            if cls is not None and p not in hints:
                raise _unknown(key, known)
            tp = hints.get(p) if cls is not None else None
            if cls is not None and not (dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict):
                raise _unknown(key, known)
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"`{key}`: `{'.'.join(parts[:i + 1])}` was set to {child!r} by an earlier "
                                  "override, not a table")
            node = child
            cls = tp if dataclasses.is_dataclass(tp) else None
        if cls is not None and parts[-1] not in _hints(cls):
            raise _unknown(key, known)
        node[parts[-1]] = _parse_value(raw.strip())
    return config_from_dict(data)


def load_config(source: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset name or a TOML file path, then apply ``overrides``.

    A file's ``name`` defaults to the preset name / file stem.
    """
    path = Path(source)
    if not (path.suffix == ".toml" and path.is_file()):
        path = preset_path(str(source))
        default_name = str(source).replace("/", "-")
    else:
        default_name = path.stem
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    data.setdefault("name", default_name)
    return apply_overrides(config_from_dict(data), list(overrides or []))
