"""memnets.ops.gpu.graphs.graphed_autograd: a module's whole forward as one graphed call and its
backward (the forward recomputed and differentiated) as another. On the CPU through the graphs'
eager stand-in (static buffers, outputs rewritten at each replay), float64: values and every
gradient equal plain autograd's batch after batch (the first call runs eagerly, the second
captures, later ones replay), with calls overlapping, outputs left out of the loss, frozen
parameters and autocast; gradcheck; a parameter changed in place before the backward is refused."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from memnets.ops.gpu import env_var, graphs
from memnets.ops.gpu.graphs import graphed_autograd, whole_module

DT = torch.float64


class Net(nn.Module):
    """A bidirectional GRU and a linear layer: ``(x, h0) -> (y, h_n)``."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, batch_first=True, bidirectional=True)
        self.out = nn.Linear(8, 2)

    def forward(self, x, h0):
        z, hn = self.rnn(x, h0)
        return self.out(torch.tanh(z)), hn


def _net():
    torch.manual_seed(0)
    return Net().to(DT)


def _inputs(seed, grad_h=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 3, generator=g, dtype=DT).requires_grad_()
    h = (0.5 * torch.randn(2, 2, 4, generator=g, dtype=DT)).requires_grad_(grad_h)
    w = torch.randn(2, 5, 2, generator=g, dtype=DT)
    return x, h, w


def _graphed(net, x, h):
    return graphed_autograd(("test.net", id(net)), net, (x, h), net.parameters())


def _grads(loss, x, h, net):
    wrt = [x] + ([h] if h.requires_grad else []) + [p for p in net.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, wrt, allow_unused=True)


def _close(a, b, what):
    for i, (u, v) in enumerate(zip(a, b)):
        if u is None or v is None:
            assert u is None and v is None, f"{what}, item {i}: {u} against {v}"
            continue
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-13, msg=lambda m: f"{what}, item {i}: {m}")


def test_batch_after_batch_equals_plain_autograd():
    net = _net()
    graphs.clear()
    before = graphs.stats()
    for i in range(5):
        x, h, w = _inputs(i, grad_h=i % 2 == 0)
        both = i % 3 != 1  # the loss takes both outputs, or y alone
        y, hn = net(x, h)
        want = [y, hn, *_grads((y * w).sum() + (hn.square().sum() if both else 0), x, h, net)]
        with graphs.stand_in():
            y, hn = _graphed(net, x, h)
            got = [y, hn, *_grads((y * w).sum() + (hn.square().sum() if both else 0), x, h, net)]
        _close(got, want, f"call {i}")
    after = graphs.stats()
    assert after["modules"] - before.get("modules", 0) == 5
    # the forward: eager, captured, then replayed; the backwards by which inputs and outputs
    # take gradients (four such kinds here), each eager the first time
    assert after["captures"] - before.get("captures", 0) >= 2
    assert after["replays"] - before.get("replays", 0) >= 4
    graphs.clear()


def test_overlapping_calls_and_a_graphed_call_inside():
    """Two forwards of one shape before their backwards (what each backward needs is its own
    inputs), and a graphed function called inside the module runs plainly, as part of it."""
    net = _net()
    inner = []

    def module(x, h):
        inner.append(1)
        (z,) = graphs.graphed("test.inner", lambda t: (t * 2.0,), x)
        return net(z, h)

    graphs.clear()
    xs = [_inputs(i) for i in range(3)]
    with graphs.stand_in():
        for _ in range(3):  # eager, capture, replay
            outs = [graphed_autograd(("test.overlap", id(net)), module, (x, h), net.parameters()) for x, h, _ in xs]
            loss = sum((y * w).sum() + hn.sum() for (y, hn), (_, _, w) in zip(outs, xs))
            got = torch.autograd.grad(loss, [t for x, h, _ in xs for t in (x, h)] + list(net.parameters()))
    assert "test.inner" not in str(list(graphs._CACHE))  # never a graph of its own
    outs = [net(2.0 * x, h) for x, h, _ in xs]
    loss = sum((y * w).sum() + hn.sum() for (y, hn), (_, _, w) in zip(outs, xs))
    want = torch.autograd.grad(loss, [t for x, h, _ in xs for t in (x, h)] + list(net.parameters()))
    _close(got, want, "overlapping calls")
    graphs.clear()


def test_frozen_parameters_no_grad_and_unused_inputs():
    net = _net()
    net.out.weight.requires_grad_(False)
    x, h, w = _inputs(0, grad_h=False)
    with graphs.stand_in():
        for _ in range(3):
            y, hn = _graphed(net, x, h)
            got = torch.autograd.grad((y * w).sum(), [x] + [p for p in net.parameters() if p.requires_grad])
            with torch.no_grad():
                y0, hn0 = _graphed(net, x, h)
            assert not y0.requires_grad
    y, hn = net(x, h)
    want = torch.autograd.grad((y * w).sum(), [x] + [p for p in net.parameters() if p.requires_grad])
    _close(got, want, "frozen out.weight")
    _close([y0, hn0], [y.detach(), hn.detach()], "no_grad")
    graphs.clear()


