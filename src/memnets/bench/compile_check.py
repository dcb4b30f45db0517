"""Compile every Triton kernel of the recurrent memories for a CUDA target, without a GPU.

Triton's interpreter (how the tests check the kernels' arithmetic on the CPU) accepts programs
that its compiler rejects, and it says nothing of a kernel's registers or shared memory. This
check closes that gap on any machine: it runs each memory's forward and backward down the CUDA
code path on CPU tensors with Triton in compiled mode, and turns every kernel launch into an
ahead-of-time compilation for the target (``sm_90`` by default: H100/H200) through Triton's own
pipeline — Triton IR, LLVM, PTX and ``ptxas`` to a cubin, which Triton bundles. Nothing is
launched: the kernels' outputs are left unwritten, so the values computed around them are
meaningless, and only the compilations are reported (per kernel: the types it was compiled
for, its warps, its shared memory, and, from ``ptxas -v``, its registers and spills).

``python -m memnets.bench.compile_check [--arch 90 80] [--json PATH]``; exit status 1 when a
kernel fails to compile or needs more shared memory than the target has. ``make test`` runs it
(``tests/test_triton_compile.py``) in a child process, since a process imports Triton in one
mode only (:func:`memnets.ops.gpu.interpreting`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch

__all__ = ["compile_only", "run", "main", "format_table", "SHARED_LIMIT"]

# shared memory a block may use (bytes), by compute capability's major*10+minor
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


class _AOTDriver:
    """The few calls Triton's launcher makes of its driver, for a GPU that is not there."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def _ptx_usage(ptx: str, arch: int) -> dict[str, Any]:
    """Registers and spills of the PTX's kernel, from ``ptxas -v`` (the ptxas Triton bundles)."""
    try:  # the ptxas Triton itself compiles with for this arch
        from triton.backends.nvidia.compiler import get_ptxas
        try:
            ptxas = get_ptxas(arch).path
        except TypeError:  # older triton: get_ptxas() takes no arch
            ptxas = get_ptxas().path
    except Exception:  # noqa: BLE001 - its bundled ptxas by path
        import triton
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True, timeout=300)
    text = p.stdout + p.stderr
    out: dict[str, Any] = {}
    m = re.search(r"Used (\d+) registers", text)
    if m:
        out["registers"] = int(m.group(1))
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if m:
        out["spill_stores"], out["spill_loads"] = int(m.group(1)), int(m.group(2))
    # the block-wide barriers in the code (each reduction across warps costs one or two; a
    # loop's body counts once): with one program per sequence, a step waits on each in turn
    out["barriers"] = len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx))
    return out


