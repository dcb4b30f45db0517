"""NAM primitives (docs/maths.md §1): the paper's theorems as property tests, and input checks."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memnets.ops import nam_read, nam_write, unit

D64 = torch.float64
small = st.integers(min_value=1, max_value=6)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
SETTINGS = settings(max_examples=25, deadline=None)


def _randn(*shape, seed):
    return torch.randn(*shape, dtype=D64, generator=torch.Generator().manual_seed(seed))


@SETTINGS
@given(b=small, dv=small, dk=small, seed=seeds)
def test_thm_3_1_write_then_read_returns_value(b, dv, dk, seed):
    M = _randn(b, dv, dk, seed=seed)
    k = unit(_randn(b, dk, seed=seed + 1))
    v = _randn(b, dv, seed=seed + 2)
    M2 = nam_write(M, k, v, 1.0, 1.0)
    torch.testing.assert_close(nam_read(M2, k, 1.0), v, rtol=1e-10, atol=1e-10)


@SETTINGS
@given(S=st.integers(1, 8), extra=st.integers(0, 4), dv=small, seed=seeds)
def test_thm_3_3_orthonormal_keys_store_everything(S, extra, dv, seed):
    dk = S + extra
    Q, _ = torch.linalg.qr(_randn(dk, dk, seed=seed))
    keys = Q[:, :S].T  # S orthonormal rows
    vals = _randn(S, dv, seed=seed + 1)
    M = torch.zeros(dv, dk, dtype=D64)
    for i in range(S):
        M = nam_write(M, keys[i], vals[i], 1.0, 1.0)
    torch.testing.assert_close(M, vals.T @ keys, rtol=1e-10, atol=1e-10)  # Σ v_i k_iᵀ
    for i in range(S):
        torch.testing.assert_close(nam_read(M, keys[i]), vals[i], rtol=1e-10, atol=1e-10)


@SETTINGS
@given(n_in=small, n_out=small, seed=seeds)
def test_cor_3_4_write_maps_x_to_y(n_in, n_out, seed):
    W = _randn(n_out, n_in, seed=seed)
    x = _randn(n_in, seed=seed + 1) + 0.1
    y = _randn(n_out, seed=seed + 2)
    nx = x.norm()
    W2 = nam_write(W, x / nx, y / nx, 1.0, 1.0)
    torch.testing.assert_close(W2 @ x, y, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(n=st.integers(2, 5), K=st.integers(1, 4), F=st.integers(2, 8), seed=seeds)
def test_thm_3_5_class_mean_write_is_cosine_classifier(n, K, F, seed):
    feats = _randn(n, K, F, seed=seed)
    W = torch.zeros(n, F, dtype=D64)  # values are one-hot class vectors, keys unit features
    for c in range(n):
        for j in range(K):
            W = nam_write(W, unit(feats[c, j]), torch.eye(n, dtype=D64)[c], 1.0 / K, 0.0)
    means = unit(feats).mean(1)  # class means of unit features
    torch.testing.assert_close(W, means, rtol=1e-10, atol=1e-10)
    x = _randn(7, F, seed=seed + 3)
    cos = torch.nn.functional.cosine_similarity(x[:, None], means[None], dim=-1, eps=1e-12)
    torch.testing.assert_close(unit(x) @ unit(W).T, cos, rtol=1e-9, atol=1e-9)


def test_delta_rule_identity():
    M, k, v, beta = _randn(3, 4, 5, seed=1), unit(_randn(3, 5, seed=2)), _randn(3, 4, seed=3), torch.rand(3, dtype=D64)
    delta = M + beta[:, None, None] * (v - (M @ k[..., None])[..., 0])[..., None] * k[:, None, :]
    torch.testing.assert_close(nam_write(M, k, v, beta, beta), delta)


def test_leading_batch_dims_and_per_element_probs():
    M = _randn(2, 3, 4, 5, seed=0)
    k, q, v = unit(_randn(2, 3, 5, seed=1)), unit(_randn(2, 3, 5, seed=2)), _randn(2, 3, 4, seed=3)
    pw, pe, pr = (torch.rand(2, 3, dtype=D64) for _ in range(3))
    out = nam_read(nam_write(M, k, v, pw, pe), q, pr)
    for i in range(2):
        for j in range(3):
            Mij = M[i, j] + pw[i, j] * torch.outer(v[i, j], k[i, j]) - pe[i, j] * torch.outer(M[i, j] @ k[i, j], k[i, j])
            torch.testing.assert_close(out[i, j], pr[i, j] * Mij @ q[i, j])


def test_unit_zero_vector_no_nan():
    x = torch.zeros(3, 4, dtype=D64, requires_grad=True)
    y = unit(x)
    y.sum().backward()
    assert torch.all(y == 0) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(unit(torch.tensor([3.0, 4.0])), torch.tensor([0.6, 0.8]))


def test_gradcheck_read_write():
    M = _randn(2, 3, 4, seed=0).requires_grad_()
    k, q = _randn(2, 4, seed=1).requires_grad_(), _randn(2, 4, seed=2).requires_grad_()
    v = _randn(2, 3, seed=3).requires_grad_()
    pw, pe, pr = (torch.rand(2, dtype=D64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(nam_write, (M, k, v, pw, pe))
    assert torch.autograd.gradcheck(nam_read, (M, q, pr))


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: nam_read(torch.zeros(4), torch.zeros(4)), "`M`"),
        (lambda: nam_read(torch.zeros(2, 3, 4), torch.zeros(2, 5)), "`q`"),
        (lambda: nam_write(torch.zeros(2, 3, 4), torch.zeros(2, 3), torch.zeros(2, 3), 1.0, 1.0), "`k`"),
        (lambda: nam_write(torch.zeros(2, 3, 4), torch.zeros(2, 4), torch.zeros(2, 4), 1.0, 1.0), "`v`"),
        (lambda: nam_write(torch.zeros(2, 3, 4), torch.zeros(2, 4), torch.zeros(2, 3), torch.ones(3), 1.0), "`p_w`"),
        (lambda: nam_read(torch.zeros(2, 3, 4), torch.zeros(2, 4), torch.ones(2, 1)), "`p_r`"),
    ],
)
def test_bad_input_names_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_non_tensor_raises_type_error():
    with pytest.raises(TypeError, match="`M`"):
        nam_read([[1.0]], torch.zeros(1))
