"""DNC memory-access ops (docs/maths.md §8): worked example, hand loops, ranges, gradcheck, bad input."""
import pytest
import torch

from memnets.ops import (dnc_allocation, dnc_directional_weights, dnc_link, dnc_precedence, dnc_read_weights,
                         dnc_retention, dnc_usage, dnc_write_weighting)

D = torch.float64


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _simplex(*shape, g, scale=1.0):
    return torch.softmax(torch.randn(*shape, generator=g, dtype=D), -1) * scale


def test_allocation_worked_example():
    a = dnc_allocation(torch.tensor([0.4, 0.8, 0.1]))
    torch.testing.assert_close(a, torch.tensor([0.06, 0.008, 0.9]))


def test_allocation_hand_loop_and_range():
    g = _g(1)
    u = torch.rand(4, 7, generator=g, dtype=D)
    a = dnc_allocation(u)
    for b in range(4):
        order = sorted(range(7), key=lambda i: float(u[b, i]))
        prod = 1.0
        for i in order:
            assert abs(float(a[b, i]) - (1 - float(u[b, i])) * prod) < 1e-12
            prod *= float(u[b, i])
        assert abs(float(a[b].sum()) - (1 - float(u[b].prod()))) < 1e-12
    assert (a >= 0).all()
    # a fully used memory allocates nothing; an empty one allocates its first slot
    torch.testing.assert_close(dnc_allocation(torch.ones(3)), torch.zeros(3))
    torch.testing.assert_close(dnc_allocation(torch.zeros(3)), torch.tensor([1.0, 0.0, 0.0]))


def test_retention_usage_hand_and_range():
    g = _g(2)
    f = torch.rand(3, 2, generator=g, dtype=D)
    wr = _simplex(3, 2, 5, g=g)
    psi = dnc_retention(f, wr)
    torch.testing.assert_close(psi, (1 - f[:, 0, None] * wr[:, 0]) * (1 - f[:, 1, None] * wr[:, 1]))
    u_prev = torch.rand(3, 5, generator=g, dtype=D)
    ww = _simplex(3, 5, g=g)
    u = dnc_usage(u_prev, ww, psi)
    torch.testing.assert_close(u, (u_prev + ww - u_prev * ww) * psi)
    assert (u >= 0).all() and (u <= 1).all()
    # no free gate: usage only grows; a freed slot that was fully read returns to zero
    assert (dnc_usage(u_prev, ww, torch.ones(3, 5, dtype=D)) >= u_prev).all()
    freed = dnc_retention(torch.ones(1, 1), torch.tensor([[[0.0, 1.0]]]))
    torch.testing.assert_close(freed, torch.tensor([[1.0, 0.0]]))


def test_write_weighting_precedence():
    g = _g(3)
    c, a = _simplex(2, 4, g=g), _simplex(2, 4, g=g, scale=0.9)
    gw, ga = torch.rand(2, generator=g, dtype=D), torch.rand(2, generator=g, dtype=D)
    w = dnc_write_weighting(c, a, gw, ga)
    torch.testing.assert_close(w, gw[:, None] * (ga[:, None] * a + (1 - ga[:, None]) * c))
    assert (w.sum(-1) <= 1 + 1e-12).all()
    p_prev = _simplex(2, 4, g=g, scale=0.5)
    p = dnc_precedence(p_prev, w)
    torch.testing.assert_close(p, (1 - w.sum(-1, keepdim=True)) * p_prev + w)
    assert (p.sum(-1) <= 1 + 1e-12).all()


def test_link_hand_loop_zero_diagonal():
    g = _g(4)
    n = 5
    L_prev = torch.rand(2, n, n, generator=g, dtype=D) * 0.2
    L_prev = L_prev * (1 - torch.eye(n, dtype=D))
    p_prev = _simplex(2, n, g=g, scale=0.8)
    w = _simplex(2, n, g=g, scale=0.9)
    L = dnc_link(L_prev, p_prev, w)
    for b in range(2):
        for i in range(n):
            for j in range(n):
                ref = 0.0 if i == j else (1 - w[b, i] - w[b, j]) * L_prev[b, i, j] + w[b, i] * p_prev[b, j]
                assert abs(float(L[b, i, j]) - float(ref)) < 1e-12
    assert (L >= 0).all() and (L <= 1).all()


