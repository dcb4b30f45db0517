"""Typed run configuration: frozen dataclasses, TOML presets and dotted overrides (docs/maths.md §12).

A run is described by :class:`RunConfig` (model, task, optimiser, schedule, loop settings).
Presets are TOML files shipped in ``memnets/configs/`` (``memnets configs ls``); a preset
or any TOML file is loaded with :func:`load_config`, then changed with dotted overrides such
as ``optim.lr=3e-4`` or ``model.options.num_heads=2``. Values are parsed as TOML literals
(``3e-4``, ``true``, ``[5, 10]``, ``"x"``; a bare word is taken as a string) and checked
against the field's type; an unknown key is rejected with the closest known key.

Defaults are the authors' training settings (docs/maths.md §12) except the optimiser: AdamW (the
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

from ..ops._impl import COMPILE_MODES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ModelConfig", "TaskConfig", "OptimConfig", "ScheduleConfig", "RunConfig", "ConfigError",
    "load_config", "apply_overrides", "config_to_dict", "config_from_dict", "list_presets",
    "preset_path", "flatten", "suggest_key", "to_toml", "config_to_toml", "describe_keys", "keys_markdown",
    "keys_text", "RENAMED_PRESETS",
]


class ConfigError(ValueError):
    """A bad config file, preset name, key or value (the message names it)."""


def _field(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, help: str) -> Any:
    """A dataclass field with a one-line ``help``: its meaning in ``memnets configs keys`` and
    docs/config.md (:func:`describe_keys`)."""
    return field(default=default, default_factory=factory, metadata={"help": help})


@dataclass(frozen=True)
class ModelConfig:
    """The task model: :class:`memnets.models.seq.SequenceTaskModel` ``(backbone, d_model, **options)``."""

    backbone: str = _field("transformer", help="sequence backbone: transformer, universal_transformer, "
                           "lstm_attention, bilstm, lsam_stack, lsam_encdec, nam_tm, nam_tm_nojmp, ntm or dnc "
                           "(memnets.models.seq.BACKBONES; lstm and lsam are former names of bilstm and "
                           "lsam_stack); other task families name their own models")
    d_model: int = _field(64, help="model width: embedding and backbone input/output size")
    options: dict[str, Any] = _field(factory=dict, help="keyword arguments of the backbone, free-form "
                                     "(e.g. model.options.num_heads=2)")


@dataclass(frozen=True)
class TaskConfig:
    """Masked-completion task (:mod:`memnets.tasks.nsp`) and its splits (digit ranges, inclusive)."""

    name: str = _field("reduce", help="task: fib, addition, palindrome or reduce (algorithmic tasks), copy, "
                       "repeat_copy, associative_recall or priority_sort (NTM tasks), listops or text (LRA), babi (MemN2N) ...; "
                       "every task: memnets.train.task.TASKS")
    train_digits: tuple[int, int] = _field((1, 10), help="[lo, hi] digit counts of the training samples (inclusive)")
    train_size: int = _field(25600, help="training samples per epoch (at least batch_size)")
    eval_size: int = _field(2048, help="samples in each evaluation split")
    splits: dict[str, tuple[int, int]] = _field(
        factory=lambda: {"id": (5, 10), "od_easy": (11, 13), "od_hard": (14, 16)},
        help="evaluation splits: name = [lo, hi] digit counts (inclusive)")
    fresh_each_epoch: bool = _field(True, help="draw new training samples every epoch; false: the same "
                                    "train_size samples every epoch (in a new order)")
    options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "settings of the task's family, free-form (e.g. task.options.min_len=1 for the NTM tasks; "
                "docs/tasks.md); empty for the algorithmic tasks", "omit_empty": True})


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser settings; ``grad_clip`` is a global-norm bound (0 disables).

    ``kind``: ``adamw`` (:class:`torch.optim.AdamW`, decoupled weight decay) or ``adam``
    (:class:`torch.optim.Adam`, ``weight_decay`` as an L2 penalty added to the gradient, as the
    authors trained); built by :func:`memnets.train.optim.make_optimizer`.

    ``nan_policy``: what a non-finite loss or gradient does to a training step: ``raise``
    (stop with :class:`~memnets.train.nan_guard.NonFiniteError` naming the step and the
    tensor; the last checkpoint stays) or ``skip`` (drop that update and go on).

    ``spike_skip``: drop an update whose total gradient norm (before clipping) is more than
    ``spike_skip`` times the median of the last steps' norms
    (:class:`~memnets.train.step_guard.SpikeGuard`); 0 turns it off.

    On CUDA with Adam/AdamW both drops are decided on the device, inside a replayed step too
    (:class:`~memnets.train.step_guard.DeviceGuard`: the fused optimiser skips the update), and
    the dropped steps are told at the next record, checkpoint or evaluation.
    """

    kind: str = _field("adamw", help="optimiser: adamw (decoupled weight decay), adam (weight_decay as an "
                       "L2 penalty added to the gradient, as the authors trained) or sgd (plain SGD, as "
                       "MemN2N was trained)")
    lr: float = _field(1e-4, help="learning rate before the schedule's factor")
    weight_decay: float = _field(5e-5, help="weight decay (decoupled for adamw, L2 for adam)")
    betas: tuple[float, float] = _field((0.9, 0.999), help="Adam's [beta1, beta2]")
    grad_clip: float = _field(0.5, help="bound on the global gradient norm (0: no clipping)")
    nan_policy: str = _field("raise", help="a non-finite loss or gradient: raise (stop, naming the step and "
                             "the tensor; the last checkpoint stays; on CUDA found at the next record, "
                             "checkpoint or evaluation, so that no step waits on a read-back) or skip (drop "
                             "that update and go on; on CUDA with Adam/AdamW dropped on the device and said at "
                             "the next record)")
    spike_skip: float = _field(0.0, help="drop an update whose total gradient norm (before clipping) is more than "
                               "this many times the median norm of the last 100 steps, once 20 were taken "
                               "(0: off); the train records count them as spikes_skipped")


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule: ``exp`` (lr × gamma^epoch), ``constant``, ``cosine`` (over all steps)
    or ``rsqrt`` (lr × sqrt(warmup_steps / step) once past the warm-up), after ``warmup_steps``
    of linear warm-up."""

    kind: str = _field("exp", help="learning-rate schedule: exp (lr × gamma^epoch), constant, cosine "
                       "(over all steps) or rsqrt (lr × sqrt(warmup_steps / step) after the warm-up, as LRA)")
    gamma: float = _field(0.98, help="exp: learning-rate factor per epoch")
    warmup_steps: int = _field(0, help="optimiser steps of linear warm-up before the schedule (0: none)")


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
    only), ``bf16`` (bf16 autocast on CUDA and on the CPU) or ``none``. ``threads``: torch intra-op threads (0: torch's default).
    ``compile``: ``torch.compile`` the module the training steps call (``none``: eager).
    ``cuda_graph``: replay each training step from a CUDA graph
    (:class:`memnets.train.graph_step.CUDAGraphStep`; :func:`memnets.train.loop.graph_steps`).
    ``time_limit_min``: stop after the first optimiser step past this wall time, inside an
    epoch if need be, with a checkpoint and an evaluation there (0: no limit; a run stopped
    this way is not reproducible step for step).
    """

    name: str = _field("run", help="run name; the run directory defaults to runs/NAME (a preset's or "
                       "file's name by default)")
    description: str = _field("", help="one line shown by `memnets configs ls`")
    seed: int = _field(0, help="seed of the initial weights, the training samples and their order")
    epochs: int = _field(100, help="training epochs")
    batch_size: int = _field(128, help="global batch size (split across DDP processes)")
    select_split: str = _field("od_easy", help="split whose sequence accuracy selects the reported epoch "
                               "(ties: the ID sequence accuracy, then the lower loss on this split)")
    select_ties: str = _field("first", help="which of several evaluations equal on all the selection criteria "
                              "is reported: first, or last (the most trained model)")
    eval_every: int = _field(1, help="evaluate every that many epochs (and after the last one)")
    checkpoint_every: int = _field(0, help="also checkpoint every that many optimiser steps (0: at epoch "
                                   "ends only)")
    log_every: int = _field(20, help="optimiser steps between training records in metrics.jsonl (also one at "
                            "each epoch end and where max_steps or the time limit stops a run)")
    device: str = _field("auto", help="auto (CUDA when available, else CPU), cpu, cuda, cuda:N or mps")
    amp: str = _field("auto", help="mixed precision: auto (bf16 autocast on CUDA only), bf16 (bf16 autocast "
                      "on CUDA and on the CPU) or none")
    threads: int = _field(0, help="torch intra-op CPU threads (0: torch's default)")
    compile: str = field(default="none", metadata={
        "help": "torch.compile the training forward: none, default, reduce-overhead (CUDA graphs on "
                "CUDA) or max-autotune; evaluation stays eager", "omit_empty": True})
    cuda_graph: str = field(default="auto", metadata={
        "help": "replay each training step (forward, backward, clipping, Adam) from a CUDA graph: auto (on "
                "CUDA in one process with Adam/AdamW and no compile), on (the same, refusing a setting it cannot "
                "take) or off", "omit_empty": True})
    tensorboard: bool = _field(False, help="also write TensorBoard event files to RUN_DIR/tb (needs the "
                               "tensorboard package, `pip install memnets[tensorboard]`; without it the run "
                               "goes on without them)")
    time_limit_min: float = _field(0.0, help="stop after the first optimiser step past this many minutes of wall "
                                   "time, inside an epoch if need be, and evaluate there (0: no limit; a run "
                                   "stopped so is not reproducible step for step)")
    max_steps: int = field(default=0, metadata={
        "help": "stop after this many optimiser steps, inside an epoch if need be, and evaluate there "
                "(0: run every epoch)", "omit_empty": True})
    model: ModelConfig = _field(factory=ModelConfig, help="the model")
    task: TaskConfig = _field(factory=TaskConfig, help="the task and its splits")
    optim: OptimConfig = _field(factory=OptimConfig, help="the optimiser")
    schedule: ScheduleConfig = _field(factory=ScheduleConfig, help="the learning-rate schedule")

    def __post_init__(self) -> None:
        _rename_backbone(self)
        _validate(self)


