"""One self-contained static HTML page for several runs: results table, learning curves and
the memory figures of each run.

Images are embedded as ``data:image/png;base64`` URIs and the CSS is inline; the page loads
nothing from anywhere and runs no script, so it can be opened from disk or mailed around.
"""
from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

__all__ = ["build_report", "results_row", "figure_data_uri"]

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1100px; color: #1d2430; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 2em; }
h3 { font-size: 1.0em; color: #445; }
.meta { color: #57606a; font-size: 0.9em; }
table.results { border-collapse: collapse; margin: 12px 0; font-size: 0.92em; }
table.results th, table.results td { border: 1px solid #d0d7de; padding: 5px 10px; text-align: right; }
table.results th { background: #f1f4f8; }
table.results td:first-child, table.results th:first-child { text-align: left; }
figure { margin: 10px 0 22px 0; }
figure img { max-width: 100%; border: 1px solid #e4e8ec; }
figcaption { color: #57606a; font-size: 0.85em; }
.error { color: #b42318; }
nav.toc { border: 1px solid #d5dae1; border-radius: 4px; padding: 6px 16px; margin: 12px 0; background: #f7f8fa; }
nav.toc h2 { font-size: 1.05em; margin: 4px 0; }
nav.toc ul { margin: 4px 0; padding-left: 20px; }
"""

_CAPTIONS = {
    "learning_curve": "Learning curve: training loss and the evaluation metric per split.",
    "weightings": "Inputs, outputs and the write / read weightings over time (memory slot on y).",
    "dnc_memory": "DNC usage over time, the temporal link matrix after the last step, and read modes.",
    "tape_heads": "NAM-TM head positions on each tape and action probabilities over time, one column per tape, "
                  "the input token under each step. Head weights are signed: a head mixes its moved copies and, "
                  "with JUMP, the jump target read from the key tape, which is not a distribution "
                  "(docs/maths.md §3), so weights below 0 or above 1 are expected.",
    "gates": "Read and write gates per head over time.",
    "attention": "Implied attention maps (query on y, key on x) for one sample.",
}


def figure_data_uri(fig: Figure, dpi: int = 90) -> str:
    """``data:image/png;base64,...`` of ``fig``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _metric_cell(metric: str, v) -> str | None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if metric in _FRACTIONS:  # a share in [0, 1]: shown in %
        return f"{100 * float(v):.1f}%"
    return _fmt(float(v))


_FRACTIONS = ("seq_acc", "tok_acc", "ans_acc", "accuracy", "acc")


def results_row(run_dir: str | Path) -> dict[str, str]:
    """One table row for ``run_dir`` from its ``results.json`` (and ``config.json``).

    Keys: ``run``, ``model``, ``task``, ``params``, ``steps``, ``best epoch``, then one
    ``<split> <metric>`` per split at the reported evaluation, ``metric`` being the run's main
    metric (``results["metric"]``, docs/tasks.md; ``seq_acc`` for the algorithmic tasks;
    shares in %), one ``<split> <metric>`` per held-out test split (``results["test"]``) and,
    for the NTM tasks, ``final cost (bits)``. Missing values are ``"–"``.
    """
    from ..train.task import family_of

    d = Path(run_dir)
    res = json.loads((d / "results.json").read_text()) if (d / "results.json").is_file() else {}
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    row = {
        "run": res.get("name") or cfg.get("name") or d.name,
        "model": res.get("backbone") or res.get("model") or cfg.get("model", {}).get("backbone"),
        "task": res.get("task") or cfg.get("task", {}).get("name"),
        "params": res.get("params"),
        "steps": res.get("steps"),
        "best epoch": res.get("best_epoch"),
    }
    metric = res.get("metric") or ("seq_acc" if family_of(res) in ("nsp", None) else None)
    for part in ("splits", "test"):
        for split, m in (res.get(part) or {}).items():
            cell = _metric_cell(metric, m.get(metric)) if isinstance(m, dict) and metric else None
            if cell is not None:
                row[f"{split} {metric}"] = cell
    if "final_cost_bits" in res:
        row["final cost (bits)"] = res["final_cost_bits"]
    return {k: _fmt(v) for k, v in row.items()}


def _run_metric(d: Path) -> str:
    """The main metric of run ``d`` (``results.json`` ``metric``, else its task's; ``seq_acc``)."""
    try:
        res = json.loads((d / "results.json").read_text())
        if res.get("metric"):
            return str(res["metric"])
    except (OSError, ValueError, AttributeError):
        pass
    try:
        from ..train.task import get_task

        return get_task(json.loads((d / "config.json").read_text())["task"]["name"]).metric
    except (OSError, ValueError, KeyError, TypeError):
        return "seq_acc"


def _table(rows: list[dict[str, str]]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(r.get(c, '–'))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f'<table class="results"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def build_report(run_dirs: Sequence[str | Path], out: str | Path = "report.html", *, seed: int = 0,
                 title: str = "memnets report", dpi: int = 90) -> Path:
    """Write the HTML report of ``run_dirs`` to ``out``; returns its path.

    For each run: a row of the results table (:func:`results_row`), its learning curve and the
    memory figures of its model on one task sample drawn with ``seed``
    (:func:`memnets.viz.runs.run_figures`). A run whose model cannot be rebuilt keeps its
    table row and shows the reason instead of figures. When there are several runs, a combined
    learning-curve figure comes first. A table of contents links the results table, the
    combined curves and each run's section. Raises ValueError when ``run_dirs`` is empty.
    """
    from .curves import plot_learning_curves, read_metrics, train_curve
    from .runs import run_figures

    if not run_dirs:
        raise ValueError("`run_dirs` expected at least one run directory")
    rows, sections, curves, metrics = [], [], {}, set()
    toc: list[tuple[str, str]] = []  # (anchor, text) of each run's section
    for rd in run_dirs:
        d = Path(rd)
        row = results_row(d)
        rows.append(row)
        name = row["run"]
        anchor = name if name not in {a for a, _ in toc} else f"{name}-{len(toc) + 1}"
        toc.append((anchor, name))
        try:
            recs = read_metrics(d)
            if train_curve(recs):
                curves[name] = recs
                metrics.add(_run_metric(d))
        except FileNotFoundError:
            pass
        parts = [f'<h2 id="{html.escape(anchor)}">{html.escape(name)}</h2>',
                 f'<p class="meta">{html.escape(str(d))}</p>']
        try:
            figs = run_figures(d, seed=seed)
        except Exception as e:  # a broken run must not hide the others
            parts.append(f'<p class="error">no figures: {html.escape(type(e).__name__)}: {html.escape(str(e))}</p>')
            figs = {}
        order = ["learning_curve"] + [k for k in figs if k != "learning_curve"]
        for key in order:
            if key not in figs:
                continue
            cap = _CAPTIONS.get(key, key.replace("_", " "))
            parts.append(f'<figure><img src="{figure_data_uri(figs[key], dpi)}" alt="{html.escape(name)}: '
                         f'{html.escape(key)}"><figcaption>{html.escape(cap)}</figcaption></figure>')
        sections.append("\n".join(parts))
    combined = ""
    if len(curves) > 1:
        metric = metrics.pop() if len(metrics) == 1 else "seq_acc"
        uri = figure_data_uri(plot_learning_curves(curves, title="all runs", metric=metric), dpi)
        combined = (f'<h2 id="learning-curves">Learning curves</h2><figure><img src="{uri}" alt="learning curves of all runs">'
                    f'<figcaption>{html.escape(_CAPTIONS["learning_curve"])}</figcaption></figure>')
    items = [("results", "Results")] + ([("learning-curves", "Learning curves of all runs")] if combined else [])
    items += toc
    nav = ('<nav class="toc"><h2>Contents</h2><ul>\n'
           + "\n".join(f'<li><a href="#{html.escape(a)}">{html.escape(t)}</a></li>' for a, t in items)
           + "\n</ul></nav>")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">{len(rows)} run(s) · generated {stamp} · sample seed {seed}</p>
{nav}
<h2 id="results">Results</h2>
{_table(rows)}
{combined}
{"".join(sections)}
</body>
</html>
"""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
