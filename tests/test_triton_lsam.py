"""LSAM's Triton kernels (memnets.ops.gpu.lsam) against the reference recurrence, values and
every gradient, float32 and float64: on a GPU when there is one, else on CPU tensors through
Triton's interpreter (``TRITON_INTERPRET=1``, the ``triton_interpreter`` fixture of conftest.py).
Skipped, with the reason, only where triton or numpy is not installed
(``pip install 'memnets[gpu]' numpy``)."""
from __future__ import annotations

import pytest
import torch
from helpers import triton_marks

CUDA = torch.cuda.is_available()
pytestmark = triton_marks()

from memnets.memories.lsam import LSAM  # noqa: E402
from memnets.ops import gpu  # noqa: E402
from memnets.ops.gpu import lsam as tl_lsam  # noqa: E402
from memnets.ops.lsam import lsam_scan, lsam_scan_reference  # noqa: E402
from memnets.ops.lsam.recurrence import LSAMRecurrence  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _inputs(T, B, F, D, H, dirs, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    G = 3 * (D // dirs) + 2 * (H // dirs)

    def r(*s, scale=1.0):
        return (scale * torch.randn(*s, generator=g, dtype=torch.float64)).to(DEV, dtype).requires_grad_()

    d = D // H
    return dict(x=r(T, B, F), weight_ih=r(dirs, G, F, scale=0.5), weight_hh=r(dirs, G, D // dirs, scale=0.5),
                bias=r(dirs, G, scale=0.5), memory=r(dirs, B, H // dirs, d, d, scale=0.3),
                h=r(dirs, B, D // dirs, scale=0.5))


def _run(fn, inp, H, dirs):
    out, M, h = fn(inp["x"], inp["weight_ih"], inp["weight_hh"], inp["bias"], inp["memory"], inp["h"], H // dirs)
    g = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t)).sum() for t in (out, M, h))
    grads = torch.autograd.grad(loss, list(inp.values()))
    return [out, M, h], grads


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-4)])
@pytest.mark.parametrize("dirs,D,H", [(1, 8, 2), (2, 12, 4), (1, 6, 2)])  # d = 4, 3 (not a power of 2), 3
def test_triton_lsam_scan_matches_the_reference(dirs, D, H, dtype, tol, monkeypatch):
    monkeypatch.setattr(tl_lsam, "SEGMENT", 3)  # several exact copies in 7 steps
    inp = _inputs(7, 2, 5, D, H, dirs, dtype)
    with gpu.cuda_path():
        assert gpu.use_triton(inp["x"])
        got, ggot = _run(lsam_scan, inp, H, dirs)
    ref, gref = _run(lsam_scan_reference, inp, H, dirs)
    for a, b in zip(got + list(ggot), ref + list(gref)):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_triton_lsam_recurrence_zero_keys_match_the_cpu_recurrence():
    """Pre-activations where one step's q and k blocks are zero (μ's eps branch): values and
    gradients equal to the CPU fused recurrence's, float64."""
    T, dirs, B, Hp, d = 4, 2, 1, 2, 3
    G, Dp = Hp * (3 * d + 2), Hp * d
    g = torch.Generator().manual_seed(3)
    gx = torch.randn(T, dirs, B, G, generator=g, dtype=torch.float64)
    gx.view(T, dirs * B * Hp, 3 * d + 2)[1, 0, : 2 * d] = 0.0
    w = 0.0 * torch.randn(dirs, G, Dp, generator=g, dtype=torch.float64)  # h_{t-1} adds nothing: q, k stay 0
    M0 = 0.3 * torch.randn(dirs * B * Hp, d, d, generator=g, dtype=torch.float64)
    h0 = torch.randn(dirs, B, Dp, generator=g, dtype=torch.float64)
    args = [t.to(DEV).requires_grad_() for t in (gx, w, M0, h0)]
    cargs = [a.detach().cpu().requires_grad_() for a in args]
    got = tl_lsam.LSAMRecurrenceTriton.apply(*args)
    ref = LSAMRecurrence.apply(*cargs, False)
    co = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in ref]
    ggot = torch.autograd.grad(sum((a * c.to(a)).sum() for a, c in zip(got, co)), args)
    gref = torch.autograd.grad(sum((a * c).sum() for a, c in zip(ref, co)), cargs)
    # near μ's eps branch the gradients reach 1e6 and carry eps itself: a kernel given eps as a
    # float argument (float32: 1e-6 off by 2.5e-9 of itself) fails here
    for a, b in zip(list(got) + list(ggot), list(ref) + list(gref)):
        torch.testing.assert_close(a.cpu(), b, atol=1e-12, rtol=1e-12)


def test_triton_lsam_recurrence_gradcheck(monkeypatch):
    """torch.autograd.gradcheck of the autograd Function, float64, across an exact copy."""
    monkeypatch.setattr(tl_lsam, "SEGMENT", 2)
    T, dirs, B, Hp, d = 3, 1, 1, 1, 2
    G, Dp = Hp * (3 * d + 2), Hp * d
    g = torch.Generator().manual_seed(4)
    args = [(s * torch.randn(*shape, generator=g, dtype=torch.float64)).to(DEV).requires_grad_()
            for s, shape in ((1.0, (T, dirs, B, G)), (0.3, (dirs, G, Dp)), (0.3, (B * Hp, d, d)), (1.0, (dirs, B, Dp)))]
    assert torch.autograd.gradcheck(lambda *a: tl_lsam.LSAMRecurrenceTriton.apply(*a), args, eps=1e-6, atol=1e-7)


def test_triton_lsam_checks_its_arguments_and_leaves_inputs_alone():
    T, dirs, B, Hp, d = 3, 1, 2, 2, 4
    G, Dp = Hp * (3 * d + 2), Hp * d
    gx, w = torch.randn(T, dirs, B, G, device=DEV), torch.randn(dirs, G, Dp, device=DEV)
    M0, h0 = torch.randn(dirs * B * Hp, d, d, device=DEV), torch.randn(dirs, B, Dp, device=DEV)
    before = [t.clone() for t in (gx, w, M0, h0)]
    tl_lsam.LSAMRecurrenceTriton.apply(gx, w, M0, h0)
    assert all(torch.equal(a, b) for a, b in zip((gx, w, M0, h0), before))
    with pytest.raises(ValueError, match="inconsistent shapes"):
        tl_lsam.LSAMRecurrenceTriton.apply(gx, w, M0[:-1], h0)
    with pytest.raises(TypeError, match="float32 or float64"):
        tl_lsam.LSAMRecurrenceTriton.apply(gx, w.double(), M0, h0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lsam_module_on_the_cuda_path_matches_its_cpu_path(bidirectional):
    """The whole LSAM layer stack: its CUDA code path (Triton kernels) equals the CPU fused path."""
    torch.manual_seed(0)
    m = LSAM(5, 8, num_heads=2, num_layers=2, bidirectional=bidirectional).double()
    x = torch.randn(2, 6, 5, dtype=torch.float64)
    y_ref, _ = m(x)
    g_ref = torch.autograd.grad(y_ref.square().sum(), list(m.parameters()))
    md, xd = m.to(DEV), x.to(DEV)
    with gpu.cuda_path():
        y, _ = md(xd)
        gg = torch.autograd.grad(y.square().sum(), list(md.parameters()))
    torch.testing.assert_close(y.cpu(), y_ref, atol=1e-10, rtol=1e-10)
    for a, b in zip(gg, g_ref):
        torch.testing.assert_close(a.cpu(), b, atol=1e-10, rtol=1e-10)
