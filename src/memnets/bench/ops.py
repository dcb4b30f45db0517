"""``memnets bench ops``: the NAM sequence op and NAM attention against their baselines.

* ``nam_scan`` chunked vs reference (time loop), forward+backward, B=4, H=4, d=64,
  T ∈ {512, 2048, 8192}, at the default ``chunk_size=64`` and at 32.
* ``nam_attention`` vs ``torch.nn.functional.scaled_dot_product_attention``,
  forward+backward, B=1, H=8, d=64, S ∈ {1024, 4096, 8192}.
Each row gives the time, the speed-up of the fast implementation and the growth factor of
its time when the length doubles.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ops import nam_attention, nam_scan, unit
from .timing import fwd_bwd, time_fn

__all__ = ["run"]


def _scan_inputs(B, T, H, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = unit(torch.randn(B, T, H, d, generator=g, dtype=dtype))
    k = unit(torch.randn(B, T, H, d, generator=g, dtype=dtype))
    v = torch.randn(B, T, H, d, generator=g, dtype=dtype)
    pw = torch.rand(B, T, H, generator=g, dtype=dtype)
    pe = torch.rand(B, T, H, generator=g, dtype=dtype)
    ts = [q, k, v, pw, pe]
    for t in ts:
        t.requires_grad_(True)
    return ts


def _growth(times: dict[int, float], sizes: list[int]) -> dict[int, float | None]:
    out: dict[int, float | None] = {sizes[0]: None}
    for a, b in zip(sizes, sizes[1:]):
        out[b] = (times[b] / times[a]) ** (1.0 / math.log2(b / a))
    return out


def run(quick: bool = False) -> dict:
    rows = []
    B, H, d = 4, 4, 64
    lengths = [64, 128, 256] if quick else [512, 2048, 8192]
    chunks = (64, 32)  # the default chunk size, and a shorter one that is faster on CPUs
    t_ref: dict[int, float] = {}
    t_chk: dict[int, dict[int, float]] = {c: {} for c in chunks}
    for T in lengths:
        ts = _scan_inputs(B, T, H, d)
        ref = fwd_bwd(lambda: nam_scan(*ts, impl="reference"), ts)
        big = T >= 8192
        t_ref[T] = time_fn(ref, warmup=0 if big else 1, repeat=1 if big else 3, stat="min")
        for c in chunks:
            chk = fwd_bwd(lambda: nam_scan(*ts, impl="chunked", chunk_size=c), ts)
            t_chk[c][T] = time_fn(chk, warmup=1, repeat=5, stat="min")
    g_ref = _growth(t_ref, lengths)
    for c in chunks:
        g_chk = _growth(t_chk[c], lengths)
        for T in lengths:
            rows.append({"op": "nam_scan fwd+bwd", "size": f"B={B} H={H} d={d} T={T}",
                         "baseline": "reference", "baseline_ms": 1e3 * t_ref[T],
                         "ours": f"chunked (chunk_size={c})", "ours_ms": 1e3 * t_chk[c][T],
                         "speedup": t_ref[T] / t_chk[c][T],
                         "growth_x2_base": g_ref[T], "growth_x2_ours": g_chk[T]})

    B, H, d = 1, 8, 64
    sizes = [128, 256, 512] if quick else [1024, 4096, 8192]
    t_sdpa, t_nam = {}, {}
    g = torch.Generator().manual_seed(0)
    for S in sizes:
        q, k, v = (torch.randn(B, H, S, d, generator=g).requires_grad_(True) for _ in range(3))
        sdpa = fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v), [q, k, v])
        nam = fwd_bwd(lambda: nam_attention(q, k, v), [q, k, v])
        t_sdpa[S] = time_fn(sdpa, warmup=1, repeat=3, stat="min")
        t_nam[S] = time_fn(nam, warmup=1, repeat=7, stat="min")
    g_sdpa, g_nam = _growth(t_sdpa, sizes), _growth(t_nam, sizes)
    for S in sizes:
        rows.append({"op": "attention fwd+bwd", "size": f"B={B} H={H} d={d} S={S}",
                     "baseline": "SDPA", "baseline_ms": 1e3 * t_sdpa[S], "ours": "nam_attention",
                     "ours_ms": 1e3 * t_nam[S], "speedup": t_sdpa[S] / t_nam[S],
                     "growth_x2_base": g_sdpa[S], "growth_x2_ours": g_nam[S]})
    return {
        "suite": "ops",
        "title": "NAM ops: fast path vs baseline (forward+backward, float32)",
        "columns": ["op", "size", "baseline", "baseline_ms", "ours", "ours_ms", "speedup",
                    "growth_x2_base", "growth_x2_ours"],
        "rows": rows,
        "notes": ["speedup = baseline time / ours, measured in this one process; each time is "
                  "the fastest of its repeats (robust to other jobs on the machine)",
                  "growth_x2 = time factor per doubling of the length (2.0 = linear, 4.0 = quadratic)"],
    }
