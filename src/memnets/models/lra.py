"""The Long Range Arena classifier (seed 000 Table 3; docs/maths.md §5, §11): token embedding,
learned positions, a :class:`~memnets.models.transformer.TransformerEncoder` with any attention
kind, pooling and a linear head. Trained as the ``listops`` and ``text`` tasks of
:mod:`memnets.train.families.lra` (``memnets train lra/...``), timed by :mod:`memnets.bench.lra_steps`.
"""
from __future__ import annotations

import torch
from torch import nn

from .transformer import TransformerEncoder

__all__ = ["LRAClassifier"]


class LRAClassifier(nn.Module):
    """Embedding + learned positions + :class:`TransformerEncoder` + pooling + Linear.

    ``forward(tokens [B, S] int64, 0 = padding) -> logits [B, num_classes]``. ``pool="mean"``
    averages the encoder output over non-pad positions; ``pool="cls"`` prepends a CLS token
    (id ``vocab_size``) and reads its output, so positions run to ``max_len + 1``.
    """

    def __init__(self, vocab_size: int, num_classes: int, max_len: int, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, dim_feedforward: int | None = None, dropout: float = 0.0,
                 attention: str = "softmax", pool: str = "mean", attention_options: dict | None = None,
                 norm_first: bool = False):
        super().__init__()
        if pool not in ("mean", "cls"):
            raise ValueError(f"`pool` expected 'mean' or 'cls', got {pool!r}")
        self.pool, self.vocab_size = pool, vocab_size
        self.embed = nn.Embedding(vocab_size + (pool == "cls"), d_model, padding_idx=0)
        self.encoder = TransformerEncoder(d_model, num_layers, num_heads, dim_feedforward, dropout, attention,
                                          norm_first=norm_first, max_len=max_len + (pool == "cls"),
                                          attention_options=attention_options)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"`tokens` expected int64 [B, S], got {tokens.dtype} {tuple(tokens.shape)}")
        if self.pool == "cls":
            cls = torch.full_like(tokens[:, :1], self.vocab_size)
            tokens = torch.cat([cls, tokens], dim=1)                  # [B, S + 1]
        mask = tokens != 0                                            # [B, S] True = keep
        h = self.encoder(self.embed(tokens), mask)                    # [B, S, d]
        if self.pool == "cls":
            return self.head(h[:, 0])
        m = mask.unsqueeze(-1).to(h.dtype)                            # [B, S, 1]
        return self.head((h * m).sum(1) / m.sum(1).clamp_min(1.0))
