"""Parameters read in another row order, with a one-op backward.

The fused recurrences read their weight rows in an order of their own (LSAM per head, the DNC's
interface by kind), so every call gathers the parameters' rows by a fixed permutation.
``x.index_select(dim, p)`` differentiates into a zero fill and an ``index_add`` (two launches on
CUDA, whatever ``p``); for a permutation the gradient is the same gather by the inverse
permutation, one ``index_select``: :func:`permute`.
"""
from __future__ import annotations

import torch

__all__ = ["permute", "inverse_permutation"]


def inverse_permutation(index: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[index[i]] = i`` for a permutation ``index`` of ``0 … n−1`` (1-D integers)."""
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"`index` expected a 1-D integer tensor, got {index.dtype} of shape {list(index.shape)}")
    inv = torch.empty_like(index)
    inv[index] = torch.arange(index.numel(), dtype=index.dtype, device=index.device)
    return inv


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, index, inverse):
        ctx.dim = dim
        ctx.save_for_backward(inverse)
        return x.index_select(dim, index)

    @staticmethod
    def backward(ctx, g):
        (inverse,) = ctx.saved_tensors
        return g.index_select(ctx.dim, inverse), None, None, None  # differentiable: double backward works


def permute(x: torch.Tensor, dim: int, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """``x.index_select(dim, index)`` for a permutation ``index`` of ``x``'s ``dim`` (``inverse``
    its :func:`inverse_permutation`), whose backward is one gather (``index_select`` by
    ``inverse``) instead of a zero fill and an ``index_add``. The caller vouches that ``index``
    is a permutation; sizes are checked."""
    n = x.shape[dim]
    if index.shape != (n,) or inverse.shape != (n,):
        raise ValueError(f"`index` and `inverse` expected shape [{n}] (x.shape[{dim}]), got "
                         f"{list(index.shape)} and {list(inverse.shape)}")
    return _Permute.apply(x, dim, index, inverse)
