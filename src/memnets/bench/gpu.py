"""``memnets bench gpu``: forward+backward GPU timings (CUDA events, median after warm-up).

Sections (each row records the GPU name, ``torch.cuda.get_device_name()``):

- ``scan``: the NAM sequence scan, B=8 H=16, d ∈ {64, 128}, T ∈ {2048, 8192, 32768}, bfloat16 and
  float32: ``nam_scan`` chunked (ours, PyTorch), ``nam_scan`` impl="auto" (fla's kernels for
  half precision when installed) with ``p_e ≠ p_w`` and with ``p_e = p_w``, and fla's own
  kernels called directly: ``chunk_delta_rule`` (p_e = p_w), ``chunk_dplr_delta_rule`` with no
  decay (any p_e, p_w; fla's ``chunk_iplr_delta_rule`` has no backward), ``fused_recurrent_delta_rule``
  and ``fused_recurrent_iplr_delta_rule``. Rows fla cannot run say why ('n/a: ...'), out-of-memory
  rows say 'OOM'.
- ``attention``: ``nam_attention`` against ``F.scaled_dot_product_attention`` on its flash
  backend, bfloat16, B=1 H=8 d=64, S ∈ {4K, 16K, 32K, 64K}, non-causal and causal.
- ``models``: one training step (forward, backward of a mean-square loss, Adam) of LSAM, DNC and
  NAM-TM (and the NTM, eager only) against cuDNN ``nn.LSTM`` of the same width, at the CPU benchmark's sizes
  (:mod:`memnets.bench.models_nam`, :mod:`memnets.bench.models_classic`) and at paper widths.
  With ``--compile MODE ...`` each of our models is also timed under ``torch.compile`` in those
  modes (``reduce-overhead``: CUDA graphs), with the speed-up over its eager row.

``--quick`` runs a small subset (about a minute); ``--tiny`` shrinks every size so that the whole
script runs on a CPU (a smoke test of the code, not a measurement). Each row's first call (JIT
compilation, Triton autotuning, cuDNN's plans) is timed on its own (``first_ms``) and, with the
warm-up calls after it, kept out of the time budget: each section stops starting new rows once
the timed repeats of its rows have spent its share of ``--max-seconds`` (the rest are recorded as
skipped). ``make gpu-check`` (:mod:`memnets.bench.gpu_check`) runs the rows that the GPU targets
name, after the CUDA tests.
"""
from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from ..ops._impl import COMPILE_MODES, compile_module

__all__ = ["run", "time_cuda", "time_first_then_median", "COLUMNS"]

