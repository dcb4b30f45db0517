"""The task interface of the training engine, and the registry of tasks by name.

A :class:`Task` says *what* is learnt; the engine (:mod:`memnets.train.loop`) says *how*.

What a task provides (a subclass of :class:`Task`, registered under ``cfg.task.name``):

* ``validate(cfg)``: the checks of its part of the config (``task.*``, ``model.*``);
* ``build_model(cfg)``: the model (head or wrapper included), before any weights are loaded;
* data: ``steps_per_epoch(cfg)``, ``train_data(cfg, epoch)`` and
  ``train_batch(cfg, data, epoch, b, rank, world)`` (batch ``b`` of an epoch, the shard of
  process ``rank``; a pure function of the config, the epoch and ``b``, so that a resumed run
  or another DDP process regenerates it), ``eval_splits(cfg)`` (``{split: data}``);
* ``train_step(net, batch, ...)``: the forward pass and the loss (and per-step statistics);
* ``evaluate(model, split_data, ...)``: the metrics of one split (``{metric: value}``);
* model selection: ``selection_key(evals, cfg)`` (higher is better) and its rule in words;
* ``results(cfg, summary)``: the ``results.json`` dict, from the engine's :class:`RunSummary`;
* ``format_table(results)`` (a class method): the Markdown table of the family's runs.

What the engine owns: the loop over epochs and steps, the optimiser (``optim.kind``) and the
learning-rate schedule, gradient clipping and the NaN guard, autocast, DDP, the progress bar,
time and step limits, atomic checkpoints and exact resume, ``metrics.jsonl`` and TensorBoard,
evaluation every ``eval_every`` epochs and the choice of the reported evaluation.

Tasks are looked up by name with :func:`get_task`; :data:`TASKS` maps each name to the module
and class that implement it (imported on first use) and :func:`register_task` adds one.
"""
from __future__ import annotations

import contextlib
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Task", "RunSummary", "TASKS", "FAMILIES", "get_task", "register_task", "task_names",
           "family_of", "family_task", "common_results",
           "updates_dropped"]


@dataclass
class RunSummary:
    """What the engine hands :meth:`Task.results` at the end of a run.

    ``best``: ``{"epoch", "splits"}`` of the reported evaluation; ``evals``: every evaluation
    (``{split: metrics}``, in order; main process only); ``final``: the last one;
    ``decided_by``: which part of the selection key singled out the reported one;
    ``records``: every ``metrics.jsonl`` record (main process only); ``test``: the metrics of
    the reported model on :meth:`Task.test_splits`; ``task_state``: the task's final state;
    ``step_wall_s``,
    ``step_cpu_s``, ``steps_timed``: the wall and process CPU seconds of the ``steps_timed``
    training steps (forward, backward, optimiser) when the task sets ``time_steps``.
    """

    name: str
    params: int
    best: dict[str, Any]
    evals: list[dict]
    final: dict | None
    epochs: int
    steps: int
    stopped_by_time_limit: bool
    wall_s: float
    world_size: int
    decided_by: str | None = None
    records: list[dict] = field(default_factory=list)
    stopped_by_max_steps: bool = False
    test: dict | None = None
    task_state: dict | None = None
    step_wall_s: float = 0.0
    step_cpu_s: float = 0.0
    steps_timed: int = 0
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


