"""Every model and fast op gives the same values and gradients on CUDA as on the CPU.

Each test runs twice (the ``cuda_side`` fixture of conftest.py): on CUDA where there is one
(skipped elsewhere, with the reason printed), and always on the CPU down the CUDA code path
(``cuda_path-cpu``: :func:`memnets.ops.gpu.cuda_path` with the C kernels off, Triton kernels
through the interpreter when ``TRITON_INTERPRET=1``), so that no test here can break unseen on
a machine without a GPU. Each check builds the module once, copies it to the device, feeds both
copies the same float64 input and compares outputs and all parameter / input gradients: the
CPU's own path against the CUDA path.
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import backbone_names, tiny_backbone_model


def _same_on_cuda(side, module: torch.nn.Module, *inputs: torch.Tensor, out=lambda y: y, tol: float = 1e-8) -> None:
    """``module(*inputs)`` on the CPU and on ``side`` (float64): equal outputs and gradients."""
    dev = side.device
    torch.manual_seed(0)
    cpu = module.double().eval()  # no dropout: the two copies must see the same function
    gpu = copy.deepcopy(cpu).to(dev)
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    xs_c = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    xs_g = [x.detach().clone().to(dev).requires_grad_(x.is_floating_point()) for x in inputs]
    yc = out(cpu(*xs_c))
    w = torch.randn_like(yc)
    (yc * w).sum().backward()
    with side.path(), torch.backends.cudnn.flags(enabled=False):  # cuDNN's RNN has no backward in eval mode
        yg = out(gpu(*xs_g))
        assert yg.device.type == dev.type
        (yg * w.to(dev)).sum().backward()
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


@pytest.mark.parametrize("backbone", backbone_names())
def test_sequence_backbones_match_cpu(backbone, cuda_side):
    model = tiny_backbone_model(backbone)
    tokens = torch.randint(0, 16, (3, 12))
    _same_on_cuda(cuda_side, model, tokens)


def test_nam_tm_unit_key_heads_match_cpu(cuda_side):
    """normalize_heads="all": the C kernel on the CPU, the per-step loop on CUDA, one function."""
    from memnets.memories.nam_tm import NAMTuringMachine

    torch.manual_seed(0)
    m = NAMTuringMachine(6, 8, num_tapes=2, tape_length=5, normalize_heads="all")
    _same_on_cuda(cuda_side, m, torch.randn(3, 9, 6), out=lambda y: y[0])


@pytest.mark.parametrize("attention,causal", [(a, c) for a in ("softmax", "linear", "nam", "delta")
                                              for c in (False, True) if c or a != "delta"])  # delta: causal only
def test_attention_modules_match_cpu(attention, causal, cuda_side):
    from memnets.models.transformer import TransformerEncoder
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

    _same_on_cuda(cuda_side, WithMask(), x)


@pytest.mark.parametrize("compiled", [True, False])
def test_lsam_scan_matches_cpu(compiled, cuda_side):
    from memnets.ops.lsam import lsam_scan
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

    _same_on_cuda(cuda_side, Scan(), torch.randn(T, B, Fi), 0.1 * torch.randn(dirs, B, H, d, d), torch.randn(dirs, B, D))


def test_lsam_layer_matches_cpu(cuda_side):
    from memnets import LSAM
    torch.manual_seed(0)
    model = LSAM(8, 16, num_heads=2, num_layers=2)
    _same_on_cuda(cuda_side, model, torch.randn(3, 9, 8, dtype=torch.float64), out=lambda r: r[0])


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_dnc_matches_cpu(impl, cuda_side):
    from memnets import DNC
    torch.manual_seed(0)
    model = DNC(6, 5, memory_slots=8, word_size=6, read_heads=2, controller_size=16, impl=impl)
    _same_on_cuda(cuda_side, model, torch.randn(3, 10, 6, dtype=torch.float64), out=lambda r: r[0])


def test_ntm_matches_cpu(cuda_side):
    from memnets import NTM
    torch.manual_seed(0)
    model = NTM(6, 5, memory_slots=16, word_size=8, read_heads=1, write_heads=1, controller_size=16)
    _same_on_cuda(cuda_side, model, torch.randn(3, 10, 6, dtype=torch.float64), out=lambda r: r[0])


def test_memn2n_matches_cpu(cuda_side):
    from memnets import MemN2N
    torch.manual_seed(0)
    model = MemN2N(vocab_size=30, embedding_dim=12, hops=3, memory_size=10, sentence_size=6)
    story = torch.randint(1, 30, (4, 10, 6))
    query = torch.randint(1, 30, (4, 6))
    _same_on_cuda(cuda_side, model, story, query, out=lambda r: r[0] if isinstance(r, tuple) else r)


@pytest.mark.parametrize("update_rule", ["delta", "sum"])
def test_fast_weights_match_cpu(update_rule, cuda_side):
    from memnets.memories.fast_weights import FastWeightMemory
    torch.manual_seed(0)
    model = FastWeightMemory(12, num_heads=2, update_rule=update_rule, output_size=12)
    _same_on_cuda(cuda_side, model, torch.randn(2, 70, 12, dtype=torch.float64), out=lambda r: r[0])


def test_nam_fewshot_matches_cpu(cuda_side):
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

    _same_on_cuda(cuda_side, Scores(), torch.randn(7, 16, dtype=torch.float64), support)


def test_lra_experiment_runs_on_cuda(tmp_path, monkeypatch, cuda_side):
    """The LRA runs train on the GPU and report the device."""
    import json

    from memnets.cli.main import main
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    dev = cuda_side.device.type
    with cuda_side.path():
        assert main(["experiment", "lra", "task.options.max_len=100", "task.train_size=64", "task.eval_size=32",
                     "max_steps=4", f"device={dev}", "--quiet", "--out", str(tmp_path / "out")]) == 0
    for kind in ("softmax", "linear", "nam"):
        res = json.loads((tmp_path / "out" / f"listops-{kind}" / "results.json").read_text())
        assert res["device"].startswith(dev) and res["steps"] == 4


def _fla_or_skip(side):
    """Skip unless fla's kernels can run on ``side``: its compiled kernels need CUDA (on the CPU,
    tests/test_fla_interpret.py runs its step-by-step kernels through Triton's interpreter)."""
    from memnets.ops.delta.fla_backend import fla_available, fla_reasons
    if not side.is_cuda:
        pytest.skip("fla's chunked kernels need CUDA (the CPU runs of fla's kernels: tests/test_fla_interpret.py)")
    if not fla_available():
        pytest.skip("flash-linear-attention (fla) is not installed: "
                    + "; ".join(fla_reasons(torch.zeros(1, device=side.device))))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


