"""Conv-4 feature extractor and a cosine classifier head for few-shot Omniglot (docs/maths.md §4, §11).

Conv-4 (Vinyals et al. 2016; Snell et al. 2017): four blocks of
``conv 3×3 (64 channels, padding 1) → BatchNorm → ReLU → max-pool 2×2``. On ``[B, 1, 28, 28]``
inputs the spatial size goes 28 → 14 → 7 → 3 → 1, so the output is a 64-d feature ``[B, 64]``.

The pre-training head is a cosine classifier with a learned scale ``s`` (Gidaris & Komodakis
2018): ``logits = s · μ(W) μ(x)`` with ``μ`` row-wise L2 normalisation, ``W`` ``[C, F]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from memnets._checks import check_shape
from memnets.registry import register_model

__all__ = ["Conv4Config", "Conv4", "CosineHead", "l2_normalize"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``μ(x) = x / max(‖x‖₂, eps)`` over the last dimension (docs/maths.md §1)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


@dataclass(frozen=True)
class Conv4Config:
    """Conv-4 hyper-parameters: input channels, hidden channels per block, number of blocks."""

    in_channels: int = 1
    hidden: int = 64
    blocks: int = 4


@register_model("conv4")
class Conv4(nn.Module):
    """Conv-4 feature extractor: ``[B, C_in, H, W]`` → ``[B, hidden · (H / 2^blocks)²]``.

    With the defaults and 28×28 inputs the output is ``[B, 64]`` (ReLU features, ≥ 0).
    """

    def __init__(self, in_channels: int = 1, hidden: int = 64, blocks: int = 4) -> None:
        super().__init__()
        self.config = Conv4Config(in_channels, hidden, blocks)
        layers: list[nn.Module] = []
        c = in_channels
        for _ in range(blocks):
            layers += [nn.Conv2d(c, hidden, 3, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c = hidden
        self.encoder = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, C_in, H, W]`` float → features ``[B, F]``."""
        check_shape("x", x, ["B", "C_in", "H", "W"], [None, self.config.in_channels, None, None])
        return self.encoder(x).flatten(1)  # [B, hidden, h, w] -> [B, F]


class CosineHead(nn.Module):
    """Cosine classifier with learned scale: ``logits = s · μ(W) μ(x)``, ``W`` ``[C, F]``.

    ``x`` ``[B, F]`` → logits ``[B, C]`` in ``[-s, s]``; ``s`` starts at ``scale``.
    """

    def __init__(self, feature_dim: int, num_classes: int, scale: float = 10.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_classes, feature_dim) / feature_dim**0.5)
        self.scale = nn.Parameter(torch.tensor(float(scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_shape("x", x, ["B", "F"], [None, self.weight.shape[1]])
        return self.scale * F.linear(l2_normalize(x), l2_normalize(self.weight))
