"""biLSTM → dot-product self-attention → biLSTM baseline (docs/maths.md §10, §12).

As the authors ran it (Luong-style global attention over the encoder's own outputs)::

    h      = biLSTM_enc(x)                                  [B, S, d]
    a_ts   = softmax_s( (W_in h_t) · h_s · scale )          scale = 1 (default) or 1/√d
    c_t    = Σ_s a_ts h_s
    z_t    = tanh(W_out [c_t ; h_t])
    y      = biLSTM_dec(dropout(z))                         [B, S, d]

Each biLSTM has ``d/2`` units per direction, so widths stay ``d``.

Example::

    model = LSTMAttentionBaseline(d_model=64)
    mask = torch.arange(20)[None, :] < torch.tensor([[20], [12]])   # right padding
    y = model(torch.randn(2, 20, 64), mask)                         # [2, 20, 64], y[1, 12:] = 0
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._checks import check_positive_int, check_shape
from ..attention import check_mask
from ..registry import register_model
from ..ops._amp import run_rnn

__all__ = ["DotProductSelfAttention", "LSTMAttentionBaseline"]


class DotProductSelfAttention(nn.Module):
    """Global dot-product attention of every position over the sequence (one head).

    ``forward(h [B, S, d], mask [B, S] bool or None) -> tanh(W_out [c ; h]) [B, S, d]``.
    Padded positions (mask False) get no attention weight.
    """

    def __init__(self, d_model: int, scaled: bool = False):
        super().__init__()
        self.input_proj = nn.Linear(d_model, d_model, bias=False)
        self.output_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.scale = 1.0 / math.sqrt(d_model) if scaled else 1.0

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scores = self.input_proj(h) @ h.transpose(1, 2) * self.scale  # [B, S(query), S(key)]
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        if mask is not None:  # a sequence with no kept position: zero weights, not NaN
            attn = attn.masked_fill(~mask.any(dim=1)[:, None, None], 0.0)
        c = attn @ h  # [B, S, d]
        return torch.tanh(self.output_proj(torch.cat([c, h], dim=-1)))


@register_model("lstm_attention")
class LSTMAttentionBaseline(nn.Module):
    """The paper's LSTM baseline: biLSTM → dot-product self-attention → biLSTM (docs/maths.md §12).

    Args:
        d_model: width (even); each LSTM direction has ``d_model // 2`` units.
        num_layers: total biLSTM layers, ``num_layers // 2`` before the attention and the
            rest after it (default 2: one and one, as the authors ran it).
        dropout: dropout on the attention output (and between stacked LSTM layers).
        scaled: scale attention scores by ``1/√d`` (the authors' code does not).

    ``forward(x [B, S, d_model], mask [B, S] bool or None) -> [B, S, d_model]``. The mask
    must be a right-padding mask (each row ``True…True False…False``): sequences are packed,
    so the backward direction starts at each sequence's last kept token. Outputs at padded
    positions are zero.
    """

    def __init__(self, d_model: int, num_layers: int = 2, dropout: float = 0.0, scaled: bool = False):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_layers", num_layers, minimum=2)
        if d_model % 2:
            raise ValueError(f"`d_model` expected an even integer (two LSTM directions), got {d_model}")
        n_enc = num_layers // 2
        n_dec = num_layers - n_enc
        self.d_model = d_model
        self.encoder = nn.LSTM(d_model, d_model // 2, n_enc, batch_first=True, bidirectional=True,
                               dropout=dropout if n_enc > 1 else 0.0)
        self.attention = DotProductSelfAttention(d_model, scaled=scaled)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.LSTM(d_model, d_model // 2, n_dec, batch_first=True, bidirectional=True,
                               dropout=dropout if n_dec > 1 else 0.0)

    @staticmethod
    def _run(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        if lengths is None:
            return run_rnn(lstm, x)[0]
        packed = pack_padded_sequence(x, lengths.clamp_min(1).cpu(), batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(run_rnn(lstm, packed)[0], batch_first=True, total_length=x.shape[1])[0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_shape("x", x, ["B", "S", "d_model"], [None, None, self.d_model])
        mask = check_mask(mask, x.shape[0], x.shape[1])
        lengths = None
        if mask is not None:
            lengths = mask.sum(dim=1)  # [B]
            prefix = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
            if not torch.equal(prefix, mask):
                raise ValueError("`mask` expected a right-padding mask [B, S] (each row True…True False…False)")
        h = self._run(self.encoder, x, lengths)  # [B, S, d]
        z = self.drop(self.attention(h, mask))  # [B, S, d]
        y = self._run(self.decoder, z, lengths)  # [B, S, d]
        return y if mask is None else y * mask.unsqueeze(-1).to(y.dtype)
