"""memnets.ops.permute: a gather of rows by a permutation whose backward is one gather."""
from __future__ import annotations

import pytest
import torch

from memnets.ops.permute import inverse_permutation, permute


def test_inverse_permutation_inverts():
    g = torch.Generator().manual_seed(0)
    p = torch.randperm(11, generator=g)
    inv = inverse_permutation(p)
    assert torch.equal(p[inv], torch.arange(11)) and torch.equal(inv[p], torch.arange(11))
    with pytest.raises(ValueError, match="1-D integer"):
        inverse_permutation(p.float())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_permute_matches_index_select_values_and_gradients(dim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, 7, generator=g, dtype=torch.float64, requires_grad=True)
    n = x.shape[dim]
    p = torch.randperm(n, generator=g)
    inv = inverse_permutation(p)
    y = permute(x, dim, p, inv)
    assert torch.equal(y, x.index_select(dim, p))
    w = torch.randn(y.shape, generator=g, dtype=torch.float64)
    (gx,) = torch.autograd.grad((y * w).sum(), x)
    (want,) = torch.autograd.grad((x.index_select(dim, p) * w).sum(), x)
    assert torch.equal(gx, want)
    assert torch.autograd.gradcheck(lambda t: permute(t, dim, p, inv), (x,))
    assert torch.autograd.gradgradcheck(lambda t: permute(t, dim, p, inv), (x,))


def test_permute_backward_is_one_gather():
    """The backward issues one op (the gather), not index_select's zero fill and index_add."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(8, 3, requires_grad=True)
    p = torch.randperm(8)
    y = permute(x, 0, p, inverse_permutation(p))
    g = torch.ones_like(y)
    with Ops() as ops:
        torch.autograd.grad(y, x, g)
    assert ops.names.count("index_select") == 1 and "index_add" not in ops.names and "zeros" not in ops.names


def test_permute_checks_sizes():
    x = torch.randn(4, 3)
    p = torch.randperm(4)
    with pytest.raises(ValueError, match=r"expected shape \[3\]"):
        permute(x, 1, p, inverse_permutation(p))