def _rename_backbone(cfg: "RunConfig") -> None:
    """A former backbone name of the algorithmic tasks (``lstm``, ``lsam``) becomes the current
    one (``bilstm``, ``lsam_stack``), with a FutureWarning."""
    from ..models.seq import RENAMED_BACKBONES, canonical_backbone

    if cfg.model.backbone in RENAMED_BACKBONES:
        from .task import TASKS, get_task

        if cfg.task.name in TASKS and get_task(cfg.task.name).family == "nsp":
            new = canonical_backbone(cfg.model.backbone)
            object.__setattr__(cfg, "model", dataclasses.replace(cfg.model, backbone=new))


_CHOICES = {
    ("schedule", "kind"): ("exp", "constant", "cosine", "rsqrt"),
    ("amp",): ("auto", "bf16", "none"),
    ("compile",): ("none",) + COMPILE_MODES,
    ("cuda_graph",): ("auto", "on", "off"),
    ("select_ties",): ("first", "last"),
    ("optim", "nan_policy"): ("raise", "skip"),
    ("optim", "kind"): ("adamw", "adam", "sgd"),
}

# numeric keys: (lowest, bound above (exclusive) or None, lowest excluded?, the range in words)
_RANGES: dict[str, tuple[float, float | None, bool, str]] = {
    "seed": (0, None, False, "an integer >= 0"),
    "epochs": (1, None, False, "an integer >= 1"),
    "batch_size": (1, None, False, "an integer >= 1"),
    "eval_every": (1, None, False, "an integer >= 1"),
    "log_every": (1, None, False, "an integer >= 1"),
    "checkpoint_every": (0, None, False, "an integer >= 0 (0: at epoch ends only)"),
    "threads": (0, None, False, "an integer >= 0 (0: torch's default)"),
    "time_limit_min": (0, None, False, "a number of minutes >= 0 (0: no limit)"),
    "model.d_model": (1, None, False, "an integer >= 1"),
    "task.train_size": (1, None, False, "an integer >= 1"),
    "task.eval_size": (1, None, False, "an integer >= 1"),
    "optim.lr": (0, None, False, "a number >= 0"),
    "optim.weight_decay": (0, None, False, "a number >= 0"),
    "optim.betas": (0, 1, False, "numbers in [0, 1)"),
    "optim.grad_clip": (0, None, False, "a number >= 0 (0: no clipping)"),
    "optim.spike_skip": (0, None, False, "a number >= 0 (0: off)"),
    "schedule.gamma": (0, None, True, "a number > 0"),
    "schedule.warmup_steps": (0, None, False, "an integer >= 0"),
}

