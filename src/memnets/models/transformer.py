"""Transformer baselines (docs/maths.md §5, §10, §12): an encoder with a choice of attention, and the
Universal Transformer (one shared layer applied repeatedly, optional ACT halting).

Both map ``x [B, S, d_model]`` (already embedded) to ``[B, S, d_model]``; ``mask [B, S]`` is
a key-padding mask of booleans (True = keep). The attention kind is one of
``"softmax" | "nam" | "linear" | "delta"`` (:func:`memnets.attention.build_attention`).

Example::

    enc = TransformerEncoder(d_model=64, num_layers=2, num_heads=4, attention="nam", max_len=128)
    y = enc(torch.randn(8, 100, 64))                        # [8, 100, 64]
    ut = UniversalTransformer(d_model=64, num_heads=4, num_steps=6, act=True)
    y = ut(torch.randn(8, 100, 64)); aux = ut.ponder_cost   # add τ·aux to the loss
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .._checks import check_positive_int, check_shape
from ..attention import ATTENTION_KINDS, build_attention, check_mask
from ..registry import register_model

__all__ = [
    "ConvTransition", "TransformerConfig", "TransformerLayer", "TransformerEncoder", "UniversalTransformer", "sinusoidal_embedding",
]

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of :class:`TransformerEncoder` (docs/maths.md §12 paper size: d 512, 8 layers,
    8 heads, FFN 2048, post-LN, learned positions)."""

    d_model: int = 512
    num_layers: int = 8
    num_heads: int = 8
    dim_feedforward: int | None = None
    dropout: float = 0.0
    attention: str = "softmax"
    causal: bool = False
    norm_first: bool = False
    max_len: int | None = None
    activation: str = "relu"
    attention_options: dict | None = None


