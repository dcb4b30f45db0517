"""Seeing inside the memories: figures of weightings, tapes, gates, attention maps, recall maps
and learning curves (matplotlib, rendered with Agg; no pyplot state is used).

Plots take one sample's arrays (:mod:`memnets.viz.plotting`); traces come from the models'
``return_aux`` records (:mod:`memnets.viz.trace`); :mod:`memnets.viz.runs` rebuilds a trained
model from its run directory and picks the figures that fit it; :mod:`memnets.viz.report`
writes one self-contained HTML page for several runs.

Example::

    from memnets.viz import quick_figures, write_figures
    paths = write_figures(quick_figures("ntm"), "figures/ntm")   # {"weightings": Path(...)}
"""
from __future__ import annotations

from .attention_maps import attention_map, collect_attention_maps
from .curves import eval_curves, plot_learning_curves, read_metrics, train_curve
from .plotting import (heatmap, plot_attention_maps, plot_dnc_memory, plot_gates, plot_read_write,
                       plot_recall, plot_tape_heads, save_figure, to_numpy)
from .report import build_report, results_row
from .runs import (QUICK_MODELS, LoadedRun, RunDirError, load_run, model_figures, quick_figures, quick_model,
                   run_figures, run_sample, write_figures)
from .trace import aux_to_dict, collect_lsam_gates, lsam_gates, memory_kind, memory_trace

__all__ = [
    "attention_map", "collect_attention_maps", "eval_curves", "plot_learning_curves", "read_metrics",
    "train_curve", "heatmap", "plot_attention_maps", "plot_dnc_memory", "plot_gates", "plot_read_write",
    "plot_recall", "plot_tape_heads", "save_figure", "to_numpy", "build_report", "results_row", "QUICK_MODELS", "LoadedRun",
    "RunDirError", "load_run", "model_figures", "quick_figures", "quick_model", "run_figures", "run_sample",
    "write_figures", "aux_to_dict", "collect_lsam_gates", "lsam_gates", "memory_kind", "memory_trace",
]