_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")


def _validate(cfg: RunConfig) -> None:
    for path, choices in _CHOICES.items():
        obj: Any = cfg
        for p in path:
            obj = getattr(obj, p)
        if obj not in choices:
            raise ConfigError(f"`{'.'.join(path)}` expected one of {list(choices)}, got {obj!r}")
    if cfg.max_steps < 0:
        raise ConfigError(f"`max_steps` expected an integer >= 0, got {cfg.max_steps}")
    if cfg.cuda_graph == "on":
        why = ("optim.kind = 'sgd' (its step reads a tensor learning rate back to the CPU)"
               if cfg.optim.kind == "sgd" else
               f"compile = {cfg.compile!r} (torch.compile makes graphs of its own)" if cfg.compile != "none" else None)
        if why:
            raise ConfigError(f"`cuda_graph` = 'on' cannot take {why}; set cuda_graph = 'auto' or 'off'")
    if not _DEVICE.fullmatch(cfg.device):
        raise ConfigError(f"`device` expected auto, cpu, cuda, cuda:N or mps, got {cfg.device!r}")
    for key, (lo, hi, lo_open, what) in _RANGES.items():
        obj: Any = cfg
        for p in key.split("."):
            obj = getattr(obj, p)
        for i, v in enumerate(obj if isinstance(obj, tuple) else (obj,)):
            bad = v < lo or (lo_open and v == lo) or (hi is not None and v >= hi)
            if bad:
                name = f"{key}[{i}]" if isinstance(obj, tuple) else key
                raise ConfigError(f"`{name}` expected {what}, got {v}")
    from .task import get_task

    get_task(cfg.task.name).validate(cfg)  # ConfigError for an unknown task or a setting it cannot run


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


