"""Generalised few-shot evaluation on frozen features (the NAM paper's Table 2; docs/maths.md §4,
docs/fewshot.md), used by the ``omniglot_fewshot`` task (:mod:`memnets.train.families.fewshot`).

A generalised test episode: N novel test classes with K support and Q query images each, plus
``N · Q`` base queries (held-out drawers of the base classes). Accuracies (Gidaris & Komodakis
2018): *Novel* = novel queries among the N novel classes (the plain N-way K-shot accuracy),
*Base* = base queries among the base classes, *Both* = all queries among all base + novel
classes; mean over episodes ± 95% confidence half-width ``1.96 · std / √episodes``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ..memories.fewshot import NAMFewShotClassifier, nam_fewshot_weights
from ..models.conv4 import l2_normalize
from ..tasks import omniglot as og

__all__ = ["BASE_TRAIN_DRAWERS", "BASE_TEST_DRAWERS", "mean_ci", "make_gates", "episode_accuracies",
           "extract_features", "evaluate_setting", "gate_episode", "gate_loss", "format_fewshot_table"]

BASE_TRAIN_DRAWERS = torch.arange(0, 15)
BASE_TEST_DRAWERS = torch.arange(15, 20)


def mean_ci(values: torch.Tensor) -> tuple[float, float]:
    """Mean and 95% confidence half-width ``1.96 · std / √n`` of per-episode values ``[n]``."""
    v = values.double()
    n = v.numel()
    half = 1.96 * float(v.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return float(v.mean()), half


def make_gates(feature_dim: int, num_base_classes: int, hidden: int = 512) -> NAMFewShotClassifier:
    """NAM few-shot gates ``f_rw`` (docs/maths.md §4, §12) as a :class:`NAMFewShotClassifier`.

    The output biases of its two MLPs start at ``+4`` (``p_w ≈ 0.98``) and ``−4``
    (``p_e ≈ 0.02``), i.e. close to the feature-averaging cosine classifier (``p_w = 1, p_e = 0``).
    """
    clf = NAMFewShotClassifier(feature_dim, num_base_classes, hidden=hidden)
    with torch.no_grad():
        clf.f_w[-1].bias.fill_(4.0)
        clf.f_e[-1].bias.fill_(-4.0)
    return clf


def episode_accuracies(weights: torch.Tensor, num_base: int, novel_q: torch.Tensor, novel_y: torch.Tensor,
                       base_q: torch.Tensor, base_y: torch.Tensor) -> dict[str, float]:
    """Table 2's accuracies for one generalised episode.

    ``weights`` ``[B + N, F]`` (base rows first), queries ``novel_q`` ``[Qn, F]`` with labels
    ``novel_y ∈ [0, N)`` and ``base_q`` ``[Qb, F]`` with labels ``base_y ∈ [0, B)``; scores are
    ``μ(W) μ(x)``. Novel: novel queries among the N novel rows; Base: base queries among the B
    base rows; Both: all queries among all rows (novel label ``B + n``), averaged over all queries.
    """
    sn = l2_normalize(novel_q) @ weights.T  # [Qn, B+N]
    sb = l2_normalize(base_q) @ weights.T  # [Qb, B+N]
    novel = (sn[:, num_base:].argmax(1) == novel_y).double()
    base = (sb[:, :num_base].argmax(1) == base_y).double()
    both = torch.cat([sn.argmax(1) == novel_y + num_base, sb.argmax(1) == base_y]).double()
    return {"novel": float(novel.mean()), "base": float(base.mean()), "both": float(both.mean())}


@torch.no_grad()
def extract_features(backbone: torch.nn.Module, images: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Frozen (eval-mode) features of uint8 images ``[C, S, 28, 28]`` → float ``[C, S, F]``."""
    backbone.eval()
    c, s = images.shape[:2]
    flat = images.reshape(c * s, *images.shape[2:])  # [C*S, 28, 28]
    out = [backbone(og.to_float(flat[i:i + batch_size])) for i in range(0, flat.shape[0], batch_size)]
    return torch.cat(out).reshape(c, s, -1)  # [C, S, F]


def gate_episode(feats: dict, n_way: int, k_shot: int, n_query: int, g: torch.Generator) -> tuple:
    """The indices of one gate-training episode on the base features (training drawers only):
    ``(episode, base query classes [N·Q], base query drawers [N·Q])``."""
    pool, ids = feats["base"], feats["base_ids"]
    ep = og.sample_episode(pool.shape[0], pool.shape[1], n_way, k_shot, n_query, g, allowed_samples=BASE_TRAIN_DRAWERS)
    keep = torch.ones(feats["w_base"].shape[0], dtype=torch.bool)
    keep[ids[ep.classes]] = False
    others = torch.nonzero(keep[ids]).squeeze(1)  # subset rows still in W_base
    bsel = others[torch.randint(others.numel(), (n_way * n_query,), generator=g)]
    bsmp = BASE_TRAIN_DRAWERS[torch.randint(BASE_TRAIN_DRAWERS.numel(), (n_way * n_query,), generator=g)]
    return ep, bsel, bsmp