class Task:
    """One task of the engine (see the module docstring for the contract).

    Class attributes: ``family`` (``"nsp"``, ``"ntm"``, ...), ``metric`` (the main metric of an
    evaluation, printed after each evaluation and written to TensorBoard) and
    ``higher_is_better`` (of ``metric``); ``time_steps``: the engine times every training step
    (CUDA synchronised) for :class:`RunSummary`.
    """

    family: str = ""
    metric: str = "acc"
    higher_is_better: bool = True
    time_steps: bool = False

    def __init__(self, name: str) -> None:
        self.name = name

    # ------------------------------------------------------------------ config and model
    def validate(self, cfg) -> None:
        """Raise :class:`~memnets.train.config.ConfigError` for a setting this task cannot run."""

    def build_model(self, cfg) -> torch.nn.Module:
        raise NotImplementedError

    def probe_loss(self, model: torch.nn.Module, cfg, device: torch.device) -> torch.Tensor:
        """A scalar from a tiny forward pass, whose backward shows which parameters get no
        gradient (DDP is then told to look for unused parameters)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ data
    def steps_per_epoch(self, cfg) -> int:
        return cfg.task.train_size // cfg.batch_size

    def train_data(self, cfg, epoch: int) -> Any:
        """Whatever :meth:`train_batch` needs for ``epoch`` (e.g. the epoch's samples)."""
        return None

    def train_batch(self, cfg, data: Any, epoch: int, b: int, rank: int = 0, world: int = 1) -> Any:
        raise NotImplementedError

    def eval_splits(self, cfg) -> dict[str, Any]:
        raise NotImplementedError

    def sample(self, cfg, seed: int = 0, split: str | None = None) -> Any:
        """One model input (a batch of 1) drawn with ``seed`` from ``split`` (default: the
        first evaluation split), e.g. for figures of the model on it."""
        raise NotImplementedError

    # ------------------------------------------------------------------ steps and evaluation
    def train_step(self, net: torch.nn.Module, batch: Any, cfg, device: torch.device,
                   autocast: Callable[[], Any] = contextlib.nullcontext) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, stats)``: the training loss of ``batch`` (a scalar tensor) and per-step
        statistics logged, averaged, beside it in ``metrics.jsonl`` (e.g. ``{"tok_acc": ...}``):
        a dict, or a callable returning one (called only for updates that are applied). Its
        values are numbers or scalar tensors; tensors are best, as a graphed step (CUDA) reads
        them back only when it logs, not at every step."""
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, data: Any, cfg, *, device, info,
                 autocast: Callable[[], Any] = contextlib.nullcontext) -> dict[str, float]:
        raise NotImplementedError

    def selection_key(self, evals: dict[str, dict], cfg) -> tuple:
        """Rank an evaluation ``{split: metrics}`` (higher is better): ``cfg.select_split``'s
        :attr:`metric` (negated when lower is better)."""
        v = evals[cfg.select_split][self.metric]
        return (v if self.higher_is_better else -v,)

    def selection_rule(self, cfg) -> str:
        word = "highest" if self.higher_is_better else "lowest"
        return f"{word} {cfg.select_split} {self.metric}, then the {cfg.select_ties} evaluation"

    def decided_by(self, evals: list[dict], chosen: tuple, cfg) -> str | None:
        return f"{cfg.select_split} {self.metric}"

    def progress(self, evals: dict[str, dict]) -> str:
        """The end of the line printed after an evaluation."""
        return f"{self.metric}: " + " ".join(f"{n} {m[self.metric]:.3f}" for n, m in evals.items())

    # ------------------------------------------------------------------ stateful recipes (optional)
    def init_state(self, cfg) -> dict | None:
        """The task's training state (plain JSON data, saved in every checkpoint), for recipes
        whose course depends on what happened (e.g. a phase that ends when the validation loss
        stalls); None (the default) for none."""
        return None

    def restore(self, model: torch.nn.Module, state: dict) -> None:
        """Apply ``state`` to ``model`` (non-tensor settings) after it is built or resumed."""

    def step_signature(self, model: torch.nn.Module, state: dict | None) -> Any:
        """What else a training step depends on besides its batch's shapes: a hashable value
        that changes when :meth:`restore` or :meth:`after_evaluation` changes how ``model``
        computes (a Python setting its forward reads). A step replayed from a CUDA graph
        (``cuda_graph``) is captured anew for each value; None (the default): nothing else."""
        return None

    def lr_factor(self, cfg, epoch: int, step: int, state: dict) -> float | None:
        """The learning-rate factor of ``step`` in ``epoch`` from the task's state; None: the
        engine's schedule (``schedule.*``)."""
        return None

    def after_evaluation(self, model: torch.nn.Module, evals: dict[str, dict], state: dict, epoch: float) -> None:
        """Update ``state`` (and ``model``) after an evaluation at ``epoch`` (epochs completed)."""

    def should_stop(self, state: dict, epoch: int) -> bool:
        """Whether the run is complete after ``epoch`` epochs (before ``epochs``)."""
        return False

    def test_splits(self, cfg) -> dict[str, Any]:
        """Held-out splits scored once, at the end, with the reported model (never used to choose
        it); their metrics go to ``results.json`` under ``test``. None by default."""
        return {}

    def before_test(self, model: torch.nn.Module) -> None:
        """Put the reported model in its final form before :meth:`test_splits` are scored."""

    # ------------------------------------------------------------------ results and tables
    def results(self, cfg, summary: RunSummary) -> dict[str, Any]:
        return common_results(self, cfg, summary)

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        """The Markdown table of runs of this family (``results.json`` dicts)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def common_results(task: Task, cfg, s: RunSummary) -> dict[str, Any]:
    """The ``results.json`` keys shared by every family but NSP (docs/tasks.md):

    ``name``, ``family``, ``task``, ``model`` (``model.backbone``), ``params``, ``metric``,
    ``select_split``, ``selected_by``, ``selection_decided_by``, ``best_epoch``, ``splits``
    (``{split: metrics}`` at the reported evaluation), ``final`` (the last evaluation),
    ``epochs``, ``steps``, ``stopped_by_time_limit``, ``stopped_by_max_steps``, ``wall_s``,
    ``world_size``, ``seed``, ``updates_dropped`` (``{"non_finite", "spikes"}``: the updates
    ``optim.nan_policy = "skip"`` and ``optim.spike_skip`` dropped in the whole run).
    """
    return {"name": s.name, "family": task.family, "task": task.name, "model": cfg.model.backbone,
            "params": s.params, "metric": task.metric, "select_split": cfg.select_split,
            "selected_by": task.selection_rule(cfg), "selection_decided_by": s.decided_by,
            "best_epoch": s.best.get("epoch"), "splits": s.best.get("splits"), "final": s.final,
            "epochs": s.epochs, "steps": s.steps, "stopped_by_time_limit": s.stopped_by_time_limit,
            "stopped_by_max_steps": s.stopped_by_max_steps, "wall_s": s.wall_s, "world_size": s.world_size,
            "seed": cfg.seed, "updates_dropped": updates_dropped(s.records), **s.extra}


def updates_dropped(records: list[dict]) -> dict[str, int]:
    """The updates dropped in a run, from its last train record: ``{"non_finite": n, "spikes": m}``
    (``skipped_steps``, ``spikes_skipped``; counted over the run's resumptions)."""
    last = next((r for r in reversed(records) if r.get("kind") == "train"), {})
    return {"non_finite": int(last.get("skipped_steps", 0)), "spikes": int(last.get("spikes_skipped", 0))}


# name -> "module:Class" (imported on first use)
TASKS: dict[str, str] = {
    **{n: "memnets.train.families.nsp:NSPTask" for n in ("fib", "addition", "palindrome", "reduce")},
    **{n: "memnets.train.families.ntm:NTMTask" for n in ("copy", "repeat_copy", "associative_recall",
                                                         "priority_sort")},
    **{n: "memnets.train.families.lra:LRATask" for n in ("listops", "text")},
    "babi": "memnets.train.families.babi:MemN2NTask",
    "babi_seq": "memnets.train.families.babi:SeqTask",
    "omniglot_pretrain": "memnets.train.families.fewshot:PretrainTask",
    "omniglot_fewshot": "memnets.train.families.fewshot:FewShotTask",
    "retrieval": "memnets.train.families.capacity:RetrievalTask",
    "mqar": "memnets.train.families.capacity:MQARTask",
}

# family -> its task names, in order
FAMILIES: dict[str, tuple[str, ...]] = {}


def _refresh_families() -> None:
    FAMILIES.clear()
    for name, target in TASKS.items():
        fam = target.split(":")[0].rsplit(".", 1)[-1]
        FAMILIES.setdefault(fam, ())
        FAMILIES[fam] += (name,)


_refresh_families()
_CACHE: dict[str, Task] = {}


def register_task(name: str, target: str | type[Task]) -> None:
    """Register task ``name``: a :class:`Task` subclass or ``"module:Class"`` (its constructor
    takes the task name)."""
    if isinstance(target, type):
        _CACHE.pop(name, None)
        TASKS[name] = f"{target.__module__}:{target.__qualname__}"
    else:
        TASKS[name] = target
    _refresh_families()


def task_names() -> list[str]:
    """Every registered task name, in registration order."""
    return list(TASKS)


def get_task(name: str) -> Task:
    """The :class:`Task` registered as ``name``; ConfigError naming the known ones otherwise."""
    if name in _CACHE:
        return _CACHE[name]
    if name not in TASKS:
        from .config import ConfigError

        raise ConfigError(f"`task.name` expected one of {task_names()}, got {name!r}")
    module, _, cls = TASKS[name].partition(":")
    task = getattr(importlib.import_module(module), cls)(name)
    _CACHE[name] = task
    return task


def family_of(results: dict) -> str | None:
    """The family of a ``results.json`` dict: its ``family`` key (written by every family but the
    algorithmic tasks), else ``"nsp"`` for an algorithmic task, else None."""
    if results.get("family"):
        return str(results["family"])
    return "nsp" if results.get("task") in FAMILIES.get("nsp", ()) else None


def family_task(family: str) -> type[Task]:
    """The :class:`Task` class of ``family`` (for its :meth:`Task.format_table`)."""
    if family not in FAMILIES:
        from .config import ConfigError

        raise ConfigError(f"family expected one of {sorted(FAMILIES)}, got {family!r}")
    return type(get_task(FAMILIES[family][0]))


def finite_or(x: float, default: float = -math.inf) -> float:
    return x if x is not None and math.isfinite(x) else default
