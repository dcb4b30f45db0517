"""Plot a capacity sweep: loss (and accuracy) vs number of stored pairs S, one line per
memory, like Figures 2/3 of Schlag et al. (2021). matplotlib with the Agg canvas, no pyplot."""
from __future__ import annotations

from pathlib import Path

__all__ = ["plot_sweep"]


def plot_sweep(sweep: dict, path: str | Path, d_key: int | None = None) -> Path:
    """Write a PNG with two panels (loss vs S, accuracy vs S) for a :func:`run_sweep` result.

    A dotted vertical line marks ``S = d_key`` (default: the sweep's ``config["d_key"]``).
    Returns the path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax_l, ax_a = fig.subplots(1, 2)
    for m in sweep["memories"]:
        rows = sorted((r for r in sweep["results"] if r["memory"] == m), key=lambda r: r["num_pairs"])
        s = [r["num_pairs"] for r in rows]
        ax_l.plot(s, [r["loss"] for r in rows], marker="o", label=m)
        ax_a.plot(s, [r["accuracy"] for r in rows], marker="o", label=m)
    d = d_key if d_key is not None else sweep.get("config", {}).get("d_key")
    title = "with edits (setting 2)" if sweep.get("setting") == "edits" else "capacity (setting 1)"
    for ax, ylab in ((ax_l, "retrieval loss"), (ax_a, "retrieval accuracy")):
        if d:
            ax.axvline(d, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("number of stored keys S")
        ax.set_ylabel(ylab)
        ax.set_title(f"{ylab} vs S, {title}")
        ax.grid(alpha=0.3)
    ax_a.set_ylim(-0.02, 1.02)
    ax_l.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