# float16 compiles and autotunes every fla chunk kernel a second time (a minute or more on a fresh
# GPU): in the slow tier, so that `make gpu-check` keeps to its time
@pytest.mark.parametrize("dtype,mode,tol", [(torch.bfloat16, "chunk", 5e-2),
                                            pytest.param(torch.float16, "chunk", 1e-2, marks=pytest.mark.slow),
                                            (torch.float32, "recurrent", 1e-4)])
@pytest.mark.parametrize("same", [True, False], ids=["pe=pw", "pe!=pw"])
@pytest.mark.parametrize("with_state", [True, False])
def test_nam_scan_fla_matches_reference(dtype, mode, tol, same, with_state, cuda_side):
    """fla's kernels through ``nam_scan_fla`` == our float32 reference (values, every gradient)."""
    from memnets.ops import nam_scan, unit
    from memnets.ops.delta.fla_backend import nam_scan_fla
    g = torch.Generator().manual_seed(0)
    B, T, H, dk, dv = 2, 100, 2, 64, 64  # T not a multiple of the chunk
    x = dict(q=unit(torch.randn(B, T, H, dk, generator=g)), k=unit(torch.randn(B, T, H, dk, generator=g)),
             v=torch.randn(B, T, H, dv, generator=g), p_w=torch.rand(B, T, H, generator=g),
             p_e=torch.rand(B, T, H, generator=g), p_r=torch.rand(B, T, H, generator=g),
             state=0.5 * torch.randn(B, H, dv, dk, generator=g))
    if not with_state:
        x.pop("state")
    _fla_or_skip(cuda_side)
    DEV = cuda_side.device
    x = {n: t.to(DEV, dtype) for n, t in x.items()}  # rounded to dtype once; both sides see the same values
    co = torch.randn(B, T, H, dv, generator=g).to(DEV)
    cs = torch.randn(B, H, dv, dk, generator=g).to(DEV)

    def run(fn, cast):
        L = {n: t.detach().to(cast).requires_grad_() for n, t in x.items()}
        pe = L["p_w"] if same else L["p_e"]
        o, s = fn(L, pe)
        ((o.float() * co).sum() + (s.float() * cs).sum()).backward()
        return o.detach(), s.detach(), {n: t.grad for n, t in L.items() if t.grad is not None}

    o1, s1, g1 = run(lambda L, pe: nam_scan(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"],
                                            initial_state=L.get("state"), impl="reference"), torch.float32)
    o2, s2, g2 = run(lambda L, pe: nam_scan_fla(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"], L.get("state"),
                                                delta=same, mode=mode), dtype)
    assert o2.dtype == dtype and s2.dtype == dtype and s2.shape == (B, H, dv, dk)
    errs = {"out": _rel_err(o2, o1), "state": _rel_err(s2, s1)}
    errs.update({f"d{n}": _rel_err(g2[n], g1[n]) for n in g1})
    assert set(g2) == set(g1)
    assert max(errs.values()) < tol, errs