COLUMNS = ["section", "name", "config", "dtype", "first_ms", "ms", "note"]
BUDGET_SHARE = {"scan": 0.55, "attention": 0.15, "models": 0.30}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_cuda(fn: Callable[[], None], device: torch.device, *, warmup: int = 2, repeat: int = 5) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def time_first_then_median(fn: Callable[[], None], device: torch.device, *, warmup: int = 2,
                           repeat: int = 5) -> dict:
    """``{"first_ms", "ms", "timed_s"}``: the first call alone (JIT compilation, autotuning), then
    :func:`time_cuda`'s median after ``warmup`` more calls; ``timed_s`` is the wall time of the
    timed repeats only (what a time budget counts)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first_ms = 1e3 * (time.perf_counter() - t0)
    for _ in range(max(warmup - 1, 0)):
        fn()
    _sync(device)
    t1 = time.perf_counter()
    ms = time_cuda(fn, device, warmup=0, repeat=repeat)
    return {"first_ms": first_ms, "ms": ms, "timed_s": time.perf_counter() - t1}


def _fwd_bwd(fn: Callable[[], object], leaves: list[torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        for t in leaves:
            t.grad = None
        out = fn()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    return run


ROW_KEY = ("section", "name", "config", "dtype")  # what names a bench row


class _Bench:
    """Rows and the time budget: a section's share of ``max_seconds`` counts the timed repeats
    only (first calls and warm-ups are free); ``deadline`` (``time.perf_counter()`` value), when
    set, stops every row after it whatever the budget. ``on_start(row)`` is called with each row
    before it is measured, ``on_row(row)`` after. ``replay``: rows an earlier process measured
    (:mod:`memnets.bench.isolated`), given back in order, unmeasured, by the first calls of
    :meth:`measure` (which must ask for the same rows), so that later rows still pair with them."""

    def __init__(self, device: torch.device, max_seconds: float, verbose: bool = True,
                 deadline: float = math.inf, on_row: Callable[[dict], None] | None = None,
                 on_start: Callable[[dict], None] | None = None, replay: list[dict] | None = None):
        self.device = device
        self.gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({device})"
        self.rows: list[dict] = []
        self.max_seconds = max_seconds
        self.verbose = verbose
        self.section_budget = math.inf
        self.section_spent = 0.0
        self.deadline = deadline
        self.on_row = on_row
        self.on_start = on_start
        self.replay = list(replay or [])

    def start_section(self, name: str, share: float | None = None) -> None:
        self.section_budget = (BUDGET_SHARE[name] if share is None else share) * self.max_seconds
        self.section_spent = 0.0

    def measure(self, section: str, name: str, config: str, dtype, make: Callable[[], Callable[[], None]],
                warmup: int, repeat: int, note: str = "", extra: dict | None = None) -> dict:
        """Build the timed closure with ``make()`` and time it; errors become the row's note."""
        row = {"section": section, "name": name, "config": config, "dtype": str(dtype).replace("torch.", ""),
               "first_ms": None, "ms": None, "note": note, "gpu": self.gpu, **(extra or {})}
        if self.replay:
            done = self.replay.pop(0)
            if [done.get(k) for k in ROW_KEY] != [row[k] for k in ROW_KEY]:
                raise RuntimeError(f"rows to replay out of order: {[done.get(k) for k in ROW_KEY]} given back "
                                   f"where {[row[k] for k in ROW_KEY]} was asked for")
            self.rows.append(done)
            return done
        if self.on_start is not None:
            self.on_start(row)
        if time.perf_counter() > self.deadline:
            row["note"] = "skipped: total time limit reached"
        elif self.section_spent > self.section_budget:
            row["note"] = "skipped: section time budget spent"
        else:
            fn = None
            caught: list = []
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", RuntimeWarning)
                    fn = make()
                    t = time_first_then_median(fn, self.device, warmup=warmup, repeat=repeat)
                row["first_ms"], row["ms"] = t["first_ms"], t["ms"]
                row["repeats"] = repeat
                self.section_spent += t["timed_s"]
            except torch.cuda.OutOfMemoryError:
                row["note"] = "OOM"
            except _NotAvailable as e:
                row["note"] = f"n/a: {e}"
            except Exception as e:  # noqa: BLE001 - keep going: GPU time is scarce
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                row["note"] = f"error: {type(e).__name__}: {msg}"
            finally:
                del fn
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            # a CUDA-graph capture that failed inside the row (the row then timed a path without
            # that graph): kept with the row, so the table says which of its graphs it lacked
            failed = [str(w.message) for w in caught if "capture" in str(w.message) and "failed" in str(w.message)]
            if failed:
                row["capture_failures"] = [m[:400] for m in failed[:4]]
                row["note"] = (row["note"] + "; " if row["note"] else "") + \
                    f"{len(failed)} graph capture(s) failed: {failed[0][:120]}"
            for w in caught:  # shown as they would have been (the caller's filters apply)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            if row["ms"] is not None and self.device.type == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2 ** 30, 2)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
        self.rows.append(row)
        if self.verbose:
            ms = "" if row["ms"] is None else f"{row['ms']:10.2f} ms"
            first = "" if row["first_ms"] is None else f"(first {row['first_ms']:.0f} ms)"
            print(f"[{section}] {name:38s} {config:34s} {row['dtype']:9s} {ms:>13s} {first:>18s}  {row['note']}",
                  flush=True)
        if self.on_row is not None:
            self.on_row(row)
        return row


