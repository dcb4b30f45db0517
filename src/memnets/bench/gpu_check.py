"""``make gpu-check``: the CUDA tests, then the GPU bench rows that the speed targets name, in one
command on a fresh GPU machine (torch and triton only, no network), in at most 8 minutes.

``python -m memnets.bench.gpu_check`` (what ``make gpu-check`` runs, with ``PYTHONPATH=src``: no
install needed):

1. Optionally installs the wheels found in a folder (``--wheels``, default ``wheels/``) with
   ``pip install --no-index --no-deps``; none there is fine. On a machine with network::

       pip download --no-deps fla-core==0.6.0 pytest-xdist execnet -d wheels

   prepares the folder: fla-core for the fla rows, pytest-xdist and execnet (its one
   dependency) to run the tests in parallel.
2. On CUDA, starts the fla warm-up beside the tests: child processes (``--warm-only``, one per
   group: ``attention``, ``scan-delta``, ``scan-dplr``) that call, forward and backward, every
   fla kernel the attention and scan rows call, at the rows' shapes and dtypes, and
   ``nam_scan(impl="auto")`` at the scan rows' shapes (:func:`warmup_calls`). fla's autotuners
   keep their choices in Triton's on-disk cache (``FLA_CACHE_RESULTS=1``, fla's default, kept
   on) and the compiled kernels go to ``TRITON_CACHE_DIR`` (set to Triton's default folder when
   unset, so that every process shares it): the bench's own first calls then neither compile nor
   benchmark autotune configs. The bench waits for the warm-up before its first row (at most
   ``--warmup-timeout`` seconds after its start, then it is stopped), so no row is timed beside
   it (a row that still was is marked ``during_warmup``). Each child writes
   ``gpu-check-warmup-<group>.json`` (what it called, seconds each) into ``--out``; the summary
   is ``result["warmup"]``. A warm-up that fails or is cut short is a note, never a failure.
   The autotune timings are taken while the tests share the GPU: ``nam_scan(impl="auto")`` runs
   the same fla kernels with the same cached choices as the fla rows, so the scan ratios are not
   affected; ``--no-warmup`` restores first calls inside the bench.
3. Runs the Triton kernels' tests (``tests/test_triton_*.py``: each kernel against its reference,
   and replayed from CUDA graphs), the whole-step capture's (``tests/test_graph_step.py``,
   ``tests/test_step_guard.py``), then ``tests/test_cuda.py`` and ``tests/test_cuda_nam_tm.py``
   on CUDA (the CPU stand-ins of those tests are CI's; the ``compile`` tests only with
   ``--with-compile``), under a time limit; with ``pytest -n N`` when pytest-xdist is installed
   (N = min(8, CPU count // 2), at least 2; ``--tests-workers``), so that the Triton
   compilations of the tests run side by side.
4. Times the bench rows, each against its baseline:

   - ``models``: one training step (forward, backward, Adam), float32, B=32, against cuDNN
     ``nn.LSTM`` of the same width: LSAM hidden 256 and 1024, uni- and bidirectional, T=100;
     the NAM-TM at the bench's width (hidden 128, 4 tapes of 32) and the paper's (hidden 1024,
     8 tapes), T=50; the DNC (LSTM 64, memory 16x20, 4 reads; LSTM 256, memory 32x64), T=41;
     the NTM (LSTM 100, memory 128x20), T=41. Target: at most 2.0x the LSTM's time. LSAM, the
     DNC and the NTM also once more with ``MEMNETS_CUDA_GRAPHS=0`` ("no graph replay"), the
     loops launched one by one; the NAM-TM once more with ``MEMNETS_MODULE_GRAPHS=0``, its layer
     not graphed whole (the layer function's own graphs only), and the DNC likewise
     (``MEMNETS_MODULE_GRAPHS=0``: its recurrence's graphs only). The NTM also at 4 and 8 warps per program
     (``MEMNETS_NTM_WARPS``; 16 by default at this size), a comparison. The DNC at LSTM 64, whose
     time loop is one kernel each way by default, once more with it one launch per step
     (``MEMNETS_TIME_LOOP=steps``), and at 4 and 16 warps per program both ways
     (``MEMNETS_DNC_WARPS``; by default 4 forward, 8 backward), comparisons; and the NTM, per
     step by default at 128 x 20, once more with it one kernel (``=kernel``), as a loop runs
     them and with the whole step graphed. Every model and its LSTM once more with the whole
     training step replayed from one CUDA graph each ("whole step graphed",
     :class:`memnets.train.graph_step.CUDAGraphStep`), the pair's ratio against the same target.
     The LSTM of LSAM's, the DNC's and the NTM's rows also with ``torch.backends.cudnn.allow_tf32
     = False`` ("TF32 off"): by default cuDNN's RNNs multiply float32 in TF32 on tensor cores and
     cuBLAS matmuls (ours) do not, so that row is the LSTM at our precision, a comparison.
   - ``attention``: ``nam_attention`` forward+backward, bf16, B=1 H=8 d=64, S=32K, non-causal
     and causal, beside flash SDPA and fla's ``chunk_linear_attn`` on the same normalised
     inputs. Target: at most 0.6 ms non-causal, 0.9 ms causal, or within 1.2x of fla's.
   - ``scan``: ``nam_scan(impl="auto")`` forward+backward, bf16, B=8 H=16 d=64, T=2K, 8K, 32K,
     against the fla kernel it calls (``chunk_delta_rule`` for p_e = p_w,
     ``chunk_dplr_delta_rule`` otherwise). Target: within 1.1x.

   Each row's first call (JIT compilation, Triton autotuning) is timed on its own (``first_ms``)
   and, with the warm-up calls, kept out of the bench budget (``--bench-seconds``, which counts
   the timed repeats only); ``--total-seconds`` stops everything still left (marked skipped).

   Each section runs in a child process of its own (:mod:`memnets.bench.isolated`), as do the
   profile and the launch counts: a row whose kernel faults (the process's CUDA context then
   fails every later call) or hangs past ``--row-limit`` is recorded as such, and a new child
   resumes the section after it; ``--in-process`` runs them all in this process.

5. On CUDA, profiles one training step of each memory: wall time against the device time of
   its kernels (:mod:`memnets.bench.gpu_profile`; ``--no-profile`` leaves it out).
6. Counts the kernel launches of one training step of each recurrent memory on the GPU
   (``memnets bench launches --device cuda``, B=4, T=16).

The time plan (the tests' limit, the warm-up's, the bench's budget, the total) is printed first
and kept as ``result["plan"]``; the seconds each phase took (wheels, tests, warm-up and how long
the bench waited for it, each section, profile, launch counts, total) are printed last and kept
as ``result["phases"]``.

Writes ``gpu-check.json`` and ``gpu-check.md`` (a table naming the GPU) into ``--out`` (default
``out/gpu-check``) and, when the environment variable ``OUT`` is set, into that folder too; both
are rewritten after every row, so a run cut short leaves what it measured. ``--cpu`` runs the
same rows at tiny sizes on the CPU (a dry run of the driver, not a measurement): rows whose
kernels need CUDA (flash SDPA, fla's chunked kernels) are kept in the table, marked so; the
warm-up runs on CUDA only.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..train.checkpoint import atomic_write_text
from . import isolated

__all__ = ["run", "main", "format_markdown", "ROW_COLUMNS", "warmup_calls", "warm_up", "WarmUp", "WARM_GROUPS",
           "parse_test_results", "xdist_workers"]

REPO = Path(__file__).resolve().parents[3]
TEST_FILES = ("tests/test_triton_graphs.py", "tests/test_triton_lsam.py", "tests/test_triton_dnc.py",
              "tests/test_triton_ntm.py", "tests/test_triton_nam_tm.py", "tests/test_triton_nam_attention.py",
              "tests/test_triton_attention.py", "tests/test_graph_step.py", "tests/test_step_guard.py",
              "tests/test_optim_fused.py",
              "tests/test_cuda.py", "tests/test_cuda_nam_tm.py")
ROW_COLUMNS = ["section", "name", "config", "dtype", "first_ms", "ms", "baseline", "ratio", "target", "meets",
               "note"]
TIME_LIMIT_S = 480.0  # the whole check, on a fresh GPU machine
JOB_LIMIT_S = 120.0  # the profile, the launch counts: each stopped after this
WARM_GROUPS = ("attention", "scan-delta", "scan-dplr")  # one warm-up process each, side by side


# ----------------------------------------------------------------------------------- wheels
def install_wheels(folder: str | Path, python: str = sys.executable) -> list[dict]:
    """``pip install --no-index --no-deps`` each ``*.whl`` of ``folder`` (no network); a missing
    folder is no error. Returns what was tried and how it went."""
    folder = Path(folder)
    done = []
    for whl in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        p = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(whl)],
                           capture_output=True, text=True)
        done.append({"wheel": whl.name, "ok": p.returncode == 0,
                     "error": None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1][:300]})
    if done:
        import importlib

        importlib.invalidate_caches()  # so that this process finds what was just installed (fla, xdist)
    return done


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen_group(cmd: list[str], **kw) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kw)`` in a session of its own (POSIX) whose SIGINT has its
    default action even where this process ignores it (started with ``nohup`` or in a shell's
    background, an ignored signal stays ignored across ``exec``): :func:`_interrupt_group` can
    then make pytest stop and print its summary."""
    if os.name == "posix":
        kw.update(start_new_session=True, preexec_fn=_default_sigint)
    return subprocess.Popen(cmd, **kw)


def _interrupt_group(p: subprocess.Popen, wait: float = 20.0) -> None:
    """Send SIGINT to a child started with ``start_new_session=True`` and its group (pytest then
    stops and prints its summary, the failures' tracebacks included), wait up to ``wait``
    seconds, then :func:`_kill_group`."""
    if os.name == "posix" and p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGINT)
            p.wait(timeout=wait)
        except (ProcessLookupError, PermissionError, OSError, subprocess.TimeoutExpired):
            pass
    _kill_group(p)


