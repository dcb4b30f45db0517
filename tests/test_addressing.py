"""NTM addressing ops (docs/maths.md §7): worked example, hand loops, simplex, degenerate input, gradcheck."""
import math

import pytest
import torch

from memnets.ops import (circular_shift, content_weights, cosine_similarity, erase_add_write, interpolate, sharpen,
                         weighted_read)

D = torch.float64


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_shift_worked_example():
    w = torch.tensor([1.0, 0, 0, 0])
    s = torch.tensor([0.2, 0.1, 0.7])  # P(-1), P(0), P(+1)
    torch.testing.assert_close(circular_shift(w, s), torch.tensor([0.1, 0.7, 0.0, 0.2]))


def test_shift_matches_hand_loop():
    g = _g(1)
    w = torch.rand(3, 6, generator=g, dtype=D)
    s = torch.softmax(torch.randn(3, 5, generator=g, dtype=D), -1)  # shifts -2..2
    out = circular_shift(w, s)
    ref = torch.zeros_like(w)
    for b in range(3):
        for i in range(6):
            for j in range(6):
                k = (i - j) % 6  # shift taking j to i
                for idx, shift in enumerate(range(-2, 3)):
                    if shift % 6 == k:
                        ref[b, i] += w[b, j] * s[b, idx]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out.sum(-1), w.sum(-1))


def test_content_weights_hand_loop_and_simplex():
    g = _g(2)
    M = torch.randn(2, 5, 4, generator=g, dtype=D)
    k = torch.randn(2, 4, generator=g, dtype=D)
    beta = torch.rand(2, generator=g, dtype=D) * 5
    w = content_weights(M, k, beta)
    for b in range(2):
        cos = torch.stack([torch.dot(M[b, i], k[b]) / (M[b, i].norm() * k[b].norm()) for i in range(5)])
        torch.testing.assert_close(w[b], torch.softmax(beta[b] * cos, -1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, dtype=D))
    assert (w >= 0).all()


def test_content_weights_head_form_equals_per_head():
    g = _g(3)
    M = torch.randn(2, 5, 4, generator=g, dtype=D)
    k = torch.randn(2, 3, 4, generator=g, dtype=D)
    beta = torch.rand(2, 3, generator=g, dtype=D)
    w = content_weights(M, k, beta)
    assert w.shape == (2, 3, 5)
    for h in range(3):
        torch.testing.assert_close(w[:, h], content_weights(M, k[:, h], beta[:, h]))


def test_zero_memory_and_key_no_nan():
    M = torch.zeros(2, 5, 4, requires_grad=True)
    k = torch.zeros(2, 4, requires_grad=True)
    beta = torch.ones(2, requires_grad=True)
    w = content_weights(M, k, beta)
    torch.testing.assert_close(w, torch.full((2, 5), 0.2))
    (w * torch.arange(5.0)).sum().backward()
    for t in (M, k, beta):
        assert torch.isfinite(t.grad).all()
    cos = cosine_similarity(torch.zeros(5, 4), torch.ones(4))
    assert torch.equal(cos, torch.zeros(5))


def test_sharpen_values_and_zero_input():
    w = torch.tensor([0.1, 0.6, 0.3], dtype=D)
    out = sharpen(w, torch.tensor(2.0, dtype=D).expand(()))
    torch.testing.assert_close(out, w ** 2 / (w ** 2).sum())
    z = torch.zeros(2, 4, requires_grad=True)
    gamma = torch.full((2,), 3.0, requires_grad=True)
    s = sharpen(z, gamma)
    torch.testing.assert_close(s, torch.full((2, 4), 0.25))
    (s * torch.arange(4.0)).sum().backward()
    assert torch.isfinite(z.grad).all() and torch.isfinite(gamma.grad).all()
    one_hot = sharpen(torch.tensor([0.0, 1.0, 0.0]), 5.0)
    torch.testing.assert_close(one_hot, torch.tensor([0.0, 1.0, 0.0]))


def test_interpolate():
    wc = torch.tensor([[1.0, 0.0]])
    wp = torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(interpolate(wc, wp, torch.tensor([0.25])), torch.tensor([[0.25, 0.75]]))
    torch.testing.assert_close(interpolate(wc, wp, 1.0), wc)


