"""The fused NAM-TM on CUDA: float64 values and gradients equal to the CPU per-step
reference, and a bf16-autocast training step (the `memnets train` default on CUDA) that runs
and gives finite gradients close to float32. Each test runs on CUDA where there is one
(skipped elsewhere, reason printed) and always on the CPU down the CUDA code path (the
``cuda_side`` fixture of conftest.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from memnets.memories.nam_tm import NAMTuringMachine

DT = torch.float64


@pytest.mark.parametrize("kw", [{}, {"normalize_heads": True, "key_tape_mode": "transposed", "separate_erase": True},
                                {"actions": ("LEFT", "NOOP", "RIGHT"), "num_layers": 2}])
def test_fused_on_cuda_matches_cpu_reference(kw, cuda_side):
    dev = cuda_side.device
    torch.manual_seed(0)
    cpu = NAMTuringMachine(6, 8, num_tapes=2, tape_length=5, impl="reference", **kw).double()
    gpu = copy.deepcopy(cpu).to(dev)
    gpu.impl = "fused"
    x = torch.randn(3, 9, 6, dtype=DT)
    xc, xg = x.clone().requires_grad_(), x.clone().to(dev).requires_grad_()
    yc, sc = cpu(xc)
    w = torch.randn_like(yc)
    (yc * w).sum().backward()
    with cuda_side.path(), torch.backends.cudnn.flags(enabled=False):
        yg, sg = gpu(xg)
        (yg * w.to(dev)).sum().backward()
    torch.testing.assert_close(yg.detach().cpu(), yc.detach(), rtol=1e-9, atol=1e-10)
    for a, b in zip(sg, sc):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-9, atol=1e-10)
    for (name, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        torch.testing.assert_close(pg.grad.cpu(), pc.grad, rtol=1e-8, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


def test_fused_on_cuda_batch_after_batch_matches_cpu_reference(cuda_side):
    """Five batches of one shape: on CUDA the layer's forward and backward replay from their
    CUDA graphs from the third on (memnets.ops.gpu.graphs), each batch's outputs, final state
    and gradients equal to the CPU reference's, float64."""
    from memnets.ops.gpu import graphs
    dev = cuda_side.device
    torch.manual_seed(0)
    cpu = NAMTuringMachine(6, 8, num_tapes=2, tape_length=5, impl="reference", normalize_heads=True).double()
    gpu = copy.deepcopy(cpu).to(dev)
    gpu.impl = "fused"
    before = graphs.stats().get("replays", 0)
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        x, w = torch.randn(3, 9, 6, generator=g, dtype=DT), torch.randn(3, 9, 8, generator=g, dtype=DT)
        xc, xg = x.clone().requires_grad_(), x.clone().to(dev).requires_grad_()
        yc, sc = cpu(xc)
        gc = torch.autograd.grad((yc * w).sum(), [xc, *cpu.parameters()])
        with cuda_side.path(), torch.backends.cudnn.flags(enabled=False):
            yg, sg = gpu(xg)
            gg = torch.autograd.grad((yg * w.to(dev)).sum(), [xg, *gpu.parameters()])
        torch.testing.assert_close(yg.detach().cpu(), yc.detach(), rtol=1e-9, atol=1e-10)
        for a, b in zip([*sg, *gg], [*sc, *gc]):
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-8, atol=1e-10, msg=lambda m: f"batch {i}: {m}")
    if cuda_side.is_cuda:
        assert graphs.stats().get("replays", 0) - before >= 2 * 3  # forward and backward, batches 3 to 5


def test_fused_bf16_autocast_step_on_cuda(cuda_side):
    """On CUDA at the bench's width (B=8, T=30, hidden 64, 4 tapes of 16); on the CPU stand-in
    at a quarter of it (bf16 autocast on the CPU)."""
    dev = cuda_side.device
    torch.manual_seed(0)
    if cuda_side.is_cuda:
        m = NAMTuringMachine(16, 64, num_tapes=4, tape_length=16, normalize_heads=True).to(dev)
        x = torch.randn(8, 30, 16, device=dev)
    else:
        m = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8, normalize_heads=True)
        x = torch.randn(4, 12, 8)
    with cuda_side.path():
        g32 = torch.autograd.grad(m(x)[0].square().mean(), list(m.parameters()))
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            y = m(x)[0]
        g16 = torch.autograd.grad(y.float().square().mean(), list(m.parameters()))
    for a, b in zip(g16, g32):
        assert torch.isfinite(a).all()
        assert (a - b).norm() <= 0.08 * b.norm() + 1e-6