def test_link_records_write_order():
    # write slot 0, then slot 2 (one-hot): L[2, 0] = 1, forward from 0 reaches 2
    n = 3
    L = torch.zeros(1, n, n)
    p = torch.zeros(1, n)
    for slot in (0, 2):
        w = torch.zeros(1, n)
        w[0, slot] = 1.0
        L = dnc_link(L, p, w)
        p = dnc_precedence(p, w)
    assert float(L[0, 2, 0]) == 1.0 and float(L.sum()) == 1.0
    f, b = dnc_directional_weights(L, torch.tensor([[[1.0, 0.0, 0.0]]]))
    torch.testing.assert_close(f, torch.tensor([[[0.0, 0.0, 1.0]]]))
    f, b = dnc_directional_weights(L, torch.tensor([[[0.0, 0.0, 1.0]]]))
    torch.testing.assert_close(b, torch.tensor([[[1.0, 0.0, 0.0]]]))


def test_directional_and_read_weights_hand():
    g = _g(5)
    L = torch.rand(2, 4, 4, generator=g, dtype=D)
    wr = _simplex(2, 3, 4, g=g)
    f, b = dnc_directional_weights(L, wr)
    for h in range(3):
        torch.testing.assert_close(f[:, h], torch.einsum("bij,bj->bi", L, wr[:, h]))
        torch.testing.assert_close(b[:, h], torch.einsum("bij,bi->bj", L, wr[:, h]))
    c = _simplex(2, 3, 4, g=g)
    pi = _simplex(2, 3, 3, g=g)
    w = dnc_read_weights(c, f, b, pi)
    torch.testing.assert_close(w, pi[..., 0:1] * b + pi[..., 1:2] * c + pi[..., 2:3] * f)
    only_content = torch.tensor([0.0, 1.0, 0.0], dtype=D).expand(2, 3, 3)
    torch.testing.assert_close(dnc_read_weights(c, f, b, only_content), c)


def test_gradcheck_all_ops():
    g = _g(6)

    def r(*shape):
        return (torch.rand(*shape, generator=g, dtype=D) * 0.8 + 0.1).requires_grad_()

    assert torch.autograd.gradcheck(dnc_retention, (r(2, 3), r(2, 3, 4)))
    assert torch.autograd.gradcheck(dnc_usage, (r(2, 4), r(2, 4), r(2, 4)))
    assert torch.autograd.gradcheck(dnc_allocation, (r(2, 5),))
    assert torch.autograd.gradcheck(dnc_write_weighting, (r(2, 4), r(2, 4), r(2), r(2)))
    assert torch.autograd.gradcheck(dnc_precedence, (r(2, 4), r(2, 4)))
    assert torch.autograd.gradcheck(dnc_link, (r(2, 4, 4), r(2, 4), r(2, 4)))
    assert torch.autograd.gradcheck(dnc_directional_weights, (r(2, 4, 4), r(2, 3, 4)))
    assert torch.autograd.gradcheck(dnc_read_weights, (r(2, 3, 4), r(2, 3, 4), r(2, 3, 4), r(2, 3, 3)))


def test_zero_state_no_nan():
    u = torch.zeros(2, 4, requires_grad=True)
    a = dnc_allocation(u)
    (a * torch.arange(4.0)).sum().backward()
    assert torch.isfinite(a).all() and torch.isfinite(u.grad).all()


def test_bad_input_raises():
    with pytest.raises(ValueError, match="free_gates"):
        dnc_retention(torch.zeros(2, 2), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="write_weights_prev"):
        dnc_usage(torch.zeros(2, 4), torch.zeros(2, 5), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="link_prev"):
        dnc_link(torch.zeros(2, 4, 3), torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="read_modes"):
        dnc_read_weights(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 2))
    with pytest.raises(TypeError):
        dnc_allocation([0.1, 0.2])
