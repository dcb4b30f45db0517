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
    return graphed_autograd(("test.net", id(net)), net, (x, h), net.parameters(), module=net)


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
            outs = [graphed_autograd(("test.overlap", id(net)), module, (x, h), net.parameters(), module=net)
                    for x, h, _ in xs]
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
                (y2,) = graphed_autograd("test.amp", lambda t: (net(t),), (x,), net.parameters(), module=net)
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


def test_the_recomputation_reads_the_parameters_through_aliases():
    """In the backward the module reads fresh leaves sharing its parameters' storage, not the
    parameters themselves (whose accumulator nodes belong to the caller's graph and stream: on
    CUDA a gradient taken through them invalidates the capture); after it the module holds its
    parameters again, and its cuDNN-style RNN reads them (its flat weights follow)."""
    net = _net()
    seen = []

    def look(mod, args):
        seen.append((torch.is_grad_enabled(), mod.weight is net_weight, mod.weight.data_ptr() == net_weight.data_ptr(),
                     mod.weight.requires_grad, mod.weight.is_leaf))
    net_weight = net.out.weight
    rnn_weight, rnn_seen = net.rnn.weight_ih_l0, []

    def look_rnn(mod, args):  # the list cuDNN reads: the aliases, not flattened anew (same storage)
        rnn_seen.append((torch.is_grad_enabled(), mod._flat_weights[0] is mod.weight_ih_l0,
                         mod._flat_weights[0] is rnn_weight, mod._flat_weights[0].data_ptr() == rnn_weight.data_ptr()))
    hook = net.out.register_forward_pre_hook(look)
    hook_rnn = net.rnn.register_forward_pre_hook(look_rnn)
    x, h, w = _inputs(0)
    graphs.clear()
    try:
        with graphs.stand_in():
            for _ in range(3):
                y, hn = _graphed(net, x, h)
                torch.autograd.grad((y * w).sum() + hn.sum(), [x, *net.parameters()])
    finally:
        hook.remove()
        hook_rnn.remove()
    assert any(s[0] for s in rnn_seen)
    assert all(listed and (fresh != s_grad) and shared for s_grad, listed, fresh, shared in rnn_seen)
    recomputed = [s for s in seen if s[0]]  # the backward's forwards (the graphed forwards run without grad)
    assert recomputed and all(not same and shared and grad and leaf for _, same, shared, grad, leaf in recomputed)
    assert net.out.weight is net_weight and all(isinstance(p, nn.Parameter) for p in net.parameters())
    assert all(a is b for a, b in zip(net.rnn._flat_weights, [getattr(net.rnn, n) for n in net.rnn._flat_weights_names]))
    y2, hn2 = net(x, h)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    graphs.clear()


def test_tied_parameters_get_one_gradient():
    """A parameter held by two submodules is read through one alias in both places: its
    gradient is the sum over both uses, as plain autograd's."""
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
            self.b.weight = self.a.weight

        def forward(self, x):
            return (self.b(torch.tanh(self.a(x))),)

    torch.manual_seed(0)
    net = Tied().to(DT)
    x = torch.randn(4, 3, dtype=DT, requires_grad=True)
    graphs.clear()
    with graphs.stand_in():
        for _ in range(3):
            (y,) = graphed_autograd(("test.tied", id(net)), net, (x,), net.parameters(), module=net)
            got = torch.autograd.grad(y.square().sum(), [x, *net.parameters()])
    (y2,) = net(x)
    _close(got, torch.autograd.grad(y2.square().sum(), [x, *net.parameters()]), "tied parameters")
    assert net.b.weight is net.a.weight
    graphs.clear()


def test_module_must_hold_the_parameters():
    net, other = _net(), _net()
    x, h, _ = _inputs(0)
    with pytest.raises(ValueError, match="`params` must be a parameter of `module`"):
        graphed_autograd("test.own", net, (x, h), other.parameters(), module=net)
    with pytest.raises(TypeError, match="`module` expected an nn.Module"):
        graphed_autograd("test.own", net, (x, h), net.parameters(), module=lambda t: t)


def test_a_failed_capture_gives_the_generator_back_its_state():
    """A CUDA-graph capture that fails leaves the default generator in capture mode (every
    random draw after it would raise); around the capture its state cloned before is set back,
    and only on a failure."""
    class Gen:
        def __init__(self):
            self.states, self.state = [], "before"

        def clone_state(self):
            return f"clone of {self.state}"

        def graphsafe_set_state(self, st):
            self.states.append(st)

    gen = Gen()
    with graphs.rng_restored_on_failure(generator=gen):
        gen.state = "captured"
    assert gen.states == []
    gen.state = "before"
    with pytest.raises(RuntimeError, match="invalidated"):
        with graphs.rng_restored_on_failure(generator=gen):
            gen.state = "in capture mode"
            raise RuntimeError("capture invalidated")
    assert gen.states == ["clone of before"]