@contextlib.contextmanager
def compile_only(arch: int = 90, records: list | None = None, usage: bool = True):
    """Inside: every Triton kernel launch compiles for ``sm_<arch>`` instead of running, and
    :func:`memnets.ops.gpu.use_triton` takes CPU tensors on the CUDA code path. Each launch
    appends ``{kernel, arch, signature, seconds, ok, error, shared, num_warps, registers, …}``
    to ``records`` (one per distinct compilation). Needs Triton imported in compiled mode."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from ..ops.gpu import _COMPILE_ONLY, interpreting

    if interpreting():
        raise RuntimeError("compile_only needs Triton in compiled mode; this process imported it with "
                           "TRITON_INTERPRET=1 (run `python -m memnets.bench.compile_check` in a fresh process)")
    records = [] if records is None else records
    seen: set = set()
    real_run = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        sig = tuple(f"*{a.dtype}" if isinstance(a, torch.Tensor) else repr(a) if isinstance(a, (bool, str))
                    or a is None else type(a).__name__ for a in args)
        key = (self.__name__, getattr(self, "module", ""), sig, tuple(sorted(kwargs.items())))
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"kernel": f"{getattr(self, 'module', '')}.{self.__name__}", "arch": arch,
                               "signature": ", ".join(sig)}
        try:
            kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
            rec["ok"] = True
            meta = getattr(kernel, "metadata", None)
            rec["shared"] = int(getattr(meta, "shared", 0) or 0)
            rec["num_warps"] = int(getattr(meta, "num_warps", 0) or 0)
            limit = SHARED_LIMIT.get(arch)
            if limit is not None and rec["shared"] > limit:
                rec["ok"] = False
                rec["error"] = f"needs {rec['shared']} bytes of shared memory; sm_{arch} has {limit}"
            if usage and key not in seen:
                ptx = getattr(kernel, "asm", {}).get("ptx")
                if ptx:
                    rec.update(_ptx_usage(ptx, arch))
        except Exception as e:  # noqa: BLE001 - every failure is the check's result
            rec["ok"] = False
            cause = e.__cause__
            rec["error"] = (f"{type(e).__name__}: {str(e)[-1500:]}"
                            + (f"\ncaused by {type(cause).__name__}: {str(cause)[-1500:]}" if cause else ""))
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        if key not in seen:
            seen.add(key)
            records.append(rec)
        return None

    # the active driver to give back: None without a GPU (the next use finds the real one
    # again); before triton 3.5 `active` itself, a lazy proxy of the default one
    slot = "_active" if hasattr(driver, "_active") else "active"
    old_driver = getattr(driver, slot)
    driver.set_active(_AOTDriver(GPUTarget("cuda", arch, 32)))
    JITFunction.run = run
    _COMPILE_ONLY[0] += 1
    try:
        yield records
    finally:
        _COMPILE_ONLY[0] -= 1
        JITFunction.run = real_run
        setattr(driver, slot, old_driver)


class _Attention(torch.nn.Module):
    """``nam_attention`` on the Triton kernels as a case: ``x [B, T, 3·H·d]`` split into q, k, v."""

    def __init__(self, heads: int, dim: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.dim, self.causal = heads, dim, causal

    def forward(self, x: torch.Tensor):
        from ..ops import nam_attention
        from ..ops.gpu import causal_attention as ca

        B, T, _ = x.shape
        q, k, v = x.view(B, T, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        programs = ca.SUM_PROGRAMS
        try:  # non-causal: the chunk sums in groups of several chunks, as at long lengths
            ca.SUM_PROGRAMS = 1
            return (nam_attention(q, k, v, is_causal=self.causal, impl="triton"),)
        finally:
            ca.SUM_PROGRAMS = programs


def _cases() -> list[tuple]:
    """``(name, build, input size, T, dtypes[, environment])``: small sizes in float32 and float64,
    and the widths ``make gpu-check`` times (float32), whose registers matter. The DNC and the
    NTM also with their time loop in each form (``MEMNETS_TIME_LOOP=steps``: one launch per
    step; ``=kernel``: the whole loop in one; by default as :mod:`memnets.ops.gpu.rows` and the
    memory's module choose)."""
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM

    both, f32 = (torch.float32, torch.float64), (torch.float32,)
    att = (torch.bfloat16, torch.float16)
    cases = [
        ("nam_attention causal, d=64", lambda: _Attention(8, 64, True), 3 * 8 * 64, 256, att),
        ("nam_attention, d=64", lambda: _Attention(8, 64, False), 3 * 8 * 64, 256, att),
        ("nam_attention causal, d=128", lambda: _Attention(4, 128, True), 3 * 4 * 128, 256, (torch.bfloat16,)),
        ("nam_attention, d=128", lambda: _Attention(4, 128, False), 3 * 4 * 128, 256, (torch.bfloat16,)),
        ("nam_attention causal small", lambda: _Attention(2, 8, True), 3 * 2 * 8, 5, (torch.float64,)),
        ("LSAM small", lambda: LSAM(16, 16, 2), 16, 5, both),
        ("LSAM bi small", lambda: LSAM(16, 16, 2, bidirectional=True), 16, 5, both),
        ("NAM-TM small", lambda: NAMTuringMachine(8, 16, num_tapes=2, tape_length=8), 8, 5, both),
        ("DNC small", lambda: DNC(9, 8, memory_slots=8, word_size=8, read_heads=2, controller_size=16), 9, 5, both),
        ("NTM small", lambda: NTM(9, 8, memory_slots=8, word_size=8, read_heads=1, write_heads=1,
                                  controller_size=16), 9, 5, both),
        ("LSAM hidden 256, 8 heads", lambda: LSAM(256, 256, 8), 256, 3, f32),
        ("LSAM hidden 1024, 8 heads", lambda: LSAM(1024, 1024, 8), 1024, 3, f32),
        ("LSAM bi hidden 1024, 8 heads", lambda: LSAM(1024, 1024, 8, bidirectional=True), 1024, 3, f32),
        ("NAM-TM hidden 128, 4 tapes of 32", lambda: NAMTuringMachine(64, 128, num_tapes=4, tape_length=32), 64, 3,
         f32),
        ("NAM-TM hidden 1024, 8 tapes of 32", lambda: NAMTuringMachine(256, 1024, num_tapes=8, tape_length=32), 256,
         3, f32),
        ("DNC LSTM 64, memory 16x20, 4 reads", lambda: DNC(9, 8, memory_slots=16, word_size=20, read_heads=4,
                                                          controller_size=64), 9, 3, f32),
        ("DNC LSTM 256, memory 32x64, 4 reads", lambda: DNC(9, 8, memory_slots=32, word_size=64, read_heads=4,
                                                           controller_size=256), 9, 3, f32),
        ("NTM LSTM 100, memory 128x20", lambda: NTM(9, 8, memory_slots=128, word_size=20, read_heads=1,
                                                    write_heads=1, controller_size=100), 9, 3, f32),
    ]
    loops = [(f"{c[0]}, {label}",) + c[1:] + ({"MEMNETS_TIME_LOOP": form},) for c in cases
             for form, label in (("steps", "loop per step"), ("kernel", "loop in one kernel"))
             if c[0].startswith(("DNC", "NTM")) and "256" not in c[0]]  # the DNC at 256: per step
    return cases + loops


def run(arches: tuple[int, ...] = (90,), *, only: str | None = None, usage: bool = True,
        verbose: bool = False) -> dict[str, Any]:
    """Compile every kernel of every case for each of ``arches``; ``only``: cases whose name
    contains it. Returns ``{"records": [...], "cases": [...], "failed": n, "triton": version}``."""
    import triton

    from ..ops.gpu import cuda_code_path, env_var

    records: list[dict] = []
    cases = []
    for arch in arches:
        for name, build, fi, T, dtypes, *env in _cases():
            if only and only.lower() not in name.lower():
                continue
            for dt in dtypes:
                n0 = len(records)
                err = None
                with contextlib.ExitStack() as stack:
                    for k, v in (env[0] if env else {}).items():
                        stack.enter_context(env_var(k, v))
                    stack.enter_context(compile_only(arch, records, usage=usage))
                    stack.enter_context(cuda_code_path("cpu"))
                    torch.manual_seed(0)
                    model = build().to(dt)
                    x = torch.randn(1, T, fi, dtype=dt, requires_grad=True)
                    try:
                        y = model(x)[0]
                        y.float().sum().backward()
                    except Exception as e:  # noqa: BLE001 - reported with the case
                        err = f"{type(e).__name__}: {str(e)[:500]}"
                new = records[n0:]
                for r in new:
                    r["case"] = f"{name} {str(dt).replace('torch.', '')}"
                cases.append({"case": name, "dtype": str(dt).replace("torch.", ""), "arch": arch,
                              "kernels": len(new), "failed": sum(1 for r in new if not r["ok"]), "error": err})
                if verbose:
                    state = "ok" if not err and all(r["ok"] for r in new) else "FAILED"
                    print(f"sm_{arch} {name} {dt}: {len(new)} kernels compiled, {state}"
                          + (f" ({err})" if err else ""), flush=True)
    failed = sum(1 for r in records if not r["ok"]) + sum(1 for c in cases if c["error"])
    nokernel = [c for c in cases if c["kernels"] == 0 and not c["error"]]
    return {"triton": triton.__version__, "torch": torch.__version__, "arches": list(arches), "records": records,
            "cases": cases, "failed": failed, "cases_without_kernels": len(nokernel)}


def format_table(result: dict[str, Any]) -> str:
    cols = ["case", "kernel", "arch", "num_warps", "registers", "spill_stores", "barriers", "shared", "seconds", "ok"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in result["records"]:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memnets.bench.compile_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities, e.g. 90 (H100/H200) 80 (A100)")
    p.add_argument("--only", default=None, help="only the cases whose name contains this")
    p.add_argument("--no-usage", action="store_true", help="skip ptxas -v (registers, spills)")
    p.add_argument("--json", default=None, help="write the result here as JSON")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported: compiled mode
    try:
        import triton  # noqa: F401
    except ImportError:
        print("triton is not installed: nothing to compile", file=sys.stderr)
        return 2
    res = run(tuple(a.arch), only=a.only, usage=not a.no_usage, verbose=True)
    print(format_table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    for r in res["records"]:
        if not r["ok"]:
            print(f"\nFAILED {r['kernel']} for sm_{r['arch']} ({r['case']}):\n{r['error']}", file=sys.stderr)
    for c in res["cases"]:
        if c["error"]:
            print(f"\nFAILED {c['case']} {c['dtype']}: {c['error']}", file=sys.stderr)
    print(f"\n{len(res['records'])} compilations, {res['failed']} failed (triton {res['triton']})")
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
