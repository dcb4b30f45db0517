"""Figures of what a memory does over time (matplotlib, no pyplot state, Agg rendering).

Every function takes plain arrays or tensors for ONE sample (no batch dimension), returns a
:class:`matplotlib.figure.Figure` whose axes all carry a title and labelled axes, with a colour
bar beside every heatmap. Time runs along x, memory slots / tape cells / heads along y (the
layout of the copy-task figure of Graves et al. 2014). Save with :func:`save_figure`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

__all__ = [
    "to_numpy", "heatmap", "grid_figure", "save_figure", "used_slots", "plot_read_write", "plot_dnc_memory",
    "plot_tape_heads", "plot_gates", "plot_attention_maps", "plot_recall",
]


def to_numpy(x) -> np.ndarray:
    """A float64 numpy array from a tensor (detached, on CPU) or anything array-like."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def _check_dims(name: str, x: np.ndarray, dims: Sequence[str]) -> np.ndarray:
    if x.ndim != len(dims):
        raise ValueError(f"`{name}` expected [{', '.join(dims)}] ({len(dims)} dims), got shape {list(x.shape)}")
    return x


def heatmap(fig: Figure, ax, data, *, title: str, xlabel: str, ylabel: str, cbar_label: str = "",
            vmin: float | None = None, vmax: float | None = None, cmap: str = "viridis",
            yticklabels: Sequence[str] | None = None, row_index=None):
    """Draw ``data [rows, cols]`` on ``ax`` (row 0 at the top), with title, axis labels and a colour bar.

    Returns the image. ``yticklabels``: one label per row (e.g. token characters).
    ``row_index``: the index each row stands for (e.g. memory slots of a cropped window),
    shown on the y ticks.
    """
    a = _check_dims("data", to_numpy(data), ["rows", "cols"])
    im = ax.imshow(a, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)))
        ax.set_yticklabels(list(yticklabels), fontsize=7)
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if row_index is not None:
            idx = [int(i) for i in row_index]
            ax.yaxis.set_major_formatter(FuncFormatter(
                lambda v, _pos: str(idx[int(round(v))]) if 0 <= round(v) < len(idx) else ""))
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    if cbar_label:
        cb.set_label(cbar_label)
    return im


