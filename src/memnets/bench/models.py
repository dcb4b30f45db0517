"""``memnets bench models``: model forward+backward time against reference points.

Rows come from the family modules listed in :data:`CASE_MODULES`; each defines
``run_cases(quick: bool) -> list[dict]`` with keys among :data:`COLUMNS`.
"""
from __future__ import annotations

import importlib

__all__ = ["run", "CASE_MODULES", "COLUMNS"]

CASE_MODULES = ("memnets.bench.models_nam", "memnets.bench.models_classic", "memnets.bench.models_attention")
COLUMNS = ["model", "config", "baseline", "baseline_ms", "ours_ms", "ratio", "note"]


def run(quick: bool = False) -> dict:
    rows, notes = [], []
    for name in CASE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            notes.append(f"{name.rsplit('.', 1)[-1]}: not available")
            continue
        rows.extend(mod.run_cases(quick=quick))
    notes.append("ratio = ours / baseline time (lower is better), forward+backward, one process")
    return {"suite": "models", "title": "Models: forward+backward time per batch",
            "columns": COLUMNS, "rows": rows, "notes": notes}
