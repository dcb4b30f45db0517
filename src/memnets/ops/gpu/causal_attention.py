"""NAM attention as Triton kernels (docs/maths.md §5): chunk-parallel, normalisation fused in.

``nam_attention`` computes, for unit queries and keys ``Q = scale · μ(q)``, ``K = μ(k)``::

    causal:      o_t = Σ_{s<=t} (Q_t·K_s) v_s
    non-causal:  o_t = Σ_s (Q_t·K_s) v_s = Q_t (Kᵀ V)

The sequence is cut into chunks of ``C`` steps. Forward, three launches:

1. one program per chunk ``n`` and sequence: ``H_n = K_nᵀ V_n`` (``[dk, dv]``, float32), with
   μ applied to the keys as they are loaded (non-causal: one program per group of chunks, the
   group's sum, :func:`_per`);
2. the prefix sums over the chunks (causal: inclusive prefixes ``P_n = Σ_{m<=n} H_m``, one
   program per sequence and block of the ``[dk, dv]`` entries, walking the chunks
   :data:`PREFIX_ROWS` at a time) or ``torch.sum`` of the groups' sums (non-causal: the one
   summary ``Kᵀ V``);
3. one program per chunk: ``O_n = Q_n P_{n-1} + tril(Q_n K_nᵀ) V_n`` (causal) or
   ``O_n = Q_n (Kᵀ V)``.

Every chunk is independent of the others once the prefixes are summed, so the work spreads
over ``chunks × sequences`` programs at once, where a recurrence over the chunks (as in
flash-linear-attention's ``chunk_linear_attn``) runs ``sequences`` programs one chunk after
the other. Backward, three launches the same way: the chunk sums ``Q_nᵀ dO_n`` and their
prefixes, then one program per chunk writes ``dq``, ``dk`` and ``dv`` (μ's backward fused; for
head dims past :data:`SPLIT_HEAD_DIM`, one launch per gradient, :func:`_parts`)::

    dQ_n = dO_n P_{n-1}ᵀ + tril(dO_n V_nᵀ) K_n         G_n = Σ_{m>n} Q_mᵀ dO_m
    dK_n = V_n G_nᵀ + tril(dO_n V_nᵀ)ᵀ Q_n              dV_n = K_n G_n + tril(Q_n K_nᵀ)ᵀ dO_n

Saved for the backward: the inputs and the prefixes ``P`` (``[chunks, dk, dv]`` per sequence,
float32, as fla keeps its per-chunk states).

Precision: bfloat16/float16 inputs multiply in their own type with float32 accumulation, and the
products with the float32 prefixes in TF32; float32 and float64 inputs multiply in their own
type (``input_precision="ieee"``). ``scale`` and μ's ``eps`` are compile-time constants made
in the accumulation type: a float argument reaches a Triton kernel as float32, so in float64
they would be rounded (1e-6 by 2.5e-9 of itself). A NaN or Inf in a key or value at step t reaches no output
before t (masks are selections; a value that is not finite is kept out of the within-chunk
product, and its column of the outputs from t on is NaN, as the sum would make it, or would
make it ±Inf).

:func:`nam_attention_triton` takes ``[..., L, dk]``, ``[..., S, dk]``, ``[..., S, dv]`` like
:func:`memnets.ops.nam_attention`; that function runs it on CUDA (:func:`applies`), and the tests
hold it to the quadratic reference on CPU tensors through Triton's interpreter, float32 and
float64, values and every gradient.
"""
from __future__ import annotations

import os

import torch

from . import lazy_kernels

__all__ = ["NAMAttentionTriton", "nam_attention_triton", "chunk_prefix_", "applies", "fast_on_cuda", "MAX_HEAD_DIM",
           "FAST_HEAD_DIM", "CHUNK", "BACKWARD_ENV"]

MAX_HEAD_DIM = 128  # dk and dv: one program holds a [dk, dv] prefix and [C, dk], [C, dv] tiles
FAST_HEAD_DIM = 64  # where "auto" takes the kernels on CUDA (fast_on_cuda)
CHUNK = 64
SPLIT_HEAD_DIM = 64  # past it the backward is three launches (:func:`_parts`)
SUM_PROGRAMS = 1024  # the non-causal chunk sums' programs in all (:func:`_per`)
PREFIX_ROWS, PREFIX_BLOCK = 32, 128  # the causal prefix sums: chunks a step, entries a program
HALF = (torch.bfloat16, torch.float16)
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


@lazy_kernels
def kernels():
    """``(chunk_sums, forward_out, backward, chunk_prefix)``, defined on first use (see
    :func:`memnets.ops.gpu.lazy_kernels`)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _tile(ptr, b, row0, n_rows, n_cols, s_b, s_r, R: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr):
        """Rows ``row0 .. row0+R`` of sequence ``b`` (zeros past ``n_rows``/``n_cols``), in ``ACC``."""
        r = row0 + tl.arange(0, R)
        c = tl.arange(0, BC)
        m = (r < n_rows)[:, None] & (c < n_cols)[None, :]
        return tl.load(ptr + b * s_b + r[:, None] * s_r + c[None, :], mask=m, other=0.0).to(ACC)

    @triton.jit
    def _inv_norm(x, eps):
        """``1 / max(‖x_r‖, eps)`` of every row and whether ``‖x_r‖ >= eps`` (μ's two branches)."""
        nrm = tl.sqrt(tl.sum(x * x, 1))
        return 1.0 / tl.maximum(nrm, eps), nrm >= eps

    @triton.jit
    def _mm(a, b, HALF_IN: tl.constexpr, ACC: tl.constexpr, IN: tl.constexpr):
        """``a @ b`` of two operand tiles: in the inputs' half type ``IN`` when they are half, else exact."""
        if HALF_IN:
            return tl.dot(a.to(IN), b.to(IN), out_dtype=tl.float32)
        else:
            return tl.dot(a, b, input_precision="ieee", out_dtype=ACC)

    @triton.jit
    def _mm_state(a, h, HALF_IN: tl.constexpr, ACC: tl.constexpr, IN: tl.constexpr):
        """``a @ h`` with ``h`` a float32 (float64) prefix: TF32 for half inputs, else exact."""
        if HALF_IN:
            return tl.dot(a, h, input_precision="tf32", out_dtype=tl.float32)
        else:
            return tl.dot(a, h, input_precision="ieee", out_dtype=ACC)

    @triton.jit
    def _chunk_sum(x_ptr, y_ptr, b, row0, n_rows, dx, dy, sx_b, sx_r, sy_b, sy_r, scale, eps, C: tl.constexpr,
                   BX: tl.constexpr, BY: tl.constexpr, NORM: tl.constexpr, HALF_IN: tl.constexpr, ACC: tl.constexpr,
                   IN: tl.constexpr):
        """``(scale · μ(x))ᵀ y`` (``NORM``; else ``xᵀ y``) of the chunk at rows ``row0 ..`` of sequence ``b``."""
        x = _tile(x_ptr, b, row0, n_rows, dx, sx_b, sx_r, C, BX, ACC)
        y = _tile(y_ptr, b, row0, n_rows, dy, sy_b, sy_r, C, BY, ACC)
        if NORM:
            inv, _ = _inv_norm(x, eps)
            x = x * (inv * scale)[:, None]
        return _mm(tl.trans(x), y, HALF_IN, ACC, IN)

    @triton.jit
    def chunk_sums(x_ptr, y_ptr, h_ptr, n_chunks, n_groups, per, n_rows, dx, dy, sx_b, sx_r, sy_b, sy_r,
                   SCALE: tl.constexpr, EPS_: tl.constexpr, C: tl.constexpr, BX: tl.constexpr, BY: tl.constexpr,
                   NORM: tl.constexpr, ONE: tl.constexpr, HALF_IN: tl.constexpr, ACC: tl.constexpr,
                   IN: tl.constexpr):
        """``h[b, g] = Σ_n (scale · μ(x_n))ᵀ y_n`` (``NORM``; else ``x_nᵀ y_n``) over the chunks
        ``n`` of group ``g`` of sequence ``b``: chunks ``g·per ..`` (``ONE``: ``per`` is 1, chunk
        ``g`` alone, as the causal prefixes need every chunk's sum)."""
        scale, eps = tl.full([], SCALE, ACC), tl.full([], EPS_, ACC)  # exact in float64 (module docstring)
        g = tl.program_id(0) % n_groups  # one flat grid: group g of sequence b
        b = (tl.program_id(0) // n_groups).to(tl.int64)
        if ONE:
            h = _chunk_sum(x_ptr, y_ptr, b, g * C, n_rows, dx, dy, sx_b, sx_r, sy_b, sy_r, scale, eps, C, BX, BY,
                           NORM, HALF_IN, ACC, IN)
        else:
            h = tl.zeros([BX, BY], dtype=ACC)
            for n in range(g * per, tl.minimum(g * per + per, n_chunks)):
                h += _chunk_sum(x_ptr, y_ptr, b, n * C, n_rows, dx, dy, sx_b, sx_r, sy_b, sy_r, scale, eps, C, BX,
                                BY, NORM, HALF_IN, ACC, IN)
        i = tl.arange(0, BX)
        j = tl.arange(0, BY)
        tl.store(h_ptr + (b * n_groups + g) * BX * BY + i[:, None] * BY + j[None, :], h.to(h_ptr.dtype.element_ty))

    @triton.jit
    def forward_out(q_ptr, k_ptr, v_ptr, p_ptr, o_ptr, n_chunks, L, S, dk, dv, sq_b, sq_r, sk_b, sk_r, sv_b, sv_r,
                    p_b, SCALE: tl.constexpr, EPS_: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, CAUSAL: tl.constexpr, HALF_IN: tl.constexpr, ACC: tl.constexpr,
                    IN: tl.constexpr):
        scale, eps = tl.full([], SCALE, ACC), tl.full([], EPS_, ACC)
        n = tl.program_id(0) % n_chunks  # one flat grid: chunk n of sequence b
        b = (tl.program_id(0) // n_chunks).to(tl.int64)
        q = _tile(q_ptr, b, n * C, L, dk, sq_b, sq_r, C, BK, ACC)
        inv_q, _ = _inv_norm(q, eps)
        Q = q * (inv_q * scale)[:, None]
        i = tl.arange(0, BK)
        j = tl.arange(0, BV)
        if CAUSAL:
            h = tl.load(p_ptr + b * p_b + tl.maximum(n - 1, 0) * BK * BV + i[:, None] * BV + j[None, :])
            h = tl.where(n > 0, h, 0.0)  # P_{n-1}; none before the first chunk
            o = _mm_state(Q, h, HALF_IN, ACC, IN)
            k = _tile(k_ptr, b, n * C, S, dk, sk_b, sk_r, C, BK, ACC)
            inv_k, _ = _inv_norm(k, eps)
            K = k * inv_k[:, None]
            v = _tile(v_ptr, b, n * C, S, dv, sv_b, sv_r, C, BV, ACC)
            ok = tl.abs(v) < float("inf")  # finite (false for NaN too)
            r = tl.arange(0, C)
            A = tl.where(r[:, None] >= r[None, :], _mm(Q, tl.trans(K), HALF_IN, ACC, IN), 0.0)
            o += _mm(A, tl.where(ok, v, 0.0), HALF_IN, ACC, IN)
            # a NaN/Inf value at step t spoils its column of every output from t on, none before t
            first_bad = tl.min(tl.where(ok, C, r[:, None]), 0)
            o = tl.where(r[:, None] >= first_bad[None, :], float("nan"), o)
        else:
            h = tl.load(p_ptr + b * p_b + i[:, None] * BV + j[None, :])
            o = _mm_state(Q, h, HALF_IN, ACC, IN)
        rows = n * C + tl.arange(0, C)
        m = (rows < L)[:, None] & (j < dv)[None, :]
        tl.store(o_ptr + b * L * dv + rows[:, None] * dv + j[None, :], o.to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _state(h_ptr, b, h_b, n, BK: tl.constexpr, BV: tl.constexpr):
        """The ``n``-th ``[dk, dv]`` block (a chunk's prefix, or the one total) of sequence ``b``."""
        return tl.load(h_ptr + b * h_b + n * BK * BV + tl.arange(0, BK)[:, None] * BV + tl.arange(0, BV)[None, :])

    @triton.jit
    def _suffix(g_ptr, b, n, n_g, g_b, BK: tl.constexpr, BV: tl.constexpr):
        """``Σ_{m>n} Q_mᵀ dO_m`` of sequence ``b``: the last of the ``n_g`` prefixes less the ``n``-th."""
        return _state(g_ptr, b, g_b, n_g - 1, BK, BV) - _state(g_ptr, b, g_b, n, BK, BV)

    @triton.jit
    def _store_unit_grad(ptr, b, n_rows, d, rows, i, g, u, big, inv):
        """μ's backward, stored at rows ``rows`` of sequence ``b`` (``[n_rows, d]``):
        d/dx (x / max(‖x‖, eps)) · g = (g − [‖x‖ >= eps] u (u·g)) / max(‖x‖, eps), ``u = μ(x)``."""
        gx = (g - tl.where(big, tl.sum(g * u, 1), 0.0)[:, None] * u) * inv[:, None]
        m = (rows < n_rows)[:, None] & (i < d)[None, :]
        tl.store(ptr + b * n_rows * d + rows[:, None] * d + i[None, :], gx.to(ptr.dtype.element_ty), mask=m)

    @triton.jit
    def backward(q_ptr, k_ptr, v_ptr, do_ptr, p_ptr, g_ptr, dq_ptr, dk_ptr, dv_ptr, n_chunks, L, S, dk, dv,
                 sq_b, sq_r, sk_b, sk_r, sv_b, sv_r, sd_b, sd_r, p_b, g_b, n_g, SCALE: tl.constexpr,
                 EPS_: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, CAUSAL: tl.constexpr,
                 DQ: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, HALF_IN: tl.constexpr,
                 ACC: tl.constexpr, IN: tl.constexpr):
        """``dq`` of query chunk ``n`` (``DQ``), ``dk`` (``DK``) and ``dv`` (``DV``) of key chunk
        ``n``, of one sequence ``b``: all three in one program, or each in a launch of its own
        (wide heads: :func:`_parts`).

        ``p``: the prefixes of ``Kᵀ V`` (causal; non-causal: their sum); ``g``: the prefixes of
        ``Qᵀ dO`` over ``n_g`` chunks (non-causal: their sum)."""
        scale, eps = tl.full([], SCALE, ACC), tl.full([], EPS_, ACC)
        n = tl.program_id(0) % n_chunks  # one flat grid: chunk n of sequence b
        b = (tl.program_id(0) // n_chunks).to(tl.int64)
        i = tl.arange(0, BK)
        j = tl.arange(0, BV)
        r = tl.arange(0, C)
        rows = n * C + r
        # the tiles each part reads: dq the queries and dO, dk the keys and values, dv the keys;
        # causal, the within-chunk products add the rest (dv all but the values)
        if DQ or CAUSAL:
            q = _tile(q_ptr, b, n * C, L, dk, sq_b, sq_r, C, BK, ACC)
            inv_q, big_q = _inv_norm(q, eps)
            u_q = q * inv_q[:, None]
            Q = u_q * scale
            do = _tile(do_ptr, b, n * C, L, dv, sd_b, sd_r, C, BV, ACC)
        if DK or DV or CAUSAL:
            k = _tile(k_ptr, b, n * C, S, dk, sk_b, sk_r, C, BK, ACC)
            inv_k, big_k = _inv_norm(k, eps)
            K = k * inv_k[:, None]
        if DK or (DQ and CAUSAL):
            v = _tile(v_ptr, b, n * C, S, dv, sv_b, sv_r, C, BV, ACC)
        if CAUSAL:
            lower = r[:, None] >= r[None, :]
            if DQ or DK:
                dA = tl.where(lower, _mm(do, tl.trans(v), HALF_IN, ACC, IN), 0.0)
        if DQ:
            if CAUSAL:  # P_{n-1}; none before the first chunk
                h = tl.where(n > 0, _state(p_ptr, b, p_b, tl.maximum(n - 1, 0), BK, BV), 0.0)
                dQ = _mm_state(do, tl.trans(h), HALF_IN, ACC, IN) + _mm(dA, K, HALF_IN, ACC, IN)
            else:
                dQ = _mm_state(do, tl.trans(_state(p_ptr, b, p_b, 0, BK, BV)), HALF_IN, ACC, IN)
            _store_unit_grad(dq_ptr, b, L, dk, rows, i, dQ * scale, u_q, big_q, inv_q)
        if DK:
            if CAUSAL:
                dK = _mm(tl.trans(dA), Q, HALF_IN, ACC, IN)
                g = _suffix(g_ptr, b, n, n_g, g_b, BK, BV)
                dK += _mm_state(v, tl.trans(g), HALF_IN, ACC, IN)
            else:
                g = _state(g_ptr, b, g_b, 0, BK, BV)
                dK = _mm_state(v, tl.trans(g), HALF_IN, ACC, IN)
            _store_unit_grad(dk_ptr, b, S, dk, rows, i, dK, K, big_k, inv_k)
        if DV:
            if CAUSAL:
                A = tl.where(lower, _mm(Q, tl.trans(K), HALF_IN, ACC, IN), 0.0)
                dV = _mm(tl.trans(A), do, HALF_IN, ACC, IN)
                if not DK:
                    g = _suffix(g_ptr, b, n, n_g, g_b, BK, BV)
                dV += _mm_state(K, g, HALF_IN, ACC, IN)
            else:
                if not DK:
                    g = _state(g_ptr, b, g_b, 0, BK, BV)
                dV = _mm_state(K, g, HALF_IN, ACC, IN)
            mv = (rows < S)[:, None] & (j < dv)[None, :]
            tl.store(dv_ptr + b * S * dv + rows[:, None] * dv + j[None, :], dV.to(dv_ptr.dtype.element_ty),
                     mask=mv)

    # the kernels call these helpers by name: Triton looks a called function (and the helpers'
    # ``tl.constexpr`` annotations, strings under ``from __future__ import annotations``) up in
    # the kernel's module globals
    @triton.jit(do_not_specialize=["n_chunks"])
    def chunk_prefix(h_ptr, n_chunks, E, G: tl.constexpr, BLOCK: tl.constexpr):
        """``h[b, n] ← Σ_{m<=n} h[b, m]`` in place for entries ``BLOCK·j ..`` of each chunk's
        ``E`` (program ``(b, j)``), ``G`` chunks a step: their running sums within the step,
        plus the carry of the steps before."""
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mc = cols < E
        base = h_ptr + b * n_chunks * E
        carry = tl.zeros([BLOCK], dtype=h_ptr.dtype.element_ty)
        for n0 in range(0, n_chunks, G):
            rows = n0 + tl.arange(0, G)
            m = (rows < n_chunks)[:, None] & mc[None, :]
            offs = rows[:, None].to(tl.int64) * E + cols[None, :]
            x = tl.load(base + offs, mask=m, other=0.0)
            tl.store(base + offs, tl.cumsum(x, 0) + carry[None, :], mask=m)
            carry += tl.sum(x, 0)

    globals().update(triton=triton, tl=tl, _tile=_tile, _inv_norm=_inv_norm, _mm=_mm, _mm_state=_mm_state,
                     _suffix=_suffix, _chunk_sum=_chunk_sum, _state=_state, _store_unit_grad=_store_unit_grad)
    return chunk_sums, forward_out, backward, chunk_prefix


def _block(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def _warps(bk: int, bv: int, backward: bool = False, split: bool = False) -> int:
    """Warps per program: the backward holds twice the tiles of the forward (as one launch; one
    launch per gradient, ``split``, at head dims up to 64 holds one prefix tile, at 4 warps)."""
    if backward and split and max(bk, bv) <= SPLIT_HEAD_DIM:
        return 4
    return 8 if backward or bk * bv > 64 * 64 else 4


def _chunk(bk: int, bv: int) -> int:
    """Steps per chunk: :data:`CHUNK`, halved for head dims past 64 (the backward's tiles would
    not fit in shared memory)."""
    return CHUNK if max(bk, bv) <= 64 else max(16, CHUNK // 2)


BACKWARD_ENV = "MEMNETS_ATTENTION_BACKWARD"


def _parts(bk: int, bv: int) -> tuple[tuple[bool, bool, bool], ...]:
    """The backward's launches, each ``(dq, dk, dv)``: which gradients it writes. One for head dims
    up to :data:`SPLIT_HEAD_DIM`; past it one each, so that a program holds one ``[dk, dv]``
    prefix tile and one gradient tile, where one program holding all would spill registers
    (``python -m memnets.bench.compile_check``). ``MEMNETS_ATTENTION_BACKWARD=split`` takes one
    launch per gradient at every head dim (at 64, bf16: 4 warps and at most 188 registers a
    program, where the single launch takes 8 warps and 238, one program per SM; which is faster
    is for ``make gpu-check`` to say); ``fused`` or unset: as above."""
    env = os.environ.get(BACKWARD_ENV, "").strip()
    if env not in ("", "fused", "split"):
        raise ValueError(f"{BACKWARD_ENV} expected 'fused' or 'split', got {env!r}")
    if max(bk, bv) <= SPLIT_HEAD_DIM and env != "split":
        return ((True, True, True),)
    return (True, False, False), (False, True, False), (False, False, True)


def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernels take these ``[..., L, dk]``, ``[..., S, dk]``, ``[..., S, dv]`` inputs:
    one floating dtype of :data:`DTYPES`, head dims up to :data:`MAX_HEAD_DIM`, at least one step."""
    return (query.dtype in DTYPES and key.dtype == query.dtype and value.dtype == query.dtype
            and query.dim() >= 2 and key.dim() == query.dim() and value.dim() == query.dim()
            and 0 < query.shape[-1] <= MAX_HEAD_DIM and 0 < value.shape[-1] <= MAX_HEAD_DIM
            and query.numel() > 0 and key.numel() > 0 and value.numel() > 0)


def fast_on_cuda(query: torch.Tensor, value: torch.Tensor) -> bool:
    """Where ``nam_attention(impl="auto")`` takes the kernels on CUDA: bfloat16/float16 inputs with
    head dims up to :data:`FAST_HEAD_DIM`. Their exact float32 products (``ieee``, and even TF32x3)
    spill registers in the backward on sm_90, by the compile check. Past 64 (chunks of 32, the
    backward one launch per gradient) they compile without spills but are not yet timed against
    fla's kernel there, so ``auto`` keeps fla (causal) or the PyTorch path."""
    return query.dtype in HALF and query.shape[-1] <= FAST_HEAD_DIM and value.shape[-1] <= FAST_HEAD_DIM


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., R, d]`` as ``[N, R, d]`` with unit stride along ``d`` (a view where possible)."""
    x = x.reshape(-1, x.shape[-2], x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            raise ValueError(f"nam_attention (Triton): `{name}` expected a tensor [..., length, dim]")
        if t.dtype not in DTYPES:
            raise TypeError(f"nam_attention (Triton): `{name}` expected one of {[str(d) for d in DTYPES]}, "
                            f"got {t.dtype}")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or len({q.device, k.device, v.device}) != 1:
        raise TypeError("nam_attention (Triton): query, key and value must share one dtype and one device")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"nam_attention (Triton): expected query [..., L, dk], key [..., S, dk], value [..., S, dv], "
                         f"got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if not (0 < q.shape[-1] <= MAX_HEAD_DIM and 0 < v.shape[-1] <= MAX_HEAD_DIM):
        raise ValueError(f"nam_attention (Triton): head dims dk, dv expected in 1..{MAX_HEAD_DIM}, "
                         f"got dk={q.shape[-1]}, dv={v.shape[-1]}")
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError(f"nam_attention (Triton): expected non-empty inputs, got {list(q.shape)}, {list(k.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"nam_attention (Triton): causal attention expects L == S, got L={q.shape[-2]}, "
                         f"S={k.shape[-2]}")


def _sums(x, y, *, norm: bool, scale: float, eps: float, causal: bool, C: int, bx: int, by: int):
    """Chunk sums ``(scale·μ(x_n))ᵀ y_n`` and their prefixes (causal: ``[N, chunks, bx, by]``), or
    their total (``[N, bx, by]``: each program sums a group of chunks, :func:`_per`, and the
    groups' partial sums are added), in float32 (float64 for float64 inputs)."""
    chunk_sums, _, _, _ = kernels()
    N, R, _ = x.shape
    nc = -(-R // C)
    per = 1 if causal else _per(N, nc)
    G = -(-nc // per)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.new_empty(N, G, bx, by, dtype=acc)
    chunk_sums[(G * N,)](x, y, h, nc, G, per, R, x.shape[-1], y.shape[-1], x.stride(0), x.stride(1), y.stride(0),
                         y.stride(1), scale, eps, C=C, BX=bx, BY=by, NORM=norm, ONE=per == 1, **_meta(x.dtype),
                         num_warps=_warps(bx, by))
    return chunk_prefix_(h) if causal else h.sum(1)


def _per(N: int, n_chunks: int) -> int:
    """Chunks per program of the non-causal sums: some :data:`SUM_PROGRAMS` programs in all, so
    that the partial sums written are at most that many ``[dk, dv]`` blocks (16 MB at d = 64)
    however long and many the sequences, not one per chunk (64 MB at S = 32K, H = 8; 1 GB at
    B = 8, H = 16)."""
    return max(1, -(-N * n_chunks // SUM_PROGRAMS))


def chunk_prefix_(h: torch.Tensor) -> torch.Tensor:
    """``h [N, chunks, ...]`` (contiguous, float32/float64) replaced by its inclusive prefix sums
    over the chunks, in place by the ``chunk_prefix`` kernel; returns ``h``."""
    _, _, _, chunk_prefix = kernels()
    N, nc = h.shape[:2]
    E = h[0, 0].numel()
    chunk_prefix[(N, -(-E // PREFIX_BLOCK))](h, nc, E, G=PREFIX_ROWS, BLOCK=PREFIX_BLOCK, num_warps=4)
    return h


def _modes(dtype: torch.dtype):
    """``(HALF_IN, ACC, IN)`` of the kernels for inputs of ``dtype``: whether they take the
    half-precision branch, the accumulation type and the inputs' Triton type."""
    import triton.language as tl

    IN = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
          torch.float64: tl.float64}[dtype]
    return dtype in HALF, tl.float64 if dtype == torch.float64 else tl.float32, IN


def _meta(dtype: torch.dtype) -> dict:
    half, acc, IN = _modes(dtype)
    return {"HALF_IN": half, "ACC": acc, "IN": IN}


class NAMAttentionTriton(torch.autograd.Function):
    """``(q [N, L, dk], k [N, S, dk], v [N, S, dv], scale, eps, causal) -> o [N, L, dv]`` on
    the kernels of the module docstring. Every buffer it writes is its own."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, eps: float, causal: bool):
        _, fwd, _, _ = kernels()
        N, L, dk = q.shape
        S, dv = k.shape[1], v.shape[2]
        BK, BV = _block(dk), _block(dv)
        C = _chunk(BK, BV)
        P = _sums(k, v, norm=True, scale=1.0, eps=eps, causal=causal, C=C, bx=BK, by=BV)
        o = q.new_empty(N, L, dv)
        nc = -(-L // C)
        fwd[(nc * N,)](q, k, v, P, o, nc, L, S, dk, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                       v.stride(0), v.stride(1), P.stride(0), scale, eps, C=C, BK=BK, BV=BV, CAUSAL=causal,
                       **_meta(q.dtype), num_warps=_warps(BK, BV))
        ctx.save_for_backward(q, k, v, P)
        ctx.scale, ctx.eps, ctx.causal = scale, eps, causal
        return o

    @staticmethod
    def backward(ctx, do):
        _, _, bwd, _ = kernels()
        q, k, v, P = ctx.saved_tensors
        N, L, dk = q.shape
        S, dv = k.shape[1], v.shape[2]
        BK, BV = _block(dk), _block(dv)
        C = _chunk(BK, BV)
        do = do.contiguous()
        G = _sums(q, do, norm=True, scale=ctx.scale, eps=ctx.eps, causal=ctx.causal, C=C, bx=BK, by=BV)
        dq, dk_, dv_ = (t.new_empty(t.shape) for t in (q, k, v))  # contiguous, whatever the inputs' strides
        nc = -(-max(L, S) // C)
        parts = _parts(BK, BV)
        warps = _warps(BK, BV, backward=True, split=len(parts) > 1)
        for DQ, DK, DV in parts:
            bwd[(nc * N,)](q, k, v, do, P, G, dq, dk_, dv_, nc, L, S, dk, dv, q.stride(0), q.stride(1),
                           k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0), do.stride(1),
                           P.stride(0), G.stride(0), G.shape[1] if ctx.causal else 1, ctx.scale, ctx.eps, C=C,
                           BK=BK, BV=BV, CAUSAL=ctx.causal, DQ=DQ, DK=DK, DV=DV, **_meta(q.dtype),
                           num_warps=warps)
        return dq, dk_, dv_, None, None, None


def nam_attention_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, causal: bool,
                         scale: float | None = None, eps: float = 1e-6) -> torch.Tensor:
    """``scale · μ(Q) μ(K)ᵀ V`` (causal: lower-triangular) on the Triton kernels of this module.

    ``query [..., L, dk]``, ``key [..., S, dk]``, ``value [..., S, dv]`` (causal: ``L == S``), one
    dtype of :data:`DTYPES`, head dims up to :data:`MAX_HEAD_DIM`; returns ``[..., L, dv]``."""
    _check(query, key, value, causal)
    lead = query.shape[:-2]
    o = NAMAttentionTriton.apply(_rows(query), _rows(key), _rows(value), 1.0 if scale is None else float(scale),
                                 float(eps), bool(causal))
    return o.reshape(*lead, query.shape[-2], value.shape[-1])