def test_nam_scan_auto_uses_fla_for_half_precision(cuda_side):
    """On CUDA, ``impl="auto"`` takes fla's kernels in bf16 and the chunked scan in float32, with
    the same values; on the CPU stand-in, ``auto`` in bf16 down the CUDA path equals the chunked scan."""
    from memnets.ops import nam_scan, nam_scan_resolve_impl, unit
    DEV = cuda_side.device
    if cuda_side.is_cuda:
        _fla_or_skip(cuda_side)
    q = unit(torch.randn(2, 70, 2, 64, device=DEV, dtype=torch.bfloat16))
    beta = torch.rand(2, 70, 2, device=DEV, dtype=torch.bfloat16)
    with cuda_side.path():
        if cuda_side.is_cuda:
            assert nam_scan_resolve_impl("auto", q) == "fla"
            assert nam_scan_resolve_impl("auto", q.float()) == "chunked"
        else:
            assert nam_scan_resolve_impl("auto", q) in ("fla", "chunked", "reference")
        o1, s1 = nam_scan(q, q, q, beta, beta, impl="auto")
        o2, s2 = nam_scan(q, q, q, beta, beta, impl="chunked")
    assert _rel_err(o1, o2) < 5e-2 and _rel_err(s1, s2) < 5e-2


def _train_losses(run_dir) -> list:
    import json
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "train"]


@pytest.mark.parametrize("backbone", ["lsam_stack", "lsam_encdec", "nam_tm", "nam_tm_nojmp", "transformer",
                                      "universal_transformer", "lstm_attention", "dnc", "ntm", "bilstm"])
