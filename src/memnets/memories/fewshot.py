"""NAM few-shot learning (docs/maths.md §4, Algorithm 1, with the §12 fix) and the cosine classifier.

Classifier ``W ∈ R^{(Bc+N)×F}`` = base rows ``W_base`` stacked on N zero rows. For every
support feature ``x_nk`` (novel class n, shot k), with ``x̂ = μ(x_nk)`` and
``p_w = σ(f_w(x̂))``, ``p_e = σ(f_e(x̂))`` from two separate MLPs::

    ΔW_nk = p_w · e_{Bc+n} x̂ᵀ − p_e · (W x̂) x̂ᵀ      # = WR(W, x̂, e_{Bc+n}, p_w, p_e) − W
    W'    = W + Σ_n Σ_k ΔW_nk / K
    score = μ(W') μ(x)

Every ΔW is taken from the same W (the shots are written in parallel). With ``p_w = 1,
p_e = 0`` this is exactly the feature-averaging cosine classifier (Thm 3.5).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .._checks import check_positive_int, check_shape, check_tensor
from ..ops import unit
from ..registry import register_model

__all__ = ["NAMFewShotClassifier", "CosineClassifier", "nam_fewshot_weights", "cosine_fewshot_weights",
           "fewshot_accuracies"]


def _check_support(support: torch.Tensor, F: int) -> None:
    check_tensor("support", support)
    check_shape("support", support, ["N", "K", "F"], [None, None, F])
    if support.shape[1] == 0:
        raise ValueError(f"`support` expected at least one shot per class (K >= 1), got {list(support.shape)}")


def nam_fewshot_weights(base_weight: torch.Tensor, support: torch.Tensor, p_w: torch.Tensor,
                        p_e: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 of docs/maths.md §4: row-normalised classifier weights after writing the support.

    Args:
        base_weight: ``[Bc, F]`` base-class weights.
        support: ``[N, K, F]`` support features, row n = novel class n (label Bc + n).
        p_w, p_e: ``[N, K]`` write and erase probabilities in [0, 1] (or broadcastable).
    Returns:
        ``μ(W')`` of shape ``[Bc+N, F]``.
    """
    check_shape("base_weight", base_weight, ["Bc", "F"], [None, None])
    Bc, F = base_weight.shape
    _check_support(support, F)
    N, K = support.shape[:2]
    W = torch.cat([base_weight, base_weight.new_zeros(N, F)], 0)  # [Bc+N, F]
    xh = unit(support)  # [N, K, F]
    target = torch.zeros(N, 1, Bc + N, dtype=W.dtype, device=W.device)
    target[torch.arange(N), 0, Bc + torch.arange(N)] = 1.0  # e_{Bc+n}: [N, 1, Bc+N]
    U = p_w.unsqueeze(-1) * target - p_e.unsqueeze(-1) * (xh @ W.T)  # pseudo-values: [N, K, Bc+N]
    dW = torch.einsum("nkc,nkf->cf", U, xh) / K  # Σ ΔW_nk / K: [Bc+N, F]
    return unit(W + dW)


