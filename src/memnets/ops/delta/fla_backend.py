"""NAM sequence scan on the Triton kernels of flash-linear-attention (``fla``), when installed.

The NAM write of docs/maths.md §1, in our layout (memory ``M`` is ``[dv, dk]``)::

    M_t = M_{t-1} + p_w v_t k_tᵀ − p_e (M_{t-1} k_t) k_tᵀ = M_{t-1} (I − p_e k_t k_tᵀ) + (p_w v_t) k_tᵀ
    o_t = p_r M_t q_t                                                      (read after write)

fla keeps the transposed state ``S = Mᵀ`` (``[dk, dv]``), batch-first ``[B, T, H, D]`` inputs, and
scales queries by ``scale`` (default ``dk^-0.5``; we pass ``scale=1``). It does not normalise q or
k unless ``use_qk_l2norm_in_kernel=True`` (we leave it off: keys and queries are used as given,
like :func:`memnets.ops.nam_scan`). Two fla families express the write exactly:

- ``p_e = p_w = β`` (the delta rule): ``chunk_delta_rule`` / ``fused_recurrent_delta_rule`` with
  ``beta = p_w``: ``S ← S + k (β (v − Sᵀ k))ᵀ``, i.e. ``M ← M + β (v − M k) kᵀ``.
- any ``p_w, p_e`` (the generalised delta rule): fla's IPLR/DPLR write
  ``S ← (I + b aᵀ) S + k vᵀ`` (with DPLR's decay ``exp(gk) = 1``), i.e.
  ``M ← M (I + a bᵀ) + v kᵀ``, with ``a = k``, ``b = −p_e k`` and ``v`` scaled by ``p_w``:
  ``chunk_dplr_delta_rule(gk=0)`` (fla's ``chunk_iplr_delta_rule`` has no backward) or
  ``fused_recurrent_iplr_delta_rule``.

fla's chunked kernels do not run in float32 (``chunk_delta_rule`` refuses it), so ``mode="auto"``
takes the chunked kernels for float16 / bfloat16 and the step-by-step fused kernels for float32
(they keep the state in float32 registers). The initial state goes in as ``M₀ᵀ`` in float32, the
final state comes back as ``[B, H, dv, dk]`` in the input dtype; gradients reach q, k, v, p_w,
p_e, p_r and the initial state through fla's own backward passes.

State layouts: memnets ``[B, H, dv, dk]`` (``M``, so that ``o = M q``); fla ``[N, H, K, V]`` =
``[B, H, dk, dv]`` (fla's kernels address the state as ``h0 + i_nh·K·V + i_k·V + i_v``, e.g.
``fused_recurrent_delta_rule_fwd_kernel`` in fla-core 0.6), so every state crosses as its
transpose. Packed batches (``cu_seqlens``, fla's convention: batch size 1, offsets
``[0, l₁, …, T]``, one initial and one final state per sequence) are passed to fla's kernels as they
are.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

__all__ = ["fla_available", "fla_version", "nam_scan_fla", "fla_kernels", "MODES"]

MODES = ("auto", "chunk", "recurrent")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.lru_cache(maxsize=None)
def _import_fla() -> tuple[dict[str, Callable] | None, str]:
    """(kernels, version) or (None, why not)."""
    try:
        import triton  # noqa: F401
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule, fused_recurrent_iplr_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return None, f"{type(e).__name__}: {e}"
    try:
        from importlib.metadata import version

        ver = version("fla-core")
    except Exception:  # noqa: BLE001
        import fla

        ver = getattr(fla, "__version__", "unknown")
    kernels = {
        "delta_chunk": chunk_delta_rule,
        "delta_recurrent": fused_recurrent_delta_rule,
        "general_chunk": chunk_dplr_delta_rule,
        "general_recurrent": fused_recurrent_iplr_delta_rule,
    }
    return kernels, ver


def fla_available() -> bool:
    """True when ``fla`` and ``triton`` import (a GPU is still needed to run the kernels)."""
    return _import_fla()[0] is not None


def fla_version() -> str | None:
    """The installed fla version, or ``None`` when it does not import."""
    kernels, info = _import_fla()
    return info if kernels is not None else None


def fla_kernels() -> dict[str, Callable]:
    """fla's kernel functions by role (raises ImportError with the reason when unavailable)."""
    kernels, info = _import_fla()
    if kernels is None:
        raise ImportError(f"flash-linear-attention (fla) is not usable: {info}")
    return kernels