# common names from other training libraries for a field of these configs (last key component)
_ALIASES = {
    "learning_rate": "lr", "learningrate": "lr", "base_lr": "lr", "max_lr": "lr",
    "wd": "weight_decay", "decay": "weight_decay", "l2": "weight_decay",
    "clip": "grad_clip", "clip_grad": "grad_clip", "grad_norm": "grad_clip", "max_grad_norm": "grad_clip",
    "gradient_clip": "grad_clip", "clip_norm": "grad_clip",
    "optimizer": "kind", "optimiser": "kind", "scheduler": "kind", "type": "kind",
    "beta": "betas", "lr_decay": "gamma", "decay_rate": "gamma", "warmup": "warmup_steps",
    "batch": "batch_size", "bs": "batch_size", "num_epochs": "epochs", "n_epochs": "epochs",
    "max_epochs": "epochs", "random_seed": "seed", "precision": "amp", "mixed_precision": "amp",
    "num_threads": "threads", "hidden_size": "d_model", "dim": "d_model", "model_dim": "d_model",
    "arch": "backbone", "architecture": "backbone", "task": "name", "n_train": "train_size",
}


def suggest_key(key: str, known: list[str]) -> str | None:
    """The known dotted key that unknown ``key`` most likely meant, or None.

    Tried in order: a common alias of the last component (``optim.learning_rate`` →
    ``optim.lr``), the same last component under another table (``lr`` → ``optim.lr``), a
    last component containing or contained in it under the same table (``schedule.warmup`` →
    ``schedule.warmup_steps``), then the closest spelling of the whole key (difflib); an
    unknown ``model.X`` close to ``model.options`` becomes ``model.options.X``.
    """
    known = list(dict.fromkeys(known))

    def split(k: str) -> tuple[str, str]:  # "optim.lr" -> ("optim.", "lr")
        table, _, name = k.rpartition(".")
        return (table + "." if table else ""), name

    table, last = split(key)
    last = last.lower()
    for name in filter(None, (_ALIASES.get(last), last)):
        hits = [k for k in known if split(k) == (table, name)] or [k for k in known if split(k)[1] == name]
        hits = [k for k in hits if k != key]
        if hits:
            return hits[0]
    if len(last) >= 2:
        subs = [k for k in known if split(k)[0] == table and len(split(k)[1]) >= 2
                and (split(k)[1] in last or last in split(k)[1])]
        if subs:
            return max(subs, key=lambda k: difflib.SequenceMatcher(None, last, split(k)[1]).ratio())
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    if close and close[0] == "model.options" and table == "model.":
        return f"model.options.{key.rpartition('.')[2]}"  # a backbone option (free-form table)
    return close[0] if close else None