def test_read_and_write_hand_loops():
    g = _g(4)
    M = torch.randn(2, 5, 3, generator=g, dtype=D)
    w = torch.softmax(torch.randn(2, 2, 5, generator=g, dtype=D), -1)
    e = torch.rand(2, 2, 3, generator=g, dtype=D)
    a = torch.randn(2, 2, 3, generator=g, dtype=D)
    r = weighted_read(M, w)
    for b in range(2):
        for h in range(2):
            torch.testing.assert_close(r[b, h], sum(w[b, h, i] * M[b, i] for i in range(5)))
    torch.testing.assert_close(weighted_read(M, w[:, 0]), r[:, 0])
    M1 = erase_add_write(M, w[:, 0], e[:, 0], a[:, 0])
    ref = M.clone()
    for b in range(2):
        for i in range(5):
            ref[b, i] = M[b, i] * (1 - w[b, 0, i] * e[b, 0]) + w[b, 0, i] * a[b, 0]
    torch.testing.assert_close(M1, ref)
    M2 = erase_add_write(M, w, e, a)  # heads: erases multiply, adds sum
    ref2 = M * (1 - w[:, 0, :, None] * e[:, 0, None]) * (1 - w[:, 1, :, None] * e[:, 1, None]) \
        + w[:, 0, :, None] * a[:, 0, None] + w[:, 1, :, None] * a[:, 1, None]
    torch.testing.assert_close(M2, ref2)


def test_full_erase_then_add_stores_word():
    M = torch.randn(4, 3)
    w = torch.tensor([0.0, 1.0, 0.0, 0.0])
    a = torch.tensor([1.0, 2.0, 3.0])
    M1 = erase_add_write(M, w, torch.ones(3), a)
    torch.testing.assert_close(M1[1], a)
    torch.testing.assert_close(M1[[0, 2, 3]], M[[0, 2, 3]])
    torch.testing.assert_close(weighted_read(M1, w), a)


def test_gradcheck_all_ops():
    g = _g(5)

    def r(*shape, pos=False):
        t = torch.rand(*shape, generator=g, dtype=D) + 0.1 if pos else torch.randn(*shape, generator=g, dtype=D)
        return t.requires_grad_()

    M, k, beta = r(2, 5, 3), r(2, 3), r(2, pos=True)
    assert torch.autograd.gradcheck(content_weights, (M, k, beta))
    assert torch.autograd.gradcheck(content_weights, (M, r(2, 2, 3), r(2, 2, pos=True)))
    wc, wp, gate = r(2, 5, pos=True), r(2, 5, pos=True), r(2, pos=True)
    assert torch.autograd.gradcheck(interpolate, (wc, wp, gate))
    assert torch.autograd.gradcheck(circular_shift, (wc, r(2, 3, pos=True)))
    assert torch.autograd.gradcheck(sharpen, (wc, r(2, pos=True)))
    assert torch.autograd.gradcheck(weighted_read, (M, r(2, 2, 5, pos=True)))
    assert torch.autograd.gradcheck(erase_add_write, (M, r(2, 5, pos=True), r(2, 3, pos=True), r(2, 3)))
    assert torch.autograd.gradcheck(erase_add_write, (M, r(2, 2, 5, pos=True), r(2, 2, 3, pos=True), r(2, 2, 3)))


def test_bad_input_raises():
    M = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match="key"):
        content_weights(M, torch.zeros(2, 4), torch.ones(2))
    with pytest.raises(ValueError, match="strength"):
        content_weights(M, torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="s"):
        circular_shift(torch.zeros(2, 5), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="erase"):
        erase_add_write(M, torch.zeros(2, 5), torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(TypeError):
        weighted_read(M, [0.2] * 5)
    with pytest.raises(ValueError, match="memory"):
        weighted_read(torch.zeros(5), torch.zeros(5))
    assert math.isclose(float(sharpen(torch.tensor([1.0, 1.0]), 2.0)[0]), 0.5)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 9), shifts=st.integers(0, 3), gamma=st.floats(1.0, 20.0))
def test_pipeline_stays_on_simplex(seed, n, shifts, gamma):
    g = _g(seed)
    M = torch.randn(2, n, 3, generator=g, dtype=D)
    w = content_weights(M, torch.randn(2, 3, generator=g, dtype=D), torch.rand(2, generator=g, dtype=D) * 10)
    w = interpolate(w, torch.softmax(torch.randn(2, n, generator=g, dtype=D), -1), torch.rand(2, generator=g, dtype=D))
    shifts = min(shifts, (n - 1) // 2)  # 2n+1 <= N
    w = circular_shift(w, torch.softmax(torch.randn(2, 2 * shifts + 1, generator=g, dtype=D), -1))
    w = sharpen(w, gamma)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, dtype=D))
