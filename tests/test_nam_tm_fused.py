"""The fused NAM-TM (impl="fused": GRU controller, heads and key tape as hand-differentiated
loops, value tape by nam_scan) held to the per-step reference in float64: outputs, final
state, aux, and the gradients of every parameter, the input and the initial state; gradcheck
on both custom Functions."""
import pytest
import torch

from memnets.memories.nam_tm import ACTIONS, NAMTMState, NAMTuringMachine
from memnets.ops import unit
from memnets.ops.gru import gru_module_forward, gru_scan
from memnets.ops.nam_tm_heads import nam_tm_heads

DT = torch.float64
NOJMP = ("LEFT", "NOOP", "RIGHT")

CASES = [  # actions, normalize_heads, key_tape_mode, separate_erase, controller, layers, tapes, L, T
    (ACTIONS, False, "position", False, "gru", 1, 1, 5, 7),
    (ACTIONS, False, "position", False, "gru", 1, 2, 4, 1),  # T = 1
    (ACTIONS, True, "transposed", True, "lstm", 2, 2, 6, 5),
    (ACTIONS, True, "position", True, "gru", 2, 4, 3, 9),
    (NOJMP, False, "position", False, "gru", 2, 2, 5, 6),
    (NOJMP, True, "position", True, "gru", 1, 3, 7, 4),
    (("JUMP", "NOOP"), False, "transposed", False, "gru", 1, 2, 5, 3),
]


