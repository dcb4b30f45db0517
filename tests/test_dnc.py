"""DNC module (docs/maths.md §8): fused == reference, state round trip, aux ranges, bad input, tiny learning run."""
import pytest
import torch

import memnets
from memnets.memories.dnc import DNC, DNCState
from memnets.state import map_state
from memnets.tasks.ntm_tasks import CopyTask

from helpers import copy_cost_before_after

D = torch.float64


def _tiny(**kw):
    torch.manual_seed(0)
    args = dict(memory_slots=6, word_size=5, read_heads=2, controller_size=16)
    args.update(kw)
    return DNC(4, 3, **args)


def test_shapes_aux_and_registry():
    m = memnets.build_model("dnc", input_size=4, output_size=3, memory_slots=6, word_size=5, read_heads=2,
                            controller_size=16, controller_layers=2)
    assert isinstance(m, memnets.DNC)
    x = torch.randn(3, 7, 4)
    y, state, aux = m(x, return_aux=True)
    assert y.shape == (3, 7, 3) and isinstance(state, DNCState)
    assert state.controller.h.shape == (3, 2, 16) and state.access.link.shape == (3, 6, 6)
    assert aux.read_weights.shape == (3, 7, 2, 6) and aux.write_weights.shape == (3, 7, 6)
    assert aux.usage.shape == (3, 7, 6) and aux.link.shape == (3, 7, 6, 6) and aux.read_modes.shape == (3, 7, 2, 3)
    assert (aux.usage >= 0).all() and (aux.usage <= 1).all()
    assert (aux.write_weights.sum(-1) <= 1 + 1e-5).all()
    assert (aux.read_weights.sum(-1) <= 1 + 1e-5).all() and (aux.read_weights >= 0).all()
    assert torch.all(torch.diagonal(aux.link, dim1=-2, dim2=-1) == 0)


@pytest.mark.parametrize("layers", [1, 2])
def test_fused_equals_reference_values_and_grads(layers):
    m = _tiny(controller_layers=layers).double()
    x = torch.randn(3, 9, 4, dtype=D)
    results = []
    for impl in ("fused", "reference"):
        m.impl = impl
        m.zero_grad()
        xi = x.clone().requires_grad_()
        y, s = m(xi)
        cot_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=D)
        loss = (y * cot_y).sum()
        for i, t in enumerate(torch.utils._pytree.tree_leaves(s)):
            loss = loss + (t * torch.randn(t.shape, generator=torch.Generator().manual_seed(10 + i), dtype=D)).sum()
        loss.backward()
        results.append((y.detach(), map_state(torch.Tensor.detach, s), xi.grad.clone(),
                        {n: p.grad.clone() for n, p in m.named_parameters()}))
    (y1, s1, gx1, gp1), (y2, s2, gx2, gp2) = results
    torch.testing.assert_close(y1, y2)
    for a, b in zip(torch.utils._pytree.tree_leaves(s1), torch.utils._pytree.tree_leaves(s2)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gx1, gx2)
    for n in gp1:
        torch.testing.assert_close(gp1[n], gp2[n], msg=lambda msg: f"{n}: {msg}")


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_whole_equals_halves_and_steps(impl):
    m = _tiny(impl=impl, controller_layers=2).double()
    x = torch.randn(2, 8, 4, dtype=D)
    y, s = m(x)
    y1, s1 = m(x[:, :5])
    y2, s2 = m(x[:, 5:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    for a, b in zip(torch.utils._pytree.tree_leaves(s2), torch.utils._pytree.tree_leaves(s)):
        torch.testing.assert_close(a, b)
    st, ys = None, []
    for t in range(8):
        yt, st = m.step(x[:, t], st)
        ys.append(yt)
    torch.testing.assert_close(torch.stack(ys, 1), y)


def test_zero_input_no_nan():
    m = _tiny()
    y, _ = m(torch.zeros(2, 5, 4))
    y.sum().backward()
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_bad_input_raises():
    m = _tiny()
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 5))
    s = m.init_state(2)
    with pytest.raises(ValueError, match="state.access.link"):
        m(torch.randn(2, 5, 4), s._replace(access=s.access._replace(link=torch.zeros(2, 6, 5))))
    with pytest.raises(ValueError, match="impl"):
        DNC(4, 3, impl="cuda")
    with pytest.raises(ValueError, match="impl"):
        DNC(4, 3, impl="chunked")


def test_impl_vocabulary():
    """``auto`` resolves to ``fused``; the old name ``fast`` still works with a FutureWarning."""
    assert DNC(4, 3).impl == "fused" and DNC(4, 3, impl="auto").impl == "fused"
    assert DNC(4, 3, impl="reference").impl == "reference"
    with pytest.warns(FutureWarning, match="fast"):
        assert DNC(4, 3, impl="fast").impl == "fused"
    with pytest.raises(ValueError, match="read_heads"):
        DNC(4, 3, read_heads=0)


def test_tiny_dnc_learns_copy():
    torch.manual_seed(0)
    task = CopyTask(min_len=1, max_len=3, bits=3)
    m = DNC(task.input_size, task.output_size, memory_slots=6, word_size=6, read_heads=1, controller_size=32)
    start, end = copy_cost_before_after(m, task)
    assert end < 0.65 * start


def test_fused_write_link_gradcheck():
    from memnets.ops.dnc import WriteLink

    g = torch.Generator().manual_seed(7)
    B, N, W, R = 2, 4, 3, 2

    def r(*shape):
        return (torch.rand(*shape, generator=g, dtype=D) * 0.5).requires_grad_()

    offdiag = 1 - torch.eye(N, dtype=D)
    args = (r(B, N, W), r(B, N, N), r(B, N), r(B, N), r(B, W), r(B, W), r(B, R, N), offdiag)
    assert torch.autograd.gradcheck(WriteLink.apply, args)


