"""Linear-cost attention layers: NAM (normalized outer product) and the Linear Transformer.

    NAM:    Y = μ(Q) (μ(K)ᵀ V)                               (docs/maths.md §5, no scaling, no normaliser)
    Linear: Y = φ(Q)(φ(K)ᵀ V) / (φ(Q) Σ_s φ(k_s)),  φ = elu + 1   (Katharopoulos et al. 2020)

Both never build an ``S × S`` tensor (the causal forms use chunked prefix states).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops import linear_attention, nam_attention
from ..ops.varlen import keys_seen
from .base import MultiHeadBase

__all__ = ["NAMAttention", "LinearAttention"]


def _chunk_size(head_dim: int) -> int:
    """Chunk length of the causal prefix-state form: about the head size, in [32, 64]
    (measured fastest on CPU for dh = 16, 32, 64 at S = 2000)."""
    return 32 if head_dim <= 32 else 64


class NAMAttention(MultiHeadBase):
    """Multi-head normalized outer-product attention ``μ(Q)(μ(K)ᵀV)`` (docs/maths.md §5).

    ``forward(x [B, S, d_model], mask [B, S] bool (True = keep) or None, cu_seqlens=None)
    -> [B, S, d_model]`` (``cu_seqlens``: a packed batch, :mod:`memnets.attention.base`; the
    bidirectional form then sums over each sequence's own keys).
    Bidirectional (the paper's form) or causal (prefix sums of ``μ(k_s) v_sᵀ``). Padding is
    handled by zeroing masked keys and values, so they add nothing to ``μ(K)ᵀV``. Dropout
    is applied to the mixed values before the output projection (there are no attention
    weights to drop). Cost ``O(S·dh²)`` per head.

    ``length_norm=True`` (not in docs/maths.md §5, off by default) divides each output by the number
    of keys it sums over (the valid keys; position t's t + 1 in the causal form), so the
    output scale no longer grows with the sequence length: without it the output norm is
    about 30× that of softmax attention at length 200 and 300× at length 2000.
    """

    def __init__(self, d_model: int, num_heads: int, causal: bool = False, dropout: float = 0.0,
                 length_norm: bool = False):
        super().__init__(d_model, num_heads, causal=causal, dropout=dropout)
        self.length_norm = bool(length_norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self._check(x, mask)
        offsets = self._packed(x, cu_seqlens)
        q, k, v = self._project(x)  # [B, S, H, dh]
        if mask is not None:
            keep = mask[:, :, None, None].to(k.dtype)  # [B, S, 1, 1]
            k, v = k * keep, v * keep
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, dh]
        y = nam_attention(q, k, v, causal=self.causal, chunk_size=_chunk_size(self.head_dim),
                          cu_seqlens=cu_seqlens)  # [B, H, S, dh]
        if self.length_norm:
            B, S = x.shape[0], x.shape[1]
            valid = x.new_ones(B, S) if mask is None else mask.to(x.dtype)  # [B, S]
            if offsets is not None:  # keys of the token's own sequence (B = 1)
                n = keys_seen(valid[0], offsets, self.causal)[None]
            else:
                n = valid.cumsum(1) if self.causal else valid.sum(1, keepdim=True).expand(B, S)  # keys summed
            y = y / n.clamp_min(1.0)[:, None, :, None]
        y = F.dropout(y, self.dropout, self.training)
        return self._merge(y.transpose(1, 2))  # [B, S, H, dh] -> [B, S, D]


class LinearAttention(MultiHeadBase):
    """Multi-head Linear Transformer attention, ``φ(x) = elu(x) + 1`` with normaliser.

    ``forward(x [B, S, d_model], mask [B, S] bool (True = keep) or None, cu_seqlens=None)
    -> [B, S, d_model]`` (``cu_seqlens``: a packed batch, :mod:`memnets.attention.base`).
    A padded key gets ``φ(k) = 0`` (its pre-activation is set to ``−∞``, and
    ``elu(−∞) + 1 = 0`` with zero gradient), so it enters neither numerator nor normaliser.
    Dropout is applied to the mixed values before the output projection.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self._check(x, mask)
        self._packed(x, cu_seqlens)
        q, k, v = self._project(x)  # [B, S, H, dh]
        if mask is not None:
            k = k.masked_fill(~mask[:, :, None, None], float("-inf"))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, dh]
        y = linear_attention(q, k, v, causal=self.causal, chunk_size=_chunk_size(self.head_dim),
                             cu_seqlens=cu_seqlens)  # [B, H, S, dh]
        y = F.dropout(y, self.dropout, self.training)
        return self._merge(y.transpose(1, 2))  # [B, S, H, dh] -> [B, S, D]
