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
    (ACTIONS, "all", "position", False, "gru", 1, 2, 5, 7),  # μ(H_w) on the key tape too
    (ACTIONS, "all", "position", True, "gru", 2, 1, 4, 1),
    (ACTIONS, "all", "transposed", False, "lstm", 1, 3, 6, 5),
    (NOJMP, "all", "position", False, "gru", 1, 2, 5, 4),
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


@pytest.mark.parametrize("order,transposed,unit_keys", [([0, 1, 2, 3], False, False), ([3, 0, 1, 2], True, False),
                                                        ([2, 0, 1], False, False), ([0, 1, 2, 3], False, True),
                                                        ([3, 0, 1, 2], True, True)])
def test_heads_gradcheck(order, transposed, unit_keys):
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
    if unit_keys:  # heads away from unit norm, so that μ(H_w) matters
        h0 = (2 * torch.softmax(torch.randn(N, 2, L, generator=g, dtype=DT), -1)).requires_grad_()
    for compiled in ((True,) if unit_keys else (True, False)):  # unit_keys: the C kernel only
        assert torch.autograd.gradcheck(
            lambda *a: nam_tm_heads(*a, order=order, transposed=transposed, compiled=compiled, unit_keys=unit_keys),
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


@pytest.mark.parametrize("mode", ["position", "transposed"])
def test_unit_key_heads_under_cpu_bf16_autocast(mode, monkeypatch):
    """normalize_heads="all" under bf16 autocast: the C kernel (float32 inside) is as close to
    the float32 gradients as the per-step loop under the same autocast. With unit heads the
    model itself is more sensitive to the bf16 projections (μ divides by small head norms):
    both paths are off by up to ~10% there, so the bound is relative to the loop."""
    import memnets.memories.nam_tm as nt

    def bf16_error():
        torch.manual_seed(0)
        m = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8, normalize_heads="all", key_tape_mode=mode)
        x = torch.randn(4, 12, 8)
        g = torch.autograd.grad(m(x)[0].square().sum(), list(m.parameters()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y2 = m(x)[0]
        assert y2.dtype == torch.bfloat16
        g2 = torch.autograd.grad(y2.float().square().sum(), list(m.parameters()))
        assert all(torch.isfinite(a).all() for a in g2)
        return max(float((a - b).norm() / b.norm()) for a, b in zip(g2, g))

    fused = bf16_error()
    monkeypatch.setattr(nt, "kernel_available", lambda like: False)
    loop = bf16_error()
    assert fused <= 1.25 * loop + 0.01, (fused, loop)


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


def test_unit_key_heads_keep_the_key_tape_bounded():
    """normalize_heads="all" writes the key tape at μ(H_w): a full write then reads back its key
    at that head (the erase is a projection), whatever the head's norm. With the raw head of
    norm 2 the same writes expand the tape threefold per step (K'h = 4k − 3Kh)."""
    from memnets.memories.nam_tm import nam_tm_step

    g = torch.Generator().manual_seed(7)
    C, L = 4, 6
    h = torch.zeros(L, dtype=DT)
    h[2] = 2.0  # a head of norm 2: the jump term can give such heads
    one = torch.tensor(1.0, dtype=DT)
    act = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=DT)  # NOOP: the heads stay
    norms = {}
    for nh in ("all", True):
        K = torch.zeros(C, L, dtype=DT)
        tape = torch.zeros(C, L, dtype=DT)
        for _ in range(12):
            k = unit(torch.randn(C, generator=g, dtype=DT))
            _, tape, K, _, _ = nam_tm_step(tape, K, h, h, k, k, k, one, one, one, act, act, normalize_heads=nh)
            if nh == "all":
                torch.testing.assert_close(K @ unit(h), k)  # the key just written, nothing else
        norms[nh] = float(K.norm())
    assert norms["all"] <= 1.0 + 1e-9
    assert norms[True] > 1e4


def test_unit_key_heads_without_the_kernel_run_the_step_loop(monkeypatch):
    """Where the C kernel is missing (CUDA, no compiler) normalize_heads="all" runs the per-step
    loop: the same numbers as the reference; the heads Function itself refuses it there."""
    import memnets.memories.nam_tm as nt

    torch.manual_seed(0)
    m = NAMTuringMachine(5, 8, num_tapes=2, tape_length=5, normalize_heads="all").double()
    x = torch.randn(2, 6, 5, dtype=DT)
    st = m.init_state(2, dtype=DT)
    st = NAMTMState(*(s + 0.3 * torch.randn_like(s) for s in st))
    y_kernel = m(x, st)[0]
    monkeypatch.setattr(nt, "kernel_available", lambda like: False)
    with monkeypatch.context() as mp:
        mp.setattr(nt, "nam_tm_heads", None)  # not called: the step loop runs
        y_loop = m(x, st)[0]
    m.impl = "reference"
    y_ref = m(x, st)[0]
    torch.testing.assert_close(y_loop, y_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y_kernel, y_ref, rtol=1e-10, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    act = torch.softmax(torch.randn(3, 2, 2, 4, generator=g, dtype=DT), -1)
    q = k = unit(torch.randn(3, 2, 4, generator=g, dtype=DT))
    p = torch.rand(3, 2, generator=g, dtype=DT)
    h0, K0 = torch.softmax(torch.randn(2, 2, 5, dtype=DT), -1), torch.zeros(2, 4, 5, dtype=DT)
    with pytest.raises(ValueError, match="unit_keys"):
        nam_tm_heads(act, q, k, p, p, h0, K0, [0, 1, 2, 3], compiled=False, unit_keys=True)


def test_normalize_heads_is_checked():
    with pytest.raises(ValueError, match="normalize_heads"):
        NAMTuringMachine(4, 8, num_tapes=2, normalize_heads="keys")
