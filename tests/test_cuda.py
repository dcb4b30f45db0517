"""Every model and fast op gives the same values and gradients on CUDA as on the CPU.

Runs only where CUDA is available (skipped elsewhere, with the reason printed). Each check
builds the module once, copies it to the GPU, feeds both copies the same float64 input and
compares outputs and all parameter / input gradients.
"""
from __future__ import annotations

import copy

import pytest
import torch

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda")
pytestmark = pytest.mark.skipif(not CUDA, reason="CUDA is not available on this machine")


def _same_on_cuda(module: torch.nn.Module, *inputs: torch.Tensor, out=lambda y: y, tol: float = 1e-8) -> None:
    """``module(*inputs)`` on CPU and on CUDA (float64): equal outputs and gradients."""
    torch.manual_seed(0)
    cpu = module.double().eval()  # no dropout: the two copies must see the same function
    gpu = copy.deepcopy(cpu).to(DEV)
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    xs_c = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    xs_g = [x.detach().to(DEV).requires_grad_(x.is_floating_point()) for x in inputs]
    yc = out(cpu(*xs_c))
    w = torch.randn_like(yc)
    (yc * w).sum().backward()
    with torch.backends.cudnn.flags(enabled=False):  # cuDNN's RNN has no backward in eval mode
        yg = out(gpu(*xs_g))
        assert yg.device.type == DEV.type
        (yg * w.to(DEV)).sum().backward()
    torch.testing.assert_close(yg.detach().cpu(), yc.detach(), rtol=tol, atol=tol)
    for (name, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        if pc.grad is None:
            assert pg.grad is None or not pg.grad.any(), name
            continue
        torch.testing.assert_close(pg.grad.cpu(), pc.grad, rtol=tol, atol=tol,
                                   msg=lambda m: f"gradient of {name}: {m}")
    for i, (xc, xg) in enumerate(zip(xs_c, xs_g)):
        if xc.grad is not None:
            torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=tol, atol=tol, msg=f"gradient of input {i}")


def _backbones():
    from memnets.models.seq import BACKBONES
    return list(BACKBONES)


@pytest.mark.parametrize("backbone", _backbones())
def test_sequence_backbones_match_cpu(backbone):
    from memnets.models.seq import SIZES, SequenceTaskModel, backbone_available
    ok, why = backbone_available(backbone)
    if not ok:
        pytest.skip(f"backbone {backbone!r} not available: {why}")
    torch.manual_seed(0)
    kw = dict(SIZES["tiny"][backbone])
    model = SequenceTaskModel(backbone, vocab_size=16, d_model=kw.pop("d_model"), **kw)
    tokens = torch.randint(0, 16, (3, 12))
    _same_on_cuda(model, tokens)


@pytest.mark.parametrize("attention", ["softmax", "linear", "nam", "delta"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_modules_match_cpu(attention, causal):
    from memnets.models.transformer import TransformerEncoder
    if attention == "delta" and not causal:
        pytest.skip("delta attention is causal only")
    torch.manual_seed(0)
    enc = TransformerEncoder(16, 1, 2, 32, 0.0, attention, max_len=40, causal=causal)
    x = torch.randn(2, 37, 16, dtype=torch.float64)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False

    class WithMask(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = enc

        def forward(self, x):
            return self.enc(x, mask.to(x.device))

    _same_on_cuda(WithMask(), x)


@pytest.mark.parametrize("compiled", [True, False])
def test_lsam_scan_matches_cpu(compiled):
    from memnets.memories.lsam import lsam_scan
    torch.manual_seed(0)
    dirs, D, H, B, T, Fi = 2, 8, 2, 3, 9, 6
    G = 3 * D + 2 * H  # rows q | k | v (D each) | p_r | p_w (H each)
    d = D // H

    class Scan(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w_ih = torch.nn.Parameter(0.3 * torch.randn(dirs, G, Fi))
            self.w_hh = torch.nn.Parameter(0.3 * torch.randn(dirs, G, D))
            self.b = torch.nn.Parameter(0.1 * torch.randn(dirs, G))

        def forward(self, x, M0, h0):
            out, M, h = lsam_scan(x, self.w_ih, self.w_hh, self.b, M0, h0, H, compiled=compiled)
            return torch.cat([out.flatten(), M.flatten(), h.flatten()])

    _same_on_cuda(Scan(), torch.randn(T, B, Fi), 0.1 * torch.randn(dirs, B, H, d, d), torch.randn(dirs, B, D))


def test_lsam_layer_matches_cpu():
    from memnets import LSAM
    torch.manual_seed(0)
    model = LSAM(8, 16, num_heads=2, num_layers=2)
    _same_on_cuda(model, torch.randn(3, 9, 8, dtype=torch.float64), out=lambda r: r[0])


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_dnc_matches_cpu(impl):
    from memnets import DNC
    torch.manual_seed(0)
    model = DNC(6, 5, memory_slots=8, word_size=6, read_heads=2, controller_size=16, impl=impl)
    _same_on_cuda(model, torch.randn(3, 10, 6, dtype=torch.float64), out=lambda r: r[0])


def test_ntm_matches_cpu():
    from memnets import NTM
    torch.manual_seed(0)
    model = NTM(6, 5, memory_slots=16, word_size=8, read_heads=1, write_heads=1, controller_size=16)
    _same_on_cuda(model, torch.randn(3, 10, 6, dtype=torch.float64), out=lambda r: r[0])


def test_memn2n_matches_cpu():
    from memnets import MemN2N
    torch.manual_seed(0)
    model = MemN2N(vocab_size=30, embedding_dim=12, hops=3, memory_size=10, sentence_size=6)
    story = torch.randint(1, 30, (4, 10, 6))
    query = torch.randint(1, 30, (4, 6))
    _same_on_cuda(model, story, query, out=lambda r: r[0] if isinstance(r, tuple) else r)


@pytest.mark.parametrize("update_rule", ["delta", "sum"])
def test_fast_weights_match_cpu(update_rule):
    from memnets.memories.fast_weights import FastWeightMemory
    torch.manual_seed(0)
    model = FastWeightMemory(12, num_heads=2, update_rule=update_rule, output_size=12)
    _same_on_cuda(model, torch.randn(2, 70, 12, dtype=torch.float64), out=lambda r: r[0])


def test_nam_fewshot_matches_cpu():
    from memnets import NAMFewShotClassifier
    torch.manual_seed(0)
    model = NAMFewShotClassifier(16, 5, hidden=8)
    support = torch.randn(3, 2, 16, dtype=torch.float64)

    class Scores(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x, s):
            return self.m(x, s)

    _same_on_cuda(Scores(), torch.randn(7, 16, dtype=torch.float64), support)


def test_lra_experiment_runs_on_cuda(tmp_path, monkeypatch):
    """The LRA experiment trains on the GPU and reports the device."""
    from memnets.experiments import lra
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    res = lra.main(["--max-len", "100", "--n-train", "64", "--n-test", "32", "--steps", "4",
                    "--out", str(tmp_path / "out"), "--device", "cuda"])
    assert res["device"].startswith("cuda") and res["gpu"]
    assert all(r["steps"] == 4 for r in res["rows"])
