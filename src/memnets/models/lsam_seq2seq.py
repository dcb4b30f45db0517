"""The paper's LSAM encoder–decoder feature extractor (docs/maths.md §12, "The table's LSAM model").

    e  = x + BLSAM(x)                   BLSAM = bidirectional LSAM → Linear → Dropout → ReLU
    e  = LayerNorm(e + FFN(e))          FFN = Linear(d, F) → ReLU → Dropout → Linear(F, d) → Dropout
    u  = LSAM_dec(e; starts from the encoder's final memories, h_0 = 0)
    y  = LayerNorm(ReLU(Dropout(Linear(u))))   the decoder's output block

The encoder's forward and backward halves (H/2 heads of width d/H each) are concatenated
along the head axis to give the decoder's H initial memories. The decoder's read ``u`` is
linear in the values it reads; its output block (the authors' ``LSAMDecoder.Wo`` and norm) is
what lets a linear vocabulary head on ``y`` compute functions such as a digit sum (docs/fib.md
section 2 makes the same point for the NAM-TM). ``output_block=False`` gives ``y = u``.
Embedding and the vocabulary head are left to the task model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_positive_int, check_shape
from ..memories.lsam import LSAM, LSAMState
from ..registry import register_model

__all__ = ["LSAMEncoderDecoder", "LSAMEncoderDecoderConfig", "LSAMEncDecState"]


@dataclass(frozen=True)
class LSAMEncoderDecoderConfig:
    """Typed configuration of :class:`LSAMEncoderDecoder` (paper: d 1024, 8 heads, FFN 2048)."""

    d_model: int = 256
    num_heads: int = 4
    dim_feedforward: int = 1024
    dropout: float = 0.1
    output_block: bool = True


class LSAMEncDecState(NamedTuple):
    """``encoder``: the encoder's final bidirectional :class:`LSAMState` (memory
    ``[2, B, H/2, d, d]``, h ``[2, B, D/2]``); ``decoder``: the decoder's final
    :class:`LSAMState` (memory ``[1, B, H, d, d]``, h ``[1, B, D]``)."""

    encoder: LSAMState
    decoder: LSAMState


@register_model("lsam_encdec")
class LSAMEncoderDecoder(nn.Module):
    """Bidirectional LSAM encoder layer + forward LSAM decoder (docs/maths.md §12).

    Args:
        d_model: feature width D (divisible by ``num_heads``).
        num_heads: H, even (the encoder gives H/2 heads to each direction).
        dim_feedforward: hidden width of the encoder FFN.
        dropout: dropout probability in the BLSAM block, the FFN and the output block.
        output_block: the decoder's output block Linear → Dropout → ReLU → LayerNorm (the
            authors'); ``False``: the decoder's reads are the output.

    ``forward(x [B, T, D], state=None) -> (y [B, T, D], LSAMEncDecState)``; ``state`` (an
    :class:`LSAMEncDecState` or a bare encoder :class:`LSAMState`) sets the encoder's
    initial state; by default it is zero. The backward direction's state enters at t = T-1.
    """

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int = 1024, dropout: float = 0.1,
                 output_block: bool = True):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("dim_feedforward", dim_feedforward)
        if num_heads % 2 or d_model % num_heads:
            raise ValueError(f"`num_heads`={num_heads} must be even and divide `d_model`={d_model}")
        if not isinstance(output_block, bool):
            raise TypeError(f"`output_block` expected True or False, got {output_block!r}")
        self.config = LSAMEncoderDecoderConfig(d_model, num_heads, dim_feedforward, float(dropout), output_block)
        self.encoder = LSAM(d_model, d_model, num_heads, bidirectional=True)
        self.enc_out = nn.Linear(d_model, d_model)
        self.ffn1 = nn.Linear(d_model, dim_feedforward)
        self.ffn2 = nn.Linear(dim_feedforward, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.decoder = LSAM(d_model, d_model, num_heads)
        if output_block:
            self.dec_out = nn.Linear(d_model, d_model)
            self.dec_norm = nn.LayerNorm(d_model)

    def init_state(self, batch_size: int, device=None, dtype=None) -> LSAMEncDecState:
        """Zero encoder and decoder states."""
        return LSAMEncDecState(self.encoder.init_state(batch_size, device, dtype),
                               self.decoder.init_state(batch_size, device, dtype))

    def encode(self, x: torch.Tensor, state: LSAMState | None = None):
        """Encoder layer: ``x [B, T, D]`` -> ``(e [B, T, D], final bidirectional LSAMState)``."""
        z, enc_state = self.encoder(x, state)
        e = x + self.dropout(F.relu(self.enc_out(z)))  # x + BLSAM(x)
        e = self.norm(e + self.dropout(self.ffn2(self.dropout(F.relu(self.ffn1(e))))))
        return e, enc_state

    def forward(self, x: torch.Tensor, state=None):
        D = self.config.d_model
        check_shape("x", x, ["B", "T", "d_model"], [None, None, D])
        enc0 = state.encoder if isinstance(state, LSAMEncDecState) else state
        e, enc = self.encode(x, enc0)
        B = x.shape[0]
        dec0 = LSAMState(
            enc.memory.transpose(0, 1).flatten(1, 2).unsqueeze(0),  # [1, B, H, d, d] = [fwd heads : bwd heads]
            enc.h.new_zeros(1, B, D),  # h_0 = 0, as the authors' decoder starts
        )
        y, dec = self.decoder(e, dec0)
        if self.config.output_block:
            y = self.dec_norm(F.relu(self.dropout(self.dec_out(y))))
        return y, LSAMEncDecState(enc, dec)
