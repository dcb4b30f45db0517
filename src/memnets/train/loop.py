"""The training loop for the masked-completion tasks (docs/maths.md §12).

AdamW, per-epoch learning-rate decay (lr × 0.98 per epoch by default), global-norm gradient
clipping, bf16 autocast on CUDA only, cross-entropy over every window position, evaluation
of every split each ``eval_every`` epochs, and the reported epoch chosen by the best
``select_split`` (OD-easy) sequence accuracy, ties broken by the ID sequence accuracy, then by
the lower ``select_split`` loss, then by ``select_ties`` (:func:`selection_key`). Writes ``runs/<name>/``::

    config.json      resolved config          env.json       where it ran
    metrics.jsonl    one JSON record per log  results.json   figures at the selected epoch
    checkpoints/     last.json → step-N.{safetensors,state.pt}; best.safetensors

``resume=True`` continues exactly: the data of an epoch and its order are functions of
(seed, epoch), and the checkpoint carries the optimiser, the RNG states and the position
inside the epoch. Under ``torchrun`` each process takes a strided shard of every global
batch and DistributedDataParallel averages the gradients.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..tasks.nsp import VOCAB_SIZE, sequence_metrics
from . import checkpoint as ck
from .config import ConfigError, RunConfig, config_from_dict, config_to_dict, flatten
from .data import batch_indices, epoch_order, eval_splits, train_epoch_data
from .nan_guard import NonFiniteError, check_finite, first_non_finite
from .env import DistInfo, cleanup_distributed, resolve_device, run_env, setup_distributed

__all__ = ["train", "build_model", "evaluate", "lr_factor", "selects", "selection_key", "selection_rule",
           "RunExistsError"]


class RunExistsError(ConfigError):
    """The run directory already holds a run and ``resume`` was not asked for."""


def build_model(cfg: RunConfig) -> torch.nn.Module:
    """The :class:`~memnets.models.seq.SequenceTaskModel` described by ``cfg.model``."""
    from ..models.seq import SequenceTaskModel

    return SequenceTaskModel(cfg.model.backbone, vocab_size=VOCAB_SIZE, d_model=cfg.model.d_model,
                             **cfg.model.options)


def lr_factor(cfg: RunConfig, epoch: int, step: int, total_steps: int) -> float:
    """Multiplier of ``optim.lr`` at global ``step`` (0-based) in ``epoch`` (0-based)."""
    s = cfg.schedule
    if s.kind == "exp":
        f = s.gamma ** epoch
    elif s.kind == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * min(step / max(total_steps, 1), 1.0)))
    else:
        f = 1.0
    if s.warmup_steps and step < s.warmup_steps:
        f *= (step + 1) / s.warmup_steps
    return f


def selection_key(splits: dict[str, dict], select_split: str = "od_easy", tiebreak: str = "id") -> tuple:
    """The key that ranks an evaluation (``{split: evaluate(...)}``) for model selection.

    Higher is better, compared in order: (1) the ``select_split`` (OD-easy) sequence accuracy;
    (2) on a tie, including every evaluation scoring 0 there, the ``tiebreak`` (ID) sequence
    accuracy, so an epoch that learnt something in distribution beats an untrained one;
    (3) then the lower ``select_split`` validation loss (stored negated; an evaluation without
    a loss ranks last). Evaluations equal in all three are ordered by ``select_ties``
    (:func:`selects`): the first one stays, or the last one wins with ``"last"``.
    """
    sel = splits[select_split]
    tb = splits.get(tiebreak, {}).get("seq_acc", 0.0)
    loss = sel.get("loss")
    return (sel["seq_acc"], tb, -loss if loss is not None and math.isfinite(loss) else -math.inf)


def selection_rule(select_split: str = "od_easy", ties: str = "first", tiebreak: str = "id") -> str:
    """The rule of :func:`selection_key` in words, as recorded in ``results.json`` (``selected_by``)."""
    return (f"{select_split} seq_acc, ties by {tiebreak} seq_acc then {select_split} loss, "
            f"then the {ties} evaluation")


def selects(score, best, ties: str = "first") -> bool:
    """Whether an evaluation scoring ``score`` replaces the reported one scoring ``best``: a
    higher score always does; an equal one only with ``ties = "last"``.

    Scores are numbers or :func:`selection_key` tuples (compared element by element).
    """
    return score > best or (ties == "last" and score == best)


def _tie_level(evals: list[dict], chosen: tuple, select_split: str) -> str:
    """Which part of :func:`selection_key` singled out the chosen evaluation among ``evals``."""
    keys = [selection_key(e, select_split) for e in evals]
    for i, what in enumerate((f"{select_split} seq_acc", "id seq_acc", f"{select_split} loss")):
        if sum(k[:i + 1] == chosen[:i + 1] for k in keys) == 1:
            return what
    return "select_ties"


def _autocast(cfg: RunConfig, device: torch.device):
    """bf16 autocast for ``amp = "bf16"`` (CPU or CUDA) and for ``"auto"`` on CUDA; else none.
    The recurrences with hand-written loops run in float32 inside it (memnets.ops._amp)."""
    use = cfg.amp == "bf16" or (cfg.amp == "auto" and device.type == "cuda")
    if use and device.type in ("cuda", "cpu"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _all_reduce(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        import torch.distributed as dist

        dist.all_reduce(t)
    return t


@torch.no_grad()
def evaluate(model: torch.nn.Module, batch, *, batch_size: int = 256, device: torch.device | str = "cpu",
             info: DistInfo = DistInfo(), autocast=contextlib.nullcontext) -> dict[str, float]:
    """Sequence / token / answer-slot accuracy of ``model`` on ``batch`` (an ``NSPBatch``).

    Returns ``{"seq_acc", "tok_acc", "ans_acc"}`` in [0, 1], ``"loss"`` (the training loss:
    cross-entropy averaged over every window position) and ``"n"`` (samples). Under DDP every
    process scores a strided shard and the counts are summed.
    """
    was = model.training
    model.eval()
    idx = torch.arange(batch.inputs.shape[0])[info.rank::info.world]
    keys = ("seq_correct", "tok_correct", "tok_total", "ans_correct", "ans_total", "n", "loss_sum")
    tot = torch.zeros(len(keys), dtype=torch.float64)
    for i in range(0, idx.numel(), batch_size):
        j = idx[i:i + batch_size]
        x, y = batch.inputs[j].to(device), batch.targets[j].to(device)
        with autocast():
            logits = model(x)
        m = sequence_metrics(logits.float(), x, y)
        m["loss_sum"] = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        tot += torch.tensor([float(m[k]) for k in keys], dtype=torch.float64)
    tot = _all_reduce(tot.to(device), info).cpu()
    c = dict(zip(keys, tot.tolist()))
    model.train(was)
    return {"seq_acc": c["seq_correct"] / max(c["n"], 1), "tok_acc": c["tok_correct"] / max(c["tok_total"], 1),
            "ans_acc": c["ans_correct"] / max(c["ans_total"], 1), "loss": c["loss_sum"] / max(c["tok_total"], 1),
            "n": int(c["n"])}


class _Metrics:
    """Append-only ``metrics.jsonl`` (main process only), truncatable to a checkpoint's length."""

    def __init__(self, path: Path, enabled: bool, keep_lines: int | None) -> None:
        self.path, self.enabled, self.lines = path, enabled, 0
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
    try:
        if lock:
            lock.acquire()
        return _train(cfg, run_dir, info, resume=resume, quiet=quiet, on_epoch=on_epoch)
    finally:
        if lock:
            lock.release()
        cleanup_distributed(info)