def save_figure(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG to ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path


def grid_figure(n_rows: int, n_cols: int = 1, *, panel_w: float = 7.6, panel_h: float = 1.6,
                title: str | None = None, note: str | None = None) -> tuple[Figure, list]:
    """A Figure with an ``n_rows × n_cols`` grid of axes (row-major list) and fixed margins in
    inches, sized so that each panel is about ``panel_w × panel_h`` inches plus room for its
    title, tick labels, axis labels and colour bar. (Fixed margins instead of a layout engine:
    several times faster to render, and panels line up across figures.) ``note``: a few words
    printed under the panels (wrapped to the figure's width)."""
    import textwrap

    left, right, bottom, top = 0.85, 0.95, 0.5, 0.35 + (0.3 if title else 0.0)
    vgap, hgap = 0.75, 1.75
    W = left + right + n_cols * panel_w + (n_cols - 1) * hgap
    note_lines = textwrap.wrap(note, width=max(40, int(W * 13))) if note else []
    bottom += 0.17 * len(note_lines) + (0.15 if note_lines else 0.0)
    H = bottom + top + n_rows * panel_h + (n_rows - 1) * vgap
    fig = Figure(figsize=(W, H))
    fig.subplots_adjust(left=left / W, right=1 - right / W, bottom=bottom / H, top=1 - top / H,
                        hspace=vgap / panel_h, wspace=hgap / panel_w)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    if title:
        fig.suptitle(title, y=1 - 0.12 / H, va="top")
    if note_lines:
        fig.text(0.1 / W, 0.08 / H, "\n".join(note_lines), fontsize=8, va="bottom", ha="left")
    return fig, [ax for row in axes for ax in row]


def _figure(n_rows: int, row_height: float = 1.6, title: str | None = None) -> tuple[Figure, list]:
    return grid_figure(n_rows, 1, panel_h=row_height, title=title)


def _heads(name: str, w: np.ndarray) -> np.ndarray:
    """``[T, N]`` or ``[T, H, N]`` -> ``[H, T, N]``."""
    if w.ndim == 2:
        return w[None]
    _check_dims(name, w, ["T", "heads", "N"])
    return w.transpose(1, 0, 2)


def used_slots(weights: Sequence[np.ndarray], threshold: float = 0.1, margin: int = 2) -> np.ndarray:
    """Indices of the smallest circular window of memory slots holding every slot whose weight
    ever exceeds ``threshold`` in any of ``weights`` (``[..., N]`` arrays), widened by ``margin``
    on both sides; all slots when that window is not shorter than N."""
    N = weights[0].shape[-1]
    peak = np.max([w.reshape(-1, N).max(0) for w in weights], axis=0)  # [N]
    used = np.flatnonzero(peak > threshold)
    if used.size == 0:
        return np.arange(N)
    gaps = np.diff(np.concatenate([used, used[:1] + N]))  # circular gaps between used slots
    k = int(np.argmax(gaps))  # the window starts after the largest gap
    start, length = int(used[(k + 1) % used.size]), N - int(gaps[k]) + 1
    length += 2 * margin
    if length >= N:
        return np.arange(N)
    return (start - margin + np.arange(length)) % N


def plot_read_write(inputs, outputs, write_weights, read_weights, *, model_name: str = "NTM",
                    input_labels: Sequence[str] | None = None, output_labels: Sequence[str] | None = None,
                    output_label: str = "output", title: str | None = None, crop: bool = True) -> Figure:
    """The copy-task figure (Graves et al. 2014, Fig. 6; docs/maths.md §7, §8): inputs, outputs, write
    and read weightings of one sequence as heatmaps, time on x.

    Args:
        inputs: ``[T, in]`` input features (bits, or one-hot tokens).
        outputs: ``[T, out]`` model outputs in [0, 1] (σ of bit logits, or token probabilities).
        write_weights: ``[T, N]`` or ``[T, Hw, N]`` write weightings (each row sums to ≤ 1).
        read_weights: ``[T, N]`` or ``[T, R, N]`` read weightings.
        model_name: used in the titles. input_labels / output_labels: y tick labels.
        crop: show only the circular window of slots that any head visits (weight > 0.1),
            see :func:`used_slots`; the y ticks keep the true slot numbers.
    Returns a Figure with ``2 + Hw + R`` heatmap panels (plus one colour-bar axis each).
    """
    x = _check_dims("inputs", to_numpy(inputs), ["T", "in"])
    y = _check_dims("outputs", to_numpy(outputs), ["T", "out"])
    ww = _heads("write_weights", to_numpy(write_weights))
    rw = _heads("read_weights", to_numpy(read_weights))
    T = x.shape[0]
    for name, a in (("outputs", y), ("write_weights", ww.transpose(1, 0, 2)), ("read_weights", rw.transpose(1, 0, 2))):
        if a.shape[0] != T:
            raise ValueError(f"`{name}` expected T = {T} steps like `inputs`, got shape {list(a.shape)}")
    fig, axes = _figure(2 + len(ww) + len(rw), title=title)
    heatmap(fig, axes[0], x.T, title=f"{model_name}: inputs", xlabel="time step", ylabel="input channel",
            cbar_label="value", yticklabels=input_labels)
    heatmap(fig, axes[1], y.T, title=f"{model_name}: outputs", xlabel="time step", ylabel=f"{output_label} channel",
            cbar_label="probability", vmin=0.0, vmax=1.0, yticklabels=output_labels)
    rows = used_slots([ww, rw]) if crop else np.arange(ww.shape[-1])
    i = 2
    for kind, ws in (("write", ww), ("read", rw)):
        for h, w in enumerate(ws):
            head = f" (head {h})" if len(ws) > 1 else ""
            heatmap(fig, axes[i], w[:, rows].T, title=f"{model_name}: {kind} weighting{head}", xlabel="time step",
                    ylabel="memory slot", cbar_label="weight", vmin=0.0, cmap="magma", row_index=rows)
            i += 1
    return fig


def plot_dnc_memory(usage, link, *, read_modes=None, step: int | None = None, title: str | None = None) -> Figure:
    """DNC memory allocation (docs/maths.md §8): usage over time, the temporal link matrix, read modes.

    Args:
        usage: ``[T, N]`` usage ``u_t`` in [0, 1].
        link: ``[N, N]`` temporal link matrix ``L_t`` (``L[i, j]``: slot i was written after j),
            or ``[T, N, N]`` (then step ``step``, default the last, is shown).
        read_modes: optional ``[T, R, 3]`` read modes (backward, content, forward).
    Returns a Figure with 2 panels (3 with ``read_modes``).
    """
    u = _check_dims("usage", to_numpy(usage), ["T", "N"])
    L = to_numpy(link)
    if L.ndim == 3:
        step = L.shape[0] - 1 if step is None else step
        L = L[step]
    _check_dims("link", L, ["N", "N"])
    modes = None if read_modes is None else _check_dims("read_modes", to_numpy(read_modes), ["T", "R", "3"])
    fig, axes = _figure(2 + (modes is not None), row_height=2.0, title=title)
    heatmap(fig, axes[0], u.T, title="DNC: usage over time", xlabel="time step", ylabel="memory slot",
            cbar_label="usage", vmin=0.0, vmax=1.0, cmap="magma")
    when = f" at step {step}" if step is not None else ""
    heatmap(fig, axes[1], L, title=f"DNC: temporal link matrix L{when}", xlabel="slot j (written before)",
            ylabel="slot i (written after)", cbar_label="link weight", vmin=0.0, cmap="magma")
    if modes is not None:
        R = modes.shape[1]
        flat = modes.transpose(1, 2, 0).reshape(R * 3, -1)  # [R*3, T]
        labels = [f"r{r} {m}" for r in range(R) for m in ("bwd", "content", "fwd")]
        heatmap(fig, axes[2], flat, title="DNC: read modes per read head", xlabel="time step",
                ylabel="read head / mode", cbar_label="probability", vmin=0.0, vmax=1.0, yticklabels=labels)
    return fig


HEAD_WEIGHTS_NOTE = ("Head weights: each head is a mixture of its moved copies (LEFT, NO-OP, RIGHT) and, with JUMP, "
                     "of the jump target K'ᵀq read from the key tape, which is not a distribution (docs/maths.md §3): "
                     "weights can be negative or above 1. Colour scale centred at 0; red > 0, blue < 0.")


def _time_axis(ax, labels: Sequence[str] | None, n: int) -> None:
    """Label the time axis of ``ax`` with the input token at each step (thinned past 64 steps)."""
    if not labels:
        return
    labels = list(labels)[:n]
    every = max(1, -(-len(labels) // 64))
    ticks = list(range(0, len(labels), every))
    ax.set_xticks(ticks)
    ax.set_xticklabels([labels[i] for i in ticks], fontsize=7)
    ax.set_xlabel("time step (input token)")


def plot_tape_heads(positions: dict, actions: dict | None = None, *, action_names: Sequence[str] | None = None,
                    model_name: str = "NAM-TM", title: str | None = None,
                    time_labels: Sequence[str] | None = None, max_cols: int = 4) -> Figure:
    """NAM Turing Machine heads on the tape (docs/maths.md §3): head position weights and action
    probabilities per tape over time.

    Args:
        positions: ``{label: [T, tapes, L]}`` head position vectors (e.g. ``{"read head": ...,
            "write head": ...}``), cell on y.
        actions: ``{label: [T, tapes, A]}`` action probabilities (LEFT, NO-OP, RIGHT, JUMP ...).
        action_names: y tick labels of the action panels.
        time_labels: one label per time step (the input tokens), shown on the time axes.
        max_cols: at most this many tapes side by side; the panels of one entry (a head's
            position or actions) fill a row, one column per tape.
    Returns a Figure with one panel per (entry, tape) and a note under it on the range of the
    head weights (:data:`HEAD_WEIGHTS_NOTE`): with JUMP they are signed, so the position panels
    use a diverging colour scale centred at 0.
    """
    pos = {k: _check_dims(k, to_numpy(v), ["T", "tapes", "L"]) for k, v in positions.items()}
    act = {k: _check_dims(k, to_numpy(v), ["T", "tapes", "A"]) for k, v in (actions or {}).items()}
    panels = [(k, t, v[:, t].T, "pos") for k, v in pos.items() for t in range(v.shape[1])]
    panels += [(k, t, v[:, t].T, "act") for k, v in act.items() for t in range(v.shape[1])]
    if not panels:
        raise ValueError("`positions` expected at least one [T, tapes, L] array")
    tapes = max(v.shape[1] for v in [*pos.values(), *act.values()])
    cols = max(1, min(tapes, max_cols))
    rows = -(-len(panels) // cols)
    fig, axes = grid_figure(rows, cols, panel_w=7.6 if cols == 1 else 3.6, panel_h=1.6, title=title,
                            note=HEAD_WEIGHTS_NOTE)
    # one colour scale for every position panel, centred at 0: the weights are signed with JUMP
    span = max((float(np.abs(v).max()) for v in pos.values() if v.size), default=1.0) or 1.0
    for ax, (label, t, a, kind) in zip(axes, panels):
        if kind == "pos":
            heatmap(fig, ax, a, title=f"{model_name}: {label} position, tape {t}", xlabel="time step",
                    ylabel="tape cell", cbar_label="weight (signed)", cmap="RdBu_r", vmin=-span, vmax=span)
        else:
            names = list(action_names)[: a.shape[0]] if action_names else None
            heatmap(fig, ax, a, title=f"{model_name}: {label} probabilities, tape {t}", xlabel="time step",
                    ylabel="action", cbar_label="probability", vmin=0.0, vmax=1.0, yticklabels=names)
        _time_axis(ax, time_labels, a.shape[1])
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return fig


def plot_gates(gates: dict, *, model_name: str = "LSAM", title: str | None = None) -> Figure:
    """Read / write gates per head over time (docs/maths.md §2 ``p_r, p_w``; docs/maths.md §3 per tape).

    Args:
        gates: ``{label: [T, heads]}`` gate values in [0, 1], e.g.
            ``{"layer 0 fwd p_r": ..., "layer 0 fwd p_w": ...}``.
    Returns a Figure with one heatmap panel per entry (head on y, time on x).
    """
    g = {k: _check_dims(k, to_numpy(v), ["T", "heads"]) for k, v in gates.items()}
    if not g:
        raise ValueError("`gates` expected at least one [T, heads] array")
    fig, axes = _figure(len(g), row_height=1.2, title=title)
    for ax, (label, a) in zip(axes, g.items()):
        heatmap(fig, ax, a.T, title=f"{model_name}: {label}", xlabel="time step", ylabel="head",
                cbar_label="gate", vmin=0.0, vmax=1.0, cmap="cividis")
        if a.shape[1] <= 16:  # one tick per head (a single head: no fractional ticks)
            ax.set_yticks(range(a.shape[1]))
    return fig


def plot_attention_maps(maps: dict, *, tokens: Sequence[str] | None = None, title: str | None = None,
                        max_cols: int = 4) -> Figure:
    """Implied attention maps (docs/maths.md §5, §6): ``{label: [S, S]}``, query on y, key on x.

    ``tokens``: optional per-position labels shown on both axes (short sequences).
    Returns a Figure with one square heatmap per entry.
    """
    m = {k: _check_dims(k, to_numpy(v), ["S", "S"]) for k, v in maps.items()}
    if not m:
        raise ValueError("`maps` expected at least one [S, S] array")
    n = len(m)
    cols = min(n, max_cols)
    rows = -(-n // cols)
    fig, axes = grid_figure(rows, cols, panel_w=2.9, panel_h=2.6, title=title)
    for ax, (label, a) in zip(axes, m.items()):
        lim = np.abs(a).max() or 1.0
        signed = a.min() < -1e-12
        heatmap(fig, ax, a, title=label, xlabel="key position", ylabel="query position",
                cbar_label="weight", cmap="RdBu_r" if signed else "viridis",
                vmin=-lim if signed else 0.0, vmax=lim)
        if tokens is not None and len(tokens) == a.shape[0] and a.shape[0] <= 40:
            ax.set_xticks(range(len(tokens)))
            ax.set_xticklabels(list(tokens), fontsize=6)
            ax.set_yticks(range(len(tokens)))
            ax.set_yticklabels(list(tokens), fontsize=6)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig


def plot_recall(scores, targets, *, value_label: str, title: str | None = None, note: str | None = None,
                recalled: int | None = None, panel: str | None = None) -> Figure:
    """A recall map: ``scores [Q, S]``, how much the read-out of each query (y) is the value
    of each stored pair (x), with each query's own pair (``targets [Q]``, its column; -1: none)
    ringed. A query recalled right has its row's largest score in its ring; interference shows
    as weight on the other pairs. ``value_label``: what a score is (the colour bar's label);
    ``recalled``: how many queries were answered right, where the caller knows better than the
    row maxima (e.g. two pairs holding the same value); ``note``: said under the panel;
    ``panel``: the panel's title, ``{hit}`` and ``{total}`` filled in (default: the recall
    wording)."""
    a = _check_dims("scores", to_numpy(scores), ["Q", "S"])
    t = np.asarray(to_numpy(targets)).reshape(-1).astype(int)
    if t.shape[0] != a.shape[0]:
        raise ValueError(f"`targets` expected one column per query ({a.shape[0]}), got {t.shape[0]}")
    if ((t < -1) | (t >= a.shape[1])).any():
        raise ValueError(f"`targets` expected columns in [0, {a.shape[1]}) or -1, got {t.min()}..{t.max()}")
    rows = np.nonzero(t >= 0)[0]
    hit = int((a[rows].argmax(1) == t[rows]).sum()) if recalled is None else int(recalled)
    ring = "Red rings: each query's own pair"
    fig, axes = grid_figure(1, 1, panel_w=max(4.8, min(7.6, 2.0 + 0.12 * a.shape[1])),
                            panel_h=max(1.6, min(6.0, 1.0 + 0.12 * a.shape[0])), title=title,
                            note=f"{ring}. {note}" if note else ring)
    ax = axes[0]
    panel = panel or "each query's read-out against each stored value: {hit} of {total} recalled"
    heatmap(fig, ax, a, title=panel.format(hit=hit, total=len(rows)),
            xlabel="stored pair (order written)", ylabel="query", cbar_label=value_label)
    ax.scatter(t[rows], rows, s=36, facecolors="none", edgecolors="red", linewidths=1.2)
    return fig