def test_memnets_train_default_amp_on_cuda_trains_every_backbone(tmp_path, backbone, cuda_side, monkeypatch):
    """`memnets train` on CUDA with the defaults amp="auto" (bf16 autocast) and cuda_graph="auto":
    every backbone trains eight steps, forward and backward, with finite losses — three eager,
    then on CUDA one capture of the whole step and four replays — and env.json says bf16 was on.
    (On the CPU stand-in, amp="bf16": the same bf16 autocast, which "auto" leaves off on the CPU,
    and eager steps.)"""
    import json
    import math

    from memnets.models.seq import SIZES
    from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig, loop, train

    made = []
    real_make = loop.Trainer._make_graph_step
    monkeypatch.setattr(loop.Trainer, "_make_graph_step", lambda self: made.append(real_make(self)) or made[-1])

    tiny = dict(SIZES["tiny"][backbone])
    cfg = RunConfig(name="amp-cuda", epochs=1, batch_size=8, log_every=1, device=cuda_side.device.type,
                    amp="auto" if cuda_side.is_cuda else "bf16",
                    model=ModelConfig(backbone, tiny.pop("d_model"), tiny),
                    task=TaskConfig(name="reduce", train_digits=(1, 3), train_size=64, eval_size=8,
                                    splits={"id": (2, 3), "od_easy": (4, 4), "od_hard": (5, 5)}),
                    optim=OptimConfig(lr=3e-3))
    if cuda_side.is_cuda:
        assert cfg.amp == "auto"
    with cuda_side.path():
        res = train(cfg, tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "env.json").read_text())["autocast"] == "bfloat16"
    losses = _train_losses(tmp_path / "run")
    assert res["steps"] == 8 and len(losses) == 8 and all(math.isfinite(v) for v in losses)
    if cuda_side.is_cuda:
        assert len(made) == 1 and dict(made[0].stats) == {"eager": 3, "captured": 1, "replayed": 4}, \
            dict(made[0].stats) if made else "no CUDAGraphStep"
    else:
        assert not made


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("backbone", ["transformer", "lsam_stack", "nam_tm", "dnc"])
def test_memnets_train_compile_on_cuda_follows_eager(tmp_path, backbone, mode, cuda_side, monkeypatch):
    """`compile` on CUDA (inductor; reduce-overhead adds CUDA graphs), float32: the training
    losses follow the eager run's to float32 rounding, and the weights are saved unprefixed.
    On the CPU stand-in torch.compile runs with dynamo's ``eager`` backend (the plumbing and the
    graph capture of the CUDA path in seconds; inductor on the CPU is tests/test_compile.py's
    slow test)."""
    from memnets.models.seq import SIZES
    from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig, train

    if not cuda_side.is_cuda:
        real = torch.compile
        monkeypatch.setattr(torch, "compile", lambda model, *a, mode=None, **kw: real(model, backend="eager"))

    def run(name, compile_mode):
        tiny = dict(SIZES["tiny"][backbone])
        cfg = RunConfig(name=name, epochs=1, batch_size=8, log_every=1, device=cuda_side.device.type, amp="none",
                        compile=compile_mode, model=ModelConfig(backbone, tiny.pop("d_model"), tiny),
                        task=TaskConfig(name="reduce", train_digits=(1, 3), train_size=24, eval_size=8,
                                        splits={"id": (2, 3), "od_easy": (4, 4), "od_hard": (5, 5)}),
                        optim=OptimConfig(lr=3e-3))
        with cuda_side.path():
            train(cfg, tmp_path / name, quiet=True)
        return _train_losses(tmp_path / name)

    torch._dynamo.reset()
    eager, compiled = run("eager", "none"), run("compiled", mode)
    assert len(eager) == len(compiled) == 3
    assert compiled == pytest.approx(eager, rel=1e-3, abs=1e-4)
    from safetensors.torch import load_file
    keys = load_file(str(tmp_path / "compiled" / "checkpoints" / "best.safetensors")).keys()
    assert keys and not any(k.startswith("_orig_mod") for k in keys)


