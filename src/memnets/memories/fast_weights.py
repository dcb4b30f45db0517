"""Fast-weight memory (docs/maths.md §6, Schlag et al. 2021) as a recurrent-state module.

Per head, from the input ``x_t``: ``k_t = W_k x_t``, ``v_t = W_v x_t``, ``q_t = W_q x_t``,
``β_t = σ(W_β x_t)`` and a sum-normalised feature map φ::

    v̄_t = W_{t-1} φ(k_t)
    W_t  = W_{t-1} + β_t (v_t − v̄_t) ⊗ φ(k_t)       update_rule="delta"
    W_t  = W_{t-1} + v_t ⊗ φ(k_t)                    update_rule="sum" (linear attention)
    y_t  = W_t φ(q_t)                                read after write

The state is the fast weight tensor ``[B, H, dv, dφ]``; ``dφ = dk`` for ``"elu"`` and
``2·dk·ν`` for ``"dpfpν"``. Whole sequences run through the chunked NAM scan.

Example::

    mem = FastWeightMemory(input_size=32, num_heads=4, update_rule="delta", feature_map="dpfp1")
    y, state = mem(torch.randn(2, 50, 32))        # y [2, 50, 32], state.weights [2, 4, 8, 16]
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .._checks import check_input_dtype, check_positive_int, check_shape
from ..attention.delta import UPDATE_RULES, fast_weight_scan, fast_weight_step
from ..attention.feature_maps import feature_dim, get_feature_map
from ..ops._impl import check_impl, nam_scan_impl
from ..registry import register_model
from .packed import PackedSequence, forward_packed

__all__ = ["FastWeightState", "FastWeightMemory"]


class FastWeightState(NamedTuple):
    """State of :class:`FastWeightMemory`: ``weights [B, H, dv, dφ]`` (the fast weights)."""

    weights: torch.Tensor


@register_model("fast_weights")
class FastWeightMemory(nn.Module):
    """Multi-head fast-weight memory with the delta or the sum update rule (docs/maths.md §6).

    Args:
        input_size: size of ``x_t``.
        num_heads: number of independent fast weight matrices ``H``.
        key_size: per-head key/query size ``dk`` (default ``input_size // num_heads``).
        value_size: per-head value size ``dv`` (default ``key_size``).
        output_size: if given, a Linear maps the ``H·dv`` read-out to this size;
            otherwise the output is the concatenated read-out (size ``H·dv``).
        update_rule: ``"delta"`` (with learned ``β = σ(W_β x)``) or ``"sum"``.
        feature_map: ``"elu"``, ``"dpfp1"``, ``"dpfp2"`` or ``"dpfp3"`` (sum-normalised).
        impl: ``"auto"`` (default: :func:`memnets.ops.nam_scan` picks per call), ``"fused"`` (the
            chunkwise-parallel scan) or ``"reference"`` (the time loop, twice differentiable);
            ``"chunked"``, the old name of ``"fused"``, is accepted with a FutureWarning.
        chunk_size: chunk length of the fused scan.

    ``forward(x [B, T, input_size], state=None, mask=None) -> (y [B, T, output_size], state)``;
    ``step(x_t [B, input_size], state) -> (y_t [B, output_size], state)``;
    ``read(x [B, T, input_size] or [B, input_size], state) -> y`` queries without writing.
    ``mask [B, T]`` bool: ``False`` steps do not write (they still read).
    """

    def __init__(
        self,
        input_size: int,
        num_heads: int = 1,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        update_rule: str = "delta",
        feature_map: str = "elu",
        impl: str = "auto",
        chunk_size: int = 32,
    ):
        super().__init__()
        check_positive_int("input_size", input_size)
        check_positive_int("num_heads", num_heads)
        if key_size is None:
            if input_size % num_heads:
                raise ValueError(
                    f"`input_size`={input_size} is not divisible by `num_heads`={num_heads}; pass key_size"
                )
            key_size = input_size // num_heads
        check_positive_int("key_size", key_size)
        value_size = key_size if value_size is None else check_positive_int("value_size", value_size)
        if update_rule not in UPDATE_RULES:
            raise ValueError(f"`update_rule` expected one of {UPDATE_RULES}, got {update_rule!r}")
        self.phi = get_feature_map(feature_map)
        self.input_size, self.num_heads = input_size, num_heads
        self.key_size, self.value_size = key_size, value_size
        self.feature_size = feature_dim(feature_map, key_size)
        self.update_rule, self.feature_map = update_rule, feature_map
        self.impl, self.chunk_size = check_impl("FastWeightMemory", impl, {"chunked": "fused"}), chunk_size
        self.query = nn.Linear(input_size, num_heads * key_size, bias=False)
        self.key = nn.Linear(input_size, num_heads * key_size, bias=False)
        self.value = nn.Linear(input_size, num_heads * value_size, bias=False)
        self.beta = nn.Linear(input_size, num_heads) if update_rule == "delta" else None
        self.out = nn.Linear(num_heads * value_size, output_size) if output_size is not None else None
        self.output_size = output_size if output_size is not None else num_heads * value_size

    def extra_repr(self) -> str:
        return (f"input_size={self.input_size}, num_heads={self.num_heads}, key_size={self.key_size}, "
                f"value_size={self.value_size}, update_rule={self.update_rule!r}, feature_map={self.feature_map!r}")

    def init_state(self, batch_size: int, device=None, dtype=None) -> FastWeightState:
        """Zero fast weights ``[B, H, dv, dφ]``."""
        check_positive_int("batch_size", batch_size)
        shape = (batch_size, self.num_heads, self.value_size, self.feature_size)
        return FastWeightState(torch.zeros(shape, device=device, dtype=dtype))

    def _heads(self, x: torch.Tensor):
        """Projections of ``x [..., input_size]``: q, k ``[..., H, dk]``, v ``[..., H, dv]``, β ``[..., H]``."""
        H = self.num_heads
        check_input_dtype("x", x, self.query.weight.dtype)
        q = self.query(x).unflatten(-1, (H, self.key_size))  # [..., H, dk]
        k = self.key(x).unflatten(-1, (H, self.key_size))  # [..., H, dk]
        v = self.value(x).unflatten(-1, (H, self.value_size))  # [..., H, dv]
        beta = torch.sigmoid(self.beta(x)) if self.beta is not None else None  # [..., H]
        return q, k, v, beta

    def _readout(self, y: torch.Tensor) -> torch.Tensor:
        y = y.flatten(-2)  # [..., H·dv]
        return self.out(y) if self.out is not None else y

    def _state(self, state, x: torch.Tensor) -> torch.Tensor | None:
        if state is None:
            return None
        w = state.weights if isinstance(state, FastWeightState) else state
        check_shape("state.weights", w, ["B", "H", "dv", "dφ"],
                    [x.shape[0], self.num_heads, self.value_size, self.feature_size])
        return w.to(x.dtype)

    def forward(self, x: torch.Tensor, state: FastWeightState | None = None, mask: torch.Tensor | None = None):
        """Whole sequence: ``x [B, T, input_size]`` → ``(y [B, T, output_size], FastWeightState)``.
        ``x`` may be a ``torch.nn.utils.rnn.PackedSequence`` (no ``mask`` then): ``y`` is packed
        alike and each sequence's state is its own after its last step
        (:mod:`memnets.memories.packed`)."""
        if isinstance(x, PackedSequence):
            if mask is not None:
                raise ValueError("`mask` goes with a padded tensor `x` [B, T, input_size]; a PackedSequence "
                                 "already says where each sequence ends")
            return forward_packed(self.forward, x, state, write_mask="mask")  # one call: no writes after each end
        check_shape("x", x, ["B", "T", "input_size"], [None, None, self.input_size])
        q, k, v, beta = self._heads(x)
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(f"`mask` expected a bool tensor [B, T] (True = write), got {mask.dtype}")
        y, w = fast_weight_scan(
            q, k, v, beta, feature_map=self.feature_map, update_rule=self.update_rule, write_mask=mask,
            initial_state=self._state(state, x), impl=nam_scan_impl(self.impl), chunk_size=self.chunk_size,
        )
        return self._readout(y), FastWeightState(w)

    def step(self, x_t: torch.Tensor, state: FastWeightState | None = None):
        """One step: ``x_t [B, input_size]`` → ``(y_t [B, output_size], FastWeightState)``."""
        check_shape("x_t", x_t, ["B", "input_size"], [None, self.input_size])
        q, k, v, beta = self._heads(x_t)
        y, w = fast_weight_step(q, k, v, beta, self._state(state, x_t),
                                feature_map=self.feature_map, update_rule=self.update_rule)
        return self._readout(y), FastWeightState(w)

    def read(self, x: torch.Tensor, state: FastWeightState) -> torch.Tensor:
        """Query the memory without writing: ``y = W φ(W_q x)`` per head.

        ``x`` is ``[B, input_size]`` or ``[B, T, input_size]``; returns ``[..., output_size]``.
        """
        if isinstance(x, torch.Tensor) and x.dim() == 2:
            check_shape("x", x, ["B", "input_size"], [None, self.input_size])
        else:
            check_shape("x", x, ["B", "T", "input_size"], [None, None, self.input_size])
        w = self._state(state, x)
        fq = self.phi(self.query(x).unflatten(-1, (self.num_heads, self.key_size)))  # [..., H, dφ]
        if x.dim() == 2:
            y = torch.einsum("bhvf,bhf->bhv", w, fq)
        else:
            y = torch.einsum("bhvf,bthf->bthv", w, fq)
        return self._readout(y)