def _finite_step(cfg: RunConfig, model: torch.nn.Module, loss: torch.Tensor, step: int) -> bool:
    """Clip the gradients (``optim.grad_clip``) and say whether the update may be applied.

    Costs one ``isfinite`` of the loss and the gradient norm that clipping needs anyway; the
    per-tensor scan (:func:`~memnets.train.nan_guard.check_finite`) runs only when the loss or
    the norm is non-finite. With ``optim.nan_policy = "raise"`` a non-finite loss or gradient
    raises :class:`~memnets.train.nan_guard.NonFiniteError` naming ``step`` (1-based) and the
    first non-finite tensor; with ``"skip"`` this returns False and the gradients are left
    unclipped for the caller to drop.
    """
    policy = cfg.optim.nan_policy
    if not bool(torch.isfinite(loss.detach())):
        return check_finite(loss, None, step, policy=policy)
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if not bool(torch.isfinite(norm)):
        found = first_non_finite(None, ((n, p) for n, p in model.named_parameters() if p.grad is not None))
        if policy == "skip":
            return False
        if found is None:  # finite tensors whose squared sum overflows
            raise NonFiniteError(step, "total gradient norm", "gradient", 0, 1)
        raise NonFiniteError(step, *found)
    if cfg.optim.grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, cfg.optim.grad_clip, norm)
    return True


def _has_unused_parameters(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> bool:
    """Whether some parameter gets no gradient (e.g. the jump query of a NAM-TM without JUMP);
    DDP must then be told to look for unused parameters. RNG state is left untouched."""
    rng = torch.get_rng_state()
    x = torch.full((2, 8), 0, dtype=torch.long, device=device)
    model.zero_grad(set_to_none=True)
    model(x).float().sum().backward()
    unused = any(p.requires_grad and p.grad is None for p in model.parameters())
    model.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    return unused


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
        old = flatten(config_to_dict(saved))
        new = flatten(config_to_dict(cfg))
        free = {"time_limit_min", "tensorboard", "threads", "description"}  # may change on resume
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in free)
        if diff:
            raise ConfigError(f"cannot resume {run_dir}: config differs in {', '.join(diff)}")
    return resume and ck.has_checkpoint(run_dir / "checkpoints")