def fla_reasons(q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None) -> list[str]:
    """Reasons why :func:`nam_scan_fla` cannot run on these inputs (empty list: it can)."""
    reasons = []
    if not fla_available():
        reasons.append(f"flash-linear-attention (fla) is not usable: {_import_fla()[1]}")
    if q.device.type != "cuda":
        reasons.append(f"fla's Triton kernels need CUDA tensors, got {q.device}")
    if q.dtype not in DTYPES:
        reasons.append(f"fla runs float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("dk", k if k is not None else q), ("dv", v)):
        if t is not None and t.shape[-1] > 256:
            reasons.append(f"fla's kernels take head dims up to 256, got {name}={t.shape[-1]}")
    return reasons


def _pick_mode(mode: str, dtype: torch.dtype) -> str:
    if mode not in MODES:
        raise ValueError(f"`mode` expected one of {MODES}, got {mode!r}")
    if mode == "auto":
        return "recurrent" if dtype == torch.float32 else "chunk"
    return mode


def nam_scan_fla(
    q: torch.Tensor,  # [B, T, H, dk]
    k: torch.Tensor,  # [B, T, H, dk]
    v: torch.Tensor,  # [B, T, H, dv]
    p_w: torch.Tensor | float,  # [B, T, H] or a float
    p_e: torch.Tensor | float | None = None,  # [B, T, H], a float, or None (= p_w: the delta rule)
    p_r: torch.Tensor | float | None = None,  # [B, T, H], a float, or None (= 1)
    state: torch.Tensor | None = None,  # [B, H, dv, dk]
    *,
    delta: bool | None = None,
    mode: str = "auto",
    chunk_size: int | None = None,
    kernels: dict[str, Callable] | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The NAM scan of :func:`memnets.ops.nam_scan` on fla's kernels: ``(out [B,T,H,dv], state [B,H,dv,dk])``.

    Args:
        q, k, v, p_w, p_e, p_r, state: as ``nam_scan`` (``p_e=None`` means ``p_e = p_w``).
        delta: use the delta-rule kernels (requires ``p_e = p_w``). ``None``: when ``p_e`` is
            ``None`` or the very same object as ``p_w`` (or an equal float). The values are not
            compared (that would force a device sync); with ``delta=False`` any ``p_e`` works.
        mode: ``"chunk"`` (chunkwise-parallel kernels, float16/bfloat16), ``"recurrent"``
            (fused step-by-step kernels, any of the three dtypes) or ``"auto"`` (chunk unless
            float32).
        chunk_size: passed to fla's chunked kernels (``None``: fla's default).
        kernels: replaces fla's functions by role (tests run the mapping on fla's CPU reference
            recurrences with it); keys ``delta_chunk``, ``delta_recurrent``, ``general_chunk``,
            ``general_recurrent``.
        cu_seqlens: a packed batch (``[1, T, H, d]`` inputs, offsets ``[0, l₁, …, T]``, as in
            :func:`memnets.ops.nam_scan`), passed to fla's kernels as their ``cu_seqlens``
            (int64, on the inputs' device); ``state`` is then ``[N, H, dv, dk]``, one per
            sequence, and so is the final state.
    """
    kern = kernels if kernels is not None else fla_kernels()
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    dtype = q.dtype
    if delta is None:
        delta = p_e is None or p_e is p_w or (
            not isinstance(p_e, torch.Tensor) and not isinstance(p_w, torch.Tensor) and float(p_e) == float(p_w))
    elif delta and p_e is not None and p_e is not p_w and (
            isinstance(p_e, torch.Tensor) or isinstance(p_w, torch.Tensor) or float(p_e) != float(p_w)):
        raise ValueError("delta=True needs p_e = p_w (pass p_e=None or the same tensor)")
    which = _pick_mode(mode, dtype)
    varlen = {}
    if cu_seqlens is not None:
        from ..varlen import check_cu_seqlens

        n_seqs = len(check_cu_seqlens(cu_seqlens, T)) - 1
        if B != 1:
            raise ValueError(f"`k` expected batch size 1 with `cu_seqlens` ([1, T, H, dk]), got {list(k.shape)}")
        if state is not None and state.shape[0] != n_seqs:
            raise ValueError(f"`state` expected one state per sequence [N={n_seqs}, H, dv, dk] with `cu_seqlens`, "
                             f"got {list(state.shape)}")
        varlen = {"cu_seqlens": cu_seqlens.to(device=q.device, dtype=torch.long)}

    def prob(p) -> torch.Tensor:
        if isinstance(p, torch.Tensor):
            return p.to(dtype)
        return torch.full((B, T, H), float(p), dtype=dtype, device=q.device)

    # fla's state is [B, H, dk, dv]. Contiguous here: fla's autograd Functions make their inputs
    # contiguous inside forward, where a copy no longer requires grad, so a transposed view
    # would lose the initial state's gradient (IPLR) or fail in backward (delta rule).
    h0 = None if state is None else state.float().transpose(-1, -2).contiguous()
    extra = {} if (chunk_size is None or which != "chunk") else {"chunk_size": chunk_size}
    extra.update(varlen)
    pw = prob(p_w)
    if delta:
        fn = kern["delta_chunk" if which == "chunk" else "delta_recurrent"]
        o, hT = fn(q=q, k=k, v=v, beta=pw, scale=1.0, initial_state=h0, output_final_state=True, **extra)
    else:
        pe = prob(p_e)
        vw = v * pw.unsqueeze(-1)  # p_w v
        b = k * (-pe).unsqueeze(-1)  # the transition M (I + a bᵀ) with a = k, b = −p_e k
        if which == "chunk":
            gk = torch.zeros_like(k)  # DPLR's log decay: exp(0) = 1, no decay
            o, hT = kern["general_chunk"](q=q, k=k, v=vw, a=k, b=b, gk=gk, scale=1.0, initial_state=h0,
                                          output_final_state=True, **extra)
        else:
            o, hT = kern["general_recurrent"](q=q, k=k, v=vw, a=k, b=b, scale=1.0, initial_state=h0,
                                              output_final_state=True, **varlen)
    o = o.to(dtype)
    if p_r is not None:
        o = o * (p_r.to(dtype).unsqueeze(-1) if isinstance(p_r, torch.Tensor) else float(p_r))
    return o, hT.transpose(-1, -2).to(dtype)
