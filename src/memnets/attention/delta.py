"""Delta-rule fast-weight programmer (docs/maths.md §6, Schlag et al. 2021) as an attention layer.

Per head, with a sum-normalised feature map φ and ``β_t = σ(W_β x_t)``::

    v̄_t = W_{t-1} φ(k_t)
    W_t  = W_{t-1} + β_t (v_t − v̄_t) ⊗ φ(k_t)          (update_rule="delta")
    W_t  = W_{t-1} + v_t ⊗ φ(k_t)                       (update_rule="sum")
    y_t  = W_t φ(q_t)

The delta write is the NAM write with ``p_w = p_e = β`` (docs/maths.md §1), so the whole sequence
runs through :func:`memnets.ops.nam_scan` (chunkwise-parallel by default); the sum rule is
``p_w = 1, p_e = 0``. Fast weights are ``[B, H, dv, dφ]``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_shape
from ..ops import nam_scan, nam_step
from ..ops._impl import check_impl, nam_scan_impl
from .base import MultiHeadBase
from .feature_maps import feature_dim, get_feature_map

__all__ = ["UPDATE_RULES", "fast_weight_scan", "fast_weight_step", "DeltaAttentionState", "DeltaRuleAttention"]

UPDATE_RULES = ("delta", "sum")


def _write_probs(beta, update_rule, lead, ref, name="beta"):
    """(p_w, p_e) for nam_scan / nam_step from β ``lead``-shaped, or the sum rule."""
    if update_rule == "delta":
        if beta is None:
            raise ValueError(f"`{name}` is required for update_rule='delta'")
        check_shape(name, beta, ["B", "T", "H"] if len(lead) == 3 else ["B", "H"], list(lead))
        beta = beta.to(ref.dtype)
        return beta, beta
    if update_rule == "sum":
        return ref.new_ones(lead), ref.new_zeros(lead)
    raise ValueError(f"`update_rule` expected one of {UPDATE_RULES}, got {update_rule!r}")


def fast_weight_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    *,
    feature_map: str = "elu",
    update_rule: str = "delta",
    write_mask: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    impl: str = "auto",
    chunk_size: int = 32,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run fast weights over a sequence (docs/maths.md §6), read after write.

    Args:
        q, k: raw queries / keys ``[B, T, H, dk]`` (φ is applied here).
        v: values ``[B, T, H, dv]``.
        beta: write strengths ``[B, T, H]`` in [0, 1] (delta rule); ignored by the sum rule.
        feature_map: ``"elu"`` or ``"dpfp1"``/``"dpfp2"``/``"dpfp3"`` (sum-normalised).
        update_rule: ``"delta"`` or ``"sum"``.
        write_mask: ``[B, T]`` bool, ``False`` = that step writes nothing.
        initial_state: fast weights ``[B, H, dv, dφ]`` or ``None`` (zeros).
        impl, chunk_size: passed to :func:`memnets.ops.nam_scan`.
        cu_seqlens: a packed batch (B = 1, offsets ``[0, l₁, …, T]``), passed to
            :func:`memnets.ops.nam_scan`: ``initial_state`` and the final weights are then
            ``[N, H, dv, dφ]``, one per sequence.
    Returns:
        ``(y [B, T, H, dv], final weights [B, H, dv, dφ])``.
    """
    phi = get_feature_map(feature_map)
    check_shape("k", k, ["B", "T", "H", "dk"], [None] * 4)
    B, T, H, _ = k.shape
    p_w, p_e = _write_probs(beta, update_rule, (B, T, H), k)
    if write_mask is not None:
        check_shape("write_mask", write_mask, ["B", "T"], [B, T])
        keep = write_mask.to(k.dtype).unsqueeze(-1)  # [B, T, 1]
        p_w, p_e = p_w * keep, p_e * keep
    return nam_scan(phi(q), phi(k), v, p_w, p_e, None, initial_state=initial_state, impl=impl, chunk_size=chunk_size,
                    cu_seqlens=cu_seqlens)


