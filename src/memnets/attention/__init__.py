"""Attention layers with one interface (docs/maths.md §5, §6, §10).

``layer(x [B, S, d_model], mask=None) -> [B, S, d_model]``, ``mask`` a key-padding mask
``[B, S]`` of booleans (True = keep). Kinds:

* ``"softmax"`` — :class:`SoftmaxAttention`, scaled dot-product (quadratic baseline);
* ``"nam"`` — :class:`NAMAttention`, ``μ(Q)(μ(K)ᵀV)``, linear in S;
* ``"linear"`` — :class:`LinearAttention`, elu+1 with normaliser, linear in S;
* ``"delta"`` — :class:`DeltaRuleAttention`, delta-rule fast weights, causal only.

Example::

    from memnets.attention import build_attention
    layer = build_attention("nam", d_model=64, num_heads=4, causal=True)
    y = layer(torch.randn(2, 10, 64))           # [2, 10, 64]
"""
from __future__ import annotations

from torch import nn

from ..registry import register_model
from .base import MultiHeadBase, check_mask
from .delta import (
    UPDATE_RULES,
    DeltaAttentionState,
    DeltaRuleAttention,
    fast_weight_scan,
    fast_weight_step,
)
from .feature_maps import FEATURE_MAPS, dpfp_feature_map, elu_sum_feature_map, feature_dim, get_feature_map
from .linear_family import LinearAttention, NAMAttention
from .softmax import SoftmaxAttention

__all__ = [
    "ATTENTION_KINDS", "build_attention", "MultiHeadBase", "check_mask",
    "SoftmaxAttention", "NAMAttention", "LinearAttention", "DeltaRuleAttention", "DeltaAttentionState",
    "fast_weight_scan", "fast_weight_step", "UPDATE_RULES",
    "FEATURE_MAPS", "get_feature_map", "feature_dim", "elu_sum_feature_map", "dpfp_feature_map",
]

ATTENTION_KINDS = {
    "softmax": SoftmaxAttention,
    "nam": NAMAttention,
    "linear": LinearAttention,
    "delta": DeltaRuleAttention,
}

# Attention layers can be built by name too, e.g. build_model("attn_nam", d_model=64, num_heads=4).
for _kind, _cls in ATTENTION_KINDS.items():
    register_model(f"attn_{_kind}")(_cls)


def build_attention(
    kind: str, d_model: int, num_heads: int, causal: bool = False, dropout: float = 0.0, **options
) -> nn.Module:
    """Build the attention layer ``kind`` (one of ``"softmax"``, ``"nam"``, ``"linear"``,
    ``"delta"``); ``"delta"`` requires ``causal=True``. ``options`` go to the layer's
    constructor (e.g. ``feature_map="dpfp2"`` for ``"delta"``)."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"`kind` expected one of {tuple(ATTENTION_KINDS)}, got {kind!r}")
    return ATTENTION_KINDS[kind](d_model, num_heads, causal=causal, dropout=dropout, **options)