def _kill_group(p: subprocess.Popen) -> None:
    """Kill a child started with ``start_new_session=True`` and everything it started (pytest's
    xdist workers, a compiler), then reap it."""
    if p.poll() is None:
        try:
            if os.name == "posix":
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except (ProcessLookupError, PermissionError, OSError):
            p.kill()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _child_env() -> dict[str, str]:
    """The environment of the child processes: ``src/`` first on ``PYTHONPATH``, unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _share_triton_cache() -> tuple[str, list[str]]:
    """Set ``TRITON_CACHE_DIR`` (Triton's own default folder when unset) and ``FLA_CACHE_RESULTS=1``
    in this process's environment, which every child inherits: compiled kernels and fla's autotune
    choices are then found on disk by every process. Returns the folder and notes."""
    notes = []
    folder = os.environ.get("TRITON_CACHE_DIR")
    if not folder:
        home = os.environ.get("TRITON_HOME") or os.path.expanduser("~/")
        folder = os.path.join(home, ".triton", "cache")
        os.environ["TRITON_CACHE_DIR"] = folder
    if os.environ.get("FLA_CACHE_RESULTS", "1") != "1":
        notes.append(f"FLA_CACHE_RESULTS was {os.environ['FLA_CACHE_RESULTS']!r}; set to '1' so that fla's autotune "
                     "choices are cached on disk")
        os.environ["FLA_CACHE_RESULTS"] = "1"
    return folder, notes


# ------------------------------------------------------------------------------------ tests
_STATES = r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
# pytest -v: "tests/x.py::test_y PASSED    [ 10%]"; with pytest-xdist: "[gw0] [ 10%] PASSED tests/x.py::test_y"
_RESULT = re.compile(r"^(tests/\S+::\S+)\s+" + _STATES + r"\b")
_RESULT_XDIST = re.compile(r"^\[gw\d+\](?:\s+\[\s*\d+%\])?\s+" + _STATES + r"\s+(tests/\S+::\S+)")


def parse_test_results(text: str) -> dict[str, str]:
    """``{test id: state}`` from the ``pytest -v`` output, one process or pytest-xdist's workers
    (the last state of a test wins: a teardown error follows its PASSED)."""
    results = {}
    for line in text.splitlines():
        line = line.strip()
        m = _RESULT.match(line)
        if m:
            results[m.group(1)] = m.group(2)
            continue
        m = _RESULT_XDIST.match(line)
        if m:
            results[m.group(2)] = m.group(1)
    return results


_SUMMARY = re.compile(r"^(FAILED|ERROR) (tests/\S+::\S+|tests/\S+)(?: - (.*))?$")


def failure_messages(text: str, width: int = 300) -> dict[str, str]:
    """``{test id: message}`` from the short summary that ``pytest -rfE`` prints at its end (also
    after an interrupt): each failed test's exception line, cut to ``width`` characters."""
    out = {}
    for line in text.splitlines():
        m = _SUMMARY.match(line.strip())
        if m:
            out[m.group(2)] = (m.group(3) or "").strip()[:width]
    return out


def xdist_workers(cpu_count: int | None = None) -> int:
    """How many pytest-xdist workers the tests get: min(8, CPU count // 2), at least 2; 0 when
    pytest-xdist is not installed (one process, as without it)."""
    if importlib.util.find_spec("xdist") is None:
        return 0
    n = cpu_count if cpu_count is not None else (os.cpu_count() or 2)
    return max(2, min(8, n // 2))


def run_tests(*, cuda: bool, timeout: float, k: str | None = None, with_compile: bool = False,
              log_path: Path | None = None, python: str = sys.executable, workers: int | None = None,
              fla: bool | None = None, per_test: float | None = None) -> dict[str, Any]:
    """Run the CUDA test files in a child pytest (``-m "not slow"``), at most ``timeout`` seconds.

    On CUDA only the CUDA variants run (``-k "not cuda_path"``; the ``compile`` tests only with
    ``with_compile``); ``k`` overrides the selection. ``workers``: pytest-xdist's ``-n`` (``None``:
    :func:`xdist_workers`; 0: one process). ``fla``: True, only the tests of fla's kernels (names
    holding "fla"); False, all but those; None, all. Returns the counts, the failed tests with
    their messages (``-rfE``), the wall time and whether the limit cut the run short (pytest then
    gets SIGINT, prints its summary, and is killed with its workers). ``per_test``: pytest-timeout's
    limit per test (default 0.6 of ``timeout``)."""
    files = [f for f in TEST_FILES if (REPO / f).is_file()]
    if not files:
        return {"status": "not run: tests/ not found beside the package", "passed": 0, "failed": 0,
                "skipped": 0, "errors": 0}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run: pytest is not installed", "passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if k is None:
        k = "not cuda_path" + ("" if with_compile else " and not train_compile") if cuda else "cuda_path"
        if fla is not None:  # the tests of fla's kernels apart (their first calls compile for minutes)
            k = f"({k}) and " + ("fla" if fla else "not fla")
    if workers is None:
        workers = xdist_workers()
    elif workers and importlib.util.find_spec("xdist") is None:
        workers = 0
    cmd = [python, "-m", "pytest", "-v", "--tb=short", "-rfE", "-p", "no:cacheprovider", "-m", "not slow",
           "-k", k, *files]
    if workers:
        cmd += ["-n", str(workers)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={int(per_test) if per_test else max(30, int(timeout * 0.6))}")
    env = _child_env()
    t0 = time.perf_counter()
    timed_out = False
    p = _popen_group(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     errors="replace")
    try:
        out, _ = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        timed_out, code = True, None
        _interrupt_group(p)  # pytest prints its summary (the tracebacks), then it and its workers go
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out = "(the output was lost: pytest did not close its output after it was killed)"
    except BaseException:  # Ctrl-C: its own session does not get the signal; stop it and its workers
        _kill_group(p)
        raise
    out = out or ""
    wall = time.perf_counter() - t0
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(out)
    results = parse_test_results(out)
    count = lambda *states: sum(1 for s in results.values() if s in states)  # noqa: E731
    res = {"command": " ".join(cmd[1:]), "seconds": round(wall, 1), "timeout_s": timeout, "timed_out": timed_out,
           "workers": workers,
           "exit_code": code, "passed": count("PASSED", "XPASS"), "failed": count("FAILED"),
           "skipped": count("SKIPPED", "XFAIL"), "errors": count("ERROR"),
           "failures": sorted(t for t, s in results.items() if s in ("FAILED", "ERROR"))}
    messages = failure_messages(out)
    if messages:
        res["failure_messages"] = messages
    if timed_out:
        res["status"] = f"cut short after {timeout:.0f} s"
    elif code == 5:
        res["status"] = "no test selected"
    elif code == 0:
        res["status"] = "ok"
    else:
        res["status"] = "failures" if res["failed"] or res["errors"] else f"pytest exited {code}"
    return res


# ------------------------------------------------------------------------------------- rows
def _pair(ours: dict, base: dict | None, target: float, what: str) -> None:
    """Put ``ours``'s ratio to ``base`` and whether it meets ``target`` (ratio at most) on the row."""
    ours["target"] = f"<= {target:g}x {what}"
    if base is None:
        return
    ours["baseline"] = base["name"]
    if ours["ms"] and base["ms"]:
        ours["ratio"] = round(ours["ms"] / base["ms"], 3)
        ours["meets"] = ours["ratio"] <= target


def _compare(ours: dict, base: dict) -> None:
    """Mark ``ours`` a comparison row against ``base``: its name as the baseline, and the ratio
    of their times where both were timed."""
    ours["target"] = "comparison"
    if base["ms"] and ours["ms"]:
        ours["baseline"], ours["ratio"] = base["name"], round(ours["ms"] / base["ms"], 3)


def _cuda_only(bench, section: str, name: str, config: str, dtype, why: str, extra: dict) -> dict:
    """A row whose kernel needs CUDA, recorded unrun on the CPU."""
    return bench.measure(section, name, config, dtype, lambda: _raise_na(f"needs CUDA ({why}); not run on "
                                                                         f"{bench.device}"),
                         0, 1, extra={"needs_cuda": True, **extra})


def _raise_na(msg: str):
    from .gpu import _NotAvailable
    raise _NotAvailable(msg)


# The attention and scan rows' shapes and inputs, shared with the warm-up (which must call fla's
# kernels exactly as the rows do: same shapes, dtypes, arguments and backward).
ROWS_DTYPE = torch.bfloat16
SCAN_KERNELS = ((True, "delta_chunk", "fla chunk_delta_rule"),  # (p_e = p_w, fla_kernels role, row name)
                (False, "general_chunk", "fla chunk_dplr_delta_rule gk=0"))


def _attention_sizes(tiny: bool) -> tuple[int, int, int, int]:
    """``(B, H, d, S)`` of the attention rows."""
    return 1, 8, 64, (256 if tiny else 32768)


def _scan_sizes(tiny: bool) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """``((B, H, d), lengths)`` of the scan rows."""
    return ((1, 2, 16), (32, 64, 128)) if tiny else ((8, 16, 64), (2048, 8192, 32768))


def _wide_attention_sizes(tiny: bool) -> tuple[int, int, int, int]:
    """``(B, H, d, S)`` of the wide-head attention rows (head dim 128)."""
    return 1, (2 if tiny else 8), 128, (128 if tiny else 16384)


def _attention_inputs(dev, B: int, H: int, S: int, d: int, dtype, layout: str = "bhsd") -> list[torch.Tensor]:
    from ..ops import unit

    g = torch.Generator(device=dev).manual_seed(0)
    ts = [torch.randn(B, H, S, d, device=dev, generator=g).to(dtype) for _ in range(3)]
    if layout == "bshd":  # fla's layout, on μ(q), μ(k): the inputs nam_attention normalises
        ts = [unit(ts[0]), unit(ts[1]), ts[2]]
        ts = [t.transpose(1, 2).contiguous() for t in ts]
    return [t.requires_grad_(True) for t in ts]


def _fla_attention_step(linear_attn: Callable, dev, B: int, H: int, S: int, d: int, dtype) -> Callable[[], None]:
    """fla's ``chunk_linear_attn`` forward+backward as the attention row times it."""
    from .gpu import _fwd_bwd

    q, k, v = _attention_inputs(dev, B, H, S, d, dtype, "bshd")
    return _fwd_bwd(lambda: linear_attn(q, k, v, scale=1.0, normalize=False)[0], [q, k, v])


def _nam_attention_step(causal: bool, impl: str, dev, B: int, H: int, S: int, d: int,
                        dtype) -> Callable[[], None]:
    """``nam_attention(impl=impl)`` forward+backward as the attention rows time it."""
    from ..ops import nam_attention
    from .gpu import _fwd_bwd

    q, k, v = _attention_inputs(dev, B, H, S, d, dtype)
    return _fwd_bwd(lambda: nam_attention(q, k, v, is_causal=causal, impl=impl), [q, k, v])


def _scan_inputs(dev, B: int, T: int, H: int, d: int, dtype) -> list[torch.Tensor]:
    """q, k (unit rows), v ``[B, T, H, d]`` and p_w, p_e ``[B, T, H]``, all requiring grad."""
    from ..ops import unit

    g = torch.Generator(device=dev).manual_seed(0)
    shape = (B, T, H, d)
    ts = [unit(torch.randn(shape, device=dev, generator=g)).to(dtype),
          unit(torch.randn(shape, device=dev, generator=g)).to(dtype),
          torch.randn(shape, device=dev, generator=g).to(dtype),
          torch.rand(B, T, H, device=dev, generator=g).to(dtype),
          torch.rand(B, T, H, device=dev, generator=g).to(dtype)]
    return [t.requires_grad_(True) for t in ts]


def _fla_scan_step(fn: Callable, role: str, dev, B: int, T: int, H: int, d: int, dtype) -> Callable[[], None]:
    """fla's kernel ``fn`` (``role``: ``delta_chunk`` or ``general_chunk``) forward+backward as the
    scan row times it: the NAM write with p_e = p_w (delta rule) or any p_e (DPLR, no decay)."""
    from .gpu import _fwd_bwd

    q, k, v, pw, pe = _scan_inputs(dev, B, T, H, d, dtype)
    if role == "delta_chunk":
        call = lambda: fn(q=q, k=k, v=v, beta=pw, scale=1.0, output_final_state=True)  # noqa: E731
    else:
        gk = torch.zeros_like(k)  # no decay
        call = lambda: fn(q=q, k=k, v=v * pw[..., None], a=k, b=-pe[..., None] * k,  # noqa: E731
                          gk=gk, scale=1.0, output_final_state=True)
    return _fwd_bwd(call, [q, k, v, pw, pe])


def _nam_scan_step(same: bool, dev, B: int, T: int, H: int, d: int, dtype) -> Callable[[], None]:
    """``nam_scan(impl="auto")`` forward+backward as the scan row times it."""
    from ..ops import nam_scan
    from .gpu import _fwd_bwd

    q, k, v, pw, pe = _scan_inputs(dev, B, T, H, d, dtype)
    return _fwd_bwd(lambda: nam_scan(q, k, v, pw, pw if same else pe, impl="auto"), [q, k, v, pw, pe])


def _models_rows(bench, tiny: bool) -> None:
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM
    from ..ops.gpu.dnc import WARPS_ENV as DNC_WARPS
    from ..ops.gpu.dnc import time_loop_in_kernel as time_loop_in_kernel_dnc
    from ..ops.gpu.ntm import WARPS_ENV as NTM_WARPS, time_loop_in_kernel as time_loop_in_kernel_ntm
    from .gpu import _train_step

    dev = bench.device
    cuda = dev.type == "cuda"
    warmup, repeat = (2, 10) if not tiny else (1, 1)

    def case(name, cfg, build, B, T, Fi, extra=None, graphed=False, guard=False):
        made = []

        def make():
            torch.manual_seed(0)
            model = build().to(dev)
            x = torch.randn(B, T, Fi, device=dev)
            made.append(_train_step(model, x, lambda x: model(x)[0], graphed=graphed, guard=guard))
            return made[-1]
        row = bench.measure("models", name + (" (whole step graphed)" if graphed else ""), cfg, torch.float32,
                            make, warmup, repeat, extra={"B": B, "T": T, "needs_cuda": False, **(extra or {})})
        stats = getattr(made[-1], "stats", None) if made else None
        if stats is not None:  # whether the whole step was captured and replayed, or ran eagerly
            row["whole_step"] = dict(stats)
            if cuda and not stats.get("replayed"):
                row["note"] = (row.get("note") or "") + " not replayed: the capture failed, eager steps timed"
        return row

    def whole(name, cfg, build, B, T, Fi, lstm_build):
        """Ours and the LSTM with the whole training step replayed from one CUDA graph each
        (:class:`memnets.train.graph_step.CUDAGraphStep`): the launches of both sides gone."""
        base = case(lstm_build[0], cfg, lstm_build[1], B, T, Fi, {"baseline_row": True}, graphed=True)
        ours = case(name, cfg, build, B, T, Fi, graphed=True)
        _pair(ours, base, 2.0, "LSTM, both whole step graphed")
        if cuda and not all((r.get("whole_step") or {}).get("replayed") for r in (base, ours)):
            ours["meets"] = None  # one side ran eagerly: not on equal terms
        return ours, base

    def time_loop(name, cfg, build, B, T, Fi, base, whole_base, other):
        """The same rows with the recurrence's time loop in its ``other`` form
        (``MEMNETS_TIME_LOOP=steps``: the step kernel and a cuBLAS call each way per step;
        ``=kernel``: the whole loop one kernel each way), as a loop runs it and with the whole step
        graphed (where the kernels' own time shows), comparisons."""
        from ..ops.gpu import env_var
        from ..ops.gpu.rows import TIME_LOOP_ENV
        tag = f"{TIME_LOOP_ENV}={other}"
        with env_var(TIME_LOOP_ENV, other):
            rows = [(case(f"{name} ({tag})", cfg, build, B, T, Fi), base),
                    (case(f"{name} ({tag})", cfg, build, B, T, Fi, graphed=True), whole_base)]
        for row, against in rows:
            _pair(row, against, 2.0, "LSTM")
            row["meets"], row["target"] = None, f"comparison ({tag})"

    def eager(name, cfg, build, B, T, Fi, base):
        """The same row with the loops launched one by one (``MEMNETS_CUDA_GRAPHS=0``): its
        ratio is shown, but it is a comparison, not a target."""
        from ..ops.gpu import env_var
        with env_var("MEMNETS_CUDA_GRAPHS", "0"):
            row = case(name + " (no graph replay)", cfg, build, B, T, Fi)
        _pair(row, base, 2.0, "LSTM")
        row["meets"], row["target"] = None, "comparison (MEMNETS_CUDA_GRAPHS=0)"
        return row

    def module_graphs(value, name, cfg, build, B, T, Fi, base):
        """The same row with ``MEMNETS_MODULE_GRAPHS=value``, a comparison: ``0`` the NAM-TM
        without its layer graphed whole (cuDNN's controller and the output layer launched from
        Python around the layer function's own two graphs), the DNC without its layer graphed
        whole (the projections and the readout launched from Python around the recurrence's
        graphs)."""
        from ..ops.gpu import env_var
        with env_var("MEMNETS_MODULE_GRAPHS", value):
            row = case(f"{name} (MEMNETS_MODULE_GRAPHS={value})", cfg, build, B, T, Fi)
        _pair(row, base, 2.0, "LSTM")
        row["meets"], row["target"] = None, f"comparison (MEMNETS_MODULE_GRAPHS={value})"
        return row

    def warps(model, env, counts, cfg, build, B, T, Fi, base):
        """The DNC's and the NTM's kernels run one program per sequence, so the warps per program
        set how a step's work spreads: the same step at other counts (``env``), comparisons."""
        from ..ops.gpu import env_var
        for nw in counts:
            with env_var(env, str(nw)):
                row = case(f"{model} ({env}={nw})", cfg, build, B, T, Fi)
            _pair(row, base, 2.0, "LSTM")
            row["meets"], row["target"] = None, f"comparison ({env})"

    def lstm_build(Fi, D, bi=False):
        name = ("nn.LSTM (cuDNN)" if cuda else "nn.LSTM (CPU)") + (" bi" if bi else "")
        return name, lambda: torch.nn.LSTM(Fi, D // 2 if bi else D, batch_first=True, bidirectional=bi)

    def lstm(cfg, Fi, D, B, T, bi=False):
        name, build = lstm_build(Fi, D, bi)
        return case(name, cfg, build, B, T, Fi, {"baseline_row": True})

    def lstm_fp32(cfg, Fi, D, B, T, ours, bi=False):
        """cuDNN's LSTM once more with ``torch.backends.cudnn.allow_tf32 = False``: PyTorch lets
        cuDNN's RNNs multiply float32 in TF32 on tensor cores by default, while matmuls (ours,
        through cuBLAS and in our kernels) stay float32 unless ``torch.backends.cuda.matmul.
        allow_tf32`` is set; this row is the LSTM at our precision. ``ours`` gets its ratio to it
        (``ratio_lstm_tf32_off``), a comparison beside the target's default-settings ratio."""
        if not cuda:
            return
        name, build = lstm_build(Fi, D, bi)
        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            base = case(name + " TF32 off", cfg, build, B, T, Fi, {"baseline_row": True})
        finally:
            torch.backends.cudnn.allow_tf32 = old
        if ours.get("ms") and base.get("ms"):
            ours["ratio_lstm_tf32_off"] = round(ours["ms"] / base["ms"], 3)
            ours["note"] = ((ours.get("note") or "") + "; " if ours.get("note") else "") + \
                f"{ours['ratio_lstm_tf32_off']:.2f}x the LSTM with TF32 off"

    B = 2 if tiny else 32
    T_lsam, T_tm, T_dnc = (6, 5, 6) if tiny else (100, 50, 41)
    for D, H in ([(16, 2)] if tiny else [(256, 8), (1024, 8)]):
        for bi in (False, True):
            cfg = f"B={B} T={T_lsam} hidden={D} heads={H}" + (" bi" if bi else "")
            base = lstm(cfg, D, D, B, T_lsam, bi)
            build = lambda D=D, H=H, bi=bi: LSAM(D, D, H, bidirectional=bi)  # noqa: E731
            ours = case("LSAM" + (" bi" if bi else ""), cfg, build, B, T_lsam, D)
            _pair(ours, base, 2.0, "LSTM")
            lstm_fp32(cfg, D, D, B, T_lsam, ours, bi)
            eager("LSAM" + (" bi" if bi else ""), cfg, build, B, T_lsam, D, base)
            whole("LSAM" + (" bi" if bi else ""), cfg, build, B, T_lsam, D, lstm_build(D, D, bi))
    tm = [("bench", 8, 16, 2, 8)] if tiny else [("bench", 64, 128, 4, 32), ("paper", 256, 1024, 8, 32)]
    for label, Fi, D, Tn, L in tm:
        cfg = f"B={B} T={T_tm} in={Fi} hidden={D} tapes={Tn}x{L} ({label} width)"
        base = lstm(cfg, Fi, D, B, T_tm)
        build = lambda Fi=Fi, D=D, Tn=Tn, L=L: NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L)  # noqa: E731
        ours = case("NAM-TM", cfg, build, B, T_tm, Fi)
        _pair(ours, base, 2.0, "LSTM")
        module_graphs("0", "NAM-TM", cfg, build, B, T_tm, Fi, base)
        whole("NAM-TM", cfg, build, B, T_tm, Fi, lstm_build(Fi, D))
    for Hc, N, W, R in ([(16, 8, 8, 2)] if tiny else [(64, 16, 20, 4), (256, 32, 64, 4)]):
        cfg = f"B={B} T={T_dnc} LSTM {Hc}, memory {N}x{W}, {R} reads"
        base = lstm(cfg, 9, Hc, B, T_dnc)
        build = lambda Hc=Hc, N=N, W=W, R=R: DNC(9, 8, memory_slots=N, word_size=W, read_heads=R,  # noqa: E731
                                                 controller_size=Hc)
        ours = case("DNC", cfg, build, B, T_dnc, 9)
        _pair(ours, base, 2.0, "LSTM")
        lstm_fp32(cfg, 9, Hc, B, T_dnc, ours)
        eager("DNC", cfg, build, B, T_dnc, 9, base)
        module_graphs("0", "DNC", cfg, build, B, T_dnc, 9, base)
        _, whole_base = whole("DNC", cfg, build, B, T_dnc, 9, lstm_build(9, Hc))
        if time_loop_in_kernel_dnc(Hc, R, W):  # the DNC at LSTM 256 has the per-step form alone
            time_loop("DNC", cfg, build, B, T_dnc, 9, base, whole_base, "steps")
            if cuda:  # by default 4 warps forward, 8 backward at LSTM 64
                warps("DNC", DNC_WARPS, (4, 16), cfg, build, B, T_dnc, 9, base)
    for Hc, N, W in ([(16, 8, 8)] if tiny else [(100, 128, 20)]):
        cfg = f"B={B} T={T_dnc} LSTM {Hc}, memory {N}x{W}, 1 read 1 write"
        base = lstm(cfg, 9, Hc, B, T_dnc)
        build = lambda Hc=Hc, N=N, W=W: NTM(9, 8, memory_slots=N, word_size=W, read_heads=1,  # noqa: E731
                                            write_heads=1, controller_size=Hc)
        ours = case("NTM", cfg, build, B, T_dnc, 9)
        _pair(ours, base, 2.0, "LSTM")
        lstm_fp32(cfg, 9, Hc, B, T_dnc, ours)
        eager("NTM", cfg, build, B, T_dnc, 9, base)
        whole_ours, whole_base = whole("NTM", cfg, build, B, T_dnc, 9, lstm_build(9, Hc))
        # what clipping and the spike guard (optim.spike_skip, decided on the GPU) add to a replayed step
        _compare(case("NTM (clip, spike guard)", cfg, build, B, T_dnc, 9, graphed=True, guard=True), whole_ours)
        # the other form of its time loop (at 128 x 20 the per-step one is the default)
        other = "steps" if time_loop_in_kernel_ntm(4 * Hc, W + Hc, N, W) else "kernel"
        time_loop("NTM", cfg, build, B, T_dnc, 9, base, whole_base, other)
        if cuda:
            warps("NTM", NTM_WARPS, (4, 8), cfg, build, B, T_dnc, 9, base)


def _attention_rows(bench, tiny: bool) -> None:
    from ..ops.attention import resolve_attention_impl
    from ..ops.gpu import causal_attention as ca
    from ..ops.gpu import env_var
    from .gpu import _fwd_bwd

    dev = bench.device
    cuda = dev.type == "cuda"
    B, H, d, S = _attention_sizes(tiny)
    dtype = ROWS_DTYPE
    warmup, repeat = (2, 10) if not tiny else (1, 1)

    def inputs(layout="bhsd"):
        return _attention_inputs(dev, B, H, S, d, dtype, layout)

    fla_row = None
    for causal in (False, True):
        cfg = f"B={B} H={H} d={d} S={S}" + (" causal" if causal else "")
        extra = {"S": S, "causal": causal}
        if cuda:
            def make_sdpa():
                from torch.nn.attention import SDPBackend, sdpa_kernel
                q, k, v = inputs()

                def call():
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return _fwd_bwd(call, [q, k, v])
            sdpa = bench.measure("attention", "sdpa (flash)", cfg, dtype, make_sdpa, warmup, repeat,
                                 extra={"needs_cuda": True, "baseline_row": True, **extra})
        else:
            sdpa = _cuda_only(bench, "attention", "sdpa (flash)", cfg, dtype, "flash attention",
                              {"baseline_row": True, **extra})
        if causal:  # fla's chunked linear attention is causal
            if cuda:
                def make_fla():
                    try:
                        from fla.ops.linear_attn import chunk_linear_attn
                    except Exception as e:  # noqa: BLE001
                        _raise_na(f"fla's chunk_linear_attn does not import: {type(e).__name__}: {e}")
                    return _fla_attention_step(chunk_linear_attn, dev, B, H, S, d, dtype)
                fla_row = bench.measure("attention", "fla chunk_linear_attn", cfg, dtype, make_fla, warmup, repeat,
                                        extra={"needs_cuda": True, "baseline_row": True, **extra})
            else:
                fla_row = _cuda_only(bench, "attention", "fla chunk_linear_attn", cfg, dtype, "fla's Triton kernels",
                                     {"baseline_row": True, **extra})

        def make_nam(impl="auto", causal=causal):
            return _nam_attention_step(causal, impl, dev, B, H, S, d, dtype)
        # the other paths nam_attention has, for comparison: the PyTorch form, and fla's kernel (causal)
        other = "fla" if causal else "torch"
        if other == "fla" and not cuda:
            _cuda_only(bench, "attention", "nam_attention impl=fla", cfg, dtype, "fla's Triton kernels", dict(extra))
        else:
            bench.measure("attention", f"nam_attention impl={other}", cfg, dtype, lambda: make_nam(other), warmup,
                          repeat, extra={"needs_cuda": other == "fla", **extra})
        q0 = torch.empty(1, 1, 1, d, device=dev, dtype=dtype)  # the choice depends on device, dtype and dims only
        used = resolve_attention_impl("auto", q0, q0, q0, causal=causal)
        ours = bench.measure("attention", "nam_attention", cfg, dtype, make_nam, warmup, repeat,
                             extra={"needs_cuda": False, "impl": used, **extra})
        # the backward one launch per gradient (4 warps each) instead of one, a comparison
        name = f"nam_attention ({ca.BACKWARD_ENV}=split)"
        if cuda:
            def make_split():
                fn = make_nam("triton")

                def call():
                    with env_var(ca.BACKWARD_ENV, "split"):
                        fn()
                return call
            split = bench.measure("attention", name, cfg, dtype, make_split, warmup, repeat,
                                  extra={"needs_cuda": True, **extra})
        else:
            split = _cuda_only(bench, "attention", name, cfg, dtype, "Triton kernels", dict(extra))
        _compare(split, ours)
        limit = 0.9 if causal else 0.6
        ours["target"] = f"<= {limit} ms, or <= 1.2x fla chunk_linear_attn"
        if sdpa["ms"] and ours["ms"]:
            ours["speedup_vs_sdpa"] = round(sdpa["ms"] / ours["ms"], 3)
        if fla_row is not None and fla_row["ms"] and ours["ms"]:
            ours["baseline"] = fla_row["name"]
            ours["ratio"] = round(ours["ms"] / fla_row["ms"], 3)
        if ours["ms"] and not tiny and cuda:
            ours["meets"] = ours["ms"] <= limit or (ours.get("ratio") is not None and ours["ratio"] <= 1.2)
        if bench.on_row is not None:
            bench.on_row(ours)
    _prefix_rows(bench, tiny)
    _wide_rows(bench, tiny)
    # the non-causal row's ratio to fla's (causal) kernel, now that it is timed
    for r in bench.rows:
        if r["name"] == "nam_attention" and not r.get("causal") and fla_row is not None and fla_row["ms"] and r["ms"]:
            r["baseline"], r["ratio"] = fla_row["name"] + " (causal)", round(r["ms"] / fla_row["ms"], 3)
            if not tiny and cuda:
                r["meets"] = r["ms"] <= 0.6 or r["ratio"] <= 1.2


def _wide_rows(bench, tiny: bool) -> None:
    """``nam_attention`` at head dim 128 (bf16, forward+backward), causal and not: its Triton
    kernels (chunks of 32, the backward one launch per gradient) beside what ``impl="auto"``
    takes there on CUDA (fla's kernel causal, the PyTorch path non-causal), a comparison that
    says whether ``auto`` should take the kernels at this width too."""
    from ..ops.attention import resolve_attention_impl

    dev = bench.device
    cuda = dev.type == "cuda"
    B, H, d, S = _wide_attention_sizes(tiny)
    dtype = ROWS_DTYPE
    warmup, repeat = (2, 10) if not tiny else (1, 1)
    q0 = torch.empty(1, 1, 1, d, device=dev, dtype=dtype)
    for causal in (False, True):
        cfg = f"B={B} H={H} d={d} S={S}" + (" causal" if causal else "")
        extra = {"S": S, "d": d, "causal": causal}

        def make(impl, causal=causal):
            return _nam_attention_step(causal, impl, dev, B, H, S, d, dtype)
        other = "fla" if causal else "torch"
        name = f"nam_attention d={d} impl={other}"
        if other == "fla" and not cuda:
            base = _cuda_only(bench, "attention", name, cfg, dtype, "fla's Triton kernels",
                              {"baseline_row": True, **extra})
        else:
            base = bench.measure("attention", name, cfg, dtype, lambda other=other: make(other), warmup, repeat,
                                 note=f"impl=auto takes {resolve_attention_impl('auto', q0, q0, q0, causal=causal)}",
                                 extra={"needs_cuda": other == "fla", "baseline_row": True, **extra})
        name = f"nam_attention d={d} impl=triton"
        if cuda:
            ours = bench.measure("attention", name, cfg, dtype, lambda: make("triton"), warmup, repeat,
                                 extra={"needs_cuda": True, **extra})
        else:
            ours = _cuda_only(bench, "attention", name, cfg, dtype, "Triton kernels", dict(extra))
        _compare(ours, base)


def _prefix_rows(bench, tiny: bool) -> None:
    """Causal ``nam_attention``'s prefix sums over its chunks' ``[dk, dv]`` sums (float32, the
    attention rows' shape: 512 chunks of 64 per sequence) by its Triton kernel and by
    ``torch.cumsum`` over the chunk dim (what it replaced, 0.21 ms a call on an H200), forward
    only, a comparison; the kernel's row needs CUDA."""
    from ..ops.gpu import causal_attention as ca

    dev = bench.device
    B, H, d, S = _attention_sizes(tiny)
    shape = (B * H, -(-S // ca.CHUNK), d, d)
    cfg = f"[{', '.join(map(str, shape))}] float32"
    warmup, repeat = (2, 10) if not tiny else (1, 1)

    def make(which):
        h = torch.randn(*shape, device=dev)
        if which == "torch":
            return lambda: h.cumsum_(1)
        return lambda: ca.chunk_prefix_(h)
    base = bench.measure("attention", "chunk prefix sums (torch.cumsum)", cfg, torch.float32,
                         lambda: make("torch"), warmup, repeat, extra={"baseline_row": True, "needs_cuda": False})
    if dev.type == "cuda":
        ours = bench.measure("attention", "chunk prefix sums (Triton)", cfg, torch.float32, lambda: make("triton"),
                             warmup, repeat, extra={"needs_cuda": True})
    else:
        ours = _cuda_only(bench, "attention", "chunk prefix sums (Triton)", cfg, torch.float32, "Triton kernels", {})
    _compare(ours, base)


def _scan_rows(bench, tiny: bool) -> None:
    from ..ops import nam_scan_resolve_impl
    from ..ops.delta.fla_backend import fla_available, fla_kernels, fla_reasons

    dev = bench.device
    cuda = dev.type == "cuda"
    dtype = ROWS_DTYPE
    (B, H, d), lengths = _scan_sizes(tiny)
    kernels = fla_kernels() if cuda and fla_available() else None
    why_not = "; ".join(fla_reasons(torch.zeros(1, device=dev))) or "fla unavailable"

    for T in lengths:
        warmup, repeat = (1, 1) if tiny else ((2, 10) if T <= 2048 else (1, 5) if T <= 8192 else (1, 3))
        cfg = f"B={B} H={H} d={d} T={T}"
        extra = {"B": B, "H": H, "d": d, "T": T}

        for same, role, fla_name in SCAN_KERNELS:
            tag = "p_e=p_w" if same else "p_e!=p_w"
            if cuda:
                def make_fla(role=role, T=T):
                    if kernels is None:
                        _raise_na(why_not)
                    return _fla_scan_step(kernels[role], role, dev, B, T, H, d, dtype)
                base = bench.measure("scan", f"{fla_name} ({tag})", cfg, dtype, make_fla, warmup, repeat,
                                     extra={"needs_cuda": True, "baseline_row": True, **extra})
            else:
                base = _cuda_only(bench, "scan", f"{fla_name} ({tag})", cfg, dtype, "fla's chunked Triton kernels",
                                  {"baseline_row": True, **extra})

            def make_ours(same=same, T=T):
                return _nam_scan_step(same, dev, B, T, H, d, dtype)
            probe = torch.zeros(1, T, 1, 1, device=dev, dtype=dtype)
            ours = bench.measure("scan", f"nam_scan auto ({tag})", cfg, dtype, make_ours, warmup, repeat,
                                 note=f"impl={nam_scan_resolve_impl('auto', probe)}",
                                 extra={"needs_cuda": False, **extra})
            _pair(ours, base if base["ms"] else None, 1.1, "fla's kernel")
            if bench.on_row is not None:
                bench.on_row(ours)


SECTIONS: dict[str, Callable] = {"models": _models_rows, "attention": _attention_rows, "scan": _scan_rows}


# ---------------------------------------------------------------------------------- warm-up
def _fla_warm_kernels() -> dict[str, Callable]:
    """fla's kernels that the rows call, by role: ``linear_attn`` (``chunk_linear_attn``) and
    those of :func:`memnets.ops.delta.fla_backend.fla_kernels` (``delta_chunk``, ``general_chunk``)."""
    from fla.ops.linear_attn import chunk_linear_attn

    from ..ops.delta.fla_backend import fla_kernels

    return {"linear_attn": chunk_linear_attn, **fla_kernels()}


def _warm_groups(sections) -> tuple[str, ...]:
    """The warm-up groups the bench ``sections`` use."""
    return tuple(g for g in WARM_GROUPS if ("attention" if g == "attention" else "scan") in sections)


def warmup_calls(device: torch.device | str, *, tiny: bool = False, kernels: dict[str, Callable] | None = None,
                 groups: tuple[str, ...] = WARM_GROUPS) -> list[tuple[str, Callable[[], None]]]:
    """The warm-up's calls, ``[(name, call)]``: each call builds the inputs of one bench row and
    runs it once, forward and backward, exactly as the row does (same shapes, dtypes, arguments).

    ``attention``: fla's ``chunk_linear_attn`` at the attention rows' size (bf16, B=1 H=8 d=64
    S=32K, fla's ``[B, T, H, D]`` layout, ``scale=1``, ``normalize=False``). ``scan-delta`` and
    ``scan-dplr``: for each of the scan rows' lengths, fla's ``chunk_delta_rule`` (p_e = p_w) or
    ``chunk_dplr_delta_rule`` (p_e != p_w, ``gk=0``), then ``nam_scan(impl="auto")`` on the same
    inputs (bf16, B=8 H=16 d=64, T=2K, 8K, 32K). ``tiny``: the rows' tiny (CPU dry run) sizes.
    ``kernels``: stands in for fla's functions by role (``linear_attn``, ``delta_chunk``,
    ``general_chunk``); ``None``: fla's, imported at the first call (a missing fla makes each fla
    call raise, not this function)."""
    unknown = [g for g in groups if g not in WARM_GROUPS]
    if unknown:
        raise ValueError(f"unknown warm-up group(s) {unknown}; expected among {list(WARM_GROUPS)}")
    dev = torch.device(device)
    dtype = ROWS_DTYPE
    found: dict[str, dict[str, Callable]] = {}

    def kern(role: str) -> Callable:
        if kernels is not None:
            return kernels[role]
        if "fla" not in found:
            found["fla"] = _fla_warm_kernels()
        return found["fla"][role]

    def once(make: Callable[[], Callable[[], None]]) -> Callable[[], None]:
        def call() -> None:
            fn = make()
            try:
                fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            finally:
                del fn
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        return call

    calls: list[tuple[str, Callable[[], None]]] = []
    if "attention" in groups:
        B, H, d, S = _attention_sizes(tiny)
        calls.append((f"fla chunk_linear_attn B={B} H={H} d={d} S={S}",
                      once(lambda sz=(B, H, S, d): _fla_attention_step(kern("linear_attn"), dev, *sz, dtype))))
        B, H, d, S = _wide_attention_sizes(tiny)  # the wide-head rows' fla kernel
        calls.append((f"fla chunk_linear_attn B={B} H={H} d={d} S={S}",
                      once(lambda sz=(B, H, S, d): _fla_attention_step(kern("linear_attn"), dev, *sz, dtype))))
    (B, H, d), lengths = _scan_sizes(tiny)
    for same, role, fla_name in SCAN_KERNELS:
        if ("scan-delta" if same else "scan-dplr") not in groups:
            continue
        tag = "p_e=p_w" if same else "p_e!=p_w"
        for T in lengths:
            cfg = f"B={B} H={H} d={d} T={T}"
            sz = (B, T, H, d)
            calls.append((f"{fla_name} ({tag}) {cfg}",
                          once(lambda role=role, sz=sz: _fla_scan_step(kern(role), role, dev, *sz, dtype))))
            calls.append((f"nam_scan auto ({tag}) {cfg}",
                          once(lambda same=same, sz=sz: _nam_scan_step(same, dev, *sz, dtype))))
    return calls


def _fla_cache_results() -> bool | None:
    """Whether fla's autotuners keep their choices in Triton's disk cache (``None``: no fla)."""
    try:
        from fla.utils import env as fla_env

        return bool(fla_env.FLA_CACHE_RESULTS) and bool(fla_env.autotune_cache_kwargs.get("cache_results"))
    except Exception:  # noqa: BLE001
        return None


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def warm_up(groups: tuple[str, ...] = WARM_GROUPS, *, cpu: bool = False, json_path: str | Path | None = None,
            kernels: dict[str, Callable] | None = None, verbose: bool = True) -> dict[str, Any]:
    """Run :func:`warmup_calls` (on CUDA at the rows' sizes; on the CPU, or with ``cpu``, at the
    tiny ones), each timed; a call that fails is recorded, not raised. Writes the record to
    ``json_path`` after every call (what ``--warm-only`` does in the warm-up's child processes)."""
    cuda = torch.cuda.is_available() and not cpu
    dev = torch.device("cuda" if cuda else "cpu")
    res: dict[str, Any] = {"groups": list(groups), "device": str(dev), "tiny": not cuda, "pid": os.getpid(),
                           "started_unix": time.time(), "finished_unix": None, "seconds": None, "status": "running",
                           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
                           "fla_cache_results": None, "setup_s": None, "calls": []}
    path = Path(json_path) if json_path is not None else None

    def write() -> None:
        if path is not None:
            _write_json(path, res)

    write()
    t0 = time.perf_counter()
    if kernels is None:  # imported here, so that the first call's seconds are its own
        try:
            kernels = _fla_warm_kernels()
        except Exception as e:  # noqa: BLE001 - each fla call then says why it fails
            res["fla_import_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if cuda:
        torch.zeros(1, device=dev)  # the CUDA context
        torch.cuda.synchronize(dev)
    res["setup_s"] = round(time.perf_counter() - t0, 2)  # fla's import and the CUDA context
    try:
        calls = warmup_calls(dev, tiny=not cuda, kernels=kernels, groups=tuple(groups))
    except Exception as e:  # noqa: BLE001 - recorded
        calls, res["status"] = [], f"error: {type(e).__name__}: {e}"
    for name, call in calls:
        c0 = time.perf_counter()
        entry: dict[str, Any] = {"name": name, "seconds": None, "ok": False, "error": None}
        try:
            call()
            entry["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded: the bench row says the same
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            entry["error"] = f"{type(e).__name__}: {msg}"
        entry["seconds"] = round(time.perf_counter() - c0, 2)
        res["calls"].append(entry)
        res["fla_cache_results"] = _fla_cache_results()
        write()
        if verbose:
            print(f"[warm-up] {name}: {entry['seconds']:.1f} s" + ("" if entry["ok"] else f"  {entry['error']}"),
                  flush=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["finished_unix"] = time.time()
    if res["status"] == "running":
        res["status"] = "done"
    write()
    return res


def _exit_with_parent() -> None:
    """End this process when its parent is gone (a warm-up child must not outlive the check)."""
    ppid = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(2.0)
            if os.getppid() != ppid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class WarmUp:
    """The warm-up's child processes (``python -m memnets.bench.gpu_check --warm-only``), one
    per group, side by side: :meth:`start`, then :meth:`wait` (kills those still running at its
    limit) gives the summary. Each child writes ``gpu-check-warmup-<group>.json`` and ``.log``
    into ``folder``; it shares this process's environment, ``TRITON_CACHE_DIR`` included."""

    def __init__(self, folder: str | Path, groups: tuple[str, ...] = WARM_GROUPS, *, cpu: bool = False,
                 python: str = sys.executable):
        self.folder = Path(folder)
        self.groups = tuple(groups)
        self.cpu = cpu
        self.python = python
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: float | None = None  # time.perf_counter()
        self.started_unix: float | None = None
        self.summary: dict[str, Any] | None = None

    def json_path(self, group: str) -> Path:
        return self.folder / f"gpu-check-warmup-{group}.json"

    def log_path(self, group: str) -> Path:
        return self.folder / f"gpu-check-warmup-{group}.log"

    def start(self) -> WarmUp:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = _child_env()
        env["FLA_CACHE_RESULTS"] = "1"
        self.started, self.started_unix = time.perf_counter(), time.time()
        for g in self.groups:
            self.json_path(g).unlink(missing_ok=True)
            cmd = [self.python, "-m", "memnets.bench.gpu_check", "--warm-only", "--warm-groups", g,
                   "--warm-json", str(self.json_path(g))] + (["--cpu"] if self.cpu else [])
            with open(self.log_path(g), "w") as log:
                self.procs[g] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=os.name == "posix")
        return self

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        """Kill the children still running (no summary)."""
        for p in self.procs.values():
            _kill_group(p)

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait until every child has ended, or until ``timeout`` seconds after the start (those
        still running are then killed); the summary (also kept as ``self.summary``)."""
        if self.summary is not None:
            return self.summary
        w0 = time.perf_counter()
        end = (self.started or w0) + timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, end - time.perf_counter()))
            except subprocess.TimeoutExpired:
                pass
        cut = [g for g, p in self.procs.items() if p.poll() is None]
        for g in cut:
            _kill_group(self.procs[g])
        self.summary = self._read(cut, time.perf_counter() - w0, timeout)
        return self.summary

    def _read(self, cut: list[str], waited: float, timeout: float) -> dict[str, Any]:
        now = time.time()
        groups: dict[str, dict] = {}
        for g, p in self.procs.items():
            try:
                data = json.loads(self.json_path(g).read_text())
            except (OSError, ValueError):
                data = {}
            end = data.get("finished_unix") or now
            info: dict[str, Any] = {"seconds": round(end - (self.started_unix or now), 1), "exit_code": p.returncode,
                                    "setup_s": data.get("setup_s"), "calls": data.get("calls", []),
                                    "fla_cache_results": data.get("fla_cache_results"),
                                    "log": str(self.log_path(g))}
            if g in cut:
                info["status"] = f"stopped at its limit ({timeout:.0f} s after its start)"
            elif data.get("status") == "done" and p.returncode == 0:
                info["status"] = "done"
            else:
                info["status"] = (f"exited {p.returncode}" + (f": {data['status']}" if data.get("status") else "")
                                  + (f" ({_last_line(self.log_path(g))})" if p.returncode else ""))
            groups[g] = info
        calls = [c for info in groups.values() for c in info["calls"]]
        failed = [c for c in calls if not c.get("ok")]
        bad = [g for g, info in groups.items() if info["status"] != "done" and g not in cut]
        parts = [f"stopped at its limit ({timeout:.0f} s after its start): {', '.join(cut)}"] if cut else []
        status = "; ".join(parts + [f"{g}: {groups[g]['status']}" for g in bad]) or "done"
        return {"status": status, "seconds": max((i["seconds"] for i in groups.values()), default=0.0),
                "waited_s": round(waited, 1), "timeout_s": timeout, "processes": len(groups),
                "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"), "calls": len(calls),
                "failed_calls": len(failed),
                "groups": groups}


def _warmup_line(w: dict[str, Any] | None) -> str:
    """One line about the warm-up, for the console, the notes and the markdown."""
    if not w:
        return "warm-up: not run"
    if w.get("groups") is None or "seconds" not in w:
        return f"warm-up: {w.get('status')}"
    per = ", ".join(f"{g} {i['seconds']:.0f} s" for g, i in w["groups"].items())
    line = (f"warm-up: {w['status']}; {w['seconds']:.0f} s ({w['processes']} processes beside the tests: {per}); "
            f"the bench waited {w['waited_s']:.0f} s for it; {w['calls']} calls, {w['failed_calls']} failed")
    first_bad = next((c for i in w["groups"].values() for c in i["calls"] if not c.get("ok")), None)
    if first_bad:
        line += f" (first: {first_bad['name']}: {first_bad['error']})"
    if any(i.get("fla_cache_results") is False for i in w["groups"].values()):
        line += "; fla's autotune choices are not cached on disk (FLA_CACHE_RESULTS off, or a Triton without " \
                "cache_results): the bench's first fla calls autotune again"
    return line


# -------------------------------------------------------------------------------- time plan
_PHASES = ("wheels", "tests", "warmup", "warmup_wait", "models", "attention", "scan", "profile", "launches",
           "tests_fla", "total")


def _plan_lines(plan: dict[str, Any]) -> list[str]:
    """The time plan, as printed at the start and kept in the markdown."""
    w = plan.get("tests_workers") or 0
    how = f"pytest-xdist, {w} workers" if w else "one pytest process"
    lines = [f"time plan: everything within {plan['limit_s']:.0f} s"]
    lines.append(f"CUDA tests: at most {plan['tests_timeout_s']:.0f} s ({how})" if plan.get("tests_timeout_s")
                 else "CUDA tests: not run")
    if plan.get("warmup"):
        lines.append(f"fla warm-up: beside the tests, {len(plan['warmup'])} processes ({', '.join(plan['warmup'])}); "
                     f"the attention and scan sections wait for it, at most {plan['warmup_timeout_s']:.0f} s after "
                     "its start")
    else:
        lines.append(f"fla warm-up: {plan.get('warmup_status') or 'not run'}")
    lines.append(f"bench: {plan['bench_seconds']:.0f} s of timed repeats (first calls and warm-ups not counted); "
                 f"no row starts after {plan['total_seconds']:.0f} s; then the profile and the launch counts")
    return lines


def _tests_line(what: str, t: dict[str, Any]) -> str:
    line = f"{what}: {t['status']}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, " \
           f"{t['errors']} errors"
    return line + (f" ({t['seconds']} s)" if t.get("seconds") is not None else "")


def _phases_line(phases: dict[str, float]) -> str:
    names = {"warmup": "warm-up", "warmup_wait": "bench waited for the warm-up"}
    parts = [f"{names.get(k, k)} {phases[k]:.0f}" for k in _PHASES if phases.get(k) is not None]
    parts += [f"{k} {v:.0f}" for k, v in phases.items() if k not in _PHASES and v is not None]
    return "phases (s): " + " · ".join(parts)


# ----------------------------------------------------------------------------------- output
def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v).replace("|", "\\|")


_VARIANT = re.compile(r"^(?P<base>.+?) \((?P<what>MEMNETS_[A-Z_]+=[^)]*|no graph replay)\)(?P<rest>.*)$")


FASTER = 0.9  # an alternative at most this ratio of its default's time is marked in gpu-check.md


def alternatives(rows: list[dict]) -> list[dict]:
    """Each comparison row against the default it varies, for choosing defaults from one run:
    a model's row run another way (``"DNC (MEMNETS_TIME_LOOP=steps)"``, with or without
    ``" (whole step graphed)"``, against ``"DNC"`` of the same config and suffix; ``"… (no graph
    replay)"`` likewise), and the rows whose target is ``"comparison"`` against their own
    baseline (``"nam_attention d=128 impl=triton"`` against what ``impl="auto"`` takes there).
    Each: ``default``, ``alternative``, ``config``, their ``ms`` and ``ratio`` (alternative over
    default; < 1: the alternative was faster). Rows without a time are left out."""
    by_key = {(r["section"], r["name"], r["config"]): r for r in rows}
    out = []
    for r in rows:
        m = _VARIANT.match(r["name"])
        if m:
            base = by_key.get((r["section"], m["base"] + m["rest"], r["config"]))
        elif r.get("target") == "comparison" and r.get("baseline"):
            base = by_key.get((r["section"], r["baseline"], r["config"]))
        else:
            continue
        if base is None or not base.get("ms") or not r.get("ms"):
            continue
        out.append({"section": r["section"], "config": r["config"], "default": base["name"], "default_ms": base["ms"],
                    "alternative": r["name"], "alternative_ms": r["ms"], "ratio": round(r["ms"] / base["ms"], 3)})
    return out


def format_markdown(result: dict[str, Any]) -> str:
    """The check as one markdown page: the GPU, the test counts and the bench table."""
    env = result["env"]
    out = [f"# GPU check: {result['gpu']}", "",
           f"{result['started']} · torch {env.get('torch')} · CUDA {env.get('cuda')} · triton {env.get('triton')} · "
           f"fla {env.get('fla')} · commit {env.get('git_commit')} · {result.get('mode')}", ""]
    if env.get("triton_kernels") is False:
        out += ["**memnets' Triton kernels did not run** (triton missing, older than memnets.ops.gpu.MIN_TRITON, "
                "or MEMNETS_TRITON=0): the rows time the PyTorch paths.", ""]
    if result.get("plan") or result.get("phases"):
        out += ["## Time", ""]
        if result.get("plan"):
            out += [f"- {ln}" for ln in _plan_lines(result["plan"])]
        if result.get("phases"):
            out.append(f"- {_phases_line(result['phases'])}")
        w = result.get("warmup")
        if w:
            out.append(f"- {_warmup_line(w)}")
            calls = [(g, c) for g, i in (w.get("groups") or {}).items() if isinstance(i, dict)
                     for c in i.get("calls", [])] if isinstance(w.get("groups"), dict) else []
            if calls:
                out += ["", "| warm-up process | call | s | ok |", "|---|---|---|---|"]
                out += [f"| {g} | {_fmt(c['name'])} | {_fmt(c.get('seconds'))} | "
                        f"{'yes' if c.get('ok') else _fmt(c.get('error'))} |" for g, c in calls]
        out.append("")
    for key, title in (("tests", "CUDA tests"), ("tests_fla", "CUDA tests of fla's kernels (after the bench)")):
        t = result.get(key)
        if key == "tests_fla" and not t:
            continue
        out += [f"## {title}", ""]
        if not t:
            out.append("not run")
            out.append("")
            continue
        line = f"{t.get('status')}: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, " \
               f"{t.get('skipped', 0)} skipped, {t.get('errors', 0)} errors"
        if t.get("seconds") is not None:
            line += f" in {t['seconds']} s (limit {t.get('timeout_s')} s)"
        if t.get("workers"):
            line += f", {t['workers']} xdist workers"
        out.append(line)
        if t.get("command"):
            out.append(f"\n`python {t['command']}`")
        messages = t.get("failure_messages", {})
        for name in t.get("failures", []):
            why = messages.get(name)
            out.append(f"- failed: `{name}`" + (f": {_fmt(why)}" if why else ""))
        out.append("")
    out += ["## Bench rows", "",
            "first_ms: the row's first call (JIT compilation, autotuning), outside the time budget; ms: median "
            "after warm-up; ratio: ms over the baseline's ms.", ""]
    cols = ROW_COLUMNS
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "|".join("---" for _ in cols) + "|")
    for r in result["rows"]:
        out.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    out.append("")
    alts = alternatives(result["rows"])
    if alts:
        out += ["## Alternatives against the default", "",
                "Each comparison row beside the row it varies (same config): ratio = alternative ms / default ms "
                f"(< 1: the alternative was faster on this run; in bold where it was at least "
                f"{100 * (1 - FASTER):.0f}% faster, a default to reconsider).", "",
                "| config | default | ms | alternative | ms | ratio |", "|---|---|---|---|---|---|"]
        for a in alts:
            ratio = _fmt(a["ratio"])
            out.append(f"| {a['config']} | {a['default']} | {_fmt(a['default_ms'])} | {a['alternative']} | "
                       f"{_fmt(a['alternative_ms'])} | {f'**{ratio}**' if a['ratio'] <= FASTER else ratio} |")
        out.append("")
    pr = result.get("profile")
    if pr:
        out += ["## Wall time against kernel time, one training step (`python -m memnets.bench.gpu_profile`)", ""]
        if pr.get("note"):
            out.append(pr["note"])
        rows = pr.get("rows") or {}
        if rows:
            out += ["| model | wall_ms | kernel_ms | kernels | top kernel | host_ms | top host ops | waits on the device |",
                    "|---|---|---|---|---|---|---|---|"]
            for name, r in rows.items():
                top = r["top"][0] if r.get("top") else {}
                host = "; ".join(f"{_fmt(h['op'])[:40]} {_fmt(h['self_ms'])}" for h in (r.get("top_host") or [])[:3])
                waits = "; ".join(f"{_fmt(w['op'])[:30]} {w['count']}× {_fmt(w['self_ms'])}" for w in r.get("waits") or [])
                out.append(f"| {name} | {_fmt(r['wall_ms'])} | {_fmt(r['kernel_ms'])} | {r.get('launches', '')} | "
                           f"{_fmt(top.get('kernel', ''))} ({top.get('count', '')}×, {_fmt(top.get('ms'))} ms) | "
                           f"{_fmt(r.get('host_ms'))} | {host} | {waits} |")
            out.append("")
    lc = result.get("launches")
    if lc:
        out += ["## Kernel launches of one training step (`memnets bench launches`)", ""]
        if lc.get("note"):
            out.append(lc["note"])
        if lc.get("rows"):
            lcols = ["model", "config", "aten_step", "triton_step", "launches_step", "per_t", "marginal_per_t",
                     "graphed_step", "T_bench", "per_t_bench", "graphed_per_t_bench"]
            out.append("| " + " | ".join(lcols) + " |")
            out.append("|" + "|".join("---" for _ in lcols) + "|")
            for r in lc["rows"]:
                out.append("| " + " | ".join(_fmt(r.get(c)) for c in lcols) + " |")
            out.append("")
            out += [f"- {n}" for n in lc.get("notes", [])]
        out.append("")
    out += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(out) + "\n"


def _write(result: dict[str, Any], folders: list[Path]) -> None:
    text_json = json.dumps(result, indent=1, default=str)
    text_md = format_markdown(result)
    for folder in folders:
        for name, text in (("gpu-check.json", text_json), ("gpu-check.md", text_md)):
            atomic_write_text(folder / name, text)


def _env(device: torch.device) -> dict[str, Any]:
    from ..ops.delta.fla_backend import fla_version
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                 capture_output=True, text=True, timeout=30).stdout.strip()
        if commit and changed:  # the tree that ran is not that commit's: say so
            commit += "+changes"
    except Exception:  # noqa: BLE001
        commit = None
    from ..ops.gpu import triton_ok

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
            "triton_kernels": triton_ok(), "fla": fla_version(),
            "python": sys.version.split()[0], "device": str(device), "git_commit": commit,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            # the float32 precision of the two sides' products (cuDNN's RNNs; cuBLAS matmuls, ours)
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}


# -------------------------------------------------------------------------------------- run
def _tests_workers(tests_workers: int | None) -> int:
    """The xdist workers the tests will get (0: one process)."""
    if tests_workers is None:
        return xdist_workers()
    return tests_workers if tests_workers > 0 and importlib.util.find_spec("xdist") is not None else 0


def run(out: str | Path = "out/gpu-check", *, cpu: bool = False, tests: bool = True, tests_timeout: float = 180.0,
        tests_k: str | None = None, with_compile: bool = False, bench_seconds: float = 150.0,
        total_seconds: float = 400.0, sections: tuple[str, ...] = tuple(SECTIONS), wheels: str | Path | None = None,
        launch_counts: bool = True, profile: bool = True, verbose: bool = True, warmup: bool = True,
        warmup_timeout: float = 300.0, tests_workers: int | None = None, isolate: bool = True,
        row_limit_s: float | None = None) -> dict[str, Any]:
    """The GPU check (see the module's doc); returns the result written to ``out``/gpu-check.json.

    ``cpu``: tiny sizes on the CPU, the driver's dry run (also chosen when CUDA is missing).
    ``tests_timeout``: the CUDA tests' wall-time limit; ``tests_workers``: their pytest-xdist
    workers (``None``: :func:`xdist_workers`; 0: one process). ``warmup``: on CUDA, fla's warm-up
    beside the tests (:class:`WarmUp`), waited for before the attention and scan sections, at
    most ``warmup_timeout`` seconds after its start. ``bench_seconds``: the bench's budget of
    timed repeats (first calls and warm-ups are free); ``total_seconds``: after it no row starts.
    ``profile``: on CUDA, after the bench, wall time against kernel time of one training step
    of each memory (:mod:`memnets.bench.gpu_profile`), as ``result["profile"]``.
    ``launch_counts``: last, ``memnets bench launches`` on the device (B=4, T=16; on the CPU
    the CUDA code path at tiny sizes), as ``result["launches"]``.
    ``isolate``: each section, the profile and the launch counts in child processes of their own,
    a row that faults or runs past ``row_limit_s`` (default
    :data:`memnets.bench.isolated.ROW_LIMIT_S`) recorded as such and the section resumed after it
    in a new process (:mod:`memnets.bench.isolated`); False: all in this process.
    """
    from .gpu import _Bench

    t0 = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cuda = torch.cuda.is_available() and not cpu
    device = torch.device("cuda") if cuda else torch.device("cpu")
    folders = [Path(out)]
    if os.environ.get("OUT"):
        folders.append(Path(os.environ["OUT"]))
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; expected among {list(SECTIONS)}")
    phases: dict[str, float] = {}
    result: dict[str, Any] = {
        "suite": "gpu-check", "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU dry run)",
        "started": started, "mode": "CUDA" if cuda else "CPU dry run at tiny sizes (not a measurement)",
        "env": {}, "wheels": [], "plan": None, "phases": phases, "warmup": None, "tests": None,
        "columns": ROW_COLUMNS, "rows": [],
        "budget": {"tests_timeout_s": tests_timeout, "bench_seconds": bench_seconds, "total_seconds": total_seconds,
                   "warmup_timeout_s": warmup_timeout, "limit_s": TIME_LIMIT_S},
        "launches": None, "notes": []}
    run_notes: list[str] = []

    def say(msg: str) -> None:
        if verbose:
            print(f"[gpu-check] {msg}", flush=True)

    if wheels is not None:
        s0 = time.perf_counter()
        result["wheels"] = install_wheels(wheels)
        for w in result["wheels"]:
            say(f"wheel {w['wheel']}: {'installed' if w['ok'] else w['error']}")
        phases["wheels"] = round(time.perf_counter() - s0, 1)
    if cuda:
        cache_dir, cache_notes = _share_triton_cache()
        run_notes += cache_notes
    result["env"] = _env(device)
    if cuda:
        result["env"]["triton_cache_dir"] = cache_dir

    # the fla warm-up, beside the tests
    warm: WarmUp | None = None
    groups = _warm_groups(sections)
    if not cuda:
        result["warmup"] = {"status": "not run: warm-up: CUDA only"}
    elif not warmup:
        result["warmup"] = {"status": "not run: --no-warmup"}
    elif not groups:
        result["warmup"] = {"status": "not run: no attention or scan section"}
    else:
        try:
            from ..ops.delta.fla_backend import fla_available, fla_reasons

            if not fla_available():
                why = "; ".join(fla_reasons(torch.zeros(1, device=device))) or "fla does not import"
                result["warmup"] = {"status": f"skipped: fla is not installed ({why[:200]})"}
            else:
                warm = WarmUp(folders[-1], groups).start()
                result["warmup"] = {"status": "running", "groups": list(groups)}
        except Exception as e:  # noqa: BLE001 - the warm-up only saves time; the check goes on without it
            result["warmup"] = {"status": f"error: could not start: {type(e).__name__}: {str(e)[:200]}"}
            if warm is not None:
                warm.stop()
            warm = None

    workers = _tests_workers(tests_workers) if tests else 0
    # on CUDA the tests of fla's kernels run after the bench: their first calls compile and
    # autotune fla's kernels for minutes, which the warm-up does beside the first tests
    split_fla = bool(tests and cuda and tests_k is None and importlib.util.find_spec("fla") is not None)
    result["plan"] = {"limit_s": TIME_LIMIT_S, "tests_timeout_s": tests_timeout if tests else 0,
                      "tests_workers": workers, "warmup": list(groups) if warm is not None else None,
                      "warmup_status": None if warm is not None else result["warmup"]["status"],
                      "warmup_timeout_s": warmup_timeout, "bench_seconds": bench_seconds,
                      "total_seconds": total_seconds}
    for line in _plan_lines(result["plan"]):
        say(line)
    _write(result, folders)

    def finish_warmup() -> None:
        """Wait for the warm-up (at most until its limit, or the total limit) and record it."""
        if warm is None or warm.summary is not None:
            return
        try:
            limit = min(warmup_timeout, max(0.0, t0 + total_seconds - warm.started))
            if warm.running():
                say(f"waiting for the fla warm-up (at most {max(0.0, warm.started + limit - time.perf_counter()):.0f} "
                    "s more) ...")
            summary = warm.wait(limit)
            result["warmup"] = summary
            phases["warmup"], phases["warmup_wait"] = summary["seconds"], summary["waited_s"]
        except Exception as e:  # noqa: BLE001 - the bench's first calls compile what is left
            warm.stop()
            result["warmup"] = warm.summary = {"status": f"error: {type(e).__name__}: {str(e)[:200]}"}
        say(_warmup_line(result["warmup"]))
        _write(result, folders)

    try:
        if tests:
            how = f", {workers} xdist workers" if workers else ""
            say(f"CUDA tests (limit {tests_timeout:.0f} s{how}) ...")
            s0 = time.perf_counter()
            log = folders[-1] / "gpu-check-tests.log"
            result["tests"] = run_tests(cuda=cuda, timeout=tests_timeout, k=tests_k, with_compile=with_compile,
                                        log_path=log, workers=workers, fla=False if split_fla else None)
            phases["tests"] = round(time.perf_counter() - s0, 1)
            say(_tests_line("tests", result["tests"]))
            _write(result, folders)

        def on_row(row: dict) -> None:
            if warm is not None and warm.summary is None and warm.running():
                row["during_warmup"] = True  # timed while the warm-up still ran beside it
            _write(result, folders)

        shares = {"models": 0.3, "attention": 0.2, "scan": 0.5}
        finish_warmup()  # no row is timed beside the warm-up's autotuning
        if not isolate:
            bench = _Bench(device, bench_seconds, verbose=verbose, deadline=t0 + total_seconds, on_row=on_row)
            bench.rows = result["rows"]  # the same list: every row written as it comes
        for name in sections:
            s0 = time.perf_counter()
            if isolate:
                def on_rows(rows: list[dict], before=list(result["rows"])) -> None:
                    result["rows"][:] = before + rows
                    _write(result, folders)
                run_notes += isolated.run_section(
                    name, folder=folders[0], cpu=not cuda, bench_seconds=bench_seconds, share=shares[name],
                    deadline=t0 + total_seconds, verbose=verbose, on_rows=on_rows, say=say,
                    **({} if row_limit_s is None else {"row_limit_s": row_limit_s}))[1]
            else:
                bench.start_section(name, share=shares[name])
                SECTIONS[name](bench, not cuda)
            phases[name] = round(time.perf_counter() - s0, 1)
            say(f"{name}: {phases[name]:.1f} s")
        finish_warmup()
    finally:
        if warm is not None and warm.summary is None:
            warm.stop()
    if profile and cuda:
        from . import gpu_profile
        s0 = time.perf_counter()
        try:
            if isolate:
                result["profile"] = isolated.run_job("profile", folder=folders[0], cpu=False, limit_s=JOB_LIMIT_S)
                result["profile"].setdefault("rows", {})
            else:
                result["profile"] = gpu_profile.run()
        except Exception as e:  # noqa: BLE001 - the timings above stand
            result["profile"] = {"note": f"error: {type(e).__name__}: {str(e)[:200]}", "rows": {}}
        phases["profile"] = round(time.perf_counter() - s0, 1)
        _write(result, folders)
        say(f"profile: {phases['profile']:.1f} s")
    if launch_counts:
        if time.perf_counter() > t0 + total_seconds:
            result["launches"] = {"note": "skipped: total time limit reached", "rows": []}
        else:
            from . import launches
            s0 = time.perf_counter()
            try:
                if isolate:
                    result["launches"] = isolated.run_job("launches", folder=folders[0], cpu=not cuda,
                                                          limit_s=JOB_LIMIT_S)
                else:
                    lc = launches.run(batch=4 if cuda else 2, length=16 if cuda else 4, device=device, tiny=not cuda)
                    result["launches"] = {k: lc[k] for k in ("rows", "notes", "batch", "length", "device")}
            except Exception as e:  # noqa: BLE001 - the timings above stand
                result["launches"] = {"note": f"error: {type(e).__name__}: {str(e)[:200]}", "rows": []}
            phases["launches"] = round(time.perf_counter() - s0, 1)
            say(f"launches: {phases['launches']:.1f} s")
    if split_fla:  # fla's kernels' tests last, with the time left, their compilations alone
        left = min(tests_timeout, TIME_LIMIT_S - 15 - (time.perf_counter() - t0))
        if left < 30:
            result["tests_fla"] = {"status": f"not run: {max(left, 0):.0f} s left of {TIME_LIMIT_S:.0f} s",
                                   "passed": 0, "failed": 0, "skipped": 0, "errors": 0}
        else:
            say(f"CUDA tests of fla's kernels (limit {left:.0f} s) ...")
            s0 = time.perf_counter()
            result["tests_fla"] = run_tests(cuda=cuda, timeout=left, with_compile=with_compile, workers=workers,
                                            log_path=folders[-1] / "gpu-check-tests-fla.log", fla=True,
                                            per_test=left)  # a first call compiles and autotunes for minutes
            phases["tests_fla"] = round(time.perf_counter() - s0, 1)
        say(_tests_line("tests of fla's kernels", result["tests_fla"]))
        _write(result, folders)
    if not cuda:  # a dry run measures nothing: no target is met or missed
        for r in result["rows"]:
            r["meets"] = None
    total = time.perf_counter() - t0
    phases["total"] = round(total, 1)
    skipped = [r["name"] + " " + r["config"] for r in result["rows"] if str(r.get("note", "")).startswith("skipped")]
    met = [r for r in result["rows"] if r.get("meets") is not None]
    during = [r for r in result["rows"] if r.get("during_warmup")]
    result["seconds"] = round(total, 1)
    result["notes"] = [
        f"gpu: {result['gpu']}; {result['mode']}",
        f"total {total:.0f} s (limit {total_seconds:.0f} s for the bench rows, {TIME_LIMIT_S:.0f} s in all); "
        f"bench budget {bench_seconds:.0f} s of timed repeats, first calls and warm-ups not counted",
        _phases_line(phases),
        _warmup_line(result["warmup"]),
        f"targets met: {sum(1 for r in met if r['meets'])} of {len(met)}",
        f"rows skipped: {len(skipped)}" + (f" ({'; '.join(skipped)})" if skipped else ""),
    ]
    if during:
        result["notes"].append(f"rows timed while the fla warm-up still ran (during_warmup): {len(during)}")
    result["notes"] += run_notes
    if not cuda:
        result["notes"].append("rows with needs_cuda = true (flash SDPA, fla's chunked kernels) run only on CUDA")
    _write(result, folders)
    if verbose:
        print(format_markdown(result), flush=True)
    say(_phases_line(phases) + f" (plan: within {TIME_LIMIT_S:.0f} s)")
    say(f"written: {', '.join(str(f / 'gpu-check.json') for f in folders)} (and .md)")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memnets.bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/gpu-check", help="folder for gpu-check.json and gpu-check.md "
                   "(also written to $OUT when set; default out/gpu-check)")
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU at tiny sizes (not a measurement)")
    p.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    p.add_argument("--tests-timeout", type=float, default=180.0, help="wall-time limit of the CUDA tests (s)")
    p.add_argument("--tests-k", default=None, help="pytest -k selection of the CUDA tests (default: the CUDA "
                   "variants, compile tests left out)")
    p.add_argument("--tests-workers", type=int, default=None, help="pytest-xdist workers for the tests (default: "
                   "min(8, CPU count // 2), at least 2, when pytest-xdist is installed; 0: one process)")
    p.add_argument("--with-compile", action="store_true", help="also run the torch.compile CUDA tests (minutes)")
    p.add_argument("--bench-seconds", type=float, default=150.0,
                   help="budget of the bench's timed repeats (first calls and warm-ups not counted)")
    p.add_argument("--total-seconds", type=float, default=400.0, help="no bench row starts after this")
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--no-warmup", action="store_true", help="no fla warm-up beside the tests (the bench's first "
                   "fla calls then compile and autotune)")
    p.add_argument("--warmup-timeout", type=float, default=300.0, help="the attention and scan sections wait for "
                   "the fla warm-up at most this long after its start (s); then it is stopped")
    p.add_argument("--no-launches", action="store_true", help="skip the launch counts (memnets bench launches)")
    p.add_argument("--no-profile", action="store_true", help="skip the wall-vs-kernel-time profile of each memory")
    p.add_argument("--in-process", action="store_true", help="run the bench sections, the profile and the launch "
                   "counts in this process (default: each in a child process, a faulting or hanging row costing that "
                   "row alone)")
    p.add_argument("--row-limit", type=float, default=None, help="a bench row still running after this many "
                   "seconds is stopped and recorded as such (default 180; not with --in-process)")
    p.add_argument("--wheels", default="wheels", help="install the *.whl of this folder first, without network "
                   "(default wheels/; none there is fine; '' to skip)")
    p.add_argument("--warm-only", action="store_true", help="only the fla warm-up, in this process (what the "
                   "check starts beside the tests); with --cpu at the tiny sizes")
    p.add_argument("--warm-groups", nargs="+", choices=list(WARM_GROUPS), default=list(WARM_GROUPS),
                   help="with --warm-only: which rows' kernels to warm up")
    p.add_argument("--warm-json", default=None, help="with --warm-only: write what was called, and how long "
                   "each call took, to this JSON file")
    a = p.parse_args(argv)
    if a.warm_only:
        _exit_with_parent()
        warm_up(tuple(a.warm_groups), cpu=a.cpu, json_path=a.warm_json)
        return 0  # a failed call is recorded, never an error of the check
    res = run(a.out, cpu=a.cpu, tests=not a.no_tests, tests_timeout=a.tests_timeout, tests_k=a.tests_k,
              with_compile=a.with_compile, bench_seconds=a.bench_seconds, total_seconds=a.total_seconds,
              sections=tuple(a.sections), wheels=a.wheels or None, launch_counts=not a.no_launches,
              profile=not a.no_profile, warmup=not a.no_warmup, warmup_timeout=a.warmup_timeout,
              tests_workers=a.tests_workers, isolate=not a.in_process, row_limit_s=a.row_limit)
    bad = [t for t in (res.get("tests") or {}, res.get("tests_fla") or {}) if t.get("failed") or t.get("errors")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
