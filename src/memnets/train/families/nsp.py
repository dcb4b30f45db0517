"""The masked-completion algorithmic tasks as engine tasks (fib, addition, palindrome, reduce;
:mod:`memnets.tasks.nsp`, docs/maths.md §12).

Model: :class:`~memnets.models.seq.SequenceTaskModel` ``(model.backbone, d_model, **options)``.
Loss: cross-entropy over every window position. Data: ``task.train_size`` samples per epoch
with ``task.train_digits`` digits (fresh each epoch unless ``task.fresh_each_epoch`` is
false), drawn from (seed, epoch); evaluation splits ``task.splits`` (digit ranges) of
``task.eval_size`` samples each, independent of the seed. Metrics per split: ``seq_acc``,
``tok_acc``, ``ans_acc``, ``loss``, ``n``. Selection: :func:`selection_key`.

``results.json`` keys: ``name``, ``task``, ``backbone``, ``params``, ``select_split``,
``selected_by``, ``selection_decided_by``, ``best_epoch``, ``splits`` (``{split: metrics}`` at
the selected epoch), ``final`` (the last evaluation), ``epochs``, ``stopped_by_time_limit``,
``steps``, ``wall_s``, ``world_size``. ``memnets table`` prints them shaped like the NAM
paper's Table 1.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from ...tasks.nsp import TASKS, VOCAB_SIZE, NSPBatch, make_split, sequence_metrics, window_width
from ..data import batch_indices, derive_seed, epoch_order
from ..env import DistInfo
from ..task import RunSummary, Task, updates_dropped
from ._common import all_reduce_sum, decided_by_part

__all__ = ["NSPTask", "evaluate", "slot_accuracy", "selection_key", "selection_rule", "train_epoch_data", "eval_splits"]


def train_epoch_data(cfg, epoch: int) -> NSPBatch:
    """The ``task.train_size`` training samples of ``epoch`` (the same set every epoch when
    ``task.fresh_each_epoch`` is false). Window width: ``window_width(task, train_digits[1])``."""
    lo, hi = cfg.task.train_digits
    e = epoch if cfg.task.fresh_each_epoch else 0
    return make_split(cfg.task.name, lo, hi, cfg.task.train_size, derive_seed(cfg.seed, "train", e),
                      window_width(cfg.task.name, hi))


def eval_splits(cfg, draw: int = 0) -> dict[str, NSPBatch]:
    """Every split of ``task.splits`` with ``task.eval_size`` samples (independent of ``seed``).

    ``draw`` 0 is the draw every run is evaluated (and its model selected) on; another ``draw``
    gives splits of the same digit ranges drawn independently of it, to score a selected model
    on samples that took no part in selecting it (``memnets eval --draw``)."""
    if not isinstance(draw, int) or isinstance(draw, bool) or draw < 0:
        raise ValueError(f"`draw` expected an integer >= 0, got {draw!r}")
    salt = () if draw == 0 else ("draw", draw)
    return {name: make_split(cfg.task.name, lo, hi, cfg.task.eval_size, derive_seed("eval", cfg.task.name, name, *salt))
            for name, (lo, hi) in cfg.task.splits.items()}


def selection_key(splits: dict[str, dict], select_split: str = "od_easy", tiebreak: str = "id") -> tuple:
    """The key that ranks an evaluation (``{split: evaluate(...)}``) for model selection.

    Higher is better, compared in order: (1) the ``select_split`` (OD-easy) sequence accuracy;
    (2) on a tie, including every evaluation scoring 0 there, the ``tiebreak`` (ID) sequence
    accuracy, so an epoch that learnt something in distribution beats an untrained one;
    (3) then the lower ``select_split`` validation loss (stored negated; an evaluation without
    a loss ranks last). Evaluations equal in all three are ordered by ``select_ties``
    (:func:`memnets.train.loop.selects`): the first one stays, or the last one wins with ``"last"``.
    """
    sel = splits[select_split]
    tb = splits.get(tiebreak, {}).get("seq_acc", 0.0)
    loss = sel.get("loss")
    return (sel["seq_acc"], tb, -loss if loss is not None and math.isfinite(loss) else -math.inf)


def selection_rule(select_split: str = "od_easy", ties: str = "first", tiebreak: str = "id") -> str:
    """The rule of :func:`selection_key` in words, as recorded in ``results.json`` (``selected_by``)."""
    return (f"{select_split} seq_acc, ties by {tiebreak} seq_acc then {select_split} loss, "
            f"then the {ties} evaluation")


def _tie_level(evals: list[dict], chosen: tuple, select_split: str) -> str:
    """Which part of :func:`selection_key` singled out the chosen evaluation among ``evals``."""
    return decided_by_part([selection_key(e, select_split) for e in evals], chosen,
                           (f"{select_split} seq_acc", "id seq_acc", f"{select_split} loss"))


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
    tot = all_reduce_sum(tot, info, device)
    c = dict(zip(keys, tot.tolist()))
    model.train(was)
    return {"seq_acc": c["seq_correct"] / max(c["n"], 1), "tok_acc": c["tok_correct"] / max(c["tok_total"], 1),
            "ans_acc": c["ans_correct"] / max(c["ans_total"], 1), "loss": c["loss_sum"] / max(c["tok_total"], 1),
            "n": int(c["n"])}


@torch.no_grad()
def slot_accuracy(model: torch.nn.Module, batch, *, batch_size: int = 256) -> list[tuple[float, int]]:
    """Accuracy of each answer slot of ``batch`` (an ``NSPBatch``): entry ``k`` is
    ``(accuracy, count)`` over the samples' ``k``-th ``MASK`` position (for Fib the k-th least
    significant digit of the sum; slot k exists in samples with more than k answer slots).
    Which slots a model gets wrong tells a model that cannot find an operand (its first
    slots wrong) from one that drifts over long answers (its middle slots): docs/fib.md."""
    from ...tasks.nsp import MASK

    was = model.training
    model.eval()
    correct: list[int] = []
    count: list[int] = []
    for i in range(0, batch.inputs.shape[0], batch_size):
        x, y = batch.inputs[i:i + batch_size], batch.targets[i:i + batch_size]
        pred = model(x).argmax(-1)
        mask = x == MASK
        slot = mask.long().cumsum(1) - 1  # k at the k-th MASK of each row
        hit = (pred == y) & mask
        for k in range(int(mask.sum(1).max()) if mask.any() else 0):
            at = mask & (slot == k)
            if len(correct) <= k:
                correct.append(0)
                count.append(0)
            correct[k] += int((hit & at).sum())
            count[k] += int(at.sum())
    model.train(was)
    return [(c / n if n else float("nan"), n) for c, n in zip(correct, count)]


class NSPTask(Task):
    """fib, addition, palindrome or reduce (``task.name``); see the module docstring."""

    family = "nsp"
    metric = "seq_acc"

    def validate(self, cfg) -> None:
        from ..config import ConfigError

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
        if cfg.task.options:
            raise ConfigError(f"`task.options` is not used by the {self.name!r} task, got {dict(cfg.task.options)}")

    def build_model(self, cfg) -> torch.nn.Module:
        from ...models.seq import SequenceTaskModel

        return SequenceTaskModel(cfg.model.backbone, vocab_size=VOCAB_SIZE, d_model=cfg.model.d_model,
                                 **cfg.model.options)

    def probe_loss(self, model, cfg, device):
        return model(torch.full((2, 8), 0, dtype=torch.long, device=device)).float().sum()

    def train_data(self, cfg, epoch: int) -> tuple[NSPBatch, torch.Tensor]:
        return train_epoch_data(cfg, epoch), epoch_order(cfg, epoch)

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        batch, order = data
        idx = batch_indices(order, b, cfg.batch_size, rank, world)
        return batch.inputs[idx], batch.targets[idx]

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        x, y = batch[0].to(device), batch[1].to(device)
        with autocast():
            logits = net(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))  # [B*W, V]
        return loss, lambda: {"tok_acc": (logits.detach().argmax(-1) == y).float().mean()}

    def eval_splits(self, cfg) -> dict[str, NSPBatch]:
        return eval_splits(cfg)

    def sample(self, cfg, seed: int = 0, split: str | None = None) -> torch.Tensor:
        """Token ids ``[1, W]`` of one sample of ``split`` (default ``"id"`` when the run has it,
        else the training digits)."""
        splits = cfg.task.splits
        name = split or ("id" if "id" in splits else None)
        if name is not None and name not in splits:
            raise ValueError(f"`split` expected one of {sorted(splits)}, got {name!r}")
        lo, hi = splits[name] if name else cfg.task.train_digits
        return make_split(cfg.task.name, int(lo), int(hi), 1, seed).inputs

    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        return evaluate(model, data, batch_size=max(cfg.batch_size, 256), device=device, info=info,
                        autocast=autocast)

    def selection_key(self, evals, cfg) -> tuple:
        return selection_key(evals, cfg.select_split)

    def selection_rule(self, cfg) -> str:
        return selection_rule(cfg.select_split, cfg.select_ties)

    def decided_by(self, evals, chosen, cfg):
        return _tie_level(evals, chosen, cfg.select_split)

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        return {"name": s.name, "task": cfg.task.name, "backbone": cfg.model.backbone, "params": s.params,
                "select_split": cfg.select_split, "selected_by": self.selection_rule(cfg),
                "selection_decided_by": s.decided_by, "best_epoch": s.best["epoch"], "splits": s.best["splits"],
                "final": s.final, "epochs": s.epochs, "stopped_by_time_limit": s.stopped_by_time_limit,
                "steps": s.steps, "wall_s": s.wall_s, "world_size": s.world_size,
                "updates_dropped": updates_dropped(s.records)}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        from ...cli.table import format_table1

        return format_table1(results, metric or "seq_acc")


assert set(TASKS) == {"fib", "addition", "palindrome", "reduce"}
