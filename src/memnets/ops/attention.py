"""Normalized outer-product attention (docs/maths.md §5), a drop-in for SDPA that is linear in S
(SDPA's keywords ``is_causal`` and ``scale``; ``attn_mask`` and ``dropout_p`` are refused).

    NAMAttn(Q, K, V) = μ(Q) · (μ(K)ᵀ V)                 (bidirectional, the paper's form)
    causal: o_t = Σ_{s<=t} (μ(q_t)·μ(k_s)) v_s           (chunked prefix states)

Also the Linear Transformer's attention (``φ(x) = elu(x) + 1`` with normaliser) in the same
``[..., S, D]`` layout, used by the attention family and the benchmarks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_positive_int, check_tensor
from . import gpu as _gpu
from .gpu import attention as _gpu_attention
from .gpu import causal_attention as _gpu_kernels
from .nam import unit
from .varlen import attention_varlen, check_cu_seqlens, same_sequence_mask

__all__ = ["nam_attention", "nam_attention_quadratic", "linear_attention", "elu_feature_map", "ATTENTION_IMPLS",
           "resolve_attention_impl"]

ATTENTION_IMPLS = ("torch", "triton", "fla")


def _attention_reasons(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       packed: bool) -> list[str]:
    """Why ``impl`` cannot run ``nam_attention`` on these inputs (empty: it can)."""
    if impl == "torch":
        return []
    why = []
    if packed:
        why.append("cu_seqlens (packed sequences) run on the PyTorch path only")
    if impl == "triton":
        if not _gpu.use_triton(q):
            why.append("the Triton kernels run on CUDA tensors (CPU tensors only inside "
                       "memnets.ops.gpu.cuda_path with TRITON_INTERPRET=1) with triton installed")
        if not _gpu_kernels.applies(q, k, v):
            why.append(f"the Triton kernels take non-empty float inputs of one dtype with head dims up to "
                       f"{_gpu_kernels.MAX_HEAD_DIM}")
    elif impl == "fla":
        if not causal:
            why.append("fla's chunk_linear_attn is causal only")
        if not _gpu_attention.use_fla_attention(q, k, v):
            why.append("fla's kernel takes [B, H, S, D] bfloat16/float16 CUDA tensors, head dims up to 256, "
                       "with fla installed")
    else:
        why.append(f"unknown impl {impl!r}; expected one of {('auto',) + ATTENTION_IMPLS}")
    return why


def resolve_attention_impl(impl: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                           causal: bool, packed: bool = False) -> str:
    """The implementation :func:`nam_attention` runs for ``impl`` on these inputs.

    ``"auto"``: on CUDA, the Triton kernels (:mod:`memnets.ops.gpu.causal_attention`) for
    bfloat16/float16 inputs with head dims up to 64 (:func:`~memnets.ops.gpu.causal_attention.fast_on_cuda`);
    else, causal, fla's chunked kernel where it applies; else the PyTorch path (float32 and
    float64 on CUDA too: the kernels' exact float32 products spill registers). On CPU tensors
    inside :func:`memnets.ops.gpu.cuda_path` (the interpreter), the Triton kernels. ``"triton"``,
    ``"fla"`` and ``"torch"`` are taken as asked, or raise ValueError with the reasons they
    cannot run."""
    if impl == "auto":
        if not packed and _gpu.use_triton(query) and _gpu_kernels.applies(query, key, value) \
                and (not query.is_cuda or _gpu_kernels.fast_on_cuda(query, value)):
            return "triton"
        if causal and not packed and _gpu_attention.use_fla_attention(query, key, value):
            return "fla"
        return "torch"
    why = _attention_reasons(impl, query, key, value, causal, packed)
    if why:
        raise ValueError(f"nam_attention: impl={impl!r} cannot run: " + "; ".join(why))
    return impl


def _check_qkv(q, k, v, fn: str) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        check_tensor(name, t)
        if t.dim() < 2:
            raise ValueError(f"{fn}: `{name}` expected [..., S, D] (at least 2 dims), got {list(t.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"{fn}: `value` expected [..., S, dv] = {list(k.shape[:-1]) + ['dv']} like `key`, got {list(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"{fn}: `query` expected [..., L, dk] = {list(k.shape[:-2]) + ['L', k.shape[-1]]}, got {list(q.shape)}"
        )
    for name, t in (("query", q), ("value", v)):
        if t.dtype != k.dtype or t.device != k.device:
            raise TypeError(
                f"{fn}: `{name}` expected dtype {k.dtype} on {k.device} like `key`, got {t.dtype} on {t.device}"
            )
    if not k.is_floating_point():
        raise TypeError(f"{fn}: `key` expected a floating-point tensor, got {k.dtype}")


def _causal_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, state: torch.Tensor | None):
    """``(o, state + Σ_s k_sᵀ v_s)`` with o_t = q_t·(state + Σ_{s<=t} k_sᵀ v_s): within-chunk
    quadratic terms and prefix states, ``state`` (``[..., dk, dv]`` or None) before step 0."""
    S = q.shape[-2]
    C = min(chunk, S)
    N = -(-S // C)
    pad = N * C - S
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    qc = q.unflatten(-2, (N, C))  # [..., N, C, dk]
    kc = k.unflatten(-2, (N, C))  # [..., N, C, dk]
    vc = v.unflatten(-2, (N, C))  # [..., N, C, dv]
    chunk_states = kc.transpose(-1, -2) @ vc  # [..., N, dk, dv]
    total = torch.cumsum(chunk_states, dim=-3)
    # exclusive prefix by a shift, not cumsum − chunk_states: a huge or non-finite later chunk
    # must not cancel into (or spoil) the sum of the chunks before it
    prefix = F.pad(total[..., :-1, :, :], (0, 0, 0, 0, 1, 0))  # [..., N, dk, dv]
    final = total[..., -1, :, :]
    if state is not None:
        prefix = prefix + state.unsqueeze(-3)
        final = final + state
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # masked_fill, not a product with the mask: 0 · NaN would carry a later NaN key back
    intra = (qc @ kc.transpose(-1, -2)).masked_fill_(~lower, 0) @ vc  # [..., N, C, dv]
    out = qc @ prefix + intra  # [..., N, C, dv]
    return out.flatten(-3, -2)[..., :S, :], final  # [..., S, dv]


def _causal_cuts(k: torch.Tensor, v: torch.Tensor) -> list[int]:
    """The first step with a non-finite key or value of each row ``[...]`` (0 and repeats left out),
    sorted: where a causal pass must be cut for NaN locality. Empty after one sum when all is finite."""
    S = k.shape[-2]
    if S == 0 or torch.compiler.is_compiling() or bool(torch.isfinite(k.sum() + v.sum())):
        return []
    from .delta.chunked import _first_nonfinite

    bad = ~torch.isfinite(k).all(-1) | ~torch.isfinite(v).all(-1)  # [..., S]
    return [t for t in _first_nonfinite(bad.reshape(-1, S)) if t > 0]


def _causal_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int) -> torch.Tensor:
    """o_t = Σ_{s<=t} (q_t·k_s) v_s with within-chunk quadratic terms and prefix states.

    A NaN or Inf in a key or value at step t reaches no output before t (as in the step-by-step
    sum): a product with a triangular matrix would carry it back (``0 · NaN`` is NaN), so the
    sequence is cut at the first non-finite step of each row and the runs are chained through
    their states (one sum when every value is finite)."""
    S = q.shape[-2]
    if S == 0:
        return q @ (k.transpose(-1, -2) @ v)  # [..., 0, dv]
    cuts = _causal_cuts(k, v)
    if not cuts:
        return _causal_run(q, k, v, chunk, None)[0]
    outs, state = [], None
    for a, b in zip([0] + cuts, cuts + [S]):
        o, state = _causal_run(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], chunk, state)
        outs.append(o)
    return torch.cat(outs, -2)


def _sdpa_keywords(fn: str, attn_mask, dropout_p, is_causal, causal) -> bool:
    """Check the keywords shared with SDPA; returns whether the attention is causal.

    ``causal`` is the older spelling of ``is_causal``; a bool in ``attn_mask``'s position is
    that older positional ``causal`` (``nam_attention(q, k, v, True)``).
    """
    if isinstance(attn_mask, bool):
        if causal is not None and causal != attn_mask:
            raise ValueError(f"{fn}: the positional `causal`={attn_mask} conflicts with causal={causal}")
        attn_mask, causal = None, attn_mask
    if attn_mask is not None:
        raise ValueError(
            f"{fn}: `attn_mask` is not supported: NAM attention is linear-time (no L×S score matrix to mask) "
            "and supports only the causal mask, is_causal=True"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0:
        raise ValueError(
            f"{fn}: `dropout_p` expected 0.0, got {dropout_p!r}: NAM attention forms no attention-weight matrix "
            "to drop entries from (apply dropout to the output instead)"
        )
    if is_causal and causal is not None and not causal:  # is_causal=False is the default: no conflict
        raise ValueError(f"{fn}: `causal`={causal} and `is_causal`={is_causal} conflict; give one of them "
                         "(`causal` is the older name of `is_causal`)")
    return bool(is_causal) or bool(causal)


def _scale(fn: str, scale) -> float | None:
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{fn}: `scale` expected a number or None, got {type(scale).__name__} {scale!r}")
    return float(scale)


def _packed_offsets(fn: str, query, key, cu_seqlens) -> list[int] | None:
    """The offsets of ``cu_seqlens`` (None without it); query and key must share the packed length."""
    if cu_seqlens is None:
        return None
    if query.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"{fn}: `cu_seqlens` packs query and key alike, so they need the same length, "
            f"got L={query.shape[-2]} and S={key.shape[-2]}"
        )
    return check_cu_seqlens(cu_seqlens, key.shape[-2])


def nam_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    causal: bool | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
    cu_seqlens: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Normalized outer-product attention ``scale · μ(Q) (μ(K)ᵀ V)`` (docs/maths.md §5).

    Same layout and keywords as :func:`torch.nn.functional.scaled_dot_product_attention`:
    query ``[..., L, dk]``, key ``[..., S, dk]``, value ``[..., S, dv]`` → ``[..., L, dv]``, so
    ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` becomes
    ``nam_attention(q, k, v, is_causal=True)``. Cost is linear in the sequence length (no
    ``L×S`` matrix).

    - ``is_causal=True`` (requires ``L == S``): each position sees only itself and earlier
      positions. ``causal`` is the older name of the same switch (and a bool as the fourth
      positional argument is taken as it); giving ``causal=False`` with ``is_causal=True``
      raises ValueError.
    - ``scale`` multiplies the scores ``μ(q)·μ(k)`` (so the output). Default ``None`` means 1,
      not SDPA's ``1/sqrt(dk)``: the scores are cosine similarities in ``[-1, 1]`` already, and
      the output is not a softmax average that a temperature would sharpen.
    - ``attn_mask`` must be None and ``dropout_p`` 0: there is no score matrix to mask or to drop
      entries from; both raise ValueError otherwise.
    - ``cu_seqlens`` (flash-linear-attention's convention, :mod:`memnets.ops.varlen`): query, key
      and value hold N sequences one after the other along the sequence axis (``[..., T, d]``,
      usually ``[1, H, T, d]``; query and key of the same length T), and ``cu_seqlens`` is the 1-D
      int32/int64 tensor of offsets ``[0, l₁, l₁ + l₂, …, T]``. Each sequence attends only to
      itself, causal or not: the output equals running each sequence alone (the bidirectional
      form uses each sequence's own summary ``μ(K)ᵀV``). Bad offsets raise ValueError.

    - ``impl``: ``"auto"`` (default), ``"triton"``, ``"fla"`` or ``"torch"``
      (:func:`resolve_attention_impl`). On CUDA, ``"auto"`` runs memnets' Triton kernels
      (:mod:`memnets.ops.gpu.causal_attention`: chunk-parallel, μ fused in) on bfloat16/float16
      inputs with head dims up to 64, causal or not; flash-linear-attention's ``chunk_linear_attn``
      on μ(q), μ(k) for causal half-precision inputs with larger heads (``"fla"``, where fla is
      installed; :mod:`memnets.ops.gpu.attention`); elsewhere, and for packed sequences, the
      PyTorch form (chunked prefix states when causal).
    """
    fn = "nam_attention"
    causal = _sdpa_keywords(fn, attn_mask, dropout_p, is_causal, causal)
    s = _scale(fn, scale)
    _check_qkv(query, key, value, fn)
    check_positive_int("chunk_size", chunk_size)
    offsets = _packed_offsets(fn, query, key, cu_seqlens)
    if causal and query.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"nam_attention: causal=True expects query and key of the same length, "
            f"got L={query.shape[-2]} and S={key.shape[-2]}"
        )
    which = resolve_attention_impl(impl, query, key, value, causal=causal, packed=offsets is not None)
    if which == "triton":
        return _gpu_kernels.nam_attention_triton(query, key, value, causal=causal, scale=s, eps=eps)
    qn, kn = unit(query, eps=eps), unit(key, eps=eps)
    if s is not None:
        qn = qn * s
    if which == "fla":
        return _gpu_attention.nam_attention_fla(qn, kn, value)
    if offsets is not None:
        return attention_varlen(qn, kn, value, offsets, causal=causal, chunk_size=chunk_size)
    if not causal:
        return qn @ (kn.transpose(-1, -2) @ value)  # [..., L, dk] @ [..., dk, dv]
    return _causal_chunked(qn, kn, value, chunk_size)


