"""The task-agnostic training engine (docs/maths.md §12, docs/tasks.md).

The task (:mod:`memnets.train.task`, looked up by ``cfg.task.name``) gives the data, the
model, the loss, the metrics and ``results.json``; the engine gives the rest: the optimiser
(``optim.kind``) and the learning-rate schedule, global-norm gradient clipping and the NaN
guard, autocast (bf16 on CUDA by default), the progress bar, evaluation of every split each
``eval_every`` epochs and the choice of the reported evaluation (the task's selection key;
``select_ties`` between equal ones), time limits, checkpoints, exact resume and DDP. A run
writes ``runs/<name>/``::

    config.json      resolved config          env.json       where it ran
    metrics.jsonl    one JSON record per log  results.json   figures at the selected epoch
    checkpoints/     last.json → step-N.{safetensors,state.pt}; best.safetensors

``resume=True`` continues exactly: the data of an epoch and its order are functions of
(seed, epoch), and the checkpoint carries the optimiser, the RNG states and the position
inside the epoch. Under ``torchrun`` each process takes a strided shard of every global
batch and DistributedDataParallel averages the gradients.

:class:`Trainer` runs in named phases: :meth:`~Trainer.setup` (device, model, optimiser),
:meth:`~Trainer.resume` (the checkpoint, if any), :meth:`~Trainer.open_outputs` (config.json,
env.json, metrics.jsonl, TensorBoard, DDP), :meth:`~Trainer.run_epochs` (the epoch/step loop),
:meth:`~Trainer.evaluate_and_select` (after each evaluated epoch) and :meth:`~Trainer.finish`
(results.json).
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import checkpoint as ck
from .config import ConfigError, RunConfig, config_from_dict, config_to_dict, flatten
from .env import DistInfo, cleanup_distributed, resolve_device, run_env, setup_distributed
from .nan_guard import NonFiniteError, check_finite, first_non_finite
from .optim import make_optimizer
from .step_guard import SPIKE, DeviceGuard, SpikeGuard, spike_message
from .task import RunSummary, Task, get_task

__all__ = ["train", "Trainer", "build_model", "evaluate", "lr_factor", "selects", "selection_key", "selection_rule",
           "update", "graph_steps", "load_optimizer_state", "RunExistsError", "model_config_error",
           "resume_config", "FREE_ON_RESUME", "LONGER_ON_RESUME", "config_diff", "resume_diff", "StepTally",
           "drops_updates", "deferred_checks", "update_unchecked", "SpikeGuard"]


class RunExistsError(ConfigError):
    """The run directory already holds a run and ``resume`` was not asked for."""


def build_model(cfg: RunConfig) -> torch.nn.Module:
    """The model of ``cfg``'s task (e.g. a :class:`~memnets.models.seq.SequenceTaskModel` for the
    algorithmic tasks), with freshly initialised weights."""
    return get_task(cfg.task.name).build_model(cfg)


def evaluate(model: torch.nn.Module, batch, **kw) -> dict[str, float]:
    """The algorithmic tasks' evaluation (:func:`memnets.train.families.nsp.evaluate`)."""
    from .families import nsp

    return nsp.evaluate(model, batch, **kw)


def selection_key(splits: dict[str, dict], select_split: str = "od_easy", tiebreak: str = "id") -> tuple:
    """The algorithmic tasks' selection key (:func:`memnets.train.families.nsp.selection_key`)."""
    from .families import nsp

    return nsp.selection_key(splits, select_split, tiebreak)


def selection_rule(select_split: str = "od_easy", ties: str = "first", tiebreak: str = "id") -> str:
    """The algorithmic tasks' selection rule in words (:func:`memnets.train.families.nsp.selection_rule`)."""
    from .families import nsp

    return nsp.selection_rule(select_split, ties, tiebreak)


def lr_factor(cfg: RunConfig, epoch: int, step: int, total_steps: int) -> float:
    """Multiplier of ``optim.lr`` at global ``step`` (0-based) in ``epoch`` (0-based)."""
    s = cfg.schedule
    if s.kind == "exp":
        f = s.gamma ** epoch
    elif s.kind == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * min(step / max(total_steps, 1), 1.0)))
    elif s.kind == "rsqrt":  # LRA's linear_warmup * rsqrt_decay: sqrt(warmup / (step + 1)) past the warm-up
        f = math.sqrt(max(s.warmup_steps, 1) / max(step + 1, s.warmup_steps, 1))
    else:
        f = 1.0
    if s.warmup_steps and step < s.warmup_steps:
        f *= (step + 1) / s.warmup_steps
    return f


def selects(score, best, ties: str = "first") -> bool:
    """Whether an evaluation scoring ``score`` replaces the reported one scoring ``best``: a
    higher score always does; an equal one only with ``ties = "last"``.

    Scores are numbers or selection-key tuples (compared element by element).
    """
    return score > best or (ties == "last" and score == best)


