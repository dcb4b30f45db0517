"""Softmax (scaled dot-product) multi-head attention via ``F.scaled_dot_product_attention``.

    Attn(Q, K, V) = softmax(Q Kᵀ / √dh + mask) V            (docs/maths.md §5 / §10 baseline)

This is the quadratic baseline the linear-cost layers are compared against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.varlen import same_sequence_mask
from .base import MultiHeadBase

__all__ = ["SoftmaxAttention"]


class SoftmaxAttention(MultiHeadBase):
    """Multi-head softmax attention (SDPA), bidirectional or causal.

    ``forward(x [B, S, d_model], mask [B, S] bool (True = keep) or None, cu_seqlens=None)
    -> [B, S, d_model]`` (``cu_seqlens``: a packed batch, :mod:`memnets.attention.base`; an
    ``S × S`` block-diagonal mask, so quadratic like the rest).
    Dropout is applied to the attention weights (training only). A query row whose visible
    keys are all padded (e.g. causal with left padding) outputs zero before the output
    projection instead of NaN.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self._check(x, mask)
        offsets = self._packed(x, cu_seqlens)
        S = x.shape[1]
        q, k, v = (t.transpose(1, 2) for t in self._project(x))  # [B, H, S, dh]
        p = self.dropout if self.training else 0.0
        if mask is None and offsets is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        else:
            allowed = x.new_ones(1, 1, 1, S, dtype=torch.bool) if mask is None else mask[:, None, None, :]
            if offsets is not None:  # a packed batch: keys of the query's own sequence only
                allowed = allowed & same_sequence_mask(offsets, x.device)
            if self.causal:
                tri = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
                allowed = allowed & tri  # [B, 1, S, S]
            empty = ~allowed.any(dim=-1, keepdim=True)  # [B, 1, S or 1, 1]: rows with no key
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, dropout_p=p)
            y = y.masked_fill(empty, 0.0)
        return self._merge(y.transpose(1, 2))  # [B, S, H, dh] -> [B, S, D]
