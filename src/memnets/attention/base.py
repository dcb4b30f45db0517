"""Shared plumbing of the attention layers: projections, head split, mask checks.

Every layer of :mod:`memnets.attention` has the same interface::

    layer = Kind(d_model, num_heads, causal=False, dropout=0.0)
    y = layer(x, mask=None)          # x [B, S, d_model] -> y [B, S, d_model]

``mask`` is a key-padding mask ``[B, S]`` of booleans, ``True`` = keep. Padded keys never
contribute to any output; outputs at padded query positions are computed but meaningless.

Packed variable-length batches (flash-linear-attention's convention): ``layer(x, cu_seqlens=c)``
with ``x [1, T, d_model]`` holding N sequences one after the other and ``c`` the 1-D int32/int64
offsets ``[0, l₁, l₁ + l₂, …, T]`` runs every sequence as if alone (no token sees another
sequence's); see :mod:`memnets.ops.varlen`.
"""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_positive_int, check_shape, check_tensor
from ..ops.varlen import check_cu_seqlens

__all__ = ["MultiHeadBase", "check_mask"]


def check_mask(mask: object, batch: int, length: int) -> torch.Tensor | None:
    """Validate a key-padding mask: ``None`` or a bool tensor ``[B, S]`` (True = keep)."""
    if mask is None:
        return None
    check_shape("mask", mask, ["B", "S"], [batch, length])
    if mask.dtype != torch.bool:
        raise TypeError(f"`mask` expected a bool tensor [B, S] (True = keep), got {mask.dtype}")
    return mask


class MultiHeadBase(nn.Module):
    """Query/key/value projections ``d_model -> H × dh`` and an output projection.

    Args:
        d_model: model width, divisible by ``num_heads``.
        num_heads: number of heads ``H``; each head has ``dh = d_model / H`` channels.
        causal: whether position ``t`` may only see positions ``<= t``.
        dropout: dropout probability in [0, 1) (where it is applied depends on the kind).
    """

    def __init__(self, d_model: int, num_heads: int, causal: bool = False, dropout: float = 0.0):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"`d_model`={d_model} is not divisible by `num_heads`={num_heads}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"`dropout` expected a float in [0, 1), got {dropout!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.causal = bool(causal)
        self.dropout = float(dropout)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}, dropout={self.dropout}"

    def _check(self, x: object, mask: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_tensor("x", x)
        check_shape("x", x, ["B", "S", "d_model"], [None, None, self.d_model])
        if x.shape[1] == 0:
            raise ValueError(f"`x` expected a non-empty sequence [B, S>0, d_model], got {list(x.shape)}")
        return x, check_mask(mask, x.shape[0], x.shape[1])

    def _packed(self, x: torch.Tensor, cu_seqlens: object) -> list[int] | None:
        """The offsets of a packed batch (None without ``cu_seqlens``); ``x`` must be ``[1, T, d_model]``."""
        if cu_seqlens is None:
            return None
        offsets = check_cu_seqlens(cu_seqlens, x.shape[1])
        if x.shape[0] != 1:
            raise ValueError(
                f"`x` expected batch size 1 with `cu_seqlens` (the sequences concatenated along time, "
                f"[1, T, d_model]), got {list(x.shape)}"
            )
        return offsets

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, S, D] -> q, k, v`` each ``[B, S, H, dh]``."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 × [B, S, D]
        shape = x.shape[:2] + (self.num_heads, self.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)  # [B, S, H, dh]

    def _merge(self, y: torch.Tensor) -> torch.Tensor:
        """``y [B, S, H, dh] -> out(y) [B, S, D]``."""
        return self.out(y.flatten(-2))  # [B, S, D]