def _autocast(cfg: RunConfig, device: torch.device):
    """bf16 autocast for ``amp = "bf16"`` (CPU or CUDA) and for ``"auto"`` on CUDA; else none.
    The recurrences with hand-written loops run in float32 inside it (memnets.ops._amp)."""
    use = cfg.amp == "bf16" or (cfg.amp == "auto" and device.type == "cuda")
    if use and device.type in ("cuda", "cpu"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def graph_steps(cfg: RunConfig, device: torch.device, world: int = 1) -> bool:
    """Whether the training steps of ``cfg`` on ``device`` replay from CUDA graphs
    (``cuda_graph``; :class:`~memnets.train.graph_step.CUDAGraphStep`): ``on``, or ``auto`` on
    CUDA — either in one process, with Adam/AdamW and no ``compile``. The updates that
    ``optim.nan_policy = "skip"`` and ``optim.spike_skip`` drop are then dropped inside the
    replayed step (:class:`~memnets.train.step_guard.DeviceGuard`). ``on`` with more processes
    raises :class:`ConfigError`; on the CPU the steps are then eager (or the graphs' CPU
    stand-in, :func:`memnets.train.graph_step.stand_in`)."""
    mode = cfg.cuda_graph
    if mode == "off":
        return False
    if world > 1:
        if mode == "on":
            raise ConfigError("`cuda_graph` = 'on' runs in one process; DDP's gradient averaging is "
                              "not captured here: set cuda_graph = 'auto' or 'off'")
        return False
    if mode == "on":
        return True  # the settings it cannot take were refused by the config
    from ..ops.gpu import graphs

    return (device.type == "cuda" or graphs.standing_in()) and cfg.optim.kind in ("adam", "adamw") \
        and cfg.compile == "none"


def drops_updates(cfg: RunConfig) -> bool:
    """Whether some updates of ``cfg``'s run may be dropped: ``optim.nan_policy = "skip"`` or
    ``optim.spike_skip`` > 0."""
    return cfg.optim.nan_policy == "skip" or cfg.optim.spike_skip > 0


def deferred_checks(cfg: RunConfig, device: torch.device, graphed: bool) -> bool:
    """Whether the training steps' loss, statistics and gradient norm stay on the device until
    the next record, checkpoint or evaluation (:class:`StepTally`) instead of being read back
    at every step: with graphed steps, and on CUDA unless an update may be dropped
    (:func:`drops_updates`) by an optimiser other than Adam/AdamW. Updates are then dropped on
    the device (:class:`~memnets.train.step_guard.DeviceGuard`, through the fused optimiser).
    Elsewhere a read-back costs nothing, and checking each step as it is taken names the
    tensor and leaves the weights clean."""
    return graphed or (device.type == "cuda" and (not drops_updates(cfg) or cfg.optim.kind in ("adam", "adamw")))


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate to ``lr``: written into a tensor rate (a graphed step reads
    it on the GPU), assigned otherwise."""
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr


def _float_lr(state: dict) -> dict:
    """An optimiser state dict with tensor learning rates as floats (a checkpoint any device loads)."""
    groups = [dict(g, lr=float(g["lr"])) if isinstance(g.get("lr"), torch.Tensor) else g
              for g in state["param_groups"]]
    return dict(state, param_groups=groups)


_DEVICE_FLAGS = ("fused", "foreach", "capturable")


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """``opt.load_state_dict(state)`` keeping ``opt``'s own device-bound flags (``fused``,
    ``foreach``, ``capturable``, set for where this run trains) rather than the checkpoint's, so
    a run saved on a GPU resumes on the CPU and the other way round; the ``step`` counters go
    where the flags want them (the parameter's device when fused or capturable, else the CPU)."""
    flags = [{k: g[k] for k in _DEVICE_FLAGS if k in g} for g in opt.param_groups]
    opt.load_state_dict(state)
    for g, f in zip(opt.param_groups, flags):
        g.update(f)
        on_device = bool(g.get("fused") or g.get("capturable"))
        for p in g["params"]:
            st = opt.state.get(p, {})
            step = st.get("step")
            if isinstance(step, torch.Tensor):
                st["step"] = step.to(device=p.device if on_device else "cpu", dtype=torch.float32)


def _all_reduce(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        import torch.distributed as dist

        dist.all_reduce(t)
    return t


class _Metrics:
    """Append-only ``metrics.jsonl`` (main process only), truncatable to a checkpoint's length."""

    def __init__(self, path: Path, enabled: bool, keep_lines: int | None) -> None:
        self.path, self.enabled, self.lines = path, enabled, 0
        self.records: list[dict] = []
        if not enabled:
            return
        old = path.read_text().splitlines() if path.exists() else []
        if keep_lines is not None:
            old = old[:keep_lines]
        else:
            old = []
        ck.atomic_write_text(path, "".join(line + "\n" for line in old))
        self.lines = len(old)
        self.records = [json.loads(line) for line in old]
        self._f = open(path, "a")

    def write(self, rec: dict) -> None:
        if self.enabled:
            self._f.write(json.dumps(rec) + "\n")
            self._f.flush()
            self.records.append(rec)
            self.lines += 1

    def close(self) -> None:
        if self.enabled:
            self._f.close()


def _progress(total: int, initial: int, desc: str, disable: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def train(cfg: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False, quiet: bool = False,
          on_epoch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` (default ``runs/<cfg.name>``); return the ``results.json`` dict.

    Raises :class:`RunExistsError` when ``run_dir`` already holds a run and ``resume`` is
    false, ConfigError when resuming with a different config,
    :class:`~memnets.train.nan_guard.NonFiniteError` on a non-finite loss or gradient under
    ``optim.nan_policy = "raise"`` (the checkpoints written before it stay), and
    :class:`~memnets.train.checkpoint.RunLockedError` when another process holds the directory.
    """
    run_dir = Path(run_dir or Path("runs") / cfg.name)
    info = setup_distributed()
    lock = ck.RunLock(run_dir) if info.is_main else None
    # the folders this run would create: removed again (when still empty) if it cannot start
    new_dirs = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
    finished = False
    try:
        if lock:
            lock.acquire()
        res = Trainer(cfg, run_dir, info, quiet=quiet, on_epoch=on_epoch).run(resume)
        finished = True
        return res
    finally:
        if lock:
            lock.release()
            for d in new_dirs:  # deepest first; a folder holding anything stays
                try:
                    d.rmdir()
                except OSError:
                    break
        cleanup_distributed(info, barrier=finished)


_UNEXPECTED = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


def _class_named(name: str, cfg: RunConfig) -> type | None:
    """The model class called ``name`` (for a message): the backbone's, else one in memnets or torch.nn."""
    from ..models.seq import BACKBONES

    module, cls = BACKBONES.get(cfg.model.backbone, (None, None))[:2]
    if cls == name and module in sys.modules:
        return getattr(sys.modules[module], cls, None)
    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and (mod_name.startswith("memnets.") or mod_name == "torch.nn"):
            obj = getattr(mod, name, None)
            if isinstance(obj, type):
                return obj
    return None


def model_config_error(cfg: RunConfig, e: Exception) -> ConfigError:
    """A one-line ConfigError for an exception raised while building ``cfg``'s model: an
    unknown ``model.options`` key is named with the backbone's closest option ("did you
    mean"), anything else is reported as a value the model cannot take."""
    import difflib
    import inspect

    m = _UNEXPECTED.search(str(e))
    if m:
        cls_name, key = m.groups()
        cls = _class_named(cls_name, cfg)
        opts: list[str] = []
        if cls is not None:
            try:
                opts = [p.name for p in inspect.signature(cls.__init__).parameters.values()
                        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            except (TypeError, ValueError):
                opts = []
        close = difflib.get_close_matches(key, opts, n=2, cutoff=0.6)
        close += [o for o in opts if o not in close and o.split("_")[0] == key.split("_")[0]
                  and difflib.SequenceMatcher(None, key, o).ratio() >= 0.5][:1]
        if close and difflib.SequenceMatcher(None, key, close[0]).ratio() >= 0.85:
            close = close[:1]  # one clear match
        hint = "; did you mean " + " or ".join(f"`model.options.{c}`" for c in close[:2]) + "?" if close else ""
        known = f" (its options: {', '.join(opts)})" if opts else ""
        return ConfigError(f"`model.options.{key}` is not an option of the {cfg.model.backbone!r} model "
                           f"({cls_name}){hint}{known}")
    opts_text = ", ".join(f"{k}={v!r}" for k, v in cfg.model.options.items()) or "none"
    return ConfigError(f"cannot build the {cfg.model.backbone!r} model with d_model={cfg.model.d_model} and "
                       f"model.options {opts_text}: {type(e).__name__}: {e}")


# keys whose change does not alter what is computed: a resumed run may set them anew. ``optim.nan_policy``
# only decides a step whose gradient is not finite, which under "raise" ended the run: continuing a run
# that stopped so with "skip" is the run that "skip" would have made
FREE_ON_RESUME = ("time_limit_min", "tensorboard", "threads", "description", "compile", "cuda_graph",
                  "optim.nan_policy")


def config_diff(old: RunConfig, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` (keys sorted) for every key in which ``new``
    computes something else than ``old``: each value that differs, except those of
    :data:`FREE_ON_RESUME`."""
    a, b = flatten(config_to_dict(old)), flatten(config_to_dict(new))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in FREE_ON_RESUME}


# budget keys that a resumed run may raise (a longer run), unless the schedule spans the budget
LONGER_ON_RESUME = ("epochs", "max_steps")


def resume_diff(old: RunConfig, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """:func:`config_diff` less a longer budget: ``epochs`` raised, ``max_steps`` raised or
    lifted (0). Such a run continues as the longer run would have gone, because an epoch's data
    and the learning rate at a step do not depend on the budget; not so for the ``cosine``
    schedule, which decays over all steps, so there a changed budget stays in the diff.

    ConfigError when the budget is lowered (a run is not shortened on resume)."""
    diff = config_diff(old, new)
    if old.schedule.kind == "cosine" or new.schedule.kind == "cosine":
        return diff
    if "epochs" in diff and new.epochs < old.epochs:
        raise ConfigError(f"`epochs` may only grow on resume: the run was started with epochs={old.epochs}, "
                          f"got {new.epochs}")
    if "max_steps" in diff and old.max_steps and 0 < new.max_steps < old.max_steps:
        raise ConfigError(f"`max_steps` may only grow (or be lifted with 0) on resume: the run was started with "
                          f"max_steps={old.max_steps}, got {new.max_steps}")
    return {k: v for k, v in diff.items() if k not in LONGER_ON_RESUME}


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config to continue the run in ``run_dir`` with: its saved ``config.json`` and
    ``overrides`` (``key=value``). Only the keys of :data:`FREE_ON_RESUME` (``compile``,
    ``threads``, ``time_limit_min``, ...) may change, and the budget may grow (``epochs``,
    ``max_steps``: :func:`resume_diff`), which continues a finished run further; an override
    repeating a saved value is accepted, so the command that started the run also continues it.
    ConfigError when ``config.json`` is missing or malformed, or an override changes another key."""
    from .config import apply_overrides

    cfg_file = Path(run_dir) / "config.json"
    try:
        saved = config_from_dict(json.loads(cfg_file.read_text()))
    except OSError as e:
        raise ConfigError(f"cannot resume {run_dir}: no readable {cfg_file} ({e.strerror or e})") from e
    except (ValueError, TypeError, AttributeError) as e:  # JSONDecodeError and ConfigError are ValueErrors
        raise ConfigError(f"cannot resume {run_dir}: {cfg_file} is malformed ({e})") from e
    cfg = apply_overrides(saved, list(overrides or []), absent_ok=True)  # a removal the saved config made
    diff = resume_diff(saved, cfg)
    if diff:
        was = ", ".join(f"{k}={json.dumps(v[0])}" for k, v in diff.items())
        why = " (the cosine schedule decays over the whole budget)" if set(diff) & set(LONGER_ON_RESUME) else ""
        raise ConfigError(f"cannot change {', '.join(diff)} when resuming {run_dir} (it was started with {was})"
                          f"{why}; on resume only {', '.join(FREE_ON_RESUME)} may change, and epochs or max_steps "
                          "grow unless the schedule is cosine; leave the other overrides out (the run's config.json "
                          "is used) or train into a new --run-dir")
    return cfg


def _check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool) -> bool:
    """Validate the directory; return whether there is a checkpoint to resume from."""
    cfg_file = run_dir / "config.json"
    existing = ck.has_checkpoint(run_dir / "checkpoints") or (run_dir / "metrics.jsonl").exists()
    if existing and not resume:
        raise RunExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    if resume and cfg_file.exists():
        try:
            saved = config_from_dict(json.loads(cfg_file.read_text()))
        except (ValueError, TypeError, AttributeError) as e:  # JSONDecodeError and ConfigError are ValueErrors
            raise ConfigError(f"cannot resume {run_dir}: {cfg_file} is malformed ({e})") from e
        diff = resume_diff(saved, cfg)
        if diff:
            raise ConfigError(f"cannot resume {run_dir}: config differs in {', '.join(diff)}")
    return resume and ck.has_checkpoint(run_dir / "checkpoints")


class Trainer:
    """One run of ``cfg`` into ``run_dir`` by process ``info.rank``; :meth:`run` does every phase."""

    def __init__(self, cfg: RunConfig, run_dir: Path, info: DistInfo, *, quiet: bool = False,
                 on_epoch: Callable[[dict], None] | None = None) -> None:
        self.cfg, self.run_dir, self.info, self.quiet, self.on_epoch = cfg, Path(run_dir), info, quiet, on_epoch
        self.task: Task = get_task(cfg.task.name)
        self.step = self.epoch = self.batch0 = 0
        self.wall_before = 0.0
        self.best: dict[str, Any] = {"score": -1.0, "epoch": None, "splits": None}
        self.keep_lines: int | None = None
        self.has_ckpt = False
        self.partial = False
        self.by_steps = False  # stopped by max_steps
        self.done_by_task = False  # stopped by the task's recipe (Task.should_stop)
        self.skipped = 0  # updates dropped by optim.nan_policy = "skip" (over resumptions: checkpointed)
        # optim.spike_skip's guard (setup), its count of dropped updates self.spikes.dropped (checkpointed likewise)
        self.spikes: SpikeGuard | DeviceGuard | None = None
        self.tb = None
        self.timing = [0.0, 0.0, 0]  # wall s, CPU s, steps timed (tasks with time_steps)
        self.graph_step = None  # a CUDAGraphStep when the steps replay from CUDA graphs
        self._leaves: list = []  # the batch of the graphed step being taken (its non-tensor leaves)
        self._holder: dict = {}  # where the graphed step's body leaves its gradient norm
        self.tally: StepTally | None = None  # the steps' losses, read back when logged (deferred_checks)
        self.guard: DeviceGuard | None = None  # drops updates on the device (deferred checks that may drop)

    # ------------------------------------------------------------------ phases
    def run(self, resume: bool) -> dict[str, Any]:
        self.setup(resume)
        self.resume()
        self.open_outputs()
        self.run_epochs()
        return self.finish()

    def setup(self, resume: bool) -> None:
        """Threads, device, the run directory check, the model (same initial weights in every
        process) and the optimiser."""
        cfg, info = self.cfg, self.info
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = resolve_device(cfg.device, info)
        has_ckpt = _check_run_dir(cfg, self.run_dir, resume) if info.is_main else False
        if info.enabled:
            import torch.distributed as dist

            flag = torch.tensor([int(has_ckpt)])
            dist.broadcast(flag, 0)
            has_ckpt = bool(flag.item())
        self.has_ckpt = has_ckpt
        torch.manual_seed(cfg.seed)  # identical initial weights in every process
        try:
            model = build_model(cfg)
        except ConfigError:
            raise
        except (TypeError, ValueError, RuntimeError, ZeroDivisionError, AssertionError, IndexError) as e:
            raise model_config_error(cfg, e) from e
        self.model = model.to(self.device)
        from ..registry import count_parameters

        self.n_params = count_parameters(self.model)
        self.graphed = graph_steps(cfg, self.device, info.world)
        self.deferred = deferred_checks(cfg, self.device, self.graphed)
        guarded = self.deferred and drops_updates(cfg)  # a fused optimiser drops them on the device
        self.opt = make_optimizer(cfg.optim, self.model.parameters(), fused=True if guarded else None)
        if guarded:
            self.guard = DeviceGuard(cfg.optim.spike_skip, self.device)
            self.guard.attach(self.opt)
        if cfg.optim.spike_skip > 0:
            self.spikes = self.guard if guarded else SpikeGuard(cfg.optim.spike_skip)
        self.task_state = self.task.init_state(cfg)
        if self.task_state is not None:
            self.task.restore(self.model, self.task_state)
        self.meta = {"model_config": json.dumps(config_to_dict(cfg.model)), "task": cfg.task.name}

    def resume(self) -> None:
        """Load the last checkpoint (weights, optimiser, RNG, position, best so far), if any."""
        if not self.has_ckpt:
            return
        st = ck.load_checkpoint(self.run_dir / "checkpoints", self.model)
        load_optimizer_state(self.opt, st["optimizer"])
        torch.set_rng_state(st["rng_cpu"])
        if torch.cuda.is_available() and st.get("rng_cuda") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(st["rng_cuda"], self.device)
        self.step, self.epoch, self.batch0 = int(st["step"]), int(st["epoch"]), int(st["batch"])
        self.wall_before, self.best = float(st["wall_s"]), json.loads(st["best"])
        self.keep_lines = int(st["metrics_lines"])
        if self.task_state is not None and "task_state" in st:
            self.task_state = json.loads(st["task_state"])
            self.task.restore(self.model, self.task_state)
        if "timing" in st:
            self.timing = [float(st["timing"][0]), float(st["timing"][1]), int(st["timing"][2])]
        if self.spikes is not None and "spike_norms" in st:
            self.spikes.load(json.loads(st["spike_norms"]))
        if "dropped" in st:  # the updates dropped before the checkpoint: the counts go on from there
            self.skipped, spikes = json.loads(st["dropped"])
            if self.spikes is not None:
                self.spikes.dropped = spikes

    def open_outputs(self) -> None:
        """config.json, env.json, metrics.jsonl, TensorBoard, the DDP wrapper and the evaluation data."""
        cfg, info, run_dir = self.cfg, self.info, self.run_dir
        if info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            ck.atomic_write_text(run_dir / "config.json", json.dumps(config_to_dict(cfg), indent=2))
            if self.has_ckpt and self.trains_on():
                # a run stopped early (time limit, max_steps) or given a larger budget trains on: the
                # results of where it stopped no longer describe it
                (run_dir / "results.json").unlink(missing_ok=True)
            env = run_env(self.device, info.world)
            ac = _autocast(cfg, self.device)
            env.update(params=self.n_params, resumed_from_step=self.step if self.has_ckpt else None,
                       autocast=str(ac.fast_dtype).replace("torch.", "") if isinstance(ac, torch.autocast) else None)
            ck.atomic_write_text(run_dir / "env.json", json.dumps(env, indent=2))
        self.metrics = _Metrics(run_dir / "metrics.jsonl", info.is_main, self.keep_lines)
        if cfg.tensorboard and info.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:
                print("tensorboard is not installed; skipping TensorBoard logs", file=sys.stderr)
        self.net = self.model
        if info.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.net = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                           find_unused_parameters=self._has_unused_parameters())
        if cfg.compile != "none":
            # The training forward only; evaluation (other shapes, no grad) stays eager on self.model.
            from ..ops._impl import compile_module

            self.net = compile_module(self.net, cfg.compile)
        if self.graphed:
            self.graph_step = self._make_graph_step()
        if self.deferred:
            self.tally = StepTally(skip_non_finite=cfg.optim.nan_policy == "skip")
        self.splits = self.task.eval_splits(cfg)
        self.nb = self.task.steps_per_epoch(cfg)
        self.total = self.nb * cfg.epochs
        if cfg.max_steps:
            self.total = min(self.total, cfg.max_steps)
        self.bar_off = self.quiet or not info.is_main or not sys.stderr.isatty()
        self.t_start = time.perf_counter()

    def done_by_recipe(self) -> bool:
        """Whether the task's own recipe finished the run at an epoch's end (Task.should_stop)."""
        return self.task_state is not None and self.batch0 == 0 and 0 < self.epoch < self.cfg.epochs and \
            self.task.should_stop(self.task_state, self.epoch)

    def trains_on(self) -> bool:
        """Whether the run has steps left from where it stands (a resumed run may have none)."""
        cfg = self.cfg
        return self.epoch < cfg.epochs and not (cfg.max_steps and self.step >= cfg.max_steps) and \
            not self.done_by_recipe()

    def run_epochs(self) -> None:
        """The epoch/step loop, from the resumed position to ``epochs`` or the time limit."""
        cfg = self.cfg
        self.partial = False
        self.model.train()
        if self.done_by_recipe():  # a finished run resumed: nothing is left to train
            self.done_by_task = True
            return
        while self.epoch < cfg.epochs:
            if cfg.max_steps and self.step >= cfg.max_steps:
                self.by_steps = True
                break
            stopped_at = self.train_epoch()
            self.batch0 = 0
            if stopped_at is not None:  # a limit inside the epoch: checkpoint here, score the model, stop
                b = stopped_at
                by_steps = bool(cfg.max_steps) and self.step >= cfg.max_steps
                self.partial, self.by_steps = not by_steps, by_steps
                self.save(self.epoch, b + 1)
                self.evaluate_and_select(round(self.epoch + (b + 1) / self.nb, 3))
                why = f"max_steps {cfg.max_steps}" if by_steps else f"time limit {cfg.time_limit_min} min"
                self._say(f"stopped at step {self.step} (epoch {self.epoch + (b + 1) / self.nb:.2f}): {why}")
                break
            self.epoch += 1
            if self.epoch % cfg.eval_every == 0 or self.epoch == cfg.epochs:
                self.evaluate_and_select(self.epoch)
            self.save(self.epoch, 0)
            if cfg.time_limit_min and self.epoch < cfg.epochs and self.time_up():
                if self.epoch % cfg.eval_every:
                    self.evaluate_and_select(self.epoch)  # score the model we stop with
                self._say(f"stopping after epoch {self.epoch}: time limit {cfg.time_limit_min} min")
                break
            if self.done_by_recipe():
                self.done_by_task = True
                self._say(f"stopping after epoch {self.epoch}: the task's recipe is complete")
                break
            if cfg.max_steps and self.epoch < cfg.epochs and self.step >= cfg.max_steps:
                if self.epoch % cfg.eval_every:
                    self.evaluate_and_select(self.epoch)
                self.by_steps = True
                self._say(f"stopping after epoch {self.epoch}: max_steps {cfg.max_steps}")
                break

    def train_epoch(self) -> int | None:
        """The steps of epoch ``self.epoch`` from batch ``self.batch0``; returns the batch index
        at which the time limit stopped it (None when the epoch ran to its end)."""
        cfg, info, task, nb = self.cfg, self.info, self.task, self.nb
        epoch = self.epoch
        data = task.train_data(cfg, epoch)
        bar = _progress(nb, self.batch0, f"epoch {epoch + 1}/{cfg.epochs}", self.bar_off)
        acc_loss = 0.0
        acc_stats: dict[str, float] = {}
        acc_n = 0
        gnorm = [0.0, 0.0]  # the applied steps' total gradient norms before clipping: sum, max
        t_log = time.perf_counter()
        stopped_at = None
        for b in range(self.batch0, nb):
            batch = task.train_batch(cfg, data, epoch, b, info.rank, info.world)
            f = task.lr_factor(cfg, epoch, self.step, self.task_state) if self.task_state is not None else None
            lr = cfg.optim.lr * (lr_factor(cfg, epoch, self.step, self.total) if f is None else f)
            _set_lr(self.opt, lr)
            if task.time_steps:
                self._sync()
                w0, c0 = time.perf_counter(), time.process_time()
            dropped = self.spikes.dropped if self.spikes is not None else 0
            if self.tally is not None:  # no read-back: the tally keeps the step's loss on the device
                if self.graph_step is not None:
                    loss, stats, norm, told = self.graph_update(batch)
                else:
                    loss, stats = task.train_step(self.net, batch, cfg, self.device, self._autocast)
                    norm = update_unchecked(cfg, self.model, self.opt, loss, self.guard)
                    told = self.guard.told if self.guard is not None else None
                self.tally.add(self.step + 1, loss, stats() if callable(stats) else stats, norm, told)
                applied = True  # (or dropped on the device: the tally tells when read back)
            else:
                loss, stats = task.train_step(self.net, batch, cfg, self.device, self._autocast)
                norm = update(cfg, self.model, self.opt, loss, self.step + 1, self.spikes)
                applied = norm is not None
                if applied:
                    gnorm = [gnorm[0] + norm, max(gnorm[1], norm)]
            if applied:
                if task.time_steps:
                    self._sync()
                    self.timing = [self.timing[0] + time.perf_counter() - w0,
                                   self.timing[1] + time.process_time() - c0, self.timing[2] + 1]
                if self.tally is None:
                    acc_loss += float(loss.detach())
                    for k, v in (stats() if callable(stats) else stats).items():
                        acc_stats[k] = acc_stats.get(k, 0.0) + float(v)
                acc_n += 1
            elif self.spikes is not None and self.spikes.dropped > dropped:  # dropped as a spike
                self._say(f"step {self.step + 1}: {self.spikes.last}, update skipped")
            else:  # nan_policy = "skip" dropped it; the batch position is kept
                self.skipped += 1
                self._say(f"step {self.step + 1}: non-finite loss or gradient, update skipped")
            self.step += 1
            # a limit inside the epoch (max_steps, then the time limit) stops after this step
            stop = b < nb - 1 and bool((cfg.max_steps and self.step >= cfg.max_steps)
                                       or (cfg.time_limit_min and self.time_up()))
            if self.step % cfg.log_every == 0 or b == nb - 1 or stop:  # a stopped run logs its last steps
                self.log_train(epoch, lr, acc_loss, acc_stats, acc_n, gnorm, t_log, bar)
                acc_loss, acc_stats, acc_n, gnorm = 0.0, {}, 0, [0.0, 0.0]
                t_log = time.perf_counter()
            bar.update(1)
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and b < nb - 1:
                self.save(epoch, b + 1)
            if stop:
                stopped_at = b
                break
        bar.close()
        return stopped_at

    def log_train(self, epoch, lr, acc_loss, acc_stats, acc_n, gnorm, t_log, bar) -> None:
        """One ``"train"`` record: the mean loss and statistics since the last one, over every
        process, and the mean and largest total gradient norm (before clipping) of the updates
        taken (``gnorm``: their sum and largest; the gradients are the same in every process)."""
        if self.tally is not None:  # the steps' losses: read back now (raises on a non-finite one)
            self.check_tally()
            acc_loss, acc_stats, acc_n = self.tally.take()
            gnorm = [acc_stats.pop("grad_norm", 0.0), acc_stats.pop("grad_norm_max", 0.0)]
        keys = list(acc_stats)
        vals = torch.tensor([acc_loss] + [acc_stats[k] for k in keys], dtype=torch.float64, device=self.device)
        vals = (_all_reduce(vals, self.info).cpu() / (max(acc_n, 1) * self.info.world)).tolist()
        sps = acc_n * self.cfg.batch_size / max(time.perf_counter() - t_log, 1e-9)  # global batch per step
        rec = {"kind": "train", "epoch": epoch, "step": self.step, "loss": vals[0],
               **dict(zip(keys, vals[1:])), "lr": lr, "samples_per_s": sps}
        if acc_n and gnorm[1] > 0:  # (0 where no step's norm was taken: an eager step of a graphed run)
            rec["grad_norm"], rec["grad_norm_max"] = gnorm[0] / acc_n, gnorm[1]
        if self.skipped:
            rec["skipped_steps"] = self.skipped
        if self.spikes is not None and self.spikes.dropped:
            rec["spikes_skipped"] = self.spikes.dropped
        self.metrics.write(rec)
        if self.tb:
            self.tb.add_scalar("train/loss", vals[0], self.step)
            if "grad_norm" in rec:
                self.tb.add_scalar("train/grad_norm", rec["grad_norm"], self.step)
        post = {"loss": f"{vals[0]:.4f}"}
        if keys:
            post["acc" if keys[0].endswith("acc") else keys[0]] = f"{vals[1]:.3f}"
        bar.set_postfix(**post, sps=f"{sps:.0f}")

    def evaluate_and_select(self, ep: float) -> None:
        """Score every split, record it, and keep the model if the task's selection key prefers it."""
        self.check_tally()
        cfg, task = self.cfg, self.task
        res = {name: task.evaluate(self.model, s, cfg, device=self.device, info=self.info,
                                   autocast=self._autocast) for name, s in self.splits.items()}
        rec = {"kind": "eval", "epoch": ep, "step": self.step, "splits": res, "wall_s": self.wall()}
        self.metrics.write(rec)
        score = res[cfg.select_split][task.metric]
        key = task.selection_key(res, cfg)
        old = task.selection_key(self.best["splits"], cfg) if self.best["splits"] else (-math.inf,)
        if selects(key, old, cfg.select_ties):
            self.best = {"score": score, "epoch": ep, "splits": res}
            if self.info.is_main:
                ck.save_weights(self.run_dir / "checkpoints" / "best.safetensors", self.model, self.meta)
        if self.tb:
            for name, m in res.items():
                self.tb.add_scalar(f"{name}/{task.metric}", m[task.metric], self.step)
        self._say(f"epoch {ep}/{cfg.epochs} step {self.step} {task.progress(res)} ({self.wall():.0f}s)")
        if self.task_state is not None:
            task.after_evaluation(self.model, res, self.task_state, ep)
        if self.on_epoch:
            self.on_epoch(rec)

    def finish(self) -> dict[str, Any]:
        """Close the logs and write ``results.json`` (the task's schema)."""
        cfg, info = self.cfg, self.info
        self.metrics.close()
        if self.tb:
            self.tb.close()
        evals = [r["splits"] for r in self.metrics.records if r["kind"] == "eval"] if info.is_main else []
        last = evals[-1] if evals else None
        decided = self.task.decided_by(evals, self.task.selection_key(self.best["splits"], cfg), cfg) \
            if evals and self.best["splits"] else None
        summary = RunSummary(name=cfg.name, params=self.n_params, best=self.best, evals=evals, final=last,
                             epochs=self.epoch, steps=self.step,
                             stopped_by_time_limit=self.partial or (self.epoch < cfg.epochs and not self.by_steps
                                                                   and not self.done_by_task),
                             stopped_by_max_steps=self.by_steps, wall_s=self.wall(),
                             world_size=info.world, decided_by=decided, records=list(self.metrics.records),
                             step_wall_s=self.timing[0], step_cpu_s=self.timing[1], steps_timed=self.timing[2],
                             device=str(self.device))
        summary.test = self.evaluate_test()
        summary.task_state = self.task_state
        results = self.task.results(cfg, summary)
        if info.is_main:
            ck.atomic_write_text(self.run_dir / "results.json", json.dumps(results, indent=2))
        return results

    def evaluate_test(self) -> dict | None:
        """The reported model (best.safetensors) scored on the task's test splits, if it has any."""
        splits = self.task.test_splits(self.cfg)
        if not splits:
            return None
        best = self.run_dir / "checkpoints" / "best.safetensors"
        if self.info.enabled:
            import torch.distributed as dist

            dist.barrier()  # process 0 has written best.safetensors
        if self.best["splits"] is not None and best.is_file():
            ck.load_weights(best, self.model)
        self.task.before_test(self.model)
        return {name: self.task.evaluate(self.model, data, self.cfg, device=self.device, info=self.info,
                                         autocast=self._autocast) for name, data in splits.items()}

    # ------------------------------------------------------------------ graphed steps
    def _make_graph_step(self):
        """The :class:`~memnets.train.graph_step.CUDAGraphStep` of this run: the task's loss of a
        batch rebuilt from the step's input tensors, then the backward, the gradient norm and
        clipping, and the optimiser (made capturable, its learning rate a tensor on the GPU)."""
        from .graph_step import CUDAGraphStep

        cfg, model = self.cfg, self.model
        if self.device.type == "cuda":
            for g in self.opt.param_groups:  # the schedule writes into it; a float would be baked in
                g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=self.device)

        def loss_fn(*tensors):
            it = iter(tensors)
            leaves = [next(it) if isinstance(x, torch.Tensor) else x for x in self._leaves[0]]
            batch = torch.utils._pytree.tree_unflatten(leaves, self._leaves[1])
            loss, stats = self.task.train_step(self.net, batch, cfg, self.device, self._autocast)
            holder: dict = {"loss": loss}
            self._holder = holder
            return loss, stats, holder

        def before_step():
            self._holder["norm"] = norm = _clip_gradients(cfg, model)
            if self.guard is not None:  # sets the fused optimiser's found_inf for the step below
                self._holder["told"] = self.guard.decide(self._holder["loss"], norm)

        return CUDAGraphStep(loss_fn, self.opt, before_step=before_step)

    def graph_update(self, batch) -> tuple[torch.Tensor, Any, torch.Tensor | None, torch.Tensor | None]:
        """One training step of ``batch`` through :attr:`graph_step` (replayed from a CUDA graph
        once its signature was captured): ``(loss, stats, norm, told)``, the step's loss,
        statistics, total gradient norm and :attr:`guard`'s verdict (None without one), on the
        device and unread.

        Nothing is read back here: :attr:`tally` keeps them, and :meth:`check_tally` reads the
        steps since the last record at once (at every ``log_every`` steps, and before every
        checkpoint and evaluation), so the CPU runs ahead of the GPU. A replayed step cannot stop
        half-way, and the next ones are already queued when a non-finite loss or gradient is
        read: :class:`~memnets.train.nan_guard.NonFiniteError` names the first such step, and no
        checkpoint was written after it. A batch whose step runs eagerly (an unhashable leaf) is
        checked at once, as :func:`update` does (with a :attr:`guard`, at the next read-back)."""
        leaves, spec = torch.utils._pytree.tree_flatten(batch)
        tensors = [x.to(self.device, non_blocking=True) for x in leaves if isinstance(x, torch.Tensor)]
        others = tuple(x for x in leaves if not isinstance(x, torch.Tensor))
        key = (str(spec), others, self.task.step_signature(self.model, self.task_state))
        try:
            hash(key)
        except TypeError:  # an unhashable leaf: this batch's step runs eagerly
            tensors = []
        if not tensors:
            self.check_tally()
            loss, stats = self.task.train_step(self.net, batch, self.cfg, self.device, self._autocast)
            if self.guard is not None:
                norm = update_unchecked(self.cfg, self.model, self.opt, loss, self.guard)
                return loss, stats, norm, self.guard.told
            norm = update(self.cfg, self.model, self.opt, loss, self.step + 1)  # nan_policy is "raise" here
            return loss, stats, torch.tensor(norm, device=loss.device), None
        self._leaves = [leaves, spec]
        loss, stats, holder = self.graph_step(*tensors, key=key)
        return loss, stats, holder["norm"], holder.get("told")

    def check_tally(self) -> None:
        """Read the steps taken since the last check (graphed, or eager with
        :func:`deferred_checks`) back from the device in one transfer (:class:`StepTally`).

        Raises :class:`~memnets.train.nan_guard.NonFiniteError` for the first of them whose loss
        or total gradient norm is not finite. The offending gradient is named when that step is
        the last one taken (its gradients are still there), else the error names the total
        gradient norm."""
        bad = self.tally.check() if self.tally is not None else None
        for step, what, norm, median, n in self.tally.take_dropped() if self.tally is not None else ():
            if what == "spike":  # (self.spikes is the device guard)
                self.spikes.dropped += 1
                self.spikes.last = spike_message(norm, self.spikes.factor, median, n)
                self._say(f"step {step}: {self.spikes.last}, update skipped")
            else:
                self.skipped += 1
                self._say(f"step {step}: non-finite loss or gradient, update skipped")
        if bad is None:
            return
        step, what, n_nan, n_inf = bad
        if what == "loss":
            raise NonFiniteError(step, "loss", "loss", n_nan, n_inf)
        if step == self.step:  # the gradients of that step are still in place
            for name, p in self.model.named_parameters():
                found = first_non_finite(p.grad) if p.grad is not None else None
                if found is not None:
                    raise NonFiniteError(step, f"{name}.grad", "gradient", *found[2:])
        raise NonFiniteError(step, "total gradient norm", "gradient", n_nan, n_inf)

    # ------------------------------------------------------------------ helpers
    def _autocast(self):
        return _autocast(self.cfg, self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _say(self, msg: str) -> None:
        if self.info.is_main and not self.quiet:
            print(f"[{self.cfg.name}] {msg}", file=sys.stderr, flush=True)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_start

    def save(self, ep: int, b: int) -> None:
        self.check_tally()  # no checkpoint after a non-finite step
        if self.info.is_main:
            device = self.device
            state = {"step": self.step, "epoch": ep, "batch": b, "optimizer": _float_lr(self.opt.state_dict()),
                     "rng_cpu": torch.get_rng_state(),
                     "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                     "best": json.dumps(self.best), "metrics_lines": self.metrics.lines, "wall_s": self.wall()}
            if self.task.time_steps:
                state["timing"] = list(self.timing)
            if self.spikes is not None:
                state["spike_norms"] = json.dumps(self.spikes.norms())
            state["dropped"] = json.dumps([self.skipped, self.spikes.dropped if self.spikes is not None else 0])
            if self.task_state is not None:
                state["task_state"] = json.dumps(self.task_state)
            ck.save_checkpoint(self.run_dir / "checkpoints", self.step, self.model, state, self.meta)

    def time_up(self) -> bool:
        """Past ``time_limit_min``? (decided by process 0, so every process stops together)"""
        flag = torch.tensor([int(self.wall() > 60 * self.cfg.time_limit_min)])
        if self.info.enabled:
            import torch.distributed as dist

            dist.broadcast(flag, 0)
        return bool(flag.item())

    def _has_unused_parameters(self) -> bool:
        """Whether some parameter gets no gradient (e.g. the jump query of a NAM-TM without JUMP);
        DDP must then be told to look for unused parameters. RNG state is left untouched."""
        model = self.model
        rng = torch.get_rng_state()
        model.zero_grad(set_to_none=True)
        self.task.probe_loss(model, self.cfg, self.device).backward()
        unused = any(p.requires_grad and p.grad is None for p in model.parameters())
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        return unused


class StepTally:
    """The losses, statistics and gradient norms of training steps, kept on the device until
    they are read back together (:meth:`check`), so that a step costs no device-to-host sync.

    :meth:`add` stacks the step's scalars into one small tensor (a copy: a replayed CUDA
    graph overwrites its outputs at the next replay); :meth:`check` moves those kept since its
    last call to the host in one transfer, finds the first step whose loss or gradient norm is
    not finite and adds the others to the sums that :meth:`take` hands over.

    Steps whose update a :class:`~memnets.train.step_guard.DeviceGuard` dropped (its verdict
    given to :meth:`add`) are not summed: :meth:`take_dropped` lists them, the spikes and, with
    ``skip_non_finite`` (``optim.nan_policy = "skip"``), the non-finite steps, which otherwise
    :meth:`check` reports."""

    _TOLD = 3  # the guard's verdict, median and window size, after the loss and the norm

    def __init__(self, skip_non_finite: bool = False) -> None:
        self.skip_non_finite = skip_non_finite
        self.rows: list[tuple[int, tuple[str, ...], torch.Tensor]] = []
        self.sums: dict[str, float] = {}
        self.n = 0  # steps summed
        self.dropped: list[tuple[int, str, float, float, int]] = []

    def add(self, step: int, loss: torch.Tensor, stats: dict[str, Any], norm: torch.Tensor | None,
            told: torch.Tensor | None = None) -> None:
        """Keep step ``step``'s (1-based) ``loss``, ``stats`` (name → scalar tensor or number),
        total gradient ``norm`` (None: not checked) and ``told``, the verdict of
        :meth:`DeviceGuard.decide <memnets.train.step_guard.DeviceGuard.decide>` (None: none)."""
        dev = loss.device
        vals = [loss.detach(), norm.detach() if norm is not None else torch.zeros((), device=dev)]
        vals += list((told.detach() if told is not None else torch.zeros(self._TOLD, device=dev)).unbind())
        vals += [v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), device=dev)
                 for v in stats.values()]
        self.rows.append((step, tuple(stats), torch.stack([v.reshape(()).to(dev, torch.float64) for v in vals])))

    def check(self) -> tuple[int, str, int, int] | None:
        """Read the steps kept since the last call back: ``(step, "loss" | "gradient", n_nan,
        n_inf)`` for the first whose loss or gradient norm is not finite (and not dropped), else
        None (the others' values are then added to the sums)."""
        rows, self.rows = self.rows, []
        if not rows:
            return None
        flat = torch.cat([r[2] for r in rows]).cpu().tolist()  # the one sync
        at = 0
        for step, keys, t in rows:
            row, at = flat[at:at + t.numel()], at + t.numel()
            (loss, norm, verdict, median, n), row = row[:5], row[5:]
            if verdict == SPIKE:
                self.dropped.append((step, "spike", norm, median, int(n)))
                continue
            bad = next(((what, v) for what, v in (("loss", loss), ("gradient", norm)) if not math.isfinite(v)), None)
            if bad is not None:
                if self.skip_non_finite:
                    self.dropped.append((step, "non-finite", norm, median, int(n)))
                    continue
                return step, bad[0], int(math.isnan(bad[1])), int(math.isinf(bad[1]))
            for k, v in zip(("loss", "grad_norm", *keys), (loss, norm, *row)):
                self.sums[k] = self.sums.get(k, 0.0) + v
            self.sums["grad_norm_max"] = max(self.sums.get("grad_norm_max", 0.0), norm)
            self.n += 1
        return None

    def take(self) -> tuple[float, dict[str, float], int]:
        """The sums of the checked steps since the last call, ``(loss, {stat: sum}, steps)`` (with
        ``grad_norm``, and ``grad_norm_max`` the largest; ``steps`` summed), and forget them."""
        sums, self.sums, n, self.n = self.sums, {}, self.n, 0
        return sums.pop("loss", 0.0), sums, n

    def take_dropped(self) -> list[tuple[int, str, float, float, int]]:
        """The dropped steps read back since the last call, ``(step, "spike" | "non-finite", norm,
        median, n)`` (the median of the ``n`` norms the spike was judged against), and forget them."""
        dropped, self.dropped = self.dropped, []
        return dropped


def update(cfg: RunConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor,
           step: int, spikes: SpikeGuard | None = None) -> float | None:
    """One optimiser update from ``loss`` (``step``: 1-based, for messages): zero the gradients,
    backward, clip and check them (:func:`_finite_step`) and step ``opt``. Returns the total
    gradient norm before clipping, or None when ``optim.nan_policy = "skip"`` dropped the
    update, or ``spikes`` (``optim.spike_skip``) did (the gradients are then cleared)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = _finite_step(cfg, model, loss, step)
    if norm is not None and spikes is not None and not spikes.admits(norm):
        norm = None
    if norm is not None:
        opt.step()
        return norm
    opt.zero_grad(set_to_none=True)
    return None


def update_unchecked(cfg: RunConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                     loss: torch.Tensor, guard: DeviceGuard | None = None) -> torch.Tensor:
    """:func:`update` without reading anything back: zero the gradients, backward, clip them
    (``optim.grad_clip``) with their total norm, step ``opt``, and return that norm (a tensor)
    for the caller to check later (:class:`StepTally`). Without a ``guard`` a non-finite loss or
    gradient reaches the weights, and the caller stops the run before the next checkpoint; with
    one (attached to ``opt``) the guard judges the step first (its verdict: ``guard.told``) and
    the fused ``opt`` leaves a dropped step's weights as they were."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = _clip_gradients(cfg, model)
    if guard is not None:
        guard.decide(loss, norm)
    opt.step()
    return norm


def _gradient_norm(model: torch.nn.Module, exact: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The parameters that have a gradient, and the total norm of their gradients (a tensor).

    ``exact``: the squares are summed in float64 (float32 on MPS, which has no float64). An
    exploding recurrence (the NTM's location addressing over a hundred steps, say) gives finite
    float32 gradients of 1e19 and more, whose float32 sum of squares overflows to inf, which would
    zero the clipping factor and stop the run as if a gradient were non-finite; in float64 the norm
    is finite and clipping scales that step to ``optim.grad_clip``. A NaN or inf gradient still
    gives a non-finite norm. Otherwise the sum is in the gradients' dtype, which on the CPU is
    10-20 times faster (a float64 multi-tensor norm does not vectorise there): for callers that
    read the norm back anyway and can take the exact one when this one is not finite."""
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad for p in params]
    if not exact and hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return params, torch.nn.utils.get_total_norm(grads)
    if not grads:
        return params, torch.tensor(0.0, dtype=torch.float64 if exact else torch.float32)
    dev = grads[0].device
    acc = torch.float64 if exact and dev.type != "mps" else None
    try:  # one multi-tensor reduction per device and dtype
        norms = torch._foreach_norm(grads, 2.0, dtype=acc)
    except (AttributeError, TypeError, RuntimeError):  # releases without the dtype argument
        norms = [torch.linalg.vector_norm(g, dtype=acc) for g in grads]
    return params, torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))


def _clip_with_norm(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients of ``params`` by ``min(1, max_norm / (norm + 1e-6))`` in place, the
    factor left on the device (``torch.nn.utils.clip_grads_with_norm_``, its own form before
    torch 2.6)."""
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))


def _clip_gradients(cfg: RunConfig, model: torch.nn.Module) -> torch.Tensor:
    """Clip the gradients to ``optim.grad_clip`` (0: leave them) by their total norm, which is
    returned unread."""
    params, norm = _gradient_norm(model)
    if cfg.optim.grad_clip > 0:
        _clip_with_norm(params, cfg.optim.grad_clip, norm)
    return norm


def _finite_step(cfg: RunConfig, model: torch.nn.Module, loss: torch.Tensor, step: int) -> float | None:
    """Clip the gradients (``optim.grad_clip``) and return their total norm before clipping, or
    None where the update may not be applied.

    Costs one ``isfinite`` of the loss and the gradient norm that clipping needs anyway; the
    per-tensor scan (:func:`~memnets.train.nan_guard.check_finite`) runs only when the loss or
    the norm is non-finite. With ``optim.nan_policy = "raise"`` a non-finite loss or gradient
    raises :class:`~memnets.train.nan_guard.NonFiniteError` naming ``step`` (1-based) and the
    first non-finite tensor; with ``"skip"`` this returns None and the gradients are left
    unclipped for the caller to drop.
    """
    policy = cfg.optim.nan_policy
    if not bool(torch.isfinite(loss.detach())):
        check_finite(loss, None, step, policy=policy)  # raises under "raise"
        return None
    params, norm = _gradient_norm(model, exact=False)
    value = float(norm)  # the step's one read-back of the norm
    if not math.isfinite(value):
        params, norm = _gradient_norm(model)  # finite gradients may overflow a float32 sum of squares
        value = float(norm)
    if not math.isfinite(value):
        if policy == "skip":
            return None
        found = first_non_finite(None, ((n, p) for n, p in model.named_parameters() if p.grad is not None))
        if found is None:  # finite tensors whose squared sum overflows
            raise NonFiniteError(step, "total gradient norm", "gradient", 0, 1)
        raise NonFiniteError(step, *found)
    if cfg.optim.grad_clip > 0:
        _clip_with_norm(params, cfg.optim.grad_clip, norm)
    return value