class _NotAvailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------------- scan
def _scan_section(bench: _Bench, quick: bool, tiny: bool) -> None:
    from ..ops import nam_scan, unit
    from ..ops.delta.fla_backend import fla_available, fla_kernels, fla_reasons

    dev = bench.device
    if tiny:
        B, H, dims, lengths = 2, 2, (16,), (64, 128)
    elif quick:
        B, H, dims, lengths = 8, 16, (64,), (2048, 8192)
    else:
        B, H, dims, lengths = 8, 16, (64, 128), (2048, 8192, 32768)
    dtypes = (torch.bfloat16, torch.float32)
    kernels = fla_kernels() if fla_available() else None
    why_not = "; ".join(fla_reasons(torch.zeros(1, device=dev))) or "fla unavailable"
    for dtype in dtypes:
        for d in dims:
            for T in lengths:
                if T >= 32768:
                    warmup, repeat = 1, 3
                elif T >= 8192:
                    warmup, repeat = 1, 5
                else:
                    warmup, repeat = 2, 10
                cfg = f"B={B} H={H} d={d} T={T}"

                def inputs(requires_pe=True):
                    g = torch.Generator(device=dev).manual_seed(0)
                    shape = (B, T, H, d)
                    q = unit(torch.randn(shape, device=dev, generator=g)).to(dtype)
                    k = unit(torch.randn(shape, device=dev, generator=g)).to(dtype)
                    v = torch.randn(shape, device=dev, generator=g).to(dtype)
                    pw = torch.rand(B, T, H, device=dev, generator=g).to(dtype)
                    pe = torch.rand(B, T, H, device=dev, generator=g).to(dtype)
                    ts = [q, k, v, pw, pe]
                    for t in ts:
                        t.requires_grad_(True)
                    return ts

                def ours(impl, same):
                    def make():
                        q, k, v, pw, pe = inputs()
                        return _fwd_bwd(lambda: nam_scan(q, k, v, pw, pw if same else pe, impl=impl),
                                        [q, k, v, pw, pe])
                    return make

                def fla_direct(role):
                    def make():
                        if kernels is None:
                            raise _NotAvailable(why_not)
                        q, k, v, pw, pe = inputs()
                        fn = kernels[role]
                        if role.startswith("delta"):
                            call = lambda: fn(q=q, k=k, v=v, beta=pw, scale=1.0, output_final_state=True)  # noqa: E731
                        elif role == "general_chunk":
                            gk = torch.zeros_like(k)
                            call = lambda: fn(q=q, k=k, v=v * pw[..., None], a=k, b=-pe[..., None] * k,  # noqa: E731
                                              gk=gk, scale=1.0, output_final_state=True)
                        else:
                            call = lambda: fn(q=q, k=k, v=v * pw[..., None], a=k, b=-pe[..., None] * k,  # noqa: E731
                                              scale=1.0, output_final_state=True)
                        return _fwd_bwd(call, [q, k, v, pw, pe])
                    return make

                rows = [
                    ("nam_scan chunked (ours, p_e!=p_w)", ours("chunked", False)),
                    ("nam_scan auto (p_e!=p_w)", ours("auto", False)),
                    ("nam_scan auto (p_e=p_w)", ours("auto", True)),
                    ("fla chunk_delta_rule (p_e=p_w)", fla_direct("delta_chunk")),
                    ("fla chunk_dplr_delta_rule gk=0", fla_direct("general_chunk")),
                    ("fla fused_recurrent_delta_rule", fla_direct("delta_recurrent")),
                    ("fla fused_recurrent_iplr_delta_rule", fla_direct("general_recurrent")),
                ]
                if quick and not tiny:
                    rows = rows[:5]
                for name, make in rows:
                    note = ""
                    if name.startswith("nam_scan auto"):
                        from ..ops import nam_scan_resolve_impl
                        probe = torch.zeros(1, T, 1, 1, device=dev, dtype=dtype)
                        note = f"impl={nam_scan_resolve_impl('auto', probe)}"
                    bench.measure("scan", name, cfg, dtype, make, warmup, repeat, note=note,
                                  extra={"B": B, "H": H, "d": d, "T": T})