def _run(m, x, st, impl):
    m.impl = impl
    y, s2, aux = m(x, st, return_aux=True)
    g = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=g, dtype=DT)).sum()
    loss = loss + sum((z * torch.randn(z.shape, generator=g, dtype=DT)).sum() for z in s2)
    grads = torch.autograd.grad(loss, [x, *st, *m.parameters()])
    return y, s2, aux, grads


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_fused_matches_reference_float64(case):
    actions, nh, mode, sep, ctrl, layers, tapes, L, T = case
    torch.manual_seed(0)
    m = NAMTuringMachine(6, 4 * tapes, num_tapes=tapes, tape_length=L, actions=actions, controller=ctrl,
                         num_layers=layers, normalize_heads=nh, separate_erase=sep, key_tape_mode=mode).double()
    x = torch.randn(3, T, 6, dtype=DT, requires_grad=True)
    st = m.init_state(3, dtype=DT)
    st = NAMTMState(*(s + 0.3 * torch.randn_like(s) for s in st))  # a non-trivial initial state
    for s in st:
        s.requires_grad_(True)
    ref, fus = _run(m, x, st, "reference"), _run(m, x, st, "fused")
    torch.testing.assert_close(fus[0], ref[0], rtol=1e-10, atol=1e-12)
    for a, b in zip(fus[1], ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(fus[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    names = ["x", "tape", "key_tape", "h_r", "h_w"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, fus[3], ref[3]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda s, n=name: f"grad of {n}: {s}")


def test_auto_is_fused_and_impl_is_checked():
    m = NAMTuringMachine(4, 8, num_tapes=2)
    assert m.impl == "auto"
    with pytest.raises(ValueError, match="impl"):
        NAMTuringMachine(4, 8, impl="fast")
    with pytest.raises(ValueError, match="impl"):
        m.impl = "chunked"


@pytest.mark.parametrize("order,transposed", [([0, 1, 2, 3], False), ([3, 0, 1, 2], True), ([2, 0, 1], False)])
def test_heads_gradcheck(order, transposed):
    g = torch.Generator().manual_seed(3)
    T, N, C, L = 4, 3, 3, 4
    A = len(order)
    act = torch.softmax(torch.randn(T, N, 2, A, generator=g, dtype=DT), -1).requires_grad_()
    q = unit(torch.randn(T, N, C, generator=g, dtype=DT)).requires_grad_()
    k = unit(torch.randn(T, N, C, generator=g, dtype=DT)).requires_grad_()
    pw = torch.rand(T, N, generator=g, dtype=DT).requires_grad_()
    pe = torch.rand(T, N, generator=g, dtype=DT).requires_grad_()
    h0 = torch.softmax(torch.randn(N, 2, L, generator=g, dtype=DT), -1).requires_grad_()
    K0 = torch.randn(N, C, L, generator=g, dtype=DT).requires_grad_()
    for compiled in (True, False):
        assert torch.autograd.gradcheck(
            lambda *a: nam_tm_heads(*a, order=order, transposed=transposed, compiled=compiled),
            (act, q, k, pw, pe, h0, K0))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_gru_matches_torch_and_gradcheck(bidirectional):
    torch.manual_seed(0)
    gru = torch.nn.GRU(5, 4, batch_first=True, bidirectional=bidirectional).double()
    x = torch.randn(3, 7, 5, dtype=DT, requires_grad=True)
    y = gru(x)[0]
    w = torch.randn_like(y)
    ref = torch.autograd.grad((y * w).sum(), [x, *gru.parameters()])
    for compiled in (True, False):
        y2 = gru_module_forward(gru, x, compiled=compiled)
        torch.testing.assert_close(y2, y, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad((y2 * w).sum(), [x, *gru.parameters()]), ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    D = 2 if bidirectional else 1
    g = torch.Generator().manual_seed(4)
    args = (torch.randn(4, D, 2, 9, generator=g, dtype=DT, requires_grad=True),
            (0.5 * torch.randn(D, 9, 3, generator=g, dtype=DT)).requires_grad_(),
            torch.randn(D, 9, generator=g, dtype=DT, requires_grad=True),
            torch.randn(D, 2, 3, generator=g, dtype=DT, requires_grad=True))
    assert torch.autograd.gradcheck(gru_scan, args)


def test_gru_module_forward_rejects_other_shapes():
    with pytest.raises(ValueError, match="one-layer"):
        gru_module_forward(torch.nn.GRU(3, 4, num_layers=2, batch_first=True), torch.randn(2, 3, 3))


def test_fused_float32_close_to_reference_and_trains():
    torch.manual_seed(0)
    m = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8, normalize_heads=True)
    x = torch.randn(4, 12, 8)
    m.impl = "reference"
    y_ref = m(x)[0]
    m.impl = "fused"
    torch.testing.assert_close(m(x)[0], y_ref, rtol=1e-4, atol=1e-5)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    target = torch.randn(4, 12, 16)
    losses = []
    for _ in range(30):
        loss = ((m(x)[0] - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("kw", [{}, {"normalize_heads": True, "key_tape_mode": "transposed", "separate_erase": True},
                                {"actions": NOJMP}, {"controller": "lstm"}])
def test_fused_under_cpu_bf16_autocast(kw):
    """Forward and backward under bf16 autocast: the tape loops run in float32 inside, so the
    gradients stay within bf16 rounding of the float32 ones."""
    torch.manual_seed(0)
    m = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8, **kw)
    x = torch.randn(4, 12, 8)
    y = m(x)[0]
    g = torch.autograd.grad(y.square().sum(), list(m.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y2 = m(x)[0]
    assert y2.dtype == torch.bfloat16
    g2 = torch.autograd.grad(y2.float().square().sum(), list(m.parameters()))
    torch.testing.assert_close(y2.float(), y, rtol=0.05, atol=0.02)
    for a, b in zip(g2, g):
        assert torch.isfinite(a).all()
        assert (a - b).norm() <= 0.06 * b.norm() + 1e-6


def test_pooled_key_tapes_are_never_shared_between_live_graphs():
    """The per-step key tapes come from a workspace pool: two graphs alive at once, a second
    backward through a retained graph, and evaluation without a graph all give the gradients
    of a fresh model."""
    torch.manual_seed(0)
    m = NAMTuringMachine(6, 8, num_tapes=2, tape_length=6).double()
    x1, x2 = (torch.randn(2, 7, 6, dtype=DT) for _ in range(2))

    def grads(x):
        m.zero_grad()
        m(x)[0].pow(2).sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    g1, g2 = grads(x1), grads(x2)
    m.zero_grad()
    y1, y2 = m(x1)[0], m(x2)[0]  # both graphs alive
    with torch.no_grad():
        m(x2)  # a forward without a graph in between
    y1.pow(2).sum().backward(retain_graph=True)
    for p, a in zip(m.parameters(), g1):
        torch.testing.assert_close(p.grad, a)
    m.zero_grad()
    y2.pow(2).sum().backward()
    for p, a in zip(m.parameters(), g2):
        torch.testing.assert_close(p.grad, a)
    m.zero_grad()
    y1.pow(2).sum().backward()  # the retained graph again: its workspace went back, it is recomputed
    for p, a in zip(m.parameters(), g1):
        torch.testing.assert_close(p.grad, a)


def test_fused_unit_matches_unit():
    """The fused path's μ (one-step backward) gives unit's values and gradients, zero and
    clamped rows included, and passes gradcheck."""
    from memnets.memories.nam_tm import _unit

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 6, generator=g, dtype=DT)
    x[0, 0] = 0.0  # zero vector
    x[1, 2] *= 1e-8  # norm below eps: clamped
    x.requires_grad_(True)
    w = torch.randn(3, 4, 6, generator=g, dtype=DT)
    y, y_ref = _unit(x), unit(x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    gx = torch.autograd.grad((y * w).sum(), x)[0]
    gx_ref = torch.autograd.grad((y_ref * w).sum(), x)[0]
    torch.testing.assert_close(gx, gx_ref, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(_unit, (torch.randn(2, 3, 5, generator=g, dtype=DT, requires_grad=True),))


def test_value_tape_chunks_are_equal_and_short():
    from memnets.memories.nam_tm import _scan_chunk

    for T in range(1, 300):
        c = _scan_chunk(T)
        n = -(-T // c)
        assert 1 <= c <= 32 and n == -(-T // 32) and n * c - T < n