def test_graphed_autograd_of_a_cudnn_rnn_module_matches_plain_autograd(cuda_side):
    """A module with cuDNN's GRU and LSTM graphed whole (memnets.ops.gpu.graphs.graphed_autograd:
    the forward one CUDA graph, the backward, which recomputes and differentiates it, another):
    batch after batch (eager, capture, replays) its outputs and every gradient equal plain
    autograd's, float64 (on the CPU through the graphs' stand-in)."""
    import contextlib

    from memnets.ops.gpu import graphs

    dev = cuda_side.device
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(5, 6, batch_first=True, bidirectional=True)
            self.lstm = torch.nn.LSTM(12, 4, batch_first=True)
            self.out = torch.nn.Linear(4, 3)

        def forward(self, x, h0):
            z, hn = self.gru(x, h0)
            return self.out(self.lstm(z)[0]).tanh(), hn

    block = Block().to(dev, torch.float64)
    key = ("test.cudnn_block", id(block))
    graphs.clear()
    before = graphs.stats()
    for i in range(5):
        stand_in = contextlib.nullcontext() if cuda_side.is_cuda else graphs.stand_in()
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, 7, 5, generator=g, dtype=torch.float64).to(dev).requires_grad_()
        h0 = torch.randn(2, 3, 6, generator=g, dtype=torch.float64).to(dev).requires_grad_()
        w = torch.randn(3, 7, 3, generator=g, dtype=torch.float64).to(dev)
        y, hn = block(x, h0)
        want = [y, hn, *torch.autograd.grad((y * w).sum() + hn.sum(), [x, h0, *block.parameters()])]
        with cuda_side.path(), stand_in:
            assert graphs.whole_module(x, key=key, module=block)
            y, hn = graphs.graphed_autograd(key, block, (x, h0), block.parameters(), module=block)
            got = [y, hn, *torch.autograd.grad((y * w).sum() + hn.sum(), [x, h0, *block.parameters()])]
        for j, (a, b) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m: f"batch {i}, item {j}: {m}")
    after = graphs.stats()
    assert after.get("failures", 0) == before.get("failures", 0)  # both graphs captured
    assert after["replays"] - before.get("replays", 0) >= 2 * 3  # forward and backward, batches 3 to 5
    graphs.clear()


def test_a_failed_capture_leaves_random_numbers_working(cuda_side):
    """A graphed function whose capture fails (on CUDA: it reads a value back to the host, which
    invalidates the capture) warns and runs without a graph, and the device's random numbers
    still work after it (a failed ``torch.cuda.graph`` capture used to leave the default
    generator in capture mode: every later draw raised). On the CPU the stand-in's capture
    fails the same way (the function raises on its second call)."""
    import contextlib

    from memnets.ops.gpu import graphs

    dev = cuda_side.device
    calls = []

    def fn(x):
        calls.append(1)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            x.sum().item()  # a read back to the host: not capturable
        elif not x.is_cuda and len(calls) == 2:  # the stand-in's capture is the second call
            raise RuntimeError("not capturable")
        return (x * 2,)

    graphs.clear()
    before = graphs.stats().get("failures", 0)
    x = torch.arange(4.0, device=dev)
    stand_in = contextlib.nullcontext() if cuda_side.is_cuda else graphs.stand_in()
    with cuda_side.path(), stand_in:
        for i in range(3):  # eager, the capture that fails, then eager for good
            if i == 1:
                with pytest.warns(RuntimeWarning, match="capture of"):
                    (y,) = graphs.graphed(("test.uncapturable",), fn, x)
            else:
                (y,) = graphs.graphed(("test.uncapturable",), fn, x)
            assert torch.equal(y, 2 * x)
    assert graphs.stats().get("failures", 0) == before + 1
    r = torch.rand(1000, device=dev)  # raised on CUDA before the fix
    kept = torch.nn.functional.dropout(torch.ones(1000, device=dev), 0.5, training=True)
    assert 0.3 < r.mean().item() < 0.7 and 300 < int((kept != 0).sum()) < 700
    graphs.clear()