# ------------------------------------------------------------------------------ attention
def _attention_section(bench: _Bench, quick: bool, tiny: bool) -> None:
    from ..ops import nam_attention

    dev = bench.device
    B, H, d = 1, 8, 64
    if tiny:
        sizes = (128, 256)
    elif quick:
        sizes = (4096, 16384)
    else:
        sizes = (4096, 16384, 32768, 65536)
    dtype = torch.bfloat16

    def sdpa_ctx():
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            import contextlib
            return contextlib.nullcontext(), "default backend"
        if dev.type != "cuda":
            return sdpa_kernel([SDPBackend.MATH]), "math backend (CPU)"
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION]), "flash backend"

    for causal in (False, True):
        for S in sizes:
            cfg = f"B={B} H={H} d={d} S={S}" + (" causal" if causal else "")

            def inputs():
                g = torch.Generator(device=dev).manual_seed(0)
                return [torch.randn(B, H, S, d, device=dev, generator=g).to(dtype).requires_grad_(True)
                        for _ in range(3)]

            def make_sdpa():
                q, k, v = inputs()

                def call():
                    with sdpa_ctx()[0]:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return _fwd_bwd(call, [q, k, v])

            def make_nam():
                q, k, v = inputs()
                return _fwd_bwd(lambda: nam_attention(q, k, v, causal=causal), [q, k, v])

            warmup, repeat = (2, 10) if S <= 16384 else (1, 5)
            base = bench.measure("attention", "sdpa", cfg, dtype, make_sdpa, warmup, repeat, note=sdpa_ctx()[1],
                                 extra={"S": S, "causal": causal})
            ours = bench.measure("attention", "nam_attention", cfg, dtype, make_nam, warmup, repeat,
                                 extra={"S": S, "causal": causal})
            if base["ms"] and ours["ms"]:
                ours["speedup_vs_sdpa"] = round(base["ms"] / ours["ms"], 3)
                ours["note"] = f"{ours['speedup_vs_sdpa']:.2f}x vs sdpa"


# --------------------------------------------------------------------------------- models
def _train_step(model: torch.nn.Module, x: torch.Tensor, run: Callable, graphed: bool = False,
                guard: bool = False) -> Callable[[], None]:
    """One training step (forward, mean-square loss, backward, Adam — fused on CUDA, as memnets
    trains there, for every model and baseline alike) as a closure; ``graphed``:
    the whole step replayed from a CUDA graph (:class:`memnets.train.graph_step.CUDAGraphStep`,
    captured at the second call; eager where CUDA graphs are not available). ``guard`` (with
    ``graphed``): the step also clips the gradient norm to 10 and judges it with the spike guard
    (:class:`memnets.train.step_guard.DeviceGuard`, ``optim.spike_skip = 1000``), as ``memnets
    train`` does inside the replayed step."""
    from ..train.optim import fusable

    params = list(model.parameters())
    fused = fusable(params) or guard  # the guard's dropped update is the fused optimiser's skip
    opt = torch.optim.Adam(params, lr=1e-4, **({"fused": True} if fused else {}))  # as make_optimizer
    if graphed:
        from ..train.graph_step import CUDAGraphStep

        before, held = None, {}
        if guard:
            from ..train.step_guard import DeviceGuard

            judge = DeviceGuard(1000.0, x.device)
            judge.attach(opt)

            def before() -> None:
                norm = torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
                judge.decide(held["loss"], norm)

        def loss_fn(x):
            held["loss"] = run(x).float().pow(2).mean()
            return held["loss"]
        whole = CUDAGraphStep(loss_fn, opt, warmup=1, before_step=before)

        def graphed_step() -> None:
            whole(x)
        graphed_step.stats = whole.stats  # eager / captured / replayed / failed, for the row
        return graphed_step

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        y = run(x)
        y.float().pow(2).mean().backward()
        opt.step()
    return step