def fast_weight_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    state: torch.Tensor | None,
    *,
    feature_map: str = "elu",
    update_rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of :func:`fast_weight_scan`: q, k ``[B, H, dk]``, v ``[B, H, dv]``,
    beta ``[B, H]``, state ``[B, H, dv, dφ]`` → ``(y [B, H, dv], new state)``."""
    phi = get_feature_map(feature_map)
    check_shape("k", k, ["B", "H", "dk"], [None] * 3)
    p_w, p_e = _write_probs(beta, update_rule, tuple(k.shape[:2]), k)
    return nam_step(phi(q), phi(k), v, p_w, p_e, None, initial_state=state)


class DeltaAttentionState(NamedTuple):
    """Carried state of :class:`DeltaRuleAttention`: ``weights [B, H, dh, dφ]``."""

    weights: torch.Tensor


class DeltaRuleAttention(MultiHeadBase):
    """Delta-rule fast-weight attention layer (docs/maths.md §6), causal only.

    ``forward(x [B, S, d_model], mask=None, state=None, return_state=False)`` returns
    ``y [B, S, d_model]`` (or ``(y, DeltaAttentionState)`` with ``return_state=True``).
    ``β = σ(W_β x)`` per head; φ is sum-normalised elu+1 (``feature_map="elu"``) or DPFP-ν.
    Padded steps (``mask`` False) do not write (β = 0). Dropout is applied to the read
    values before the output projection. Running a sequence whole equals running it in
    pieces passing ``state`` along, and equals ``step(x_t, state)`` token by token.
    ``forward(x, cu_seqlens=c)`` runs a packed batch (``x [1, T, d_model]``, offsets ``c``, see
    :mod:`memnets.attention.base`): each sequence from its own ``state.weights[n]``
    (``[N, H, dh, dφ]``), returning one final state per sequence.

    Args:
        d_model, num_heads, dropout: as every attention layer.
        causal: must be True (a fast-weight memory reads what was written so far).
        feature_map: ``"elu"``, ``"dpfp1"``, ``"dpfp2"`` or ``"dpfp3"``.
        impl: ``"auto"`` (default: :func:`memnets.ops.nam_scan` picks per call), ``"fused"``
            (the chunkwise-parallel scan) or ``"reference"`` (the time loop); ``"chunked"``, the
            old name of ``"fused"``, is accepted with a FutureWarning.
        chunk_size: chunk length of the chunked scan (32 measured fastest on CPU for
            head sizes 16 to 64 at S = 2000).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        causal: bool = True,
        dropout: float = 0.0,
        *,
        feature_map: str = "elu",
        impl: str = "auto",
        chunk_size: int = 32,
    ):
        if not causal:
            raise ValueError("DeltaRuleAttention is causal only: `causal` must be True")
        super().__init__(d_model, num_heads, causal=True, dropout=dropout)
        self.feature_map = feature_map
        self.feature_size = feature_dim(feature_map, self.head_dim)
        self.impl = check_impl("DeltaRuleAttention", impl, {"chunked": "fused"})
        self.chunk_size = chunk_size
        self.beta = nn.Linear(d_model, num_heads)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", feature_map={self.feature_map!r}"

    def init_state(self, batch_size: int, device=None, dtype=None) -> DeltaAttentionState:
        """Zero fast weights ``[B, H, dh, dφ]``."""
        w = torch.zeros(batch_size, self.num_heads, self.head_dim, self.feature_size, device=device, dtype=dtype)
        return DeltaAttentionState(w)

    def _initial(self, state, x: torch.Tensor, offsets: list[int] | None = None) -> torch.Tensor | None:
        if state is None:
            return None
        w0 = state.weights if isinstance(state, DeltaAttentionState) else state
        batch = x.shape[0] if offsets is None else len(offsets) - 1
        check_shape("state.weights", w0, ["B" if offsets is None else "N", "H", "dh", "dφ"],
                    [batch, self.num_heads, self.head_dim, self.feature_size])
        return w0.to(x.dtype)

    def step(self, x_t: torch.Tensor, state: DeltaAttentionState | None = None):
        """One token (recurrent decoding): ``x_t [B, d_model]`` → ``(y_t [B, d_model], state)``."""
        check_shape("x_t", x_t, ["B", "d_model"], [None, self.d_model])
        q, k, v = self._project(x_t.unsqueeze(1))  # [B, 1, H, dh]
        beta = torch.sigmoid(self.beta(x_t))  # [B, H]
        y, w = fast_weight_step(q[:, 0], k[:, 0], v[:, 0], beta, self._initial(state, x_t),
                                feature_map=self.feature_map)
        y = F.dropout(y, self.dropout, self.training)
        return self._merge(y), DeltaAttentionState(w)  # [B, H, dh] -> [B, D]

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        state: DeltaAttentionState | None = None,
        return_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
    ):
        x, mask = self._check(x, mask)
        offsets = self._packed(x, cu_seqlens)
        q, k, v = self._project(x)  # [B, S, H, dh]
        beta = torch.sigmoid(self.beta(x))  # [B, S, H]
        w0 = self._initial(state, x, offsets)
        y, w = fast_weight_scan(
            q, k, v, beta, feature_map=self.feature_map, update_rule="delta", write_mask=mask,
            initial_state=w0, impl=nam_scan_impl(self.impl), chunk_size=self.chunk_size,
            cu_seqlens=cu_seqlens,
        )
        y = F.dropout(y, self.dropout, self.training)
        y = self._merge(y)  # [B, S, D]
        return (y, DeltaAttentionState(w)) if return_state else y
