"""``make gpu-check``: the CUDA tests, then the GPU bench rows that the speed targets name, in one
command on a fresh GPU machine (torch and triton only, no network), in at most 8 minutes.

``python -m memnets.bench.gpu_check`` (what ``make gpu-check`` runs, with ``PYTHONPATH=src``: no
install needed):

1. Optionally installs the wheels found in a folder (``--wheels``, default ``wheels/``; e.g. the
   fla-core wheel) with ``pip install --no-index --no-deps``; none there is fine.
2. Runs the Triton kernels' tests (``tests/test_triton_*.py``: each kernel against its reference,
   and replayed from CUDA graphs), then ``tests/test_cuda.py`` and ``tests/test_cuda_nam_tm.py``
   on CUDA (the CPU stand-ins of those tests are CI's; the ``compile`` tests only with
   ``--with-compile``), under a time limit.
3. Times the bench rows, each against its baseline:

   - ``models``: one training step (forward, backward, Adam), float32, B=32, against cuDNN
     ``nn.LSTM`` of the same width: LSAM hidden 256 and 1024, uni- and bidirectional, T=100;
     the NAM-TM at the bench's width (hidden 128, 4 tapes of 32) and the paper's (hidden 1024,
     8 tapes), T=50; the DNC (LSTM 64, memory 16x20, 4 reads; LSTM 256, memory 32x64), T=41;
     the NTM (LSTM 100, memory 128x20), T=41. Target: at most 2.0x the LSTM's time. LSAM, the
     DNC and the NTM also once more with ``MEMNETS_CUDA_GRAPHS=0`` ("no graph replay"), the
     loops launched one by one.
   - ``attention``: ``nam_attention`` forward+backward, bf16, B=1 H=8 d=64, S=32K, non-causal
     and causal, beside flash SDPA and fla's ``chunk_linear_attn`` on the same normalised
     inputs. Target: at most 0.6 ms non-causal, 0.9 ms causal, or within 1.2x of fla's.
   - ``scan``: ``nam_scan(impl="auto")`` forward+backward, bf16, B=8 H=16 d=64, T=2K, 8K, 32K,
     against the fla kernel it calls (``chunk_delta_rule`` for p_e = p_w,
     ``chunk_dplr_delta_rule`` otherwise). Target: within 1.1x.

   Each row's first call (JIT compilation, Triton autotuning) is timed on its own (``first_ms``)
   and, with the warm-up calls, kept out of the bench budget (``--bench-seconds``, which counts
   the timed repeats only); ``--total-seconds`` stops everything still left (marked skipped).

4. On CUDA, profiles one training step of each memory: wall time against the device time of
   its kernels (:mod:`memnets.bench.gpu_profile`; ``--no-profile`` leaves it out).
5. Counts the kernel launches of one training step of each recurrent memory on the GPU
   (``memnets bench launches --device cuda``, B=4, T=16).

Writes ``gpu-check.json`` and ``gpu-check.md`` (a table naming the GPU) into ``--out`` (default
``out/gpu-check``) and, when the environment variable ``OUT`` is set, into that folder too; both
are rewritten after every row, so a run cut short leaves what it measured. ``--cpu`` runs the
same rows at tiny sizes on the CPU (a dry run of the driver, not a measurement): rows whose
kernels need CUDA (flash SDPA, fla's chunked kernels) are kept in the table, marked so.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["run", "main", "format_markdown", "ROW_COLUMNS"]

REPO = Path(__file__).resolve().parents[3]
TEST_FILES = ("tests/test_triton_graphs.py", "tests/test_triton_lsam.py", "tests/test_triton_dnc.py",
              "tests/test_triton_ntm.py", "tests/test_triton_nam_tm.py", "tests/test_cuda.py", "tests/test_cuda_nam_tm.py")
ROW_COLUMNS = ["section", "name", "config", "dtype", "first_ms", "ms", "baseline", "ratio", "target", "meets",
               "note"]


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
    return done


# ------------------------------------------------------------------------------------ tests
_RESULT = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def run_tests(*, cuda: bool, timeout: float, k: str | None = None, with_compile: bool = False,
              log_path: Path | None = None, python: str = sys.executable) -> dict[str, Any]:
    """Run the CUDA test files in a child pytest (``-m "not slow"``), at most ``timeout`` seconds.

    On CUDA only the CUDA variants run (``-k "not cuda_path"``; the ``compile`` tests only with
    ``with_compile``); ``k`` overrides the selection. Returns the counts, the failed tests, the
    wall time and whether the limit cut the run short."""
    files = [f for f in TEST_FILES if (REPO / f).is_file()]
    if not files:
        return {"status": "not run: tests/ not found beside the package", "passed": 0, "failed": 0,
                "skipped": 0, "errors": 0}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run: pytest is not installed", "passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if k is None:
        k = "not cuda_path" + ("" if with_compile else " and not train_compile") if cuda else "cuda_path"
    cmd = [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not slow", "-k", k, *files]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={max(30, int(timeout * 0.6))}")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    timed_out = False
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        out, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        raw = (e.stdout or b"") + (e.stderr or b"")
        out, code, timed_out = raw.decode(errors="replace") if isinstance(raw, bytes) else raw, None, True
    wall = time.perf_counter() - t0
    if log_path is not None:
        log_path.write_text(out)
    results = {}
    for line in out.splitlines():
        m = _RESULT.match(line.strip())
        if m:
            results[m.group(1)] = m.group(2)
    count = lambda *states: sum(1 for s in results.values() if s in states)  # noqa: E731
    res = {"command": " ".join(cmd[1:]), "seconds": round(wall, 1), "timeout_s": timeout, "timed_out": timed_out,
           "exit_code": code, "passed": count("PASSED", "XPASS"), "failed": count("FAILED"),
           "skipped": count("SKIPPED", "XFAIL"), "errors": count("ERROR"),
           "failures": sorted(t for t, s in results.items() if s in ("FAILED", "ERROR"))}
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


def _cuda_only(bench, section: str, name: str, config: str, dtype, why: str, extra: dict) -> dict:
    """A row whose kernel needs CUDA, recorded unrun on the CPU."""
    return bench.measure(section, name, config, dtype, lambda: _raise_na(f"needs CUDA ({why}); not run on "
                                                                         f"{bench.device}"),
                         0, 1, extra={"needs_cuda": True, **extra})


def _raise_na(msg: str):
    from .gpu import _NotAvailable
    raise _NotAvailable(msg)


def _models_rows(bench, tiny: bool) -> None:
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM
    from .gpu import _train_step

    dev = bench.device
    cuda = dev.type == "cuda"
    warmup, repeat = (2, 10) if not tiny else (1, 1)

    def case(name, cfg, build, B, T, Fi, extra=None):
        def make():
            torch.manual_seed(0)
            model = build().to(dev)
            x = torch.randn(B, T, Fi, device=dev)
            return _train_step(model, x, lambda x: model(x)[0])
        return bench.measure("models", name, cfg, torch.float32, make, warmup, repeat,
                             extra={"B": B, "T": T, "needs_cuda": False, **(extra or {})})

    def eager(name, cfg, build, B, T, Fi, base):
        """The same row with the loops launched one by one (``MEMNETS_CUDA_GRAPHS=0``): its
        ratio is shown, but it is a comparison, not a target."""
        from ..ops.gpu import env_var
        with env_var("MEMNETS_CUDA_GRAPHS", "0"):
            row = case(name + " (no graph replay)", cfg, build, B, T, Fi)
        _pair(row, base, 2.0, "LSTM")
        row["meets"], row["target"] = None, "comparison (MEMNETS_CUDA_GRAPHS=0)"
        return row

    def lstm(cfg, Fi, D, B, T, bi=False):
        name = ("nn.LSTM (cuDNN)" if cuda else "nn.LSTM (CPU)") + (" bi" if bi else "")
        return case(name, cfg, lambda: torch.nn.LSTM(Fi, D // 2 if bi else D, batch_first=True, bidirectional=bi),
                    B, T, Fi, {"baseline_row": True})

    B = 2 if tiny else 32
    T_lsam, T_tm, T_dnc = (6, 5, 6) if tiny else (100, 50, 41)
    for D, H in ([(16, 2)] if tiny else [(256, 8), (1024, 8)]):
        for bi in (False, True):
            cfg = f"B={B} T={T_lsam} hidden={D} heads={H}" + (" bi" if bi else "")
            base = lstm(cfg, D, D, B, T_lsam, bi)
            build = lambda D=D, H=H, bi=bi: LSAM(D, D, H, bidirectional=bi)  # noqa: E731
            ours = case("LSAM" + (" bi" if bi else ""), cfg, build, B, T_lsam, D)
            _pair(ours, base, 2.0, "LSTM")
            eager("LSAM" + (" bi" if bi else ""), cfg, build, B, T_lsam, D, base)
    tm = [("bench", 8, 16, 2, 8)] if tiny else [("bench", 64, 128, 4, 32), ("paper", 256, 1024, 8, 32)]
    for label, Fi, D, Tn, L in tm:
        cfg = f"B={B} T={T_tm} in={Fi} hidden={D} tapes={Tn}x{L} ({label} width)"
        base = lstm(cfg, Fi, D, B, T_tm)
        ours = case("NAM-TM", cfg, lambda Fi=Fi, D=D, Tn=Tn, L=L: NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L),
                    B, T_tm, Fi)
        _pair(ours, base, 2.0, "LSTM")
    for Hc, N, W, R in ([(16, 8, 8, 2)] if tiny else [(64, 16, 20, 4), (256, 32, 64, 4)]):
        cfg = f"B={B} T={T_dnc} LSTM {Hc}, memory {N}x{W}, {R} reads"
        base = lstm(cfg, 9, Hc, B, T_dnc)
        build = lambda Hc=Hc, N=N, W=W, R=R: DNC(9, 8, memory_slots=N, word_size=W, read_heads=R,  # noqa: E731
                                                 controller_size=Hc)
        _pair(case("DNC", cfg, build, B, T_dnc, 9), base, 2.0, "LSTM")
        eager("DNC", cfg, build, B, T_dnc, 9, base)
    for Hc, N, W in ([(16, 8, 8)] if tiny else [(100, 128, 20)]):
        cfg = f"B={B} T={T_dnc} LSTM {Hc}, memory {N}x{W}, 1 read 1 write"
        base = lstm(cfg, 9, Hc, B, T_dnc)
        build = lambda Hc=Hc, N=N, W=W: NTM(9, 8, memory_slots=N, word_size=W, read_heads=1,  # noqa: E731
                                            write_heads=1, controller_size=Hc)
        _pair(case("NTM", cfg, build, B, T_dnc, 9), base, 2.0, "LSTM")
        eager("NTM", cfg, build, B, T_dnc, 9, base)


def _attention_rows(bench, tiny: bool) -> None:
    from ..ops import nam_attention, unit
    from .gpu import _fwd_bwd

    dev = bench.device
    cuda = dev.type == "cuda"
    B, H, d = 1, 8, 64
    S = 256 if tiny else 32768
    dtype = torch.bfloat16
    warmup, repeat = (2, 10) if not tiny else (1, 1)

    def inputs(layout="bhsd"):
        g = torch.Generator(device=dev).manual_seed(0)
        ts = [torch.randn(B, H, S, d, device=dev, generator=g).to(dtype) for _ in range(3)]
        if layout == "bshd":  # fla's layout, on μ(q), μ(k): the inputs nam_attention normalises
            ts = [unit(ts[0]), unit(ts[1]), ts[2]]
            ts = [t.transpose(1, 2).contiguous() for t in ts]
        return [t.requires_grad_(True) for t in ts]

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
                    q, k, v = inputs("bshd")
                    return _fwd_bwd(lambda: chunk_linear_attn(q, k, v, scale=1.0, normalize=False)[0], [q, k, v])
                fla_row = bench.measure("attention", "fla chunk_linear_attn", cfg, dtype, make_fla, warmup, repeat,
                                        extra={"needs_cuda": True, "baseline_row": True, **extra})
            else:
                fla_row = _cuda_only(bench, "attention", "fla chunk_linear_attn", cfg, dtype, "fla's Triton kernels",
                                     {"baseline_row": True, **extra})

        def make_nam():
            q, k, v = inputs()
            return _fwd_bwd(lambda: nam_attention(q, k, v, is_causal=causal), [q, k, v])
        ours = bench.measure("attention", "nam_attention", cfg, dtype, make_nam, warmup, repeat,
                             extra={"needs_cuda": False, **extra})
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
    # the non-causal row's ratio to fla's (causal) kernel, now that it is timed
    for r in bench.rows:
        if r["name"] == "nam_attention" and not r.get("causal") and fla_row is not None and fla_row["ms"] and r["ms"]:
            r["baseline"], r["ratio"] = fla_row["name"] + " (causal)", round(r["ms"] / fla_row["ms"], 3)
            if not tiny and cuda:
                r["meets"] = r["ms"] <= 0.6 or r["ratio"] <= 1.2


def _scan_rows(bench, tiny: bool) -> None:
    from ..ops import nam_scan, nam_scan_resolve_impl, unit
    from ..ops.delta.fla_backend import fla_available, fla_kernels, fla_reasons
    from .gpu import _fwd_bwd

    dev = bench.device
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16
    B, H, d = (1, 2, 16) if tiny else (8, 16, 64)
    lengths = (32, 64, 128) if tiny else (2048, 8192, 32768)
    kernels = fla_kernels() if cuda and fla_available() else None
    why_not = "; ".join(fla_reasons(torch.zeros(1, device=dev))) or "fla unavailable"

    for T in lengths:
        warmup, repeat = (1, 1) if tiny else ((2, 10) if T <= 2048 else (1, 5) if T <= 8192 else (1, 3))
        cfg = f"B={B} H={H} d={d} T={T}"
        extra = {"B": B, "H": H, "d": d, "T": T}

        def inputs():
            g = torch.Generator(device=dev).manual_seed(0)
            shape = (B, T, H, d)
            ts = [unit(torch.randn(shape, device=dev, generator=g)).to(dtype),
                  unit(torch.randn(shape, device=dev, generator=g)).to(dtype),
                  torch.randn(shape, device=dev, generator=g).to(dtype),
                  torch.rand(B, T, H, device=dev, generator=g).to(dtype),
                  torch.rand(B, T, H, device=dev, generator=g).to(dtype)]
            return [t.requires_grad_(True) for t in ts]

        for same, role, fla_name in ((True, "delta_chunk", "fla chunk_delta_rule"),
                                     (False, "general_chunk", "fla chunk_dplr_delta_rule gk=0")):
            tag = "p_e=p_w" if same else "p_e!=p_w"
            if cuda:
                def make_fla(role=role):
                    if kernels is None:
                        _raise_na(why_not)
                    q, k, v, pw, pe = inputs()
                    fn = kernels[role]
                    if role == "delta_chunk":
                        call = lambda: fn(q=q, k=k, v=v, beta=pw, scale=1.0, output_final_state=True)  # noqa: E731
                    else:
                        gk = torch.zeros_like(k)  # no decay
                        call = lambda: fn(q=q, k=k, v=v * pw[..., None], a=k, b=-pe[..., None] * k,  # noqa: E731
                                          gk=gk, scale=1.0, output_final_state=True)
                    return _fwd_bwd(call, [q, k, v, pw, pe])
                base = bench.measure("scan", f"{fla_name} ({tag})", cfg, dtype, make_fla, warmup, repeat,
                                     extra={"needs_cuda": True, "baseline_row": True, **extra})
            else:
                base = _cuda_only(bench, "scan", f"{fla_name} ({tag})", cfg, dtype, "fla's chunked Triton kernels",
                                  {"baseline_row": True, **extra})

            def make_ours(same=same):
                q, k, v, pw, pe = inputs()
                return _fwd_bwd(lambda: nam_scan(q, k, v, pw, pw if same else pe, impl="auto"), [q, k, v, pw, pe])
            probe = torch.zeros(1, T, 1, 1, device=dev, dtype=dtype)
            ours = bench.measure("scan", f"nam_scan auto ({tag})", cfg, dtype, make_ours, warmup, repeat,
                                 note=f"impl={nam_scan_resolve_impl('auto', probe)}",
                                 extra={"needs_cuda": False, **extra})
            _pair(ours, base if base["ms"] else None, 1.1, "fla's kernel")
            if bench.on_row is not None:
                bench.on_row(ours)


SECTIONS: dict[str, Callable] = {"models": _models_rows, "attention": _attention_rows, "scan": _scan_rows}


# ----------------------------------------------------------------------------------- output
def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v).replace("|", "\\|")


def format_markdown(result: dict[str, Any]) -> str:
    """The check as one markdown page: the GPU, the test counts and the bench table."""
    env = result["env"]
    out = [f"# GPU check: {result['gpu']}", "",
           f"{result['started']} · torch {env.get('torch')} · CUDA {env.get('cuda')} · triton {env.get('triton')} · "
           f"fla {env.get('fla')} · commit {env.get('git_commit')} · {result.get('mode')}", ""]
    t = result.get("tests")
    out.append("## CUDA tests")
    out.append("")
    if not t:
        out.append("not run")
    else:
        line = f"{t.get('status')}: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, " \
               f"{t.get('skipped', 0)} skipped, {t.get('errors', 0)} errors"
        if t.get("seconds") is not None:
            line += f" in {t['seconds']} s (limit {t.get('timeout_s')} s)"
        out.append(line)
        if t.get("command"):
            out.append(f"\n`python {t['command']}`")
        for name in t.get("failures", []):
            out.append(f"- failed: `{name}`")
    out += ["", "## Bench rows", "",
            "first_ms: the row's first call (JIT compilation, autotuning), outside the time budget; ms: median "
            "after warm-up; ratio: ms over the baseline's ms.", ""]
    cols = ROW_COLUMNS
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "|".join("---" for _ in cols) + "|")
    for r in result["rows"]:
        out.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    out.append("")
    pr = result.get("profile")
    if pr:
        out += ["## Wall time against kernel time, one training step (`python -m memnets.bench.gpu_profile`)", ""]
        if pr.get("note"):
            out.append(pr["note"])
        rows = pr.get("rows") or {}
        if rows:
            out += ["| model | wall_ms | kernel_ms | kernels | top kernel |", "|---|---|---|---|---|"]
            for name, r in rows.items():
                top = r["top"][0] if r.get("top") else {}
                out.append(f"| {name} | {_fmt(r['wall_ms'])} | {_fmt(r['kernel_ms'])} | {r.get('launches', '')} | "
                           f"{_fmt(top.get('kernel', ''))} ({top.get('count', '')}×, {_fmt(top.get('ms'))} ms) |")
            out.append("")
    lc = result.get("launches")
    if lc:
        out += ["## Kernel launches of one training step (`memnets bench launches`)", ""]
        if lc.get("note"):
            out.append(lc["note"])
        if lc.get("rows"):
            lcols = ["model", "config", "aten_step", "triton_step", "launches_step", "per_t", "marginal_per_t"]
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
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("gpu-check.json", text_json), ("gpu-check.md", text_md)):
            tmp = folder / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, folder / name)


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
    except Exception:  # noqa: BLE001
        commit = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version, "fla": fla_version(),
            "python": sys.version.split()[0], "device": str(device), "git_commit": commit,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}


# -------------------------------------------------------------------------------------- run
def run(out: str | Path = "out/gpu-check", *, cpu: bool = False, tests: bool = True, tests_timeout: float = 180.0,
        tests_k: str | None = None, with_compile: bool = False, bench_seconds: float = 150.0,
        total_seconds: float = 400.0, sections: tuple[str, ...] = tuple(SECTIONS), wheels: str | Path | None = None,
        launch_counts: bool = True, profile: bool = True, verbose: bool = True) -> dict[str, Any]:
    """The GPU check (see the module's doc); returns the result written to ``out``/gpu-check.json.

    ``cpu``: tiny sizes on the CPU, the driver's dry run (also chosen when CUDA is missing).
    ``tests_timeout``: the CUDA tests' wall-time limit; ``bench_seconds``: the bench's budget of
    timed repeats (first calls and warm-ups are free); ``total_seconds``: after it no row starts.
    ``profile``: on CUDA, after the bench, wall time against kernel time of one training step
    of each memory (:mod:`memnets.bench.gpu_profile`), as ``result["profile"]``.
    ``launch_counts``: last, ``memnets bench launches`` on the device (B=4, T=16; on the CPU
    the CUDA code path at tiny sizes), as ``result["launches"]``.
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
    result: dict[str, Any] = {
        "suite": "gpu-check", "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU dry run)",
        "started": started, "mode": "CUDA" if cuda else "CPU dry run at tiny sizes (not a measurement)",
        "env": {}, "wheels": [], "tests": None, "columns": ROW_COLUMNS, "rows": [],
        "budget": {"tests_timeout_s": tests_timeout, "bench_seconds": bench_seconds, "total_seconds": total_seconds},
        "launches": None, "notes": []}
    if wheels is not None:
        result["wheels"] = install_wheels(wheels)
        for w in result["wheels"]:
            if verbose:
                print(f"[gpu-check] wheel {w['wheel']}: {'installed' if w['ok'] else w['error']}", flush=True)
    result["env"] = _env(device)
    _write(result, folders)
    if tests:
        if verbose:
            print(f"[gpu-check] CUDA tests (limit {tests_timeout:.0f} s) ...", flush=True)
        log = folders[-1] / "gpu-check-tests.log"
        result["tests"] = run_tests(cuda=cuda, timeout=tests_timeout, k=tests_k, with_compile=with_compile,
                                    log_path=log)
        if verbose:
            t = result["tests"]
            print(f"[gpu-check] tests: {t['status']}: {t['passed']} passed, {t['failed']} failed, "
                  f"{t['skipped']} skipped, {t['errors']} errors ({t.get('seconds')} s)", flush=True)
        _write(result, folders)
    bench = _Bench(device, bench_seconds, verbose=verbose, deadline=t0 + total_seconds,
                   on_row=lambda row: _write(result, folders))
    bench.rows = result["rows"]  # the same list: every row written as it comes
    shares = {"models": 0.3, "attention": 0.2, "scan": 0.5}
    for name in sections:
        bench.start_section(name, share=shares[name])
        s0 = time.perf_counter()
        SECTIONS[name](bench, not cuda)
        if verbose:
            print(f"[gpu-check] {name}: {time.perf_counter() - s0:.1f} s", flush=True)
    if profile and cuda:
        from . import gpu_profile
        s0 = time.perf_counter()
        try:
            result["profile"] = gpu_profile.run()
        except Exception as e:  # noqa: BLE001 - the timings above stand
            result["profile"] = {"note": f"error: {type(e).__name__}: {str(e)[:200]}", "rows": {}}
        _write(result, folders)
        if verbose:
            print(f"[gpu-check] profile: {time.perf_counter() - s0:.1f} s", flush=True)
    if launch_counts:
        if time.perf_counter() > t0 + total_seconds:
            result["launches"] = {"note": "skipped: total time limit reached", "rows": []}
        else:
            from . import launches
            s0 = time.perf_counter()
            try:
                lc = launches.run(batch=4 if cuda else 2, length=16 if cuda else 4, device=device, tiny=not cuda)
                result["launches"] = {k: lc[k] for k in ("rows", "notes", "batch", "length", "device")}
            except Exception as e:  # noqa: BLE001 - the timings above stand
                result["launches"] = {"note": f"error: {type(e).__name__}: {str(e)[:200]}", "rows": []}
            if verbose:
                print(f"[gpu-check] launches: {time.perf_counter() - s0:.1f} s", flush=True)
    if not cuda:  # a dry run measures nothing: no target is met or missed
        for r in result["rows"]:
            r["meets"] = None
    total = time.perf_counter() - t0
    skipped = [r["name"] + " " + r["config"] for r in result["rows"] if str(r.get("note", "")).startswith("skipped")]
    met = [r for r in result["rows"] if r.get("meets") is not None]
    result["seconds"] = round(total, 1)
    result["notes"] = [
        f"gpu: {result['gpu']}; {result['mode']}",
        f"total {total:.0f} s (limit {total_seconds:.0f} s); bench budget {bench_seconds:.0f} s of timed repeats, "
        "first calls and warm-ups not counted",
        f"targets met: {sum(1 for r in met if r['meets'])} of {len(met)}",
        f"rows skipped: {len(skipped)}" + (f" ({'; '.join(skipped)})" if skipped else ""),
    ]
    if not cuda:
        result["notes"].append("rows with needs_cuda = true (flash SDPA, fla's chunked kernels) run only on CUDA")
    _write(result, folders)
    if verbose:
        print(format_markdown(result), flush=True)
        print(f"[gpu-check] written: {', '.join(str(f / 'gpu-check.json') for f in folders)} (and .md)", flush=True)
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
    p.add_argument("--with-compile", action="store_true", help="also run the torch.compile CUDA tests (minutes)")
    p.add_argument("--bench-seconds", type=float, default=150.0,
                   help="budget of the bench's timed repeats (first calls and warm-ups not counted)")
    p.add_argument("--total-seconds", type=float, default=400.0, help="no bench row starts after this")
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--no-launches", action="store_true", help="skip the launch counts (memnets bench launches)")
    p.add_argument("--no-profile", action="store_true", help="skip the wall-vs-kernel-time profile of each memory")
    p.add_argument("--wheels", default="wheels", help="install the *.whl of this folder first, without network "
                   "(default wheels/; none there is fine; '' to skip)")
    a = p.parse_args(argv)
    res = run(a.out, cpu=a.cpu, tests=not a.no_tests, tests_timeout=a.tests_timeout, tests_k=a.tests_k,
              with_compile=a.with_compile, bench_seconds=a.bench_seconds, total_seconds=a.total_seconds,
              sections=tuple(a.sections), wheels=a.wheels or None, launch_counts=not a.no_launches,
              profile=not a.no_profile)
    t = res.get("tests") or {}
    return 1 if t.get("failed") or t.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