def sinusoidal_embedding(length: int, dim: int, *, device=None, dtype=None) -> torch.Tensor:
    """Fixed sin/cos coordinate embedding ``[length, dim]`` (Vaswani et al. 2017).

    Computed in float32, or in float64 when ``dtype`` is float64 (so float64 models agree
    across devices to float64 precision)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    pos = torch.arange(length, device=device, dtype=work).unsqueeze(1)  # [L, 1]
    half = (dim + 1) // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=device, dtype=work) / max(half, 1))
    ang = pos * freq  # [L, half]
    emb = torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)[:, :dim]  # [L, dim]
    return emb.to(dtype or torch.get_default_dtype())


class ConvTransition(nn.Module):
    """The convolutional transition of the Universal Transformer (Dehghani et al. 2019 §2.1, as in
    the tensor2tensor code the NAM authors' UT follows; docs/maths.md §10): two 1-D convolutions of
    width ``kernel_size`` along the sequence, zero-padded on both sides, each followed by ReLU and
    dropout (the second ReLU too, as in that code). ``[B, S, d] → [B, S, d]``; with a key-padding
    ``mask [B, S]`` the dropped positions are zeroed before each convolution, so they add nothing
    to their neighbours."""

    def __init__(self, d_model: int, dim_feedforward: int, kernel_size: int = 3, dropout: float = 0.0):
        super().__init__()
        k = check_positive_int("kernel_size", kernel_size)
        self.pad = (k // 2, (k - 1) // 2)
        self.conv1 = nn.Conv1d(d_model, dim_feedforward, k)
        self.conv2 = nn.Conv1d(dim_feedforward, d_model, k)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_shape("x", x, ["B", "S", "d_model"], [None, None, self.conv1.in_channels])
        mask = check_mask(mask, x.shape[0], x.shape[1])
        keep = None if mask is None else mask.to(x.dtype).unsqueeze(1)  # [B, 1, S]
        h = x.transpose(1, 2)  # [B, d, S]
        for conv in (self.conv1, self.conv2):
            if keep is not None:
                h = h * keep
            h = self.drop(torch.relu(conv(nn.functional.pad(h, self.pad))))
        return h.transpose(1, 2)


_TRANSITIONS = ("linear", "conv")


class TransformerLayer(nn.Module):
    """One encoder layer: attention + feed-forward, each with residual, dropout, LayerNorm.

    Post-LN (``norm_first=False``): ``x = LN(x + Attn(x)); x = LN(x + FFN(x))``;
    pre-LN: ``x = x + Attn(LN(x)); x = x + FFN(LN(x))``. The feed-forward is position-wise
    (``transition="linear"``: Linear → activation → Dropout → Linear) or
    :class:`ConvTransition` (``transition="conv"``).
    """

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int | None = None, dropout: float = 0.0,
                 attention: str = "softmax", causal: bool = False, norm_first: bool = False,
                 activation: str = "relu", attention_options: dict | None = None, transition: str = "linear"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"`activation` expected one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        if transition not in _TRANSITIONS:
            raise ValueError(f"`transition` expected one of {_TRANSITIONS}, got {transition!r}")
        if transition == "conv" and causal:
            raise ValueError("transition='conv' looks at both neighbours: it cannot be causal")
        ff = 4 * d_model if dim_feedforward is None else check_positive_int("dim_feedforward", dim_feedforward)
        self.norm_first = bool(norm_first)
        self.attn = build_attention(attention, d_model, num_heads, causal=causal, dropout=dropout,
                                    **(attention_options or {}))
        self.conv = transition == "conv"
        if self.conv:
            self.ff = ConvTransition(d_model, ff, dropout=dropout)
        else:
            self.ff = nn.Sequential(nn.Linear(d_model, ff), _ACTIVATIONS[activation](), nn.Dropout(dropout),
                                    nn.Linear(ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def _ff(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.ff(x, mask) if self.conv else self.ff(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop(self.attn(self.norm1(x), mask))
            return x + self.drop(self._ff(self.norm2(x), mask))
        x = self.norm1(x + self.drop(self.attn(x, mask)))
        return self.norm2(x + self.drop(self._ff(x, mask)))


def _check_attention(attention: str, causal: bool) -> None:
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"`attention` expected one of {tuple(ATTENTION_KINDS)}, got {attention!r}")
    if attention == "delta" and not causal:
        raise ValueError("attention='delta' is causal only: pass causal=True")


class _Positions(nn.Module):
    """Learned positions ``[max_len, d]`` when ``max_len`` is given, else fixed sinusoids
    (``fixed=True``) or none."""

    def __init__(self, d_model: int, max_len: int | None, fixed: bool):
        super().__init__()
        self.d_model, self.max_len, self.fixed = d_model, max_len, fixed
        self.table = nn.Embedding(check_positive_int("max_len", max_len), d_model) if max_len is not None else None

    def forward(self, S: int, ref: torch.Tensor) -> torch.Tensor | None:
        if self.table is not None:
            if S > self.max_len:
                raise ValueError(f"`x` expected at most max_len={self.max_len} positions, got S={S}")
            return self.table.weight[:S].to(ref.dtype)  # [S, d]
        if self.fixed:
            return sinusoidal_embedding(S, self.d_model, device=ref.device, dtype=ref.dtype)
        return None


def _check_input(x: object, d_model: int, mask: object) -> torch.Tensor | None:
    check_shape("x", x, ["B", "S", "d_model"], [None, None, d_model])
    return check_mask(mask, x.shape[0], x.shape[1])


@register_model("transformer")
class TransformerEncoder(nn.Module):
    """Stack of :class:`TransformerLayer` with a choice of attention (docs/maths.md §10 baseline).

    Args:
        d_model, num_layers, num_heads: sizes; ``d_model`` divisible by ``num_heads``.
        dim_feedforward: FFN width (default ``4·d_model``).
        dropout: dropout in attention, FFN and residual branches.
        attention: ``"softmax"``, ``"nam"``, ``"linear"`` or ``"delta"`` (delta needs ``causal``).
        causal: causal self-attention.
        norm_first: pre-LN (with a final LayerNorm) instead of post-LN.
        max_len: learned position embeddings of this many positions; ``None`` adds none.
        activation: ``"relu"`` or ``"gelu"``.
        attention_options: extra keyword arguments of the attention layer
            (e.g. ``{"feature_map": "dpfp2"}`` for ``"delta"``).

    ``forward(x [B, S, d_model], mask [B, S] bool or None) -> [B, S, d_model]``.
    """

    def __init__(self, d_model: int, num_layers: int, num_heads: int, dim_feedforward: int | None = None,
                 dropout: float = 0.0, attention: str = "softmax", causal: bool = False, norm_first: bool = False,
                 max_len: int | None = None, activation: str = "relu", attention_options: dict | None = None):
        super().__init__()
        check_positive_int("num_layers", num_layers)
        _check_attention(attention, causal)
        self.config = TransformerConfig(d_model, num_layers, num_heads, dim_feedforward, dropout, attention,
                                        causal, norm_first, max_len, activation, attention_options)
        self.d_model = d_model
        self.positions = _Positions(d_model, max_len, fixed=False)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, num_heads, dim_feedforward, dropout, attention, causal, norm_first, activation,
                             attention_options)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else None

    @classmethod
    def from_config(cls, config: TransformerConfig) -> "TransformerEncoder":
        return cls(**asdict(config))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = _check_input(x, self.d_model, mask)
        pos = self.positions(x.shape[1], x)
        if pos is not None:
            x = x + pos
        x = self.drop(x)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x


@register_model("universal_transformer")
class UniversalTransformer(nn.Module):
    """Universal Transformer encoder (Dehghani et al. 2019; docs/maths.md §10, §12): one shared
    :class:`TransformerLayer` applied ``num_steps`` times; before every step the state gets
    position embeddings (learned if ``max_len`` is given, else sinusoidal) plus a sinusoidal
    step embedding.

    With ``act=True``, Adaptive Computation Time (Graves 2016) per position: a halting unit
    ``p_n = σ(w·s_n + b)``; a position halts at the first ``N`` with ``Σ_{n≤N} p_n >
    act_threshold`` (or at ``num_steps``), its last step gets the remainder
    ``R = 1 − Σ_{n<N} p_n``; the output is ``Σ_n w_n · layer(s_n)`` with those weights, and a
    halted position's state stops changing. After each forward, :attr:`ponder_cost` holds the
    mean of ``N + R`` over kept positions (a differentiable scalar to add, scaled, to the loss)
    and :attr:`ponder_times` the per-position ``N + R`` ``[B, S]`` (both ``None`` without ACT).

    Args:
        d_model, num_heads, dim_feedforward, dropout, attention, causal, activation,
            attention_options: as :class:`TransformerEncoder` (for the one shared layer).
        num_steps: how many times the layer is applied (the ACT maximum with ``act``).
        act, act_threshold: ACT halting and its threshold ``1 − ε`` in (0, 1].
        norm_first: pre-LN shared layer (the paper's UT), else post-LN.
        max_len: learned position embeddings of this many positions; ``None``: sinusoidal.
        transition: the shared layer's feed-forward: ``"linear"`` (position-wise) or ``"conv"``
            (:class:`ConvTransition`, two convolutions of width 3 along the sequence).
        input_projection: a bias-free ``Linear(d_model, d_model)`` on the input before the first step.
        final_norm: a LayerNorm on the output (default: with ``norm_first``).

    The NAM authors' UT (the one behind Table 1 of the NAM paper; docs/maths.md §10) is
    ``transition="conv", dim_feedforward=d_model, input_projection=True, final_norm=False`` with
    sinusoidal positions (``max_len=None``).

    ``forward(x [B, S, d_model], mask [B, S] bool or None) -> [B, S, d_model]``.
    """

    def __init__(self, d_model: int, num_heads: int, num_steps: int = 8, dim_feedforward: int | None = None,
                 dropout: float = 0.0, attention: str = "softmax", act: bool = False, act_threshold: float = 0.99,
                 norm_first: bool = True, max_len: int | None = None, causal: bool = False,
                 activation: str = "relu", attention_options: dict | None = None,
                 transition: str = "linear", input_projection: bool = False, final_norm: bool | None = None):
        super().__init__()
        check_positive_int("num_steps", num_steps)
        _check_attention(attention, causal)
        if not 0.0 < act_threshold <= 1.0:
            raise ValueError(f"`act_threshold` expected a float in (0, 1], got {act_threshold!r}")
        self.d_model, self.num_steps = d_model, num_steps
        self.act, self.act_threshold = bool(act), float(act_threshold)
        self.layer = TransformerLayer(d_model, num_heads, dim_feedforward, dropout, attention, causal,
                                      norm_first, activation, attention_options, transition)
        self.positions = _Positions(d_model, max_len, fixed=True)
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, d_model, bias=False) if input_projection else None
        final_norm = norm_first if final_norm is None else bool(final_norm)
        self.norm = nn.LayerNorm(d_model) if final_norm else None
        self.halting = nn.Linear(d_model, 1) if act else None
        if self.halting is not None:
            nn.init.constant_(self.halting.bias, 1.0)  # start by halting early (as the UT code does)
        self.ponder_cost: torch.Tensor | None = None
        self.ponder_times: torch.Tensor | None = None

    def _coordinates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self.positions(x.shape[1], x)  # [S, d]
        steps = sinusoidal_embedding(self.num_steps, self.d_model, device=x.device, dtype=x.dtype)  # [N, d]
        return pos, steps

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = _check_input(x, self.d_model, mask)
        pos, steps = self._coordinates(x)
        s = x if self.proj is None else self.proj(x)
        if not self.act:
            for n in range(self.num_steps):
                s = self.layer(self.drop(s + pos + steps[n]), mask)
            self.ponder_cost = self.ponder_times = None
            return self.norm(s) if self.norm is not None else s
        return self._forward_act(s, pos, steps, mask)

    def _forward_act(self, s, pos, steps, mask):
        B, S, _ = s.shape
        halt = s.new_zeros(B, S)  # Σ p of the steps taken so far
        done = torch.zeros(B, S, dtype=torch.bool, device=s.device)
        remainder = s.new_zeros(B, S)
        n_updates = s.new_zeros(B, S)
        out = torch.zeros_like(s)
        for n in range(self.num_steps):
            s_in = s + pos + steps[n]
            p = torch.sigmoid(self.halting(s_in)).squeeze(-1)  # [B, S]
            running = (~done).to(s.dtype)
            over = (halt + p * running > self.act_threshold).to(s.dtype)
            if n == self.num_steps - 1:
                over = torch.ones_like(over)  # every still-running position halts now
            new_halted = over * running
            still = (1.0 - over) * running
            halt = halt + p * still
            remainder = remainder + new_halted * (1.0 - halt)
            done = done | new_halted.bool()
            n_updates = n_updates + still + new_halted
            weight = (p * still + new_halted * remainder).unsqueeze(-1)  # [B, S, 1]
            y = self.layer(self.drop(s_in), mask)
            out = out + weight * y
            s = torch.where(running.unsqueeze(-1) > 0, y, s)  # halted positions keep their state
            if bool(done.all()):
                break
        ponder = n_updates + remainder  # [B, S]
        keep = torch.ones_like(ponder) if mask is None else mask.to(ponder.dtype)
        self.ponder_times = ponder
        self.ponder_cost = (ponder * keep).sum() / keep.sum().clamp_min(1.0)
        return self.norm(out) if self.norm is not None else out