def _models_section(bench: _Bench, quick: bool, tiny: bool, compile_modes: tuple[str, ...] = ()) -> None:
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM

    dev = bench.device
    dtype = torch.float32

    def case(name, cfg, build, run, B, T, Fi, warmup=2, repeat=5, note="", compile_mode=None):
        def make():
            torch.manual_seed(0)
            model = build().to(dev)
            if compile_mode is not None:  # compiled during the warm-up steps, which are not timed
                model = compile_module(model, compile_mode)
            x = torch.randn(B, T, Fi, device=dev)
            return _train_step(model, x, run(model))
        extra = {"B": B, "T": T} if compile_mode is None else {"B": B, "T": T, "compile": compile_mode}
        return bench.measure("models", name, cfg, dtype, make, warmup, repeat, note=note, extra=extra)

    def ours_rows(name, cfg, build, B, T, Fi):
        """Our model eager, then compiled in each of ``compile_modes`` (with its ratio to eager)."""
        eager = case(name, cfg, build, lambda m: (lambda x: m(x)[0]), B, T, Fi)
        for mode in compile_modes:
            row = case(f"{name} compile={mode}", cfg, build, lambda m: (lambda x: m(x)[0]), B, T, Fi,
                       warmup=3, compile_mode=mode)
            if eager["ms"] and row["ms"]:
                row["speedup_vs_eager"] = round(eager["ms"] / row["ms"], 3)
                r = row["speedup_vs_eager"]
                row["note"] = f"{r:.2f}x faster than eager" if r >= 1 else f"{1 / r:.2f}x slower than eager"
        return eager

    def lstm_row(cfg, Fi, D, B, T, bi=False):
        return case(("nn.LSTM (cuDNN)" if dev.type == "cuda" else "nn.LSTM") + (" bi" if bi else ""), cfg,
                    lambda: torch.nn.LSTM(Fi, D // 2 if bi else D, batch_first=True, bidirectional=bi),
                    lambda m: (lambda x: m(x)[0]), B, T, Fi)

    def paired(base, ours):
        if base["ms"] and ours["ms"]:
            ours["ratio_vs_lstm"] = round(ours["ms"] / base["ms"], 3)
            ours["note"] = (ours["note"] + "; " if ours["note"] else "") + f"{ours['ratio_vs_lstm']:.2f}x LSTM time"

    # LSAM: the CPU benchmark's size, and the paper's width (d 1024, 8 heads of 128).
    lsam_sizes = [(4, 10, 32, 4)] if tiny else [(32, 100, 256, 8)] + ([] if quick else [(32, 100, 1024, 8)])
    for B, T, D, H in lsam_sizes:
        for bi in (False, True):
            cfg = f"B={B} T={T} hidden={D} heads={H}" + (" bi" if bi else "")
            base = lstm_row(cfg, D, D, B, T, bi)

            def build(D=D, H=H, bi=bi):
                return LSAM(D, D, H, bidirectional=bi)
            ours = ours_rows("LSAM" + (" bi" if bi else ""), cfg, build, B, T, D)
            paired(base, ours)
    # DNC: the CPU benchmark's copy-task size, and a wider controller.
    dnc_sizes = [(4, 10, 16, 8, 8, 2)] if tiny else [(32, 41, 64, 16, 20, 4)] + ([] if quick else [(32, 41, 256, 32, 64, 4)])
    for B, T, Hc, N, W, R in dnc_sizes:
        cfg = f"B={B} T={T} LSTM {Hc}, memory {N}x{W}, {R} reads"
        base = lstm_row(cfg, 9, Hc, B, T)

        def build(Hc=Hc, N=N, W=W, R=R):
            return DNC(9, 8, memory_slots=N, word_size=W, read_heads=R, controller_size=Hc)
        ours = ours_rows("DNC", cfg, build, B, T, 9)
        paired(base, ours)
    # NAM-TM: the CPU benchmark's size, and the paper's 8 tapes x 128.
    tm_sizes = [(4, 8, 16, 32, 2, 8)] if tiny else [(32, 50, 64, 128, 4, 32)] + ([] if quick else [(32, 50, 256, 1024, 8, 32)])
    for B, T, Fi, D, Tn, L in tm_sizes:
        cfg = f"B={B} T={T} in={Fi} hidden={D} tapes={Tn} L={L}"
        base = lstm_row(cfg, Fi, D, B, T)

        def build(Fi=Fi, D=D, Tn=Tn, L=L):
            return NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L)
        ours = ours_rows("NAM-TM", cfg, build, B, T, Fi)
        paired(base, ours)
    # NTM: the copy task's size (LSTM 100, memory 128x20, one read and one write head); eager only.
    ntm_sizes = [(4, 10, 16, 8, 8)] if tiny else [(32, 41, 100, 128, 20)]
    for B, T, Hc, N, W in ntm_sizes:
        cfg = f"B={B} T={T} LSTM {Hc}, memory {N}x{W}, 1 read 1 write"
        base = lstm_row(cfg, 9, Hc, B, T)
        ours = case("NTM", cfg, lambda Hc=Hc, N=N, W=W: NTM(9, 8, memory_slots=N, word_size=W, read_heads=1,
                                                           write_heads=1, controller_size=Hc),
                    lambda m: (lambda x: m(x)[0]), B, T, 9)
        paired(base, ours)


