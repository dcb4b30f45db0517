"""Learning curves from ``metrics.jsonl`` for one or several runs.

Two record formats are read:

* the training engine's (:mod:`memnets.train.loop`): ``{"kind": "train", "step", "loss",
  "tok_acc", ...}`` and ``{"kind": "eval", "step", "epoch", "splits": {name: {"seq_acc", ...}}}``;
* plain step records such as ``{"step", "cost_bits", ...}`` (no ``kind``: each one a training record).

A training curve is drawn from ``loss`` (else ``cost_bits``) against ``step``; an evaluation
panel (the task's metric per split against step: sequence accuracy for the algorithmic
tasks, ``results.json``'s ``metric`` for the others) is added when eval records hold it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .plotting import grid_figure

__all__ = ["read_metrics", "plot_learning_curves", "train_curve", "eval_curves"]

_LOSS_KEYS = ("loss", "cost_bits")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl`` (a path to the file itself also works).

    Raises FileNotFoundError when there is no such file; a truncated last line is skipped.
    """
    p = Path(run_dir)
    path = p if p.is_file() else p / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {p}")
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(record, dict):  # anything else is not a record
            out.append(record)
    return out


def train_curve(records: Sequence[dict]) -> tuple[str, list[float], list[float]] | None:
    """``(metric name, steps, values)`` of the training loss (or cost), or None if absent."""
    for key in _LOSS_KEYS:
        pts = [(r["step"], r[key]) for r in records
               if r.get("kind", "train") == "train" and key in r and "step" in r]
        if pts:
            return key, [float(s) for s, _ in pts], [float(v) for _, v in pts]
    return None


def eval_curves(records: Sequence[dict], metric: str = "seq_acc") -> dict[str, tuple[list[float], list[float]]]:
    """``{split: (steps, values)}`` of ``metric`` from the eval records."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for r in records:
        if r.get("kind") != "eval":
            continue
        for split, m in (r.get("splits") or {}).items():
            if isinstance(m, dict) and metric in m:
                xs, ys = out.setdefault(split, ([], []))
                xs.append(float(r.get("step", r.get("epoch", len(xs)))))
                ys.append(float(m[metric]))
    return out


_METRIC_NAMES = {"seq_acc": "sequence accuracy", "accuracy": "accuracy", "bit_errors": "bit errors per sequence"}


def plot_learning_curves(runs, *, title: str | None = None, log_loss: bool = True, metric: str = "seq_acc") -> Figure:
    """Training loss and the evaluation ``metric`` (default: sequence accuracy) against optimiser step.

    Args:
        runs: a run directory, a list of them, or ``{label: records}`` (records as returned by
            :func:`read_metrics`).
        log_loss: log scale for the loss axis (when every value is positive and they span
            more than a factor 20).
        metric: the key of the evaluation metrics drawn in the second panel (the run's
            ``results.json`` ``metric``, e.g. ``accuracy`` or ``bit_errors``).
    Returns a Figure with 1 panel (loss) or 2 (loss, the eval metric), one line per run (and
    split). Raises ValueError when no run has a training curve.
    """
    if isinstance(runs, (str, Path)):
        runs = [runs]
    if not isinstance(runs, dict):
        runs = {Path(r).name: read_metrics(r) for r in runs}
    curves = {name: train_curve(recs) for name, recs in runs.items()}
    evals = {name: eval_curves(recs, metric) for name, recs in runs.items()}
    if not any(curves.values()):
        raise ValueError("no training records (loss or cost_bits against step) in " + ", ".join(map(str, runs)))
    has_eval = any(evals.values())
    fig, axes = grid_figure(1, 2 if has_eval else 1, panel_w=4.2, panel_h=2.8, title=title)
    ax = axes[0]
    keys = set()
    lo, hi = float("inf"), 0.0
    for name, c in curves.items():
        if c:
            key, xs, ys = c
            keys.add(key)
            lo, hi = min(lo, min(ys)), max(hi, max(ys))
            # a run with one training record is a point, drawn as a marker (a line of one point is invisible)
            ax.plot(xs, ys, label=name, lw=1.3, marker="o" if len(xs) == 1 else None, ms=5)
    key = "/".join(sorted(keys))
    ax.set_title(f"training {key}")
    ax.set_xlabel("optimiser step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # steps are whole numbers
    ax.set_ylabel(key + (" (bits per sequence)" if key == "cost_bits" else ""))
    if log_loss and lo > 0 and hi / lo > 20:  # log scale only when the loss spans decades
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if has_eval:
        ax = axes[1]
        many = len(runs) > 1
        for name, splits in evals.items():
            for split, (xs, ys) in splits.items():
                ax.plot(xs, ys, marker="o", ms=3, lw=1.2, label=f"{name}: {split}" if many else split)
        label = _METRIC_NAMES.get(metric, metric)
        ax.set_title(f"evaluation {label}")
        ax.set_xlabel("optimiser step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.set_ylabel(label)
        if all(0.0 <= y <= 1.0 for splits in evals.values() for _, ys in splits.values() for y in ys):
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig
