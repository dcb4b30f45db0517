"""``nam_attention``'s Triton kernels (memnets.ops.gpu.causal_attention) against the quadratic
reference, values and every gradient, float32 and float64, causal and not: on a GPU when there
is one, else on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``, the
``triton_interpreter`` fixture). The interpreter multiplies bfloat16 tiles wrongly, so on the
CPU the half-precision path of the kernels (casts, TF32 products) runs in float16 and on float32
tiles; on a GPU bfloat16 itself is held to the float32 result. Skipped, with the reason, only where triton or
numpy is not installed (``pip install 'memnets[gpu]' numpy``)."""
from __future__ import annotations

import pytest
import torch
from helpers import triton_marks

CUDA = torch.cuda.is_available()
pytestmark = triton_marks()

from memnets.ops import gpu, nam_attention  # noqa: E402
from memnets.ops.attention import nam_attention_quadratic, resolve_attention_impl  # noqa: E402
from memnets.ops.gpu import causal_attention as ca  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _inputs(shape_q, shape_k, dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g, dtype=torch.float64)
    k = torch.randn(*shape_k, generator=g, dtype=torch.float64)
    v = torch.randn(*shape_k[:-1], dv, generator=g, dtype=torch.float64)
    return [t.to(DEV, dtype) for t in (q, k, v)]