SECTIONS = {"scan": _scan_section, "attention": _attention_section, "models": _models_section}


def run(quick: bool = False, *, device: str | torch.device | None = None, tiny: bool = False,
        sections: tuple[str, ...] = tuple(SECTIONS), max_seconds: float = 330.0, verbose: bool = True,
        compile_modes: tuple[str, ...] = ()) -> dict:
    """Run the sections and return a bench result dict (``rows`` carry the GPU name).

    ``compile_modes``: the ``models`` section also times LSAM, DNC and NAM-TM under
    ``torch.compile`` in each of these modes (``reduce-overhead`` uses CUDA graphs on CUDA), each
    row with its speed-up over the eager row.

    ``device``: None or ``"auto"`` for CUDA when available, else the CPU; a device this machine
    lacks raises :class:`~memnets.train.config.ConfigError` (:func:`memnets.train.env.resolve_device`).
    """
    from ..train.env import DistInfo, resolve_device

    current = DistInfo(local_rank=torch.cuda.current_device()) if torch.cuda.is_available() else None
    device = resolve_device("auto" if device is None else str(device), current)
    from ..ops.delta.fla_backend import fla_version
    bad = [m for m in compile_modes if m not in COMPILE_MODES]
    if bad:
        raise ValueError(f"`compile_modes` expected modes among {list(COMPILE_MODES)}, got {bad}")
    bench = _Bench(device, max_seconds, verbose)
    t0 = time.perf_counter()
    for name in sections:
        bench.start_section(name)
        s0 = time.perf_counter()
        if name == "models":
            SECTIONS[name](bench, quick, tiny, compile_modes=tuple(compile_modes))
        else:
            SECTIONS[name](bench, quick, tiny)
        if verbose:
            print(f"[{name}] section took {time.perf_counter() - s0:.1f} s", flush=True)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    notes = [f"gpu: {bench.gpu}", f"fla: {fla_version() or 'not installed'}; triton: {triton_version}",
             "ms = median forward+backward (models: + Adam step) time, CUDA events, after warm-up; "
             "first_ms = the first call alone (JIT compilation, autotuning), outside the time budget",
             f"total {time.perf_counter() - t0:.0f} s"]
    return {"suite": "gpu", "title": "GPU: NAM scan, attention and models (forward+backward)",
            "columns": COLUMNS, "rows": bench.rows, "notes": notes, "gpu": bench.gpu,
            "fla": fla_version(), "triton": triton_version, "quick": quick, "tiny": tiny,
            "compile_modes": list(compile_modes)}


def main(argv=None) -> dict:  # ``python -m memnets.bench.gpu``
    import argparse

    from .registry import bench_env, format_table

    p = argparse.ArgumentParser(prog="python -m memnets.bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device", default=None)
    p.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS))
    p.add_argument("--max-seconds", type=float, default=330.0)
    p.add_argument("--compile", nargs="+", choices=COMPILE_MODES, default=[])
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    res = run(a.quick, device=a.device, tiny=a.tiny, sections=tuple(a.sections), max_seconds=a.max_seconds,
              compile_modes=tuple(a.compile))
    res["env"] = bench_env()
    print(format_table(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