def _random_state(m, B, seed):
    g = torch.Generator().manual_seed(seed)
    s = m.init_state(B, dtype=D)
    return map_state(lambda z: (torch.rand(z.shape, generator=g, dtype=D) * 0.3).requires_grad_(), s)


@pytest.mark.parametrize("layers,T,R", [(1, 1, 1), (1, 6, 2), (2, 5, 3), (3, 4, 2)])
def test_scan_equals_reference_with_state_grads(layers, T, R):
    """The whole-sequence Function (impl="fused") against the per-equation reference in float64:
    outputs, final state, and gradients of every parameter, the input and the initial state."""
    m = _tiny(controller_layers=layers, read_heads=R).double()
    x = torch.randn(3, T, 4, dtype=D, generator=torch.Generator().manual_seed(1))
    results = []
    for impl in ("fused", "reference"):
        m.impl = impl
        m.zero_grad()
        xi = x.clone().requires_grad_()
        s0 = _random_state(m, 3, 5)
        y, s = m(xi, s0)
        loss = (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=D)).sum()
        for i, t in enumerate(torch.utils._pytree.tree_leaves(s)):
            loss = loss + (t * torch.randn(t.shape, generator=torch.Generator().manual_seed(10 + i), dtype=D)).sum()
        loss.backward()
        results.append((y.detach(), [t.detach() for t in torch.utils._pytree.tree_leaves(s)], xi.grad,
                        {n: p.grad for n, p in m.named_parameters()}, [t.grad for t in torch.utils._pytree.tree_leaves(s0)]))
    (y1, s1, gx1, gp1, gs1), (y2, s2, gx2, gp2, gs2) = results
    torch.testing.assert_close(y1, y2)
    for a, b in zip(s1, s2):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gx1, gx2)
    for n in gp1:
        torch.testing.assert_close(gp1[n], gp2[n], msg=lambda msg: f"{n}: {msg}")
    for i, (a, b) in enumerate(zip(gs1, gs2)):
        torch.testing.assert_close(a, b, msg=lambda msg: f"initial state leaf {i}: {msg}")


def test_scan_backward_twice_with_retain_graph():
    m = _tiny().double()
    y, _ = m(torch.randn(2, 4, 4, dtype=D))
    g1 = torch.autograd.grad(y.sum(), m.interface.weight, retain_graph=True)[0]
    g2 = torch.autograd.grad(y.sum(), m.interface.weight)[0]
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("layers,lengths", [(1, None), (2, None), (1, [2, 3, 1]), (2, [1, 3, 3])],
                         ids=["1layer", "2layers", "1layer-lengths", "2layers-lengths"])
def test_scan_function_gradcheck(layers, lengths):
    """With ``lengths`` each sequence's final state is taken after its own last step."""
    from memnets.ops.dnc import DNCRecurrence

    g = torch.Generator().manual_seed(3)
    T, B, C, N, W, R = 3, 3, 3, 4, 3, 2
    I = (R + 1) * W + (R + 1) + 2 * W + R + 2 + 3 * R

    def r(*shape, scale=0.5):
        return ((torch.rand(*shape, generator=g, dtype=D) - 0.3) * scale).requires_grad_()

    def p(*shape):
        return (torch.rand(*shape, generator=g, dtype=D) * 0.4).requires_grad_()

    upper = [t for _ in range(layers - 1) for t in (r(4 * C, 2 * C), r(4 * C))]
    F = 2
    dims = (R, W) if lengths is None else (R, W, torch.tensor(lengths))
    args = (dims, r(B, T, F, scale=2.0), r(4 * C, F, scale=2.0), r(4 * C), r(I, C, scale=2.0), r(I, scale=2.0),
            r(B, layers, C), r(B, layers, C),
            r(B, N, W), p(B, N), p(B, N, N), p(B, N), p(B, R, N), p(B, N), r(B, R, W), r(4 * C, R * W + C), *upper)
    assert torch.autograd.gradcheck(DNCRecurrence.apply, args)


def test_scan_two_graphs_alive_and_no_grad():
    """Workspaces are pooled per shape: two forwards before their backwards, and inference
    under no_grad, must not share buffers."""
    from memnets.ops.dnc import clear_workspaces

    m = _tiny().double()
    x1, x2 = torch.randn(2, 5, 4, dtype=D), torch.randn(2, 5, 4, dtype=D)
    grads = {}
    for impl in ("fused", "reference"):
        m.impl = impl
        m.zero_grad()
        y1, _ = m(x1)
        y2, _ = m(x2)
        with torch.no_grad():
            m(x1)
        (y1.sum() + 2 * y2.sum()).backward()
        grads[impl] = [p.grad.clone() for p in m.parameters()]
    for a, b in zip(grads["fused"], grads["reference"]):
        torch.testing.assert_close(a, b)
    clear_workspaces()


def test_run_env_records_the_impl_each_memory_runs():
    from memnets.memories.fast_weights import FastWeightMemory
    from memnets.train.env import model_impls, run_env

    model = torch.nn.ModuleDict({"dnc": DNC(4, 3, impl="auto"), "fw": FastWeightMemory(8, impl="fused"),
                                 "ref": DNC(4, 3, impl="reference")})
    assert model_impls(model) == {"dnc": "fused", "fw": "fused", "ref": "reference"}
    env = run_env(torch.device("cpu"), model=model)
    assert env["impls"] == {"dnc": "fused", "fw": "fused", "ref": "reference"} and "nam_scan_impl" in env
    assert "impls" not in run_env(torch.device("cpu"))
