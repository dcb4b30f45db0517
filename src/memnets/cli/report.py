"""``memnets report <run_dirs...> [--out FILE]``: one self-contained HTML page with the
results table, the learning curves and the memory figures of every run (images embedded as
base64 data URIs, inline CSS, no scripts; opens from disk without a server)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["add_parser", "default_report_path"]


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of several runs", description=__doc__)
    p.add_argument("run_dirs", nargs="+", help="directories written by `memnets train`")
    p.add_argument("--out", default=None, help="HTML file to write (default: report.html in the folder holding the "
                   "runs, e.g. runs/report.html)")
    p.add_argument("--task-sample", type=int, default=0, metavar="SEED", help="seed of the task sample (default 0)")
    p.add_argument("--title", default="memnets report", help="page title")
    p.set_defaults(func=_run)


def default_report_path(run_dirs) -> Path:
    """``report.html`` in the folder holding the runs (their common parent: ``runs/`` for
    ``runs/a runs/b``), not in the current folder."""
    import os

    parents = [str(Path(d).resolve().parent) for d in run_dirs]
    return Path(os.path.commonpath(parents)) / "report.html"


def _not_a_run(d: Path) -> str | None:
    """Why directory ``d`` holds no run the report can show (None when it holds one): a run has
    ``config.json`` (``memnets train``, every task family) or at least a ``results.json`` naming
    its ``task`` (shown as a table row without figures)."""
    if (d / "config.json").is_file():
        return None
    expected = 'expected config.json (memnets train) or a results.json with a "task"'
    f = d / "results.json"
    if not f.is_file():
        return f"{d} is not a run directory: {expected}"
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        return f"cannot read {f}: {e}"
    if not isinstance(res, dict) or "task" not in res:
        return f'{d} is not a run directory: its results.json has no "task"; {expected}'
    return None


def _bad_file(d: Path) -> str | None:
    """The first of ``d``'s JSON files the report reads that does not parse, named in the error."""
    for name in ("config.json", "results.json"):
        f = d / name
        if not f.is_file():
            continue
        try:
            value = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return f"cannot read {f}: {e}"
        if not isinstance(value, dict):
            return f"cannot read {f}: expected a JSON object, got {type(value).__name__}"
    return None


def _unreadable_lines(d: Path) -> int:
    """How many non-empty lines of ``d/metrics.jsonl`` are not JSON objects (the curves skip them)."""
    f = d / "metrics.jsonl"
    if not f.is_file():
        return 0
    bad = 0
    try:
        text = f.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        bad += not ok
    return bad


def _run(args) -> int:
    from ..viz.report import build_report
    from .main import UsageError

    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        raise UsageError(f"not a directory: {', '.join(missing)}")
    for d in args.run_dirs:
        problem = _not_a_run(Path(d)) or _bad_file(Path(d))
        if problem:  # checked before anything is written, so an existing report stays as it is
            raise UsageError(problem)
    for d in args.run_dirs:
        bad = _unreadable_lines(Path(d))
        if bad:  # one warning per file, with the count
            print(f"memnets report: warning: {Path(d) / 'metrics.jsonl'}: skipped {bad} unreadable "
                  f"line{'s' if bad > 1 else ''}", file=sys.stderr)
    out = args.out or default_report_path(args.run_dirs)
    path = build_report(args.run_dirs, out, seed=args.task_sample, title=args.title)
    print(f"report: {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
