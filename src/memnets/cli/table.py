"""``memnets table <run_dirs...>``: the Markdown table of each task family's runs.

Algorithmic-task runs (fib, palindrome, reduce, ...) give a table shaped like the NAM paper's
Table 1: models are columns, task × split are rows, plus a parameter-count row; each cell is
the sequence accuracy (or ``--metric``) at the epoch selected by the OD-easy accuracy, read
from each run's ``results.json``. ``--paper`` alone prints the paper's own Table 1 (seed
000); with run directories it prints ours beside the paper's: per cell the mean over the runs
of that task and model (seeds), the per-seed values, and the paper's figure. ``--at last`` reads each run's last evaluation (the end of its budget) instead. Runs of the
other families (``"family"`` in ``results.json``) give their family's table
(:meth:`memnets.train.task.Task.format_table`), one per family, each under a heading when
there are several.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["add_parser", "at_last_evaluation", "family_tables", "format_table1", "format_table1_vs_paper", "load_results", "paper_cell",
           "with_evaluation", "PAPER_TABLE1", "MODEL_ORDER"]

MODEL_ORDER = ["TF", "LSTM", "UT", "DNC", "LSAM", "NAM-TM", "No Jmp", "NTM", "LSAM (stack)", "biLSTM"]
TASK_LABEL = {"palindrome": "Palin", "fib": "Fib", "addition": "Fib", "reduce": "Reduce"}
SPLIT_LABEL = {"id": "ID", "od_easy": "OD-easy", "od_hard": "OD-hard"}

# Table 1 of seed 000 (sequence accuracy, %); columns TF LSTM UT DNC LSAM NAM-TM No Jmp, which
# are the backbones transformer, lstm_attention, universal_transformer, dnc, lsam_encdec,
# nam_tm and nam_tm_nojmp (their labels in memnets.models.seq.BACKBONES).
PAPER_TABLE1 = {
    "Parameters": ["28.7M", "31.5M", "26.0M", "40.2M", "25.8M", "23.3M", "22.2M"],
    ("Palin", "ID"): [100, 100, 100, 100, 100, 100, 100],
    ("Palin", "OD-easy"): [65.6, 100, 99.2, 100, 100, 100, 100],
    ("Palin", "OD-hard"): [19.0, 100, 5.2, 100, 100, 100, 100],
    ("Fib", "ID"): [98.9, 46.2, 99.1, 46.9, 100, 97.4, 40.4],
    ("Fib", "OD-easy"): [0.4, 8.3, 21.3, 1.8, 39.9, 89.7, 19.8],
    ("Fib", "OD-hard"): [0.0, 0.0, 0.1, 0.0, 2.9, 71.5, 1.1],
    ("Reduce", "ID"): [99.6, 99.5, 98.7, 100, 99.9, 100, 100],
    ("Reduce", "OD-easy"): [0.2, 91.5, 15.7, 95.7, 96.8, 100, 100],
    ("Reduce", "OD-hard"): [0.0, 63.6, 0.0, 60.1, 77.6, 100, 100],
}


def add_parser(sub) -> None:
    p = sub.add_parser("table", help="Markdown Table 1 from run directories", description=__doc__)
    p.add_argument("run_dirs", nargs="*", help="directories written by `memnets train`")
    p.add_argument("--metric", default=None,
                   help="which metric to show (algorithmic tasks: seq_acc, tok_acc or ans_acc; default: the "
                        "sequence accuracy, the paper's; other families: their main metric)")
    p.add_argument("--paper", action="store_true",
                   help="alone: print the paper's Table 1; with run directories: the paper's figures beside "
                        "ours (mean over seeds, per-seed values)")
    p.add_argument("--eval", default=None, metavar="FILENAME",
                   help="score each run by the file of this name in its directory, written by `memnets eval "
                        "--save` (e.g. on splits drawn independently of those that selected the model), "
                        "instead of its results.json's evaluation; runs without it are left out")
    p.add_argument("--at", choices=("selected", "last"), default="selected",
                   help="which evaluation of each run: the one the selection split chose (default, the "
                        "table's rule) or the run's last (the end of its training budget, no selection); "
                        "algorithmic-task runs only, not with --eval")
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.set_defaults(func=_run)


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def _label(res: dict) -> str:
    from ..models.seq import BACKBONES, canonical_backbone

    name = canonical_backbone(str(res.get("backbone", "")), warn=False)  # a run of a former name too
    return BACKBONES.get(name, (None, None, None, res.get("backbone", "?")))[3]


def format_table1(results: list[dict], metric: str = "seq_acc") -> str:
    """Markdown table from ``results.json`` dicts (models as columns, task × split as rows).

    Several runs of one task and column (seeds, or repeats) share a cell: it reads
    ``mean (run a, run b)`` in %, the runs in seed order (then by name and run directory), so
    the table does not depend on the order the runs are given in; a note under the table
    says how many cells pool several runs.
    """
    cells: dict[tuple[str, str, str], list[float]] = {}
    params: dict[str, set] = {}
    tasks, splits, cols = [], [], []
    for r in sorted(results, key=_run_order):
        col, task = _label(r), TASK_LABEL.get(r["task"], r["task"])
        cols += [col] if col not in cols else []
        tasks += [task] if task not in tasks else []
        params.setdefault(col, set()).add(r["params"])
        for split, m in (r.get("splits") or {}).items():
            s = SPLIT_LABEL.get(split, split)
            splits += [s] if s not in splits else []
            cells.setdefault((task, s, col), []).append(m[metric])
    order = {m: i for i, m in enumerate(MODEL_ORDER)}
    cols.sort(key=lambda c: order.get(c, len(order)))
    tasks.sort(key=lambda t: ["Palin", "Fib", "Reduce"].index(t) if t in ("Palin", "Fib", "Reduce") else 9)
    lines = ["| Model | | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    lines.append("| Parameters | | " + " | ".join("/".join(_params(n) for n in sorted(params[c])) for c in cols) + " |")
    for t in tasks:
        for i, s in enumerate(splits):
            row = [_cell(cells[(t, s, c)]) if (t, s, c) in cells else "–" for c in cols]
            lines.append(f"| {t if i == 0 else ''} | {s} | " + " | ".join(row) + " |")
    pooled = sum(len(v) > 1 for v in cells.values())
    if pooled:
        lines += ["", f"{pooled} cell{'s' if pooled > 1 else ''} pool several runs: mean (each run, in seed order)."]
    return "\n".join(lines)


def _run_order(r: dict) -> tuple:
    """Runs in seed order, then by name and run directory: a table's cells do not depend on
    the order the run directories were given in."""
    seed = r.get("seed", 0)
    return (seed if isinstance(seed, (int, float)) else 0, str(r.get("name", "")), str(r.get("run_dir", "")))


def _cell(vals: list[float]) -> str:
    """One run: ``98.8%``; several: ``77.4% (55.9, 98.8)``, the mean then each run."""
    if len(vals) == 1:
        return f"{100 * vals[0]:.1f}%"
    return f"{100 * sum(vals) / len(vals):.1f}% ({', '.join(f'{100 * v:.1f}' for v in vals)})"


def paper_cell(task: str, split: str, col: str) -> float | None:
    """The paper's Table 1 figure (%) for task label ``task`` ("Fib"), split label ``split``
    ("OD-easy") and column ``col`` ("NAM-TM"); None where the paper has none."""
    cols = MODEL_ORDER[:7]
    vals = PAPER_TABLE1.get((task, split))
    return vals[cols.index(col)] if vals is not None and col in cols else None


def _pct(v: float) -> str:
    return f"{v:.1f}"


def format_table1_vs_paper(results: list[dict], metric: str = "seq_acc") -> str:
    """Markdown Table 1 with ours beside the paper's figures.

    Runs of one task and column (e.g. two seeds) are pooled: each cell reads
    ``mean (seed a, seed b) / paper`` in %, the mean over the runs and the per-run values in
    seed order (a run's ``seed`` key, if present). Columns: the paper's seven, then any other
    backbone among ``results``.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    cols = list(MODEL_ORDER[:7])
    for r in sorted(results, key=_run_order):
        col, task = _label(r), TASK_LABEL.get(r["task"], r["task"])
        cols += [col] if col not in cols else []
        groups.setdefault((task, col), []).append(r)
    order = {m: i for i, m in enumerate(MODEL_ORDER)}
    cols.sort(key=lambda c: order.get(c, len(order)))
    task_order = ["Palin", "Fib", "Reduce"]
    tasks = task_order + sorted({t for t, _ in groups} - set(task_order))
    splits = ["ID", "OD-easy", "OD-hard"]
    head = f"ours ({metric}, %): mean over seeds (per seed) / paper (sequence accuracy, %)"
    lines = ["| Model | | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    par = []
    for c in cols:
        ours = sorted({r["params"] for t in tasks for r in groups.get((t, c), [])})
        pp = PAPER_TABLE1["Parameters"][MODEL_ORDER.index(c)] if c in MODEL_ORDER[:7] else "–"
        par.append(f"{'/'.join(_params(n) for n in ours) or '–'} / {pp}")
    lines.append("| Parameters | | " + " | ".join(par) + " |")
    for t in tasks:
        for i, s in enumerate(splits):
            row = []
            for c in cols:
                key = {v: k for k, v in SPLIT_LABEL.items()}[s]
                vals = [100 * r["splits"][key][metric] for r in groups.get((t, c), [])
                        if r.get("splits") and key in r["splits"]]
                if not vals:
                    ours = "–"
                elif len(vals) == 1:
                    ours = _pct(vals[0])
                else:
                    ours = f"{_pct(sum(vals) / len(vals))} ({', '.join(_pct(v) for v in vals)})"
                pv = paper_cell(t, s, c)
                row.append(f"{ours} / {'–' if pv is None else _pct(pv)}")
            lines.append(f"| {t if i == 0 else ''} | {s} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"Cells: {head}.")
    return "\n".join(lines)


def _json_object(f: Path, what: str) -> dict:
    """The JSON object in ``f``; ValueError naming ``f`` when it cannot be read or is not ``what``."""
    try:
        obj = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {f}: {e}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{f} is not {what}")
    return obj


def load_results(run_dirs, warn: bool = True) -> list[dict]:
    """The ``results.json`` of each of ``run_dirs`` that has one, with ``seed`` (from
    ``config.json``) and ``run_dir`` added; the others are skipped (with a note on stderr).
    ValueError naming the file for a ``results.json`` that is not a JSON object."""
    results = []
    for d in run_dirs:
        f = Path(d) / "results.json"
        if not f.is_file():
            if warn:
                print(f"memnets table: skipping {d}: no results.json (unfinished run?)", file=sys.stderr)
            continue
        r = _json_object(f, "a results table (expected a JSON object)")
        try:
            r.setdefault("seed", json.loads((Path(d) / "config.json").read_text()).get("seed", 0))
        except (OSError, ValueError):
            r.setdefault("seed", 0)
        r["run_dir"] = str(d)
        results.append(r)
    return results


def family_tables(results: list[dict], metric: str | None = None, *, other_metric: str | None = None,
                  paper: bool = False, headings: bool | None = None) -> str:
    """The tables of ``results`` (``results.json`` dicts), one per task family in order of first
    appearance (a run without a ``family`` is an algorithmic-task run, :func:`~memnets.train.task.family_of`).

    The algorithmic tasks give Table 1 of ``metric`` (default ``seq_acc``): :func:`format_table1`,
    or with ``paper`` :func:`format_table1_vs_paper`; the other families their
    :meth:`~memnets.train.task.Task.format_table` of ``other_metric`` (default: the family's main
    metric). Each table stands under a ``## <family>`` heading (``## Table 1: ours / the paper's``
    for the algorithmic tasks with ``paper``): always with ``headings=True``, never with False,
    and with None (``memnets table``) only when there are several families. ``memnets table``
    and ``memnets suite run`` print these. A family's ValueError is raised again naming the
    first run of the family (its ``run_dir``).
    """
    from ..train.task import family_of, family_task

    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(family_of(r) or "nsp", []).append(r)
    parts = []
    for fam, rs in groups.items():
        try:
            if fam == "nsp":
                t = (format_table1_vs_paper if paper else format_table1)(rs, metric or "seq_acc")
            else:
                t = family_task(fam).format_table(rs, other_metric)
        except ValueError as e:
            raise ValueError(f"{rs[0].get('run_dir', fam)}: {e}") from e
        title = "Table 1: ours / the paper's" if fam == "nsp" and paper else fam
        show = len(groups) > 1 if headings is None else headings
        parts.append(f"## {title}\n\n{t}" if show else t)
    return "\n\n".join(parts)


def _paper() -> str:
    cols = MODEL_ORDER[:7]
    lines = ["| Model | | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols),
             "| Parameters | | " + " | ".join(PAPER_TABLE1["Parameters"]) + " |"]
    for key, vals in PAPER_TABLE1.items():
        if key == "Parameters":
            continue
        t, s = key
        lines.append(f"| {t if s == 'ID' else ''} | {s} | " + " | ".join(f"{v:.1f}%" for v in vals) + " |")
    return "\n".join(lines)


def _task_run_problem(res: dict, metric: str) -> str | None:
    """Why the ``results.json`` dict ``res`` cannot be a cell of Table 1 (None when it can)."""
    tasks = ", ".join(sorted(TASK_LABEL))
    if "task" not in res:
        return f'its results.json has no "task" (expected an algorithmic-task run of {tasks})'
    if res["task"] not in TASK_LABEL:
        return f"its results.json is a {res['task']!r} run (expected an algorithmic-task run of {tasks})"
    if not isinstance(res.get("params"), int) or not isinstance(res.get("splits") or {}, dict):
        return 'its results.json lacks "params" or "splits" (expected one written by `memnets train`)'
    for split, m in (res.get("splits") or {}).items():
        if not isinstance(m, dict) or not isinstance(m.get(metric), (int, float)):
            return f'its results.json has no {metric!r} for split {split!r}'
    return None


def with_evaluation(results: list[dict], name: str) -> list[dict]:
    """``results`` (from :func:`load_results`) scored by the file ``name`` in each run's
    directory (written by ``memnets eval --save``): its ``"splits"`` replace the run's, and
    ``"evaluated"`` says with what (checkpoint, draw, size). Runs without the file are left
    out, with a note on stderr; ValueError when none has it or one is malformed."""
    out = []
    for r in results:
        f = Path(r["run_dir"]) / name
        if not f.is_file():
            print(f"memnets table: leaving out {r['run_dir']}: no {name}", file=sys.stderr)
            continue
        what = 'a saved evaluation (expected a JSON object with "splits", as `memnets eval --save` writes)'
        ev = _json_object(f, what)
        if not isinstance(ev.get("splits"), dict):
            raise ValueError(f"{f} is not {what}")
        out.append(dict(r, splits=ev["splits"], evaluated={k: ev.get(k) for k in ("checkpoint", "draw", "eval_size")}))
    if not out:
        raise ValueError(f"none of the runs has {name} (written by `memnets eval RUN --save RUN/{name}`)")
    return out


def at_last_evaluation(results: list[dict]) -> list[dict]:
    """``results`` (from :func:`load_results`) scored at each run's last evaluation
    (``results.json``'s ``"final"``, written at the end of its training) instead of the one its
    selection split chose: their ``"splits"`` replaced, ``"evaluated"`` saying so. ValueError
    naming the run when one has no last evaluation."""
    out = []
    for r in results:
        final = r.get("final")
        if not isinstance(final, dict) or not final or not all(isinstance(m, dict) for m in final.values()):
            raise ValueError(f"{r.get('run_dir', '?')}: its results.json has no last evaluation (\"final\")")
        out.append(dict(r, splits=final, evaluated={"at": "last", "epoch": r.get("epochs")}))
    return out


def _run(args) -> int:
    from ..train.task import family_of
    from .main import UsageError

    if args.paper and not args.run_dirs:
        text = _paper()
    else:
        if not args.run_dirs:
            raise UsageError("give one or more run directories (or --paper)")
        try:
            results = load_results(args.run_dirs, warn=False)
        except ValueError as e:
            raise UsageError(str(e)) from e
        if not results:
            raise UsageError(f"no results.json in {', '.join(map(str, args.run_dirs))} (expected run "
                             "directories of finished `memnets train` runs)")
        at_last = getattr(args, "at", "selected") == "last"
        if at_last and args.eval:
            raise UsageError("--at last and --eval: give one (--eval scores saved weights, --at last the run's own "
                             "last evaluation)")
        if args.eval:
            try:
                results = with_evaluation(results, args.eval)
            except ValueError as e:
                raise UsageError(str(e)) from e
        if at_last:
            if any(family_of(r) not in (None, "nsp") for r in results):
                raise UsageError("--at last is for algorithmic-task runs (Table 1)")
            try:
                results = at_last_evaluation(results)
            except ValueError as e:
                raise UsageError(str(e)) from e
        for r in results:
            if family_of(r) in (None, "nsp"):
                if args.metric not in (None, "seq_acc", "tok_acc", "ans_acc"):
                    raise UsageError(f"--metric of an algorithmic-task run expected one of seq_acc, tok_acc, "
                                     f"ans_acc, got {args.metric!r}")
                problem = _task_run_problem(r, args.metric or "seq_acc")
                if problem:
                    raise UsageError(f"{r['run_dir']} is not an algorithmic-task run: {problem}")
        for d in args.run_dirs:
            if not (Path(d) / "results.json").is_file():
                why = "no results.json (unfinished run?)" if Path(d).is_dir() else "no such directory"
                print(f"memnets table: skipping {d}: {why}", file=sys.stderr)
        try:
            text = family_tables(results, args.metric, other_metric=args.metric, paper=args.paper)
        except ValueError as e:
            raise UsageError(str(e)) from e
        if args.eval:
            how = sorted({(r["evaluated"]["checkpoint"], r["evaluated"]["draw"], r["evaluated"]["eval_size"])
                          for r in results}, key=str)
            text += (f"\n\nScored from `{args.eval}` in each run's folder (`memnets eval --save`): "
                     + "; ".join(f"{c} weights, draw {d}, {n} samples per split" for c, d, n in how) + ".")
        if at_last:
            text += "\n\nEach run at its last evaluation (the end of its training budget), not at the one its selection split chose."
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0
