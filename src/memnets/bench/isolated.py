"""``make gpu-check``'s bench sections, profile and launch counts, each in a child process of its
own, so that a kernel that faults or hangs costs one row, not the rest of the check.

A kernel that reads or writes out of bounds leaves its process's CUDA context unusable: every
later call in that process fails ("an illegal memory access was encountered"), so in one process
one faulty row would fail every row, the profile and the launch counts after it. A kernel that
never returns would hold the check until the machine's limit. Here the parent starts a child per
section (``python -m memnets.bench.isolated SPEC``) and reads the child's progress file, which the
child rewrites (atomically) before and after each row: the rows measured so far and the row
being measured. When the child dies, or a row runs past ``row_limit_s``, or a row fails and the
child then finds its CUDA context unusable (it exits with :data:`EXIT_CUDA_LOST`), that row is
recorded with the reason and a new child resumes after it: it is handed the rows already
measured, which its bench gives back in order instead of measuring them again
(:class:`memnets.bench.gpu._Bench`'s ``replay``), so later rows still pair with them and the
section's budget carries over. A child that dies twice at the same place (outside a row) ends
the section, as does the check's time limit.

For tests, ``MEMNETS_GPU_CHECK_FAULT="crash:<row name>"`` (or ``hang:``) makes a child die (or
hang) when it starts a row of that name (``crash_once:``/``hang_once:``: only in the first child
of the section); ``lost:<row name>`` fails such a row and has the child then take its CUDA
context for unusable, as after an illegal memory access.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ..train.checkpoint import atomic_write_text

__all__ = ["run_section", "run_job", "child_main", "cuda_usable", "EXIT_CUDA_LOST", "FAULT_ENV", "ROW_LIMIT_S"]

EXIT_CUDA_LOST = 3  # a child whose CUDA context failed after a row's error
FAULT_ENV = "MEMNETS_GPU_CHECK_FAULT"
ROW_LIMIT_S = 180.0  # a row (first call, warm-up, repeats) still running after this is stopped
MAX_CHILDREN = 40  # per section: each one that fails at a row moves past it, so a kernel that faults at
# every row of one model costs those rows (and a start each), not the models after it


def _write_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, default=str))


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------- child
def cuda_usable(device=None) -> bool:
    """Whether this process's CUDA context still runs work (after an illegal memory access, or
    any sticky error, every call raises)."""
    import torch

    try:
        torch.cuda.synchronize(device)
        return float((torch.ones(1, device=device) + 1).item()) == 2.0
    except Exception:  # noqa: BLE001 - a context that failed raises on anything
        return False


def _fault(row: dict, first_child: bool) -> str | None:
    """The fault ``MEMNETS_GPU_CHECK_FAULT`` asks for at this row, if any (tests only): dies or
    hangs here, or returns ``"lost"``."""
    spec = os.environ.get(FAULT_ENV, "")
    kind, _, name = spec.partition(":")
    if not name or row["name"] != name:
        return None
    if kind.endswith("_once"):
        if not first_child:
            return None
        kind = kind[:-len("_once")]
    if kind == "crash":
        os._exit(70)
    if kind == "hang":
        time.sleep(3600)
    return kind if kind == "lost" else None


def child_main(spec_path: str | Path) -> int:
    """The child's side: run the job its spec names, rewriting its progress file as it goes."""
    import torch

    from .gpu_check import _exit_with_parent

    _exit_with_parent()  # a child must not outlive the check
    spec = json.loads(Path(spec_path).read_text())
    progress = Path(spec["progress"])
    state: dict[str, Any] = {"rows": [], "current": None, "spent": float(spec.get("spent", 0.0)),
                             "state": "running", "error": None, "result": None}
    device = torch.device("cuda" if torch.cuda.is_available() and not spec.get("cpu") else "cpu")
    _write_atomic(progress, state)
    try:
        if spec["job"] == "section":
            from .gpu import _Bench
            from .gpu_check import SECTIONS

            first_child = not spec.get("replay") and not spec.get("restarted")
            lost: list[dict] = []  # a row after which the context is taken for unusable (tests)

            def on_start(row: dict) -> None:
                state["current"] = {**row, "started": time.time()}
                _write_atomic(progress, state)
                if _fault(row, first_child) == "lost":
                    lost.append(row)

            def on_row(row: dict) -> None:
                if any(r is row for r in lost):
                    row.update(ms=None, first_ms=None, note=f"error: {FAULT_ENV} made this row fail")
                state["current"] = None
                state["spent"] = bench.section_spent
                _write_atomic(progress, state)
                if str(row.get("note", "")).startswith("error") and \
                        (lost or device.type == "cuda" and not cuda_usable(device)):
                    state["state"] = "cuda_lost"
                    _write_atomic(progress, state)
                    sys.stdout.flush()
                    os._exit(EXIT_CUDA_LOST)

            bench = _Bench(device, spec["bench_seconds"], verbose=spec.get("verbose", True),
                           deadline=time.perf_counter() + spec["remaining_s"], on_row=on_row, on_start=on_start,
                           replay=spec.get("replay"))
            bench.rows = state["rows"]
            bench.start_section(spec["section"], share=spec["share"])
            bench.section_spent = state["spent"]
            SECTIONS[spec["section"]](bench, device.type != "cuda")
            state["spent"] = bench.section_spent
        elif spec["job"] == "profile":
            from . import gpu_profile
            state["result"] = gpu_profile.run()
        elif spec["job"] == "launches":
            from . import launches
            cuda = device.type == "cuda"
            lc = launches.run(batch=4 if cuda else 2, length=16 if cuda else 4, device=device, tiny=not cuda)
            state["result"] = {k: lc[k] for k in ("rows", "notes", "batch", "length", "device")}
        else:
            raise ValueError(f"unknown job {spec['job']!r}")
        state["state"] = "done"
        code = 0
    except Exception as e:  # noqa: BLE001 - said in the progress file, for the parent
        state["state"] = "error"
        state["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc()
        code = 1
    _write_atomic(progress, state)
    sys.stdout.flush()
    return code


# ------------------------------------------------------------------------------------ parent
def _start(spec: dict, folder: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    from .gpu_check import REPO, _child_env, _popen_group

    folder = folder / "children"
    folder.mkdir(parents=True, exist_ok=True)
    spec_path, progress = folder / f"gpu-check-child-{tag}.spec.json", folder / f"gpu-check-child-{tag}.json"
    progress.unlink(missing_ok=True)
    _write_atomic(spec_path, {**spec, "progress": str(progress)})
    p = _popen_group([sys.executable, "-m", "memnets.bench.isolated", str(spec_path)], cwd=REPO, env=_child_env(),
                     stdin=subprocess.DEVNULL)
    return p, progress


def _watch(p: subprocess.Popen, progress: Path, *, row_limit_s: float, end: float,
           on_progress: Callable[[dict], None] | None = None) -> tuple[dict | None, str | None]:
    """Wait for the child; the last progress it wrote, and why it was stopped (None: it ended)."""
    from .gpu_check import _kill_group

    seen = None
    why = None
    while p.poll() is None:
        time.sleep(0.25)
        state = _read(progress)
        if state is not None:
            key = (len(state["rows"]), state.get("current") is None, state.get("spent"))
            if key != seen and on_progress is not None:
                on_progress(state)
            seen = key
            cur = state.get("current")
            if cur is not None and time.time() - cur["started"] > row_limit_s:
                why = f"no result within {row_limit_s:.0f} s: its process was stopped"
        if why is None and time.perf_counter() > end:
            why = "the check's time limit was reached: its process was stopped"
        if why is not None:
            _kill_group(p)
            break
    return _read(progress), why


def run_section(name: str, *, folder: str | Path, cpu: bool, bench_seconds: float, share: float,
                deadline: float, row_limit_s: float = ROW_LIMIT_S, verbose: bool = True,
                on_rows: Callable[[list[dict]], None] | None = None,
                say: Callable[[str], None] = print) -> tuple[list[dict], list[str]]:
    """Run the bench section ``name`` in child processes (the module's doc); its rows, in order,
    and notes on every child that did not end well. ``deadline``: ``time.perf_counter()`` after
    which no row starts (the children are stopped a row's limit after it)."""
    folder = Path(folder)
    rows: list[dict] = []
    notes: list[str] = []
    spent = 0.0
    stuck_at = None
    for n in range(MAX_CHILDREN):
        spec = {"job": "section", "section": name, "cpu": cpu, "bench_seconds": bench_seconds, "share": share,
                "remaining_s": max(0.0, deadline - time.perf_counter()), "spent": spent, "replay": rows,
                "restarted": n > 0, "verbose": verbose}
        p, progress = _start(spec, folder, name)

        def on_progress(state: dict, known: int = len(rows)) -> None:
            if on_rows is not None and len(state["rows"]) >= known:  # not while a new child replays
                on_rows(state["rows"])
        state, why = _watch(p, progress, row_limit_s=row_limit_s, end=deadline + row_limit_s,
                            on_progress=on_progress)
        code = p.returncode
        state = state or {"rows": rows, "current": None, "spent": spent, "state": "no progress file"}
        if len(state["rows"]) >= len(rows):
            rows, spent = state["rows"], float(state.get("spent") or spent)
        if state["state"] == "done" and why is None and code == 0:
            break
        cur = state.get("current")
        if why is None:
            why = ("its CUDA context was unusable after the row's error" if code == EXIT_CUDA_LOST
                   else f"its process died (exit code {code}; state: {state['state']}"
                        + (f", {state['error']}" if state.get("error") else "") + ")")
        if cur is not None:
            cur = {k: v for k, v in cur.items() if k != "started"}
            cur.update(ms=None, first_ms=None, note=f"error: {why}")
            rows = rows + [cur]
        elif code == EXIT_CUDA_LOST and rows:
            rows[-1]["note"] = (rows[-1].get("note") or "") + "; its CUDA context was unusable after it"
        at = cur if cur is not None else rows[-1] if code == EXIT_CUDA_LOST and rows else None
        notes.append(f"{name}: child {n + 1} ended early ({why})" +
                     (f" at row {at['name']!r} {at['config']!r}" if at is not None else "") +
                     "; the rest of the section in a new process")
        say(notes[-1])
        if on_rows is not None:
            on_rows(rows)
        place = len(rows)
        if cur is None and place == stuck_at:
            notes.append(f"{name}: the section stopped: two processes in a row ended at the same place")
            say(notes[-1])
            break
        stuck_at = place
        if time.perf_counter() > deadline:
            break
    else:
        notes.append(f"{name}: the section stopped after {MAX_CHILDREN} processes")
    return rows, notes


def run_job(job: str, *, folder: str | Path, cpu: bool, limit_s: float) -> dict:
    """Run ``job`` (``profile`` or ``launches``) in a child process; its result, or a dict with
    ``note`` saying why there is none."""
    p, progress = _start({"job": job, "cpu": cpu}, Path(folder), job)
    state, why = _watch(p, progress, row_limit_s=float("inf"), end=time.perf_counter() + limit_s)
    if why is None and state is not None and state["state"] == "done" and p.returncode == 0:
        return state["result"]
    if why is None:
        why = f"its process died (exit code {p.returncode}" + \
              (f"; {state['error']}" if state and state.get("error") else "") + ")"
    return {"note": f"error: {why}", "rows": []}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