def _unknown(key: str, known: list[str]) -> ConfigError:
    close = suggest_key(key, known)
    hint = f"; did you mean `{close}`?" if close else ""
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
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)
                if not (f.metadata.get("omit_empty") and getattr(x, f.name) in (f.default, "", 0, None, ()))}
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


# ----------------------------------------------------------------------------- TOML and key docs

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    """A TOML literal of plain ``v`` (bool, int, float, str, list/tuple, dict as an inline table)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # always has a "." or an exponent: a TOML float
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _toml_table(d: dict, path: tuple[str, ...], lines: list[str]) -> None:
    if path:
        if lines:
            lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
    tables = []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{_toml_key(str(k))} = {_toml_value(v)}")
    for k, v in tables:
        _toml_table(v, path + (str(k),), lines)


def to_toml(data: dict) -> str:
    """TOML text of nested plain ``data`` (tables become ``[a.b]`` sections); ``tomllib``
    reads it back to the same values (tuples as lists)."""
    lines: list[str] = []
    _toml_table(data, (), lines)
    return "\n".join(lines) + "\n"


def config_to_toml(cfg: RunConfig) -> str:
    """``cfg`` as a TOML config file that :func:`load_config` (and ``memnets train FILE.toml``)
    reads back to an equal :class:`RunConfig`."""
    return to_toml(config_to_dict(cfg))


def _type_name(tp: Any) -> str:
    names = {str: "string", int: "integer", float: "float", bool: "boolean"}
    if tp in names:
        return names[tp]
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    if origin is dict:
        vt = typing.get_args(tp)[1]
        return "table" if vt is Any else f"table of {_type_name(vt)}"
    return getattr(tp, "__name__", str(tp))  # pragma: no cover


def describe_keys(cls: type | None = None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default as TOML, meaning)`` of every setting of :class:`RunConfig`
    (nested tables flattened: ``optim.lr``), in declaration order."""
    cls = RunConfig if cls is None else cls
    hints = _hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe_keys(tp, prefix + f.name + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((prefix + f.name, _type_name(tp), _toml_value(_plain(default)), f.metadata.get("help", "")))
    return rows


def keys_markdown() -> str:
    """The Markdown table of :func:`describe_keys` (the one in docs/config.md)."""
    def cell(x: str, code: bool = False) -> str:  # a table cell: no bare "|", no HTML outside code
        x = x.replace("|", "\\|")
        return f"`{x}`" if code else x.replace("<", "&lt;")

    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| {cell(k, True)} | {cell(t)} | {cell(d, True)} | {cell(h)} |" for k, t, d, h in describe_keys()]
    return "\n".join(lines)


def keys_text() -> str:
    """:func:`describe_keys` as aligned plain-text columns."""
    rows = [("KEY", "TYPE", "DEFAULT", "MEANING"), *describe_keys()]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{k.ljust(w[0])}  {t.ljust(w[1])}  {d.ljust(w[2])}  {h}".rstrip() for k, t, d, h in rows)


# ----------------------------------------------------------------------------- presets

def _preset_root():
    return resources.files("memnets") / "configs"


def list_presets() -> list[str]:
    """Names of the shipped presets (``configs/<name>.toml``, sub-folders joined with ``/``;
    ``configs/suites/`` holds suites of runs, not presets)."""
    root = Path(str(_preset_root()))
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.toml")
                  if p.relative_to(root).parts[0] != "suites")