def _train(cfg, run_dir: Path, info: DistInfo, *, resume, quiet, on_epoch) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device, info)
    has_ckpt = _check_run_dir(cfg, run_dir, resume) if info.is_main else False
    if info.enabled:
        import torch.distributed as dist

        flag = torch.tensor([int(has_ckpt)])
        dist.broadcast(flag, 0)
        has_ckpt = bool(flag.item())
    torch.manual_seed(cfg.seed)  # identical initial weights in every process
    model = build_model(cfg).to(device)
    from ..registry import count_parameters

    n_params = count_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                            weight_decay=cfg.optim.weight_decay)
    meta = {"model_config": json.dumps(config_to_dict(cfg.model)), "task": cfg.task.name}
    step = epoch = batch0 = 0
    wall_before = 0.0
    best: dict[str, Any] = {"score": -1.0, "epoch": None, "splits": None}
    keep_lines = None
    if has_ckpt:
        st = ck.load_checkpoint(run_dir / "checkpoints", model)
        opt.load_state_dict(st["optimizer"])
        torch.set_rng_state(st["rng_cpu"])
        if torch.cuda.is_available() and st.get("rng_cuda") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(st["rng_cuda"], device)
        step, epoch, batch0 = int(st["step"]), int(st["epoch"]), int(st["batch"])
        wall_before, best, keep_lines = float(st["wall_s"]), json.loads(st["best"]), int(st["metrics_lines"])
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ck.atomic_write_text(run_dir / "config.json", json.dumps(config_to_dict(cfg), indent=2))
        env = run_env(device, info.world)
        ac = _autocast(cfg, device)
        env.update(params=n_params, resumed_from_step=step if has_ckpt else None,
                   autocast=str(ac.fast_dtype).replace("torch.", "") if isinstance(ac, torch.autocast) else None)
        ck.atomic_write_text(run_dir / "env.json", json.dumps(env, indent=2))
    metrics = _Metrics(run_dir / "metrics.jsonl", info.is_main, keep_lines)
    tb = None
    if cfg.tensorboard and info.is_main:
        try:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(run_dir / "tb"))
        except ImportError:
            print("tensorboard is not installed; skipping TensorBoard logs", file=sys.stderr)
    net = model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  find_unused_parameters=_has_unused_parameters(model, cfg, device))
    splits = eval_splits(cfg)
    nb = cfg.task.train_size // cfg.batch_size
    total = nb * cfg.epochs
    autocast = lambda: _autocast(cfg, device)  # noqa: E731
    bar_off = quiet or not info.is_main or not sys.stderr.isatty()
    t_start = time.perf_counter()

    def wall() -> float:
        return wall_before + time.perf_counter() - t_start

    def save(ep: int, b: int) -> None:
        if info.is_main:
            state = {"step": step, "epoch": ep, "batch": b, "optimizer": opt.state_dict(),
                     "rng_cpu": torch.get_rng_state(),
                     "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                     "best": json.dumps(best), "metrics_lines": metrics.lines, "wall_s": wall()}
            ck.save_checkpoint(run_dir / "checkpoints", step, model, state, meta)

    def time_up() -> bool:
        """Past ``time_limit_min``? (decided by process 0, so every process stops together)"""
        flag = torch.tensor([int(wall() > 60 * cfg.time_limit_min)])
        if info.enabled:
            import torch.distributed as dist

            dist.broadcast(flag, 0)
        return bool(flag.item())

    def run_eval(ep: float) -> None:
        nonlocal best
        res = {name: evaluate(model, s, batch_size=max(cfg.batch_size, 256), device=device, info=info,
                              autocast=autocast) for name, s in splits.items()}
        rec = {"kind": "eval", "epoch": ep, "step": step, "splits": res, "wall_s": wall()}
        metrics.write(rec)
        score = res[cfg.select_split]["seq_acc"]
        key = selection_key(res, cfg.select_split)
        old = selection_key(best["splits"], cfg.select_split) if best["splits"] else (-1.0,)
        if selects(key, old, cfg.select_ties):
            best = {"score": score, "epoch": ep, "splits": res}
            if info.is_main:
                ck.save_weights(run_dir / "checkpoints" / "best.safetensors", model, meta)
        if tb:
            for name, m in res.items():
                tb.add_scalar(f"{name}/seq_acc", m["seq_acc"], step)
        if info.is_main and not quiet:
            parts = " ".join(f"{n} {m['seq_acc']:.3f}" for n, m in res.items())
            print(f"[{cfg.name}] epoch {ep}/{cfg.epochs} step {step} seq_acc: {parts} ({wall():.0f}s)",
                  file=sys.stderr, flush=True)
        if on_epoch:
            on_epoch(rec)

    partial = False
    skipped = 0  # updates dropped by optim.nan_policy = "skip" in this process's run
    model.train()
    while epoch < cfg.epochs:
        data, order = train_epoch_data(cfg, epoch), epoch_order(cfg, epoch)
        bar = _progress(nb, batch0, f"epoch {epoch + 1}/{cfg.epochs}", bar_off)
        acc_loss = acc_tok = 0.0
        acc_n = 0
        partial = False
        t_log = time.perf_counter()
        for b in range(batch0, nb):
            idx = batch_indices(order, b, cfg.batch_size, info.rank, info.world)
            x, y = data.inputs[idx].to(device), data.targets[idx].to(device)
            lr = cfg.optim.lr * lr_factor(cfg, epoch, step, total)
            for g in opt.param_groups:
                g["lr"] = lr
            with autocast():
                logits = net(x)
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))  # [B*W, V]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if _finite_step(cfg, model, loss, step + 1):
                opt.step()
                acc_loss += float(loss.detach())
                acc_tok += float((logits.detach().argmax(-1) == y).float().mean())
                acc_n += 1
            else:  # nan_policy = "skip": drop this update, keep the batch position
                opt.zero_grad(set_to_none=True)
                skipped += 1
                if info.is_main and not quiet:
                    print(f"[{cfg.name}] step {step + 1}: non-finite loss or gradient, update skipped",
                          file=sys.stderr, flush=True)
            step += 1
            if step % cfg.log_every == 0 or b == nb - 1:
                stats = _all_reduce(torch.tensor([acc_loss, acc_tok], dtype=torch.float64, device=device), info)
                stats = (stats.cpu() / (max(acc_n, 1) * info.world)).tolist()
                sps = acc_n * cfg.batch_size / max(time.perf_counter() - t_log, 1e-9)
                rec = {"kind": "train", "epoch": epoch, "step": step, "loss": stats[0], "tok_acc": stats[1],
                       "lr": lr, "samples_per_s": sps}
                if skipped:
                    rec["skipped_steps"] = skipped
                metrics.write(rec)
                if tb:
                    tb.add_scalar("train/loss", stats[0], step)
                bar.set_postfix(loss=f"{stats[0]:.4f}", acc=f"{stats[1]:.3f}", sps=f"{sps:.0f}")
                acc_loss = acc_tok = 0.0
                acc_n = 0
                t_log = time.perf_counter()
            bar.update(1)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and b < nb - 1:
                save(epoch, b + 1)
            if cfg.time_limit_min and b < nb - 1 and time_up():
                partial = True
                break
        bar.close()
        batch0 = 0
        if partial:  # time limit inside the epoch: checkpoint here, score the model, stop
            save(epoch, b + 1)
            run_eval(round(epoch + (b + 1) / nb, 3))
            if info.is_main and not quiet:
                print(f"[{cfg.name}] stopped at step {step} (epoch {epoch + (b + 1) / nb:.2f}): "
                      f"time limit {cfg.time_limit_min} min", file=sys.stderr, flush=True)
            break
        epoch += 1
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            run_eval(epoch)
        save(epoch, 0)
        if cfg.time_limit_min and epoch < cfg.epochs and time_up():
            if epoch % cfg.eval_every:
                run_eval(epoch)  # score the model we stop with
            if info.is_main and not quiet:
                print(f"[{cfg.name}] stopping after epoch {epoch}: time limit {cfg.time_limit_min} min",
                      file=sys.stderr, flush=True)
            break
    metrics.close()
    if tb:
        tb.close()
    evals = [r["splits"] for r in metrics.records if r["kind"] == "eval"] if info.is_main else []
    last = evals[-1] if evals else None
    decided = _tie_level(evals, selection_key(best["splits"], cfg.select_split), cfg.select_split) \
        if evals and best["splits"] else None
    results = {"name": cfg.name, "task": cfg.task.name, "backbone": cfg.model.backbone, "params": n_params,
               "select_split": cfg.select_split, "selected_by": selection_rule(cfg.select_split, cfg.select_ties),
               "selection_decided_by": decided, "best_epoch": best["epoch"], "splits": best["splits"],
               "final": last, "epochs": epoch, "stopped_by_time_limit": partial or epoch < cfg.epochs,
               "steps": step, "wall_s": wall(), "world_size": info.world}
    if info.is_main:
        ck.atomic_write_text(run_dir / "results.json", json.dumps(results, indent=2))
    return results
