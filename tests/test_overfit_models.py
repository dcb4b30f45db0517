"""Every Table 1 backbone can fit a small batch of masked-completion sequences (a capacity smoke test).

32 sequences of length 20 over a vocabulary of 16: ten visible random digits, then ten MASK
positions whose targets repeat the ten digits (a copy, the simplest masked completion whose
answer is in the input, which every backbone — including the tape machines, whose outputs
are mixtures of stored inputs — can express). The model has to carry information from the
visible prefix to the masked suffix; 100 % token accuracy over all 20 positions within 300
Adam steps is required (400 for the DNC and LSAM's stack, :data:`STEPS`).
"""
from __future__ import annotations

import time

import pytest
import torch

from memnets.models.seq import BACKBONES, SIZES, SequenceTaskModel, backbone_available
from memnets.tasks.nsp import MASK, VOCAB_SIZE

LR = {"transformer": 3e-3, "universal_transformer": 3e-3, "nam_tm": 2e-2}
# Adam steps allowed. The count moves by about a third with float32 rounding alone, and with it
# the C kernels' vector width (-march=native): the DNC's access steps in C and as PyTorch ops, both
# exact to float64 round-off, fit seed 0 in 306 and 238 steps; LSAM's step in C fits seed 0 in 306
# steps on an AVX-512 machine against 220 for its TorchScript loops (MEMNETS_NATIVE=0), while over
# seeds 0-15 the two average 203 and 194 steps. Their caps leave that margin.
STEPS = {"dnc": 400, "lsam_stack": 400}
# The NTM (per-step content addressing through autograd over 20 steps) takes tens of seconds on 2
# shared cores: slow tier, to keep the default run short. The DNC, its access steps in C, a few.
SLOW = {"ntm"}


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    visible = torch.randint(0, 10, (32, 10), generator=g)
    x = torch.cat([visible, torch.full((32, 10), MASK)], dim=1)  # [32, 20]
    y = torch.cat([visible, visible], dim=1)
    return x, y


@pytest.mark.parametrize("backbone", [pytest.param(b, marks=pytest.mark.slow) if b in SLOW else b
                                      for b in BACKBONES])
def test_backbone_overfits_a_batch(backbone):
    ok, why = backbone_available(backbone)
    if not ok:
        pytest.skip(f"backbone {backbone!r} not available: {why}")
    torch.manual_seed(0)
    kw = dict(SIZES["tiny"][backbone])
    model = SequenceTaskModel(backbone, vocab_size=VOCAB_SIZE, d_model=kw.pop("d_model"), **kw)
    opt = torch.optim.Adam(model.parameters(), lr=LR.get(backbone, 1e-2))
    x, y = _batch()
    acc, t0 = 0.0, time.perf_counter()
    steps = STEPS.get(backbone, 300)
    for step in range(1, steps + 1):
        logits = model(x)
        acc = float((logits.detach().argmax(-1) == y).float().mean())  # before this step's update
        if acc == 1.0:
            break
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1))  # [32*20, V]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"{backbone}: {acc:.3f} token accuracy after {step} steps, {time.perf_counter() - t0:.1f}s")
    assert acc == 1.0, f"{backbone} reached only {acc:.3f} token accuracy in {steps} steps"
