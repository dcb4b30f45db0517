"""Benchmark suites by name; each suite module exposes ``run(quick: bool) -> dict``.

A result is ``{"suite", "title", "columns", "rows": [dict], "notes": [str], "env": {...}}``.
"""
from __future__ import annotations

import importlib
import platform
from typing import Any

import torch

__all__ = ["SUITES", "run_suite", "format_table", "bench_env"]

SUITES = {
    "ops": "memnets.bench.ops",
    "models": "memnets.bench.models",
    "gpu": "memnets.bench.gpu",
    "launches": "memnets.bench.launches",
}


def bench_env() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def run_suite(name: str, *, quick: bool = False) -> dict[str, Any]:
    if name not in SUITES:
        raise ValueError(f"unknown benchmark suite {name!r}; expected one of {sorted(SUITES)}")
    result = importlib.import_module(SUITES[name]).run(quick=quick)
    result.setdefault("suite", name)
    result["env"] = bench_env()
    return result


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def format_table(result: dict[str, Any]) -> str:
    cols = result["columns"]
    rows = [[_fmt(r.get(c)) for c in cols] for r in result["rows"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [f"## {result.get('title', result['suite'])}", "", line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    env = result.get("env", {})
    out += ["", f"torch {env.get('torch')} · {env.get('threads')} threads · {env.get('device')}"]
    out += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(out)