def cosine_fewshot_weights(base_weight: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Feature-averaging cosine classifier: ``μ([W_base ; mean_k μ(x_nk)])`` ``[Bc+N, F]``."""
    check_shape("base_weight", base_weight, ["Bc", "F"], [None, None])
    _check_support(support, base_weight.shape[1])
    return unit(torch.cat([base_weight, unit(support).mean(1)], 0))


def fewshot_accuracies(scores: torch.Tensor, labels: torch.Tensor, num_base: int) -> dict[str, float]:
    """Table 2's columns: ``Novel`` (novel queries among novel classes), ``Base`` (base
    queries among base classes) and ``Both`` (all queries among all classes), in [0, 1].

    scores ``[Q, Bc+N]``; labels ``[Q]`` in [0, Bc+N). A column with no query is NaN.
    """
    check_shape("scores", scores, ["Q", "C"], [None, None])
    check_shape("labels", labels, ["Q"], [scores.shape[0]])
    nov, base = labels >= num_base, labels < num_base
    out = {"Both": (scores.argmax(-1) == labels).float().mean().item()}
    out["Novel"] = ((scores[nov, num_base:].argmax(-1) + num_base) == labels[nov]).float().mean().item() \
        if nov.any() else float("nan")
    out["Base"] = (scores[base, :num_base].argmax(-1) == labels[base]).float().mean().item() \
        if base.any() else float("nan")
    return out


class _FewShotBase(nn.Module):
    def __init__(self, feature_dim: int, num_base_classes: int, scale: float):
        super().__init__()
        check_positive_int("feature_dim", feature_dim)
        check_positive_int("num_base_classes", num_base_classes)
        self.feature_dim, self.num_base_classes, self.scale = feature_dim, num_base_classes, float(scale)
        self.weight_base = nn.Parameter(torch.randn(num_base_classes, feature_dim) / feature_dim ** 0.5)

    def _base(self, base_weight: torch.Tensor | None) -> torch.Tensor:
        if base_weight is None:
            return self.weight_base
        return check_shape("base_weight", base_weight, ["Bc", "F"], [None, self.feature_dim])

    def forward(self, x: torch.Tensor, support: torch.Tensor | None = None,
                base_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``scale · μ(W') μ(x)``: x ``[..., F]`` -> ``[..., Bc+N]`` (``[..., Bc]``
        without support)."""
        check_tensor("x", x)
        if x.dim() < 1 or x.shape[-1] != self.feature_dim:
            raise ValueError(f"`x` expected [..., F] = [..., {self.feature_dim}], got {list(x.shape)}")
        W = unit(self._base(base_weight)) if support is None else self.weights(support, base_weight)
        return self.scale * unit(x) @ W.T


@register_model("cosine_classifier")
class CosineClassifier(_FewShotBase):
    """Feature-averaging cosine classifier (the baseline of docs/maths.md §4, Thm 3.5).

    Args: feature_dim F; num_base_classes Bc; scale: multiplies the cosine scores (1 = docs/maths.md §4).
    ``weights(support [N, K, F], base_weight=None) -> [Bc+N, F]``; ``forward(x, support)``.
    """

    def __init__(self, feature_dim: int, num_base_classes: int, scale: float = 1.0):
        super().__init__(feature_dim, num_base_classes, scale)

    def weights(self, support: torch.Tensor, base_weight: torch.Tensor | None = None) -> torch.Tensor:
        return cosine_fewshot_weights(self._base(base_weight), support)


def _mlp(F: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(F, hidden), nn.ReLU(), nn.Linear(hidden, 1))


@register_model("nam_fewshot")
class NAMFewShotClassifier(_FewShotBase):
    """NAM few-shot classifier (docs/maths.md §4, Algorithm 1; §12: p_w and p_e from two MLPs).

    Args:
        feature_dim: F. num_base_classes: Bc (``weight_base [Bc, F]`` is a parameter;
            ``base_weight`` given to ``forward``/``weights`` overrides it).
        hidden: width of the two MLPs ``f_w``, ``f_e`` (F → hidden → 1, then σ) applied
            to unit-normalised support features.
        scale: multiplies the cosine scores (1 = docs/maths.md §4).
    """

    def __init__(self, feature_dim: int, num_base_classes: int, hidden: int = 512, scale: float = 1.0):
        super().__init__(feature_dim, num_base_classes, scale)
        check_positive_int("hidden", hidden)
        self.f_w, self.f_e = _mlp(feature_dim, hidden), _mlp(feature_dim, hidden)

    def gates(self, support: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p_w, p_e)``, each ``[N, K]``, from the unit-normalised support ``[N, K, F]``."""
        _check_support(support, self.feature_dim)
        xh = unit(support)
        return torch.sigmoid(self.f_w(xh)).squeeze(-1), torch.sigmoid(self.f_e(xh)).squeeze(-1)

    def weights(self, support: torch.Tensor, base_weight: torch.Tensor | None = None,
                p_w: torch.Tensor | None = None, p_e: torch.Tensor | None = None) -> torch.Tensor:
        """``μ(W') [Bc+N, F]``; ``p_w``/``p_e`` ``[N, K]`` override the MLPs when given."""
        gw, ge = self.gates(support) if p_w is None or p_e is None else (None, None)
        return nam_fewshot_weights(self._base(base_weight), support,
                                   gw if p_w is None else p_w, ge if p_e is None else p_e)