def gate_loss(gates: NAMFewShotClassifier, feats: dict, episode: tuple, n_way: int, n_query: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, p_w, p_e)`` of one gate-training episode: its N base classes play the novel
    ones (their rows leave ``W_base``), their K support features are written with Algorithm 1,
    and the loss is the cross-entropy of ``s · μ(W') μ(x)`` over all remaining base +
    pseudo-novel classes, on queries of both."""
    ep, bsel, bsmp = episode
    pool, ids, w_base, scale = feats["base"], feats["base_ids"], feats["w_base"], float(feats["scale"])
    keep = torch.ones(w_base.shape[0], dtype=torch.bool)
    keep[ids[ep.classes]] = False
    remap = torch.cumsum(keep, 0) - 1  # global base id -> row among kept rows
    support = og.gather(pool, ep.classes, ep.support)  # [N, K, F]
    p_w, p_e = gates.gates(support)  # [N, K] each
    w = nam_fewshot_weights(w_base[keep], support, p_w, p_e)  # [B-N+N, F]
    nb = int(keep.sum())
    q = torch.cat([og.gather(pool, ep.classes, ep.query).reshape(-1, pool.shape[-1]),  # [N*Q, F]
                   og.gather(pool, bsel, bsmp)])
    y = torch.cat([nb + torch.arange(n_way).repeat_interleave(n_query), remap[ids[bsel]]])
    return F.cross_entropy(scale * l2_normalize(q) @ w.T, y), p_w, p_e


@torch.no_grad()
def evaluate_setting(feats: dict, n_way: int, k_shot: int, n_query: int, episodes: int,
                     methods: dict[str, Callable], seed: int) -> dict:
    """Mean ± 95% CI (in %) of Novel / Base / Both over ``episodes`` generalised test episodes.

    ``methods`` maps a name to ``fn(w_base, support [N, K, F]) -> weights [B + N, F]``; every
    method sees the same episodes. Base queries (``n_way · n_query`` per episode) come from the
    held-out drawers 16–20 of the base feature subset. Returns ``{method: {"novel" | "base" |
    "both": {"mean", "ci95"}}}``.
    """
    g = torch.Generator().manual_seed(seed)
    novel_pool, base_pool, ids, w_base = feats["novel"], feats["base"], feats["base_ids"], feats["w_base"]
    acc = {m: {"novel": [], "base": [], "both": []} for m in methods}
    for _ in range(episodes):
        ge = og.sample_generalized_episode(novel_pool.shape[0], base_pool.shape[0], novel_pool.shape[1], n_way,
                                           k_shot, n_query, n_way * n_query, g, base_samples=BASE_TEST_DRAWERS)
        support = og.gather(novel_pool, ge.novel.classes, ge.novel.support)  # [N, K, F]
        nq = og.gather(novel_pool, ge.novel.classes, ge.novel.query).reshape(-1, novel_pool.shape[-1])  # [N*Q, F]
        ny = torch.arange(n_way).repeat_interleave(n_query)
        bq = og.gather(base_pool, ge.base_classes, ge.base_samples)  # [M, F]
        by = ids[ge.base_classes]
        for name, fn in methods.items():
            r = episode_accuracies(fn(w_base, support), w_base.shape[0], nq, ny, bq, by)
            for key, v in r.items():
                acc[name][key].append(v)
    out: dict = {}
    for name, d in acc.items():
        out[name] = {}
        for key, vals in d.items():
            mean, half = mean_ci(torch.tensor(vals))
            out[name][key] = {"mean": 100 * mean, "ci95": 100 * half}
    return out


def _fmt(d: dict) -> str:
    return f"{d['mean']:.2f} ± {d['ci95']:.2f}"


def format_fewshot_table(results: list[dict]) -> str:
    """Markdown table of Both / Novel / Base (mean ± 95% CI, %) per setting and method, from
    ``results.json`` dicts of ``omniglot_fewshot`` runs (``way``, ``shot``, ``methods``)."""
    lines = ["| setting | method | Both | Novel (plain N-way) | Base | episodes | seed |", "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.get("shot", 0), r.get("way", 0), r.get("seed", 0))):
        for m, acc in (r.get("methods") or {}).items():
            lines.append(f"| {r.get('way')}-way {r.get('shot')}-shot | {m} | {_fmt(acc['both'])} | {_fmt(acc['novel'])} | "
                         f"{_fmt(acc['base'])} | {r.get('episodes')} | {r.get('seed', 0)} |")
    return "\n".join(lines)
