"""The implied ``S × S`` attention map of every attention layer of :mod:`memnets.attention`.

Every layer mixes its values linearly: before the output projection, head ``h`` at query
position ``t`` outputs ``Σ_s A[h, t, s] v_s``. The linear-cost layers never form ``A``; for a
short sample it is computed here explicitly (docs/maths.md §5, §6):

* softmax:  ``A = softmax(Q Kᵀ / √dh)`` (causal: ``s ≤ t``);
* NAM:      ``A = μ(Q) μ(K)ᵀ`` (signed, no normaliser);
* linear:   ``A[t, s] = φ(q_t)·φ(k_s) / Σ_s' φ(q_t)·φ(k_s')``, ``φ = elu + 1``;
* delta:    the fast-weight memory is linear in the values, so running the layer's own scan
  with one-hot values ``v_s = e_s`` returns row ``t`` of ``A`` as the read at step ``t``.

:func:`attention_map` holds ``layer._merge(A v) == layer(x)`` (checked by the tests).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ops import unit
from .trace import record_module_inputs

__all__ = ["attention_map", "collect_attention_maps"]


@torch.no_grad()
def attention_map(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``A [B, H, S, S]`` of ``layer`` (a :class:`~memnets.attention.MultiHeadBase`) on ``x [B, S, d_model]``.

    ``mask``: key-padding mask ``[B, S]`` (True = keep); masked keys get weight 0. Evaluation
    mode semantics (no dropout). Raises TypeError for an unknown layer kind.
    """
    from ..attention import DeltaRuleAttention, LinearAttention, NAMAttention, SoftmaxAttention
    from ..attention.delta import fast_weight_scan

    x, mask = layer._check(x, mask)
    B, S, _ = x.shape
    q, k, v = layer._project(x)  # [B, S, H, dh]
    keep = torch.ones(B, S, dtype=torch.bool, device=x.device) if mask is None else mask
    allowed = keep[:, None, None, :].expand(B, 1, S, S)  # [B, 1, S, S]
    if layer.causal:
        allowed = allowed & torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, S, dh]
    if isinstance(layer, SoftmaxAttention):
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(layer.head_dim)  # [B, H, S, S]
        scores = scores.masked_fill(~allowed, float("-inf"))
        A = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key -> 0
    elif isinstance(layer, NAMAttention):
        A = (unit(qh) @ unit(kh).transpose(-1, -2)).masked_fill(~allowed, 0.0)
    elif isinstance(layer, LinearAttention):
        fq, fk = F.elu(qh) + 1.0, F.elu(kh) + 1.0
        A = (fq @ fk.transpose(-1, -2)).masked_fill(~allowed, 0.0)
        A = A / A.sum(-1, keepdim=True).clamp_min(1e-6)
    elif isinstance(layer, DeltaRuleAttention):
        beta = torch.sigmoid(layer.beta(x))  # [B, S, H]
        eye = torch.eye(S, dtype=x.dtype, device=x.device)  # one-hot values e_s
        onehot = eye[None, :, None, :].expand(B, S, layer.num_heads, S)  # [B, S, H, S]
        rows, _ = fast_weight_scan(q, k, onehot, beta, feature_map=layer.feature_map, update_rule="delta",
                                   write_mask=mask, impl="reference")  # [B, S(t), H, S(s)]
        A = rows.transpose(1, 2)  # [B, H, S, S]
    else:
        raise TypeError(f"`layer` expected a softmax, NAM, linear or delta attention layer, got {type(layer).__name__}")
    return A


@torch.no_grad()
def collect_attention_maps(model: torch.nn.Module, *inputs, **kwargs) -> dict[str, torch.Tensor]:
    """Run ``model(*inputs, **kwargs)`` and return ``{module name: A [B, H, S, S]}`` for every
    attention layer inside it, computed from the exact input each layer received (pre-hooks).
    A layer called several times (Universal Transformer steps) gets ``name#i`` for call ``i``."""
    from ..attention import MultiHeadBase

    seen: dict[str, list] = {}
    for name, mod, args, kw in record_module_inputs(model, lambda m: isinstance(m, MultiHeadBase), *inputs, **kwargs):
        mask = args[1] if len(args) > 1 else kw.get("mask")
        seen.setdefault(name, []).append(attention_map(mod, args[0], mask))
    out = {}
    for name, maps in seen.items():
        for i, A in enumerate(maps):
            out[name if len(maps) == 1 else f"{name}#{i}"] = A
    return out
