"""The NTM's Triton kernels (memnets.ops.gpu.ntm) against its step-by-step PyTorch path, values
and every gradient, float64 and float32: on a GPU when there is one, else on CPU tensors through
Triton's interpreter (``TRITON_INTERPRET=1``, the ``triton_interpreter`` fixture of conftest.py). Skipped,
with the reason, only where triton or numpy is not installed (``pip install 'memnets[gpu]' numpy``)."""
from __future__ import annotations

import pytest
import torch
from helpers import counting_kernels, triton_marks

CUDA = torch.cuda.is_available()
pytestmark = triton_marks()

from memnets.memories.ntm import NTM  # noqa: E402
from memnets.ops import gpu  # noqa: E402
from memnets.ops.gpu import ntm as tl_ntm  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _run(m, x, state, cuda_path):
    params = list(m.parameters())
    with gpu.cuda_path() if cuda_path else torch.enable_grad():
        if cuda_path:
            assert gpu.use_triton(x)
        y, st = m(x, state)
    g = torch.Generator().manual_seed(1)
    outs = [y, *st]
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o)).sum() for o in outs if o.numel())
    inputs = [x] + params + ([t for t in state if t.requires_grad] if state is not None else [])
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return outs, grads


CASES = [dict(), dict(read_heads=2, write_heads=2, shift_range=2), dict(controller="mlp")]