def test_recomputes_under_the_forwards_autocast():
    """The backward recomputes in the autocast state of the forward (bfloat16 on the CPU),
    outside of which it runs: gradients equal to plain autograd of the same autocast forward."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(4, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = net(x)
    want = torch.autograd.grad(y.float().square().sum(), [x, *net.parameters()])
    with graphs.stand_in():
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                (y2,) = graphed_autograd("test.amp", lambda t: (net(t),), (x,), net.parameters())
            assert y2.dtype == torch.bfloat16
            got = torch.autograd.grad(y2.float().square().sum(), [x, *net.parameters()])
    _close(got, want, "autocast")
    graphs.clear()


def test_gradcheck():
    net = _net()
    x, h, _ = _inputs(3)
    params = list(net.parameters())

    def f(x, h, *ps):
        # the parameters given are the module's, read by the module itself
        y, hn = _graphed(net, x, h)
        return y, hn

    with graphs.stand_in():
        assert torch.autograd.gradcheck(f, (x, h, *params), eps=1e-6, atol=1e-7)
    graphs.clear()


def test_parameter_changed_before_the_backward_is_refused():
    net = _net()
    x, h, w = _inputs(0)
    with graphs.stand_in():
        y, _ = _graphed(net, x, h)
        with torch.no_grad():
            net.out.weight.add_(1.0)  # e.g. an optimizer step before backward()
        with pytest.raises(RuntimeError, match="modified in place"):
            (y * w).sum().backward()
    with pytest.raises(ValueError, match="inputs"):
        graphed_autograd("test.none", net, (), net.parameters())
    graphs.clear()


def test_whole_module_says_when():
    x = torch.zeros(2)
    assert not whole_module(x)  # CPU tensors outside the stand-in: no graphs
    with graphs.stand_in():
        assert whole_module(x)
        with env_var("MEMNETS_MODULE_GRAPHS", "0"):
            assert not whole_module(x)
        with env_var("MEMNETS_CUDA_GRAPHS", "0"):
            assert not whole_module(x)
        seen = []
        graphed_autograd("test.nested", lambda t: (seen.append(whole_module(t)) or t * 1.0,), (x,))
        assert seen == [False]  # inside a graphed module its own forward runs
    with graphs.counting():
        assert whole_module(x)  # a launch count takes CUDA's path on CPU tensors
    graphs.clear()


def test_whole_step_warm_ups_make_no_module_graphs():
    """The warm-up steps of a whole-step graph run the module's own path, as its capture does."""
    from memnets.train.graph_step import CUDAGraphStep
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    x, h, w = _inputs(0)

    def loss_fn(x, h):
        y, hn = _graphed(net, x, h) if whole_module(x) else net(x, h)
        return (y * w).sum()

    graphs.clear()
    before = graphs.stats().get("modules", 0)
    with graphs.stand_in():
        step = CUDAGraphStep(loss_fn, opt, warmup=2, enabled=True)
        for _ in range(4):
            step(x.detach(), h.detach())
    assert graphs.stats().get("modules", 0) == before
    graphs.clear()


def test_a_module_whose_graph_fails_runs_its_own_path(monkeypatch):
    """A graph of a module graphed whole that fails to capture (warned once) leaves that
    module on its own path from then on (whole_module says no for its key), not running its
    forward twice without graphs; the results stay right."""
    net = _net()
    key = ("test.fails", id(net))
    real = graphs._EagerGraph.__init__

    def broken(self, fn, static_in):
        raise RuntimeError("capture refused")

    x, h, w = _inputs(0)
    graphs.clear()
    with graphs.stand_in():
        assert whole_module(x, key=key)
        for i in range(2):  # the second call captures: it fails
            if i == 1:
                monkeypatch.setattr(graphs._EagerGraph, "__init__", broken)
                with pytest.warns(RuntimeWarning, match="capture of"):
                    y, hn = graphed_autograd(key, net, (x, h), net.parameters())
            else:
                y, hn = graphed_autograd(key, net, (x, h), net.parameters())
        monkeypatch.setattr(graphs._EagerGraph, "__init__", real)
        assert not whole_module(x, key=key) and whole_module(x, key=("test.other",))
        got = torch.autograd.grad((y * w).sum(), [x, h, *net.parameters()])
    y2, _ = net(x, h)
    _close([y, *got], [y2, *torch.autograd.grad((y2 * w).sum(), [x, h, *net.parameters()])], "after the failure")
    graphs.clear()
    assert whole_module(x, key=key) is False  # outside the stand-in: CPU tensors take no graphs


def test_a_replica_runs_its_own_path():
    """A replica made for one call (nn.DataParallel's: parameters that are not leaves) is not
    graphed whole: its parameters are new at every call."""
    net = _net()
    x = torch.zeros(2, 5, 3, dtype=DT)
    with graphs.stand_in():
        assert whole_module(x, module=net)
        replica = _net()
        # as replicate() leaves them: outputs of an op (a broadcast), not leaves
        replica.out._parameters["weight"] = replica.out.weight * 1.0
        assert not whole_module(x, module=replica)


def test_a_parameter_the_outputs_do_not_use_gets_no_gradient():
    """As from autograd: a parameter (or input) the outputs do not depend on keeps ``grad`` None
    (an optimiser then leaves it alone), call after call, replays included."""
    net = _net()
    spare = nn.Parameter(torch.ones(3, dtype=DT))
    x, h, w = _inputs(0)
    z = torch.zeros(2, dtype=DT, requires_grad=True)
    with graphs.stand_in():
        for _ in range(3):
            net.zero_grad(set_to_none=True)
            spare.grad = z.grad = None
            y, hn = graphed_autograd(("test.spare", id(net)), lambda x, h, z: net(x, h), (x, h, z),
                                     [*net.parameters(), spare])
            (y * w).sum().backward()
            assert spare.grad is None and z.grad is None
            assert all(p.grad is not None for p in net.parameters())
    graphs.clear()