def nam_attention_quadratic(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    causal: bool | None = None,
    eps: float = 1e-6,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference form ``scale · (μ(Q) μ(K)ᵀ [masked lower-triangular]) V``, quadratic in S.

    Takes the keywords of :func:`nam_attention` (``attn_mask``, ``dropout_p``, ``is_causal``,
    ``scale``, ``causal``, ``cu_seqlens``) with the same meaning and the same refusals
    (``cu_seqlens``: scores between tokens of different sequences are zero).
    """
    fn = "nam_attention_quadratic"
    causal = _sdpa_keywords(fn, attn_mask, dropout_p, is_causal, causal)
    s = _scale(fn, scale)
    _check_qkv(query, key, value, fn)
    offsets = _packed_offsets(fn, query, key, cu_seqlens)
    scores = unit(query, eps=eps) @ unit(key, eps=eps).transpose(-1, -2)  # [..., L, S]
    if s is not None:
        scores = scores * s
    if causal:
        scores = scores.tril()  # selects: a NaN above the diagonal becomes 0
    if offsets is not None:
        scores = scores.masked_fill(~same_sequence_mask(offsets, scores.device), 0)
    cuts = _causal_cuts(key, value) if causal else []
    if not cuts:
        return scores @ value
    # a non-finite value at step t would reach the rows before t through its zero scores (0 · NaN):
    # the rows of each run, cut at every row's first non-finite step, see only the values up to their end
    return torch.cat([scores[..., a:b, :b] @ value[..., :b, :] for a, b in zip([0] + cuts, cuts + [scores.shape[-2]])],
                     -2)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020), positive everywhere."""
    return F.elu(x) + 1.0


def linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = False,
    *,
    chunk_size: int = 64,
    eps: float = 1e-6,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Linear Transformer attention: ``φ(Q)(φ(K)ᵀV) / (φ(Q) Σφ(K))`` with ``φ = elu + 1``.

    ``cu_seqlens``: a packed batch as in :func:`nam_attention` (each sequence attends only to
    itself, numerator and normaliser alike; causal or not)."""
    _check_qkv(query, key, value, "linear_attention")
    check_positive_int("chunk_size", chunk_size)
    offsets = _packed_offsets("linear_attention", query, key, cu_seqlens)
    fq, fk = elu_feature_map(query), elu_feature_map(key)
    ones = value.new_ones(value.shape[:-1] + (1,))
    vz = torch.cat([value, ones], dim=-1)  # the normaliser rides along as an extra column
    if offsets is not None:
        num = attention_varlen(fq, fk, vz, offsets, causal=causal, chunk_size=chunk_size)
    elif causal:
        if query.shape[-2] != key.shape[-2]:
            raise ValueError("linear_attention: causal=True expects query and key of the same length")
        num = _causal_chunked(fq, fk, vz, chunk_size)
    else:
        num = fq @ (fk.transpose(-1, -2) @ vz)
    return num[..., :-1] / (num[..., -1:] + eps)