# former preset names, still accepted (with a FutureWarning naming the new one)
RENAMED_PRESETS = {
    "lra/listops-2000-nam-9000-nam": "lra/listops-2000-nam-9000",
    "lra/listops-nam-authors-gpu-nam": "lra/listops-nam-authors-gpu",
}


def preset_path(name: str) -> Path:
    """The file of preset ``name``; ConfigError with a suggestion when there is none. A former
    name (:data:`RENAMED_PRESETS`) gives the renamed preset, with a FutureWarning."""
    if name in RENAMED_PRESETS:
        import warnings

        warnings.warn(f"preset {name!r} is now named {RENAMED_PRESETS[name]!r}; the old name will go",
                      FutureWarning, stacklevel=3)
        name = RENAMED_PRESETS[name]
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


def _table_of(data: dict, key: str, known: list[str], create: bool = True) -> tuple[dict, type | None]:
    """The table of ``data`` (a config as a dict) that holds the last part of the dotted ``key``
    (made where missing; without ``create`` an empty stand-in, ``data`` left as it is), and its
    dataclass (None: a free-form table such as ``model.options``)."""
    parts = key.split(".")
    node, cls = data, RunConfig
    for i, p in enumerate(parts[:-1]):
        hints = _hints(cls) if cls is not None else {}
        if cls is not None and p not in hints:
            raise _unknown(key, known)
        tp = hints.get(p) if cls is not None else None
        if cls is not None and not (dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict):
            raise _unknown(key, known)
        child = node.setdefault(p, {}) if create else node.get(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"`{key}`: `{'.'.join(parts[:i + 1])}` was set to {child!r} by an earlier "
                              "override, not a table")
        node = child
        cls = tp if dataclasses.is_dataclass(tp) else None
    if cls is not None and parts[-1] not in _hints(cls):
        raise _unknown(key, known)
    return node, cls


def apply_overrides(cfg: RunConfig, overrides: list[str], absent_ok: bool = False) -> RunConfig:
    """Apply ``key=value`` strings (dotted keys) to ``cfg``; type-checked, unknown keys rejected.
    ``~key`` removes a key of a free-form table (``~model.options.write_gate_bias``: the
    backbone's own default again), as Hydra's overrides do; a key the table lacks is refused
    unless ``absent_ok`` (a resumed run: the command that removed it continues it)."""
    data = config_to_dict(cfg)
    known = flatten_keys(RunConfig)
    for item in overrides:
        if item.startswith("~") and "=" not in item:
            key = item[1:].strip()
            node, cls = _table_of(data, key, known, create=False)
            last = key.rsplit(".", 1)[-1]
            if cls is not None:
                raise ConfigError(f"`~{key}`: only a key of a free-form table (model.options, task.options, "
                                  f"...) can be removed; set `{key}=...` instead")
            if last not in node and absent_ok:
                continue
            if last not in node:
                raise ConfigError(f"`~{key}`: the config has no `{key}` to remove "
                                  f"(its table holds: {', '.join(sorted(node)) or 'nothing'})")
            del node[last]
            continue
        if "=" not in item:
            raise ConfigError(f"override {item!r} expected the form key=value (e.g. optim.lr=3e-4) "
                              "or ~key (remove a key of model.options, task.options, ...)")
        key, raw = item.split("=", 1)
        key = key.strip()
        node, _ = _table_of(data, key, known)
        node[key.rsplit(".", 1)[-1]] = _parse_value(raw.strip())
    return config_from_dict(data)


def load_config(source: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset name or a TOML file path, then apply ``overrides``.

    A file's ``name`` defaults to the preset name / file stem.
    """
    path = Path(source)
    if not (path.suffix == ".toml" and path.is_file()):
        path = preset_path(str(source))
        default_name = str(RENAMED_PRESETS.get(str(source), source)).replace("/", "-")
    else:
        default_name = path.stem
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    data.setdefault("name", default_name)
    return apply_overrides(config_from_dict(data), list(overrides or []))
