"""The fused NAM-TM on CUDA: float64 values and gradients equal to the CPU per-step
reference, and a bf16-autocast training step (the `memnets train` default on CUDA) that runs
and gives finite gradients close to float32. Skipped without CUDA (reason printed)."""
from __future__ import annotations

import copy

import pytest
import torch

from memnets.memories.nam_tm import NAMTuringMachine

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="CUDA is not available on this machine")
DT = torch.float64


@pytest.mark.parametrize("kw", [{}, {"normalize_heads": True, "key_tape_mode": "transposed", "separate_erase": True},
                                {"actions": ("LEFT", "NOOP", "RIGHT"), "num_layers": 2}])
def test_fused_on_cuda_matches_cpu_reference(kw):
    torch.manual_seed(0)
    cpu = NAMTuringMachine(6, 8, num_tapes=2, tape_length=5, impl="reference", **kw).double()
    gpu = copy.deepcopy(cpu).cuda()
    gpu.impl = "fused"
    x = torch.randn(3, 9, 6, dtype=DT)
    xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
    yc, sc = cpu(xc)
    w = torch.randn_like(yc)
    (yc * w).sum().backward()
    with torch.backends.cudnn.flags(enabled=False):
        yg, sg = gpu(xg)
        (yg * w.cuda()).sum().backward()
    torch.testing.assert_close(yg.detach().cpu(), yc.detach(), rtol=1e-9, atol=1e-10)
    for a, b in zip(sg, sc):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-9, atol=1e-10)
    for (name, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        torch.testing.assert_close(pg.grad.cpu(), pc.grad, rtol=1e-8, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


def test_fused_bf16_autocast_step_on_cuda():
    torch.manual_seed(0)
    m = NAMTuringMachine(16, 64, num_tapes=4, tape_length=16, normalize_heads=True).cuda()
    x = torch.randn(8, 30, 16, device="cuda")
    g32 = torch.autograd.grad(m(x)[0].square().mean(), list(m.parameters()))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)[0]
    g16 = torch.autograd.grad(y.float().square().mean(), list(m.parameters()))
    for a, b in zip(g16, g32):
        assert torch.isfinite(a).all()
        assert (a - b).norm() <= 0.08 * b.norm() + 1e-6
