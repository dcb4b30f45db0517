"""The capacity sweep: every memory × every number of stored pairs, plus MQAR.

:func:`run_sweep` trains each memory from scratch at each size (see
:func:`memnets.capacity.train_retrieval`) and returns a JSON-ready dict; :func:`markdown_table`
renders it (rows = memories, columns = sizes, cells ``accuracy (loss)``).
Memories that cannot be built here (a module missing) are skipped with the reason recorded.
"""
from __future__ import annotations

import platform
import time
from typing import Callable, Iterable

import torch

from .adapters import MEMORIES, unavailable_reason
from .harness import MQARConfig, RetrievalConfig, train_mqar, train_retrieval

__all__ = ["run_sweep", "run_mqar", "markdown_table", "mqar_table"]


def _resolve(memories: Iterable[str], log: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
    ok, skipped = [], {}
    for m in memories:
        if m not in MEMORIES:
            raise ValueError(f"`memories`: unknown memory {m!r}; expected some of {sorted(MEMORIES)}")
        reason = unavailable_reason(m)
        if reason:
            skipped[m] = reason
            log(f"skipping {m}: {reason}")
        else:
            ok.append(m)
    return ok, skipped


def run_sweep(memories: Iterable[str], sizes: Iterable[int], *, edits: bool = False,
              log: Callable[[str], None] = lambda s: None, on_row: Callable[[dict], None] | None = None,
              **cfg) -> dict:
    """Train every memory at every size; ``cfg`` are :class:`RetrievalConfig` fields.

    ``on_row(partial)`` (optional) receives the result so far after every trained row.
    Returns ``{"setting", "config", "sizes", "memories", "skipped", "results": [row, ...],
    "seconds", "env"}`` where each row is the dict of :func:`train_retrieval`.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"`sizes` expected positive integers, got {sizes}")
    mems, skipped = _resolve(memories, log)
    base = RetrievalConfig(edits=edits, **cfg)
    t0, rows = time.perf_counter(), []

    def result() -> dict:
        return {"setting": "edits" if edits else "capacity",
                "config": {k: v for k, v in base.__dict__.items() if k not in ("memory", "num_pairs")},
                "sizes": sizes, "memories": [m for m in mems if any(r["memory"] == m for r in rows)],
                "skipped": skipped, "results": rows, "seconds": time.perf_counter() - t0, "env": _env()}

    for m in mems:
        for s in sizes:
            r = train_retrieval(base, memory=m, num_pairs=s)
            rows.append(r)
            log(f"{'edits' if edits else 'capacity'} {m:<12} S={s:<4} loss {r['loss']:.4f} "
                f"acc {r['accuracy']:.3f} ({r['seconds']:.1f}s)")
            if on_row is not None:
                on_row(result())
    return result()


def run_mqar(memories: Iterable[str], *, log: Callable[[str], None] = lambda s: None, **cfg) -> dict:
    """Train every memory on MQAR (``cfg``: :class:`MQARConfig` fields); JSON-ready dict."""
    mems, skipped = _resolve(memories, log)
    base = MQARConfig(**cfg)
    t0, rows = time.perf_counter(), []
    for m in mems:
        r = train_mqar(base, memory=m)
        rows.append(r)
        log(f"mqar {m:<12} T={base.seq_len} pairs={base.num_pairs} loss {r['loss']:.4f} "
            f"acc {r['accuracy']:.3f} ({r['seconds']:.1f}s)")
    return {"setting": "mqar", "config": {k: v for k, v in base.__dict__.items() if k != "memory"},
            "memories": mems, "skipped": skipped, "results": rows,
            "seconds": time.perf_counter() - t0, "env": _env()}


def _env() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine()}


def markdown_table(sweep: dict) -> str:
    """Rows = memories, columns = sizes S, cells ``accuracy (loss)``."""
    sizes = sweep["sizes"]
    cell = {(r["memory"], r["num_pairs"]): r for r in sweep["results"]}
    head = f"| memory ({sweep['setting']}) | " + " | ".join(f"S={s}" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 1)]
    for m in sweep["memories"]:
        cells = []
        for s in sizes:
            r = cell.get((m, s))
            cells.append(f"{r['accuracy']:.3f} ({r['loss']:.3f})" if r else "—")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for m, why in sweep.get("skipped", {}).items():
        lines.append(f"| {m} | skipped: {why} |" + " |" * (len(sizes) - 1))
    return "\n".join(lines)


def mqar_table(sweep: dict) -> str:
    """One row per memory: accuracy and loss on held-out MQAR sequences."""
    c = sweep["config"]
    lines = [f"| memory (MQAR, T={c['seq_len']}, {c['num_pairs']} pairs, vocab {c['vocab_size']}) "
             "| accuracy | loss | seconds |", "|---|---|---|---|"]
    for r in sweep["results"]:
        lines.append(f"| {r['memory']} | {r['accuracy']:.3f} | {r['loss']:.3f} | {r['seconds']:.0f} |")
    for m, why in sweep.get("skipped", {}).items():
        lines.append(f"| {m} | skipped: {why} | | |")
    return "\n".join(lines)