def _grads(fn, q, k, v):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    co = torch.randn(o.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(o)
    return [o, *torch.autograd.grad((o * co).sum(), (q, k, v))]


def _close(got, ref, tol):
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        err = ((a - b).abs().max() / b.abs().max().clamp_min(1)).item()
        assert err < tol, f"{name}: relative error {err:.2e}"


CASES = [  # (causal, B, H, L, S, dk, dv): one and several chunks, ragged last chunk, dims not powers of 2
    (True, 2, 3, 150, 150, 8, 5),
    (True, 1, 2, 64, 64, 16, 16),
    (True, 1, 1, 5, 5, 3, 7),
    (False, 2, 2, 70, 150, 8, 5),
    (False, 1, 3, 130, 9, 16, 12),
    (True, 1, 1, 70, 70, 80, 72),  # head dims past 64: chunks of 32, the backward in three launches
    (False, 1, 2, 40, 70, 20, 100),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize("causal,B,H,L,S,dk,dv", CASES)
@pytest.mark.parametrize("scale", [None, 0.5])
def test_triton_nam_attention_matches_the_reference(causal, B, H, L, S, dk, dv, dtype, tol, scale):
    q, k, v = _inputs((B, H, L, dk), (B, H, S, dk), dv, dtype)
    k[0, 0, min(3, S - 1)] = 0  # a zero key: μ keeps it zero (and its gradient takes μ's other branch)
    with gpu.cuda_path():
        # "auto" takes the kernels on the interpreter's CPU tensors; on CUDA only for half inputs
        # (ca.fast_on_cuda), so float32/float64 ask for them by name there
        assert resolve_attention_impl("auto", q, k, v, causal=causal) == ("torch" if CUDA else "triton")
        got = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=causal, scale=scale, impl="triton"), q, k, v)
    ref = _grads(lambda a, b, c: nam_attention_quadratic(a, b, c, is_causal=causal, scale=scale), q, k, v)
    _close(got, ref, tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_prefix_sums_over_many_steps_and_blocks(dtype, monkeypatch):
    """The chunks' prefix sums: the kernel against ``torch.cumsum`` with chunk counts and entry
    counts that are not multiples of its step and block (a carry over several steps, masked
    lanes), then the causal attention with steps of 2 chunks, its backward's prefixes included."""
    _, _, _, prefix = ca.kernels()
    g = torch.Generator().manual_seed(4)
    h = torch.randn(3, 37, 300, generator=g, dtype=torch.float64).to(DEV, dtype)
    want = h.cumsum(1)
    prefix[(3, -(-300 // 128))](h, 37, 300, G=8, BLOCK=128, num_warps=4)
    torch.testing.assert_close(h, want, atol=1e-12 if dtype == torch.float64 else 1e-4, rtol=1e-12 if dtype ==
                               torch.float64 else 1e-5)
    monkeypatch.setattr(ca, "PREFIX_ROWS", 2)
    monkeypatch.setattr(ca, "PREFIX_BLOCK", 16)
    q, k, v = _inputs((2, 3, 330, 8), (2, 3, 330, 8), 5, dtype)  # 6 chunks of 64: 3 steps of 2
    with gpu.cuda_path():
        got = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, impl="triton"), q, k, v)
    ref = _grads(lambda a, b, c: nam_attention_quadratic(a, b, c, is_causal=True), q, k, v)
    _close(got, ref, 1e-10 if dtype == torch.float64 else 5e-5)


@pytest.mark.parametrize("programs", [1, 3, 5])
def test_non_causal_sums_in_groups_of_chunks(programs, monkeypatch):
    """Non-causal, each program of the chunk sums adds a group of chunks (some SUM_PROGRAMS
    programs in all): one group per sequence, and groups of 2 and 1 chunks with a ragged last
    group and chunk, values and every gradient against the reference in float64."""
    monkeypatch.setattr(ca, "CHUNK", 16)
    q, k, v = _inputs((1, 2, 40, 8), (1, 2, 70, 8), 5, torch.float64)  # 3 query chunks, 5 key chunks
    k[0, 1, 33] = 0
    monkeypatch.setattr(ca, "SUM_PROGRAMS", programs)
    assert ca._per(2, 5) == {1: 10, 3: 4, 5: 2}[programs]  # the keys' 5 chunks in groups of 5, 4 + 1, 2 + 2 + 1
    got = _grads(lambda a, b, c: ca.nam_attention_triton(a, b, c, causal=False, scale=0.5), q, k, v)
    ref = _grads(lambda a, b, c: nam_attention_quadratic(a, b, c, is_causal=False, scale=0.5), q, k, v)
    _close(got, ref, 1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_wide_heads_take_one_backward_launch_per_gradient(causal):
    """Head dims up to 64: the backward writes dq, dk and dv in one launch (8 warps); past 64
    (here dv) in one launch each, so no program holds two [dk, dv] prefix tiles; with
    MEMNETS_ATTENTION_BACKWARD=split at every head dim (4 warps up to 64). Each way against the
    reference; a value the variable does not know is refused."""
    from helpers import counting_kernels

    from memnets.ops.gpu import env_var

    for dv, env, launches, warps in ((64, None, 1, 8), (65, None, 3, 8), (64, "split", 3, 4), (65, "fused", 3, 8)):
        q, k, v = _inputs((1, 2, 40, 8), (1, 2, 40, 8), dv, torch.float32)
        with pytest.MonkeyPatch.context() as mp, env_var(ca.BACKWARD_ENV, env):
            counts = counting_kernels(ca, mp, names=("chunk_sums", "forward_out", "backward", "chunk_prefix"))
            got = _grads(lambda a, b, c: ca.nam_attention_triton(a, b, c, causal=causal), q, k, v)
        assert counts["backward"] == launches and counts["forward_out"] == 1, (dv, env, dict(counts))
        assert counts.warps["backward"] == {warps}, (dv, env, counts.warps)
        ref = _grads(lambda a, b, c: nam_attention_quadratic(a, b, c, is_causal=causal), q, k, v)
        _close(got, ref, 2e-5)
    with env_var(ca.BACKWARD_ENV, "three"), pytest.raises(ValueError, match="expected 'fused' or 'split'"):
        _grads(lambda a, b, c: ca.nam_attention_triton(a, b, c, causal=causal), q, k, v)


def test_triton_nam_attention_half_path_on_float32_tiles(monkeypatch):
    """The kernels' half-precision branch (operand casts, TF32 products with the prefixes), on
    float32 tiles where the interpreter runs it; bfloat16 itself on a GPU (next test)."""
    import triton.language as tl

    real = ca._modes
    monkeypatch.setattr(ca, "_modes", lambda dt: (True, tl.float32, tl.float32) if dt == torch.float32 else real(dt))
    for causal, L, S in ((True, 150, 150), (False, 40, 100)):
        q, k, v = _inputs((2, 2, L, 8), (2, 2, S, 8), 6, torch.float32)
        got = _grads(lambda a, b, c: ca.nam_attention_triton(a, b, c, causal=causal), q, k, v)
        ref = _grads(lambda a, b, c: nam_attention_quadratic(a, b, c, is_causal=causal), q, k, v)
        _close(got, ref, 1e-2 if CUDA else 2e-5)


@pytest.mark.parametrize("dtype", [
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        not CUDA, reason="the interpreter multiplies bfloat16 tiles wrongly (their bits taken for numbers); the "
        "half branch runs in float16 on the CPU, and on float32 tiles (test_triton_nam_attention_half_path_on_float32_tiles)")),
    torch.float16])
def test_triton_nam_attention_half_precision(dtype):
    """The kernels in half precision (their products of half tiles, float32 sums) against the
    PyTorch path in float32: on a GPU through ``impl="auto"`` (which takes them there), on the CPU
    (float16) through the interpreter, with the backward as one launch and one per gradient."""
    shape = (2, 4, 300, 64) if CUDA else (1, 2, 150, 64)
    q, k, v = _inputs(shape, shape, 64, torch.float32)
    for causal in (True, False):
        ref = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=causal, impl="torch"), q, k, v)
        half = [t.to(dtype) for t in (q, k, v)]
        for env in ("fused",) if CUDA else ("fused", "split"):
            with gpu.env_var(ca.BACKWARD_ENV, env):
                got = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=causal) if CUDA
                             else ca.nam_attention_triton(a, b, c, causal=causal), *half)
            assert got[0].dtype == dtype
            _close([t.float() for t in got], ref, 3e-2)


