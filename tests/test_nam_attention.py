"""nam_attention (docs/maths.md §5) and linear_attention: chunked/linear forms vs quadratic references."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memnets.ops import linear_attention, nam_attention, nam_attention_quadratic, unit

D64 = torch.float64


def qkv(*lead, L=50, S=50, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, L, dk, generator=g, dtype=D64),
            torch.randn(*lead, S, dk, generator=g, dtype=D64),
            torch.randn(*lead, S, dv, generator=g, dtype=D64))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [1, 63, 64, 100])
def test_matches_quadratic_form(causal, S):
    q, k, v = qkv(2, 3, L=S, S=S, seed=S)
    expected = unit(q) @ unit(k).transpose(-1, -2)
    if causal:
        expected = expected.tril()
    expected = expected @ v
    torch.testing.assert_close(nam_attention(q, k, v, causal, chunk_size=16), expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(nam_attention_quadratic(q, k, v, causal), expected, rtol=0, atol=1e-10)


def test_drop_in_layout_like_sdpa_cross_attention():
    q, k, v = qkv(4, L=7, S=13)
    out = nam_attention(q, k, v)
    assert out.shape == F.scaled_dot_product_attention(q, k, v).shape == (4, 7, 6)


def test_causal_does_not_see_future():
    q, k, v = qkv(1, 2, L=40, S=40, seed=2)
    out = nam_attention(q, k, v, causal=True, chunk_size=8)
    t = 17
    k2, v2, q2 = k.clone(), v.clone(), q.clone()
    k2[..., t + 1:, :] += 5 * torch.randn_like(k2[..., t + 1:, :])
    v2[..., t + 1:, :] += 5
    q2[..., t + 1:, :] -= 3
    out2 = nam_attention(q2, k2, v2, causal=True, chunk_size=8)
    torch.testing.assert_close(out2[..., : t + 1, :], out[..., : t + 1, :], rtol=0, atol=1e-12)
    assert not torch.allclose(out2[..., t + 1:, :], out[..., t + 1:, :])


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = (t.requires_grad_() for t in qkv(1, L=9, S=9, dk=3, dv=2))
    assert torch.autograd.gradcheck(lambda a, b, c: nam_attention(a, b, c, causal, chunk_size=4), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, causal, chunk_size=4), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_matches_quadratic(causal):
    q, k, v = qkv(2, L=30, S=30, seed=4)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    A = fq @ fk.transpose(-1, -2)
    if causal:
        A = A.tril()
    expected = (A @ v) / (A.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(linear_attention(q, k, v, causal, chunk_size=8), expected, rtol=1e-10, atol=1e-10)


def test_zero_queries_and_keys_no_nan():
    q = torch.zeros(1, 2, 10, 4, requires_grad=True)
    k = torch.zeros(1, 2, 10, 4, requires_grad=True)
    v = torch.randn(1, 2, 10, 4, requires_grad=True)
    for causal in (False, True):
        out = nam_attention(q, k, v, causal)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


@pytest.mark.parametrize(
    "args, name",
    [
        ((torch.zeros(5), torch.zeros(5, 4), torch.zeros(5, 4)), "`query`"),
        ((torch.zeros(5, 4), torch.zeros(5, 3), torch.zeros(5, 4)), "`query`"),
        ((torch.zeros(5, 4), torch.zeros(5, 4), torch.zeros(6, 4)), "`value`"),
    ],
)
def test_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        nam_attention(*args)
    with pytest.raises(ValueError, match="same length"):
        nam_attention(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(5, 4), causal=True)


# ----------------------------------------------------------------------------- SDPA's keywords

SDPA_LIKE = [nam_attention, nam_attention_quadratic]


def test_sdpa_call_is_a_one_word_change():
    q, k, v = qkv(2, 3, L=70, S=70, seed=7)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    nam = nam_attention(q, k, v, is_causal=True)  # the same call, one word changed
    assert nam.shape == sdpa.shape
    torch.testing.assert_close(nam, nam_attention_quadratic(q, k, v, is_causal=True), rtol=0, atol=1e-10)
    # SDPA's positional order: attn_mask, dropout_p, is_causal, scale
    torch.testing.assert_close(nam_attention(q, k, v, None, 0.0, True, 0.5),
                               nam_attention_quadratic(q, k, v, None, 0.0, True, 0.5), rtol=0, atol=1e-10)


@pytest.mark.parametrize("fn", SDPA_LIKE)
@pytest.mark.parametrize("causal", [False, True])
def test_scale_multiplies_the_scores(fn, causal):
    q, k, v = qkv(2, L=20, S=20, seed=8)
    base = fn(q, k, v, is_causal=causal)
    torch.testing.assert_close(fn(q, k, v, is_causal=causal, scale=None), base, rtol=0, atol=0)  # None: 1
    torch.testing.assert_close(fn(q, k, v, is_causal=causal, scale=0.25), 0.25 * base, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="`scale` expected a number or None"):
        fn(q, k, v, scale="0.5")


@pytest.mark.parametrize("fn", SDPA_LIKE)
def test_causal_is_an_alias_of_is_causal(fn):
    q, k, v = qkv(1, L=12, S=12, seed=9)
    want = fn(q, k, v, is_causal=True)
    for call in (lambda: fn(q, k, v, causal=True), lambda: fn(q, k, v, True),
                 lambda: fn(q, k, v, is_causal=True, causal=True)):
        torch.testing.assert_close(call(), want, rtol=0, atol=0)
    torch.testing.assert_close(fn(q, k, v, causal=False), fn(q, k, v), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"`causal`=False and `is_causal`=True conflict"):
        fn(q, k, v, is_causal=True, causal=False)
    with pytest.raises(ValueError, match="conflicts"):
        fn(q, k, v, True, causal=False)


@pytest.mark.parametrize("fn", SDPA_LIKE)
def test_refuses_attn_mask_and_dropout(fn):
    q, k, v = qkv(1, L=6, S=6)
    name = fn.__name__
    for mask in (torch.ones(6, 6, dtype=torch.bool), torch.zeros(6, 6, dtype=D64)):
        with pytest.raises(ValueError, match=rf"^{name}: `attn_mask` is not supported: NAM attention is "
                                             r"linear-time .* supports only the causal mask, is_causal=True"):
            fn(q, k, v, attn_mask=mask)
    for p in (0.1, 1, -0.5):
        with pytest.raises(ValueError, match=rf"^{name}: `dropout_p` expected 0.0, got {p!r}"):
            fn(q, k, v, dropout_p=p)
    fn(q, k, v, attn_mask=None, dropout_p=0.0)  # SDPA's defaults are accepted
    fn(q, k, v, dropout_p=0)