@pytest.mark.parametrize("loop", ["kernel", "steps"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)], ids=["f64", "f32"])
@pytest.mark.parametrize("kw", CASES, ids=["lstm", "2r2w-shift2", "mlp"])
def test_triton_ntm_matches_the_pytorch_path(kw, dtype, tol, loop, monkeypatch):
    """The time loop in one kernel each way, and one launch per step (``MEMNETS_TIME_LOOP``)."""
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    torch.manual_seed(0)
    m = NTM(3, 4, memory_slots=7, word_size=5, controller_size=6, **kw).to(DEV, dtype)
    with torch.no_grad():  # away from the focused start, so that every head's gradient is exercised
        m.read_w0.normal_()
        m.write_w0.normal_()
    x = torch.randn(2, 5, 3, dtype=dtype, device=DEV, requires_grad=True)
    got, ggot = _run(m, x, None, True)
    ref, gref = _run(m, x, None, False)
    for a, b in zip(got + list(ggot), ref + list(gref)):
        if b is None:
            assert a is None or not a.abs().sum()
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_triton_ntm_continues_from_a_given_state():
    """A state from an earlier piece (memory, weightings, reads, h, c) with gradients into it."""
    torch.manual_seed(1)
    m = NTM(3, 4, memory_slots=6, word_size=4, controller_size=5).to(DEV, torch.float64)
    x0 = torch.randn(2, 3, 3, dtype=torch.float64, device=DEV)
    _, st = m(x0)
    st = type(st)(*(t.detach().clone().requires_grad_() for t in st))
    x = torch.randn(2, 4, 3, dtype=torch.float64, device=DEV, requires_grad=True)
    got, ggot = _run(m, x, st, True)
    ref, gref = _run(m, x, st, False)
    for a, b in zip(got + list(ggot), ref + list(gref)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_triton_ntm_recurrence_gradcheck():
    """torch.autograd.gradcheck of the autograd Function, float64, a very small NTM: from a given
    state, and from the learned start spread over the batch inside (``memory_init``)."""
    torch.manual_seed(2)
    B, T, F, N, W, R, Hw, C, S = 2, 2, 2, 3, 2, 1, 1, 2, 3
    G, K, P = 4 * C, R * W + C, (R + Hw) * (W + 3 + S) + 2 * Hw * W

    def r(*s, scale=0.5):
        return (scale * torch.randn(*s, dtype=torch.float64)).to(DEV).requires_grad_()

    # the weights as constants (their gradients are held to the PyTorch path's above): gradcheck
    # costs two interpreted forward passes per input element
    weights = (r(B, T, F), r(G, F).detach(), r(G).detach(), r(G, K).detach(), r(P, C).detach(), r(P).detach())
    state = (r(B, N, W), torch.softmax(r(B, R, N), -1).detach().requires_grad_(),
             torch.softmax(r(B, Hw, N), -1).detach().requires_grad_(), r(B, R, W), r(B, C), r(B, C))
    assert torch.autograd.gradcheck(lambda *a: tl_ntm.NTMScanTriton.apply(*a, S, True), weights + state, eps=1e-6,
                                    atol=1e-6)
    learned = (r(R, N), r(Hw, N), r(R, W), r(C), r(C))
    assert torch.autograd.gradcheck(lambda *a: tl_ntm.NTMScanTriton.apply(*a[:6], None, *a[6:], S, True, 1e-3),
                                    weights + learned, eps=1e-6, atol=1e-6)


def test_triton_ntm_checks_its_arguments():
    B, T, F, N, W, R, Hw, C, S = 1, 2, 2, 4, 3, 1, 1, 2, 3
    G, K, P = 4 * C, R * W + C, (R + Hw) * (W + 3 + S) + 2 * Hw * W
    z = torch.zeros
    args = [z(B, T, F), z(G, F), z(G), z(G, K), z(P, C), z(P), z(B, N, W), z(B, R, N), z(B, Hw, N), z(B, R, W),
            z(B, C), z(B, C)]
    args = [a.to(DEV) for a in args]
    tl_ntm.NTMScanTriton.apply(*args, S, True)
    bad = list(args)
    bad[4] = z(P + 1, C, device=DEV)
    with pytest.raises(ValueError, match="`w_h` expected shape"):
        tl_ntm.NTMScanTriton.apply(*bad, S, True)
    bad = list(args)
    bad[6] = bad[6].double()
    with pytest.raises(TypeError, match="`M0` expected"):
        tl_ntm.NTMScanTriton.apply(*bad, S, True)
    bad = list(args)
    bad[1] = z(G, F + 1, device=DEV)
    with pytest.raises(ValueError, match="`w_x` expected shape"):
        tl_ntm.NTMScanTriton.apply(*bad, S, True)
    learned = [z(R, N), z(Hw, N + 1), z(R, W), z(C), z(C)]  # write logits over one slot too many
    with pytest.raises(ValueError, match="`ww0` expected shape"):
        tl_ntm.NTMScanTriton.apply(*args[:6], None, *[t.to(DEV) for t in learned], S, True, 1e-6)
    P2 = (R + Hw) * (W + 3 + 2) + 2 * Hw * W  # an even shift count
    with pytest.raises(ValueError, match="odd shift count"):
        tl_ntm.NTMScanTriton.apply(*args[:4], z(P2, C, device=DEV), z(P2, device=DEV), *args[6:], 2, True)


@pytest.mark.parametrize("loop", ["auto", "steps"])
def test_triton_ntm_time_loop_in_one_kernel_or_one_launch_per_step(loop, monkeypatch):
    """One launch each way for the whole loop where W_rh and the memory are small, T launches
    each way with ``MEMNETS_TIME_LOOP=steps``. The gpu-check NTM (W_rh 400 x 120, memory
    128 x 20) keeps the per-step form unless asked (its one-kernel backward spills registers)."""
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    assert tl_ntm.time_loop_in_kernel(4 * 64, 20 + 64, 16, 20) == (loop == "auto")
    assert not tl_ntm.time_loop_in_kernel(4 * 100, 20 + 100, 128, 20)
    monkeypatch.setenv("MEMNETS_TIME_LOOP", "kernel")
    assert tl_ntm.time_loop_in_kernel(4 * 100, 20 + 100, 128, 20)
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")  # on CUDA: every launch issued, none captured
    torch.manual_seed(3)
    m = NTM(3, 4, memory_slots=5, word_size=3, controller_size=4).to(DEV)
    for T in (2, 4):
        counts = counting_kernels(tl_ntm, monkeypatch)
        with gpu.cuda_path():
            y, _ = m(torch.randn(2, T, 3, device=DEV))
            y.sum().backward()
        want = {"forward_step": T, "backward_step": T} if loop == "steps" else {"forward_seq": 1, "backward_seq": 1}
        assert dict(counts) == want
        monkeypatch.undo()
        monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
        monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")


def test_triton_ntm_warps_follow_the_memory_tile_or_the_environment(monkeypatch):
    monkeypatch.delenv(tl_ntm.WARPS_ENV, raising=False)
    assert tl_ntm._warps(16, 16) == 2 and tl_ntm._warps(32, 32) == 4 and tl_ntm._warps(128, 32) == 16
    monkeypatch.setenv(tl_ntm.WARPS_ENV, "16")
    assert tl_ntm._warps(16, 16) == 16
    monkeypatch.setenv(tl_ntm.WARPS_ENV, "3")
    with pytest.raises(ValueError, match="MEMNETS_NTM_WARPS expected one of"):
        tl_ntm._warps(16, 16)


def test_triton_ntm_gradients_with_the_final_state_left_out_of_the_loss():
    """The final state out of the loss (its gradients reach backward as None and count as zeros)
    and only part of it in: the same gradients as the PyTorch path, float64."""
    torch.manual_seed(3)
    m = NTM(3, 4, memory_slots=6, word_size=4, controller_size=5).to(DEV, torch.float64)
    x = torch.randn(2, 4, 3, dtype=torch.float64, device=DEV, requires_grad=True)
    for pick in ([0], [0, 1, 5]):  # y alone; y, the memory and c
        grads = []
        for cuda_path in (True, False):
            with gpu.cuda_path() if cuda_path else torch.enable_grad():
                y, st = m(x)
            outs = [y, *st]
            assert not cuda_path or all(o._base is None for o in st[:3])  # no views of per-step buffers
            grads.append(torch.autograd.grad(sum(outs[i].sum() for i in pick), [x, *m.parameters()],
                                             allow_unused=True))
        for a, b in zip(*grads):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