@pytest.mark.parametrize("where", ["key", "value"])
def test_a_nan_reaches_no_earlier_output(where):
    """A NaN at step t (in one key, or in one entry of one value) spoils no output before t; a
    NaN value spoils only its own column, as the step-by-step sum does."""
    q, k, v = _inputs((1, 2, 150, 8), (1, 2, 150, 8), 5, torch.float32)
    for t in (3, 64, 70, 149):
        k2, v2 = k.clone(), v.clone()
        (k2 if where == "key" else v2)[0, 1, t, 1] = float("nan")
        with gpu.cuda_path():
            o = nam_attention(q, k2, v2, is_causal=True, impl="triton")
        assert torch.isfinite(o[0, 0]).all() and torch.isfinite(o[0, 1, :t]).all()
        later = o[0, 1, t:] if where == "key" else o[0, 1, t:, 1]
        assert not torch.isfinite(later).any()
        if where == "value":
            assert torch.isfinite(o[0, 1, :, 0]).all()


def test_any_batch_shape_and_strided_inputs():
    """Leading dims of any number, and inputs that are views with other strides (a [B, S, H, D]
    tensor transposed to [B, H, S, D]; a slice of a wider last dim)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 90, 3, 16, generator=g).to(DEV)  # [B, S, H, 2·dk]
    q, k = x[..., :8].transpose(1, 2), x[..., 8:].transpose(1, 2)
    v = torch.randn(2, 3, 90, 4, generator=g).to(DEV)
    with gpu.cuda_path():
        got = nam_attention(q, k, v, is_causal=True, impl="triton")
        got3 = nam_attention(q[0], k[0], v[0], is_causal=True, impl="triton")  # [H, S, D]: one leading dim
    ref = nam_attention_quadratic(q, k, v, is_causal=True)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got3, ref[0], atol=1e-5, rtol=1e-5)


def test_impl_choice_and_refusals():
    q = torch.randn(1, 2, 8, 4)
    # plain CPU tensors: the PyTorch path; asking for the kernels says why not
    assert resolve_attention_impl("auto", q, q, q, causal=True) == "torch"
    with pytest.raises(ValueError, match="impl='triton' cannot run: the Triton kernels run on CUDA"):
        nam_attention(q, q, q, is_causal=True, impl="triton")
    with pytest.raises(ValueError, match="impl='fla' cannot run"):
        nam_attention(q, q, q, impl="fla")
    with pytest.raises(ValueError, match="unknown impl 'cuda'"):
        nam_attention(q, q, q, impl="cuda")
    big = torch.randn(1, 1, 8, ca.MAX_HEAD_DIM + 1)
    if CUDA:  # on CUDA "auto" takes the kernels for bfloat16/float16 with head dims up to 64 only
        qc, qh = q.cuda(), q.cuda().bfloat16()
        assert resolve_attention_impl("auto", qh, qh, qh, causal=False) == "triton"
        assert resolve_attention_impl("auto", qc, qc, qc, causal=False) != "triton"  # float32: exact products spill
        wide = torch.randn(1, 1, 8, ca.FAST_HEAD_DIM + 1, device="cuda", dtype=torch.bfloat16)
        assert resolve_attention_impl("auto", wide, wide, wide, causal=False) == "torch"
        q = qc
    with gpu.cuda_path():
        if not CUDA:
            assert resolve_attention_impl("auto", q, q, q, causal=False) == "triton"
        assert resolve_attention_impl("auto", big, big, big, causal=False) == "torch"  # head dim too large
        off = torch.tensor([0, 3, 8], device=q.device)
        assert resolve_attention_impl("auto", q, q, q, causal=True, packed=True) == "torch"
        torch.testing.assert_close(nam_attention(q, q, q, is_causal=True, cu_seqlens=off),
                                   nam_attention(q, q, q, is_causal=True, cu_seqlens=off, impl="torch"))
        with pytest.raises(ValueError, match="causal=True expects query and key of the same length"):
            nam_attention(q, torch.randn(1, 2, 9, 4).to(q), torch.randn(1, 2, 9, 4).to(q), is_causal=True)


def test_kernel_entry_checks_its_inputs():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(TypeError, match="share one dtype"):
        ca.nam_attention_triton(q, q.double(), q, causal=False)
    with pytest.raises(TypeError, match="`query` expected one of"):
        ca.nam_attention_triton(q.int(), q, q, causal=False)
    with pytest.raises(ValueError, match="causal attention expects L == S"):
        ca.nam_attention_triton(q, torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), causal=True)
    with pytest.raises(ValueError, match="head dims dk, dv expected in 1..128"):
        w = torch.randn(1, 1, 4, 130)
        ca.nam_attention_triton(w, w, w, causal=False)
    with pytest.raises(ValueError, match="expected query"):
        ca.nam_attention_triton(q, torch.randn(1, 3, 8, 4), q, causal=False)


def test_inputs_are_left_untouched():
    q, k, v = _inputs((1, 2, 100, 8), (1, 2, 100, 8), 8, torch.float32)
    before = [t.clone() for t in (q, k, v)]
    with gpu.cuda_path():
        _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, impl="triton"), q, k, v)
    for a, b in zip((q, k, v), before):
        assert torch.equal(a, b)


def test_gradcheck_float64(monkeypatch):
    monkeypatch.setattr(ca, "CHUNK", 16)  # two chunks and a ragged one at a size gradcheck affords
    q, k, v = _inputs((1, 1, 20, 3), (1, 1, 20, 3), 2, torch.float64)
    for causal in (True, False):
        assert torch.autograd.gradcheck(
            lambda a, b, c: ca.nam_attention_triton(a, b, c, causal=causal, scale=0.7),
            tuple(t.requires_grad_() for t in (q, k, v)), eps=1e-6, atol=1e-6)
