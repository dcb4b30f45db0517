"""make_optimizer: Adam and AdamW run PyTorch's fused kernels when every parameter is a
floating-point CUDA tensor, and the default (foreach) form otherwise; the step is the same."""
from __future__ import annotations

import pytest
import torch

from memnets.train.config import OptimConfig
from memnets.train.optim import fusable, make_optimizer


def test_fused_only_for_floating_cuda_parameters():
    cpu = [torch.nn.Parameter(torch.randn(3))]
    assert not fusable(cpu) and not fusable([]) and not fusable([{"params": cpu}])
    for kind in ("adam", "adamw"):
        opt = make_optimizer(OptimConfig(kind=kind), cpu)
        assert not opt.defaults.get("fused")
    if torch.cuda.is_available():
        cuda = [torch.nn.Parameter(torch.randn(3, device="cuda"))]
        assert fusable(cuda) and fusable([{"params": cuda}])
        assert not fusable(cuda + cpu)
        assert make_optimizer(OptimConfig(kind="adam"), cuda).defaults["fused"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused Adam on CUDA; on the CPU the default form runs "
                    "(test_fused_only_for_floating_cuda_parameters)")
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_fused_steps_equal_the_default_form(kind):
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4).cuda()
    b = torch.nn.Linear(8, 4).cuda()
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(kind=kind, lr=1e-2, weight_decay=1e-2)
    fused = make_optimizer(cfg, a.parameters())
    plain = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    plain = plain(b.parameters(), lr=1e-2, betas=tuple(cfg.betas), weight_decay=1e-2, foreach=True)
    for _ in range(5):
        x = torch.randn(6, 8, device="cuda")
        for m, opt in ((a, fused), (b, plain)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
