"""Causal ``nam_attention`` through flash-linear-attention's chunked kernel
(:mod:`memnets.ops.gpu.attention`).

On the CPU the mapping (layout, scale, no normaliser) is checked with fla's own step-by-step
reference of the same function standing in for its chunked kernel, which needs a GPU; on a GPU
the chunked kernel itself is held to the PyTorch path, and a NaN at step t must leave every
earlier output finite. Needs the ``gpu`` extra (``make test-triton``)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from memnets.ops import nam_attention
from memnets.ops.gpu import attention as gpu_attention

MISSING = [m for m in ("fla", "triton", "einops") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.interpret, pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} "
                                                        "(pip install 'memnets[gpu]' numpy)")]


def _grads(fn, q, k, v):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    g = torch.Generator().manual_seed(2)
    co = torch.randn(o.shape, generator=g, dtype=torch.float32).to(o)
    return [o, *torch.autograd.grad((o * co).sum(), (q, k, v))]


@pytest.mark.parametrize("scale", [None, 0.5])
def test_fla_mapping_computes_causal_nam_attention(monkeypatch, scale):
    from fla.ops.linear_attn.naive import naive_recurrent_linear_attn

    torch.manual_seed(0)
    B, H, S, dk, dv = 2, 3, 37, 8, 5
    q, k, v = torch.randn(B, H, S, dk), torch.randn(B, H, S, dk), torch.randn(B, H, S, dv)
    ref = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, scale=scale), q, k, v)
    calls = []

    def kernel(*a, **kw):
        calls.append(kw)
        return naive_recurrent_linear_attn(*a, **kw)

    monkeypatch.setattr(gpu_attention, "use_fla_attention", lambda *a: True)
    monkeypatch.setattr(gpu_attention, "fla_linear_attention", lambda: kernel)
    got = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, scale=scale, impl="fla"), q, k, v)
    assert calls and calls[0]["normalize"] is False and calls[0]["scale"] == 1.0
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fla_attention_is_used_only_where_it_computes_the_same():
    x = torch.randn(1, 2, 8, 4, dtype=torch.bfloat16)
    assert not gpu_attention.use_fla_attention(x, x, x)  # CPU tensors: never
    if torch.cuda.is_available():
        xc = x.cuda()
        assert gpu_attention.use_fla_attention(xc, xc, xc)
        assert not gpu_attention.use_fla_attention(xc.float(), xc.float(), xc.float())  # float32: PyTorch path
        big = torch.randn(1, 2, 8, 512, device="cuda", dtype=torch.bfloat16)
        assert not gpu_attention.use_fla_attention(big, big, big)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's chunked kernel needs CUDA; its mapping is "
                    "checked on the CPU by test_fla_mapping_computes_causal_nam_attention")
def test_fla_chunked_kernel_on_cuda_matches_the_pytorch_path_and_keeps_nan_local():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda") for _ in range(3))
    ref = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, impl="torch"), q, k, v)
    got = _grads(lambda a, b, c: nam_attention(a, b, c, is_causal=True, impl="fla"), *(t.bfloat16() for t in (q, k, v)))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b, atol=0.1, rtol=0.05)
    k2 = k.bfloat16().clone()
    k2[:, :, 200] = float("nan")
    o = nam_attention(q.bfloat16(), k2, v.bfloat16(), is_causal=True, impl="fla")
    assert torch.isfinite(o[:, :, :200]).all() and not torch.isfinite(o[:, :, 200:]).all()
