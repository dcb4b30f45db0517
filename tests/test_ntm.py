"""NTM module (docs/maths.md §7): shapes, state round trip, stabilisers, bad input, a tiny learning run."""
import pytest
import torch

import memnets
from memnets.memories.ntm import NTM, NTMState
from memnets.tasks.ntm_tasks import CopyTask

from helpers import copy_cost_before_after

D = torch.float64


def _tiny(**kw):
    torch.manual_seed(0)
    args = dict(memory_slots=8, word_size=5, controller_size=16)
    args.update(kw)
    return NTM(4, 3, **args)


def test_shapes_aux_and_registry():
    m = memnets.build_model("ntm", input_size=4, output_size=3, memory_slots=8, word_size=5, read_heads=2,
                            write_heads=2, controller_size=16, shift_range=2)
    assert isinstance(m, memnets.NTM)
    x = torch.randn(3, 6, 4)
    y, state, aux = m(x, return_aux=True)
    assert y.shape == (3, 6, 3)
    assert isinstance(state, NTMState) and state.memory.shape == (3, 8, 5)
    assert aux.read_weights.shape == (3, 6, 2, 8) and aux.write_weights.shape == (3, 6, 2, 8)
    assert aux.reads.shape == (3, 6, 2, 5)
    for w in (aux.read_weights, aux.write_weights):
        assert (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 6, 2))
    y2, _ = m(x)
    torch.testing.assert_close(y, y2)


def test_stabilisers():
    m = _tiny()
    s = m.init_state(2)
    assert torch.all(s.memory == 1e-6)
    C = 16
    assert torch.all(m.ctrl_x.bias[C:2 * C] == 1.0) and torch.all(m.ctrl_x.bias[:C] == 0.0)
    # the initial read / write weightings start focused on slot 0 (seed 002's fixed initial focus)
    for w in (s.read_weights, s.write_weights):
        assert torch.all(w.argmax(-1) == 0) and torch.all(w[..., 0] > 0.99)
    x = torch.randn(2, 4, 4)
    y, _ = m(x)
    y.sum().backward()
    for p in (m.h0, m.c0, m.r0, m.read_w0, m.write_w0):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("controller", ["lstm", "mlp"])
def test_whole_equals_halves_and_steps(controller):
    m = _tiny(controller=controller).double()
    x = torch.randn(2, 7, 4, dtype=D)
    y, s = m(x)
    y1, s1 = m(x[:, :3])
    y2, s2 = m(x[:, 3:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    for a, b in zip(s2, s):
        torch.testing.assert_close(a, b)
    st = None
    ys = []
    for t in range(7):
        yt, st = m.step(x[:, t], st)
        ys.append(yt)
    torch.testing.assert_close(torch.stack(ys, 1), y)


def test_zero_memory_no_nan():
    m = _tiny(memory_init=0.0)
    x = torch.zeros(2, 5, 4)
    y, s = m(x)
    y.sum().backward()
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_write_gate_bias_sets_each_write_heads_gate_logit_and_nothing_else():
    kw = dict(memory_slots=16, word_size=6, read_heads=2, write_heads=3)
    torch.manual_seed(0)
    plain = NTM(5, 4, **kw)
    torch.manual_seed(0)
    biased = NTM(5, 4, **kw, write_gate_bias=-2)
    P = 6 + 3 + 3  # per head: key [W], strength, gate, sharpening, 3 shifts
    changed = (plain.heads.bias != biased.heads.bias).nonzero().flatten().tolist()
    assert changed == [h * P + 6 + 1 for h in (2, 3, 4)]  # the write heads' gates, after the read heads
    assert torch.all(biased.heads.bias[changed] == -2.0) and biased.config.write_gate_bias == -2.0
    for (name, a), (_, b) in zip(plain.named_parameters(), biased.named_parameters()):
        assert name == "heads.bias" or torch.equal(a, b), name


@pytest.mark.parametrize("bias, focused", [(-30.0, True), (30.0, False)])
def test_write_gate_bias_moves_the_first_write_between_location_and_content(bias, focused):
    # head parameters = their biases: a gate near 0 keeps the write head on its focused start
    # (slot 0, shifted and sharpened); near 1 it takes the content weighting, uniform over a
    # memory whose every slot holds the same constant
    m = NTM(3, 2, memory_slots=16, word_size=4, write_gate_bias=bias)
    with torch.no_grad():
        m.heads.weight.zero_()
    _, _, aux = m(torch.randn(2, 1, 3), return_aux=True)
    w = aux.write_weights[:, 0, 0]  # [B, N]
    if focused:  # all of it on slot 0 and its neighbours (with the default random gate, 1-2% elsewhere)
        assert torch.all(w[:, [15, 0, 1]].sum(-1) > 1 - 1e-5) and torch.all(w[:, 2:15].sum(-1) < 1e-5)
    else:
        torch.testing.assert_close(w, torch.full_like(w, 1 / 16), atol=1e-4, rtol=0)


def test_bad_input_raises():
    m = _tiny()
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="state.memory"):
        s = m.init_state(2)
        m(torch.randn(2, 5, 4), s._replace(memory=torch.zeros(2, 7, 5)))
    with pytest.raises(TypeError):
        m(torch.randn(2, 5, 4), (1, 2))
    with pytest.raises(ValueError, match="controller"):
        NTM(4, 3, controller="gru")
    with pytest.raises(ValueError, match="memory_slots"):
        NTM(4, 3, memory_slots=0)
    for bad in (float("nan"), float("inf"), "low", True):
        with pytest.raises(ValueError, match="write_gate_bias"):
            NTM(4, 3, write_gate_bias=bad)


def test_tiny_ntm_learns_copy():
    torch.manual_seed(0)
    task = CopyTask(min_len=1, max_len=3, bits=3)
    m = NTM(task.input_size, task.output_size, memory_slots=8, word_size=6, controller_size=32)
    start, end = copy_cost_before_after(m, task)
    assert end < 0.65 * start
