"""End-to-End Memory Network ops (docs/maths.md §9; Sukhbaatar et al. 2015): sentence encodings
(bag of words with position encoding, either as embedding lookups or as ``F.embedding_bag``
sums), the masked hop attention, random noise and the memory mask. Pure functions; the model is
:class:`memnets.memories.memn2n.MemN2N`, which re-exports them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


__all__ = ["position_encoding", "sentence_encoding", "Bags", "bag_weights", "encode_bags", "memory_attention",
           "random_noise", "memory_mask", "PE_FORMS", "check_pe_form"]

PE_FORMS = ("paper", "code")


def check_pe_form(form: str) -> None:
    if form not in PE_FORMS:
        raise ValueError(f"`pe_form` expected one of {PE_FORMS}, got {form!r}")


def position_encoding(sentence_length: torch.Tensor | int, embedding_dim: int,
                      max_words: int | None = None, form: str = "paper") -> torch.Tensor:
    """PE weights ``l_kj = (1 - j/J) - (k/d)(1 - 2j/J)`` (Sukhbaatar et al. 2015, §4.1).

    ``j = 1..J`` is the word position, ``k = 1..d`` the embedding coordinate, ``J`` the
    number of words in the sentence. With an int ``J`` returns ``[J, d]``; with a tensor of
    lengths ``[...]`` returns ``[..., max_words, d]`` (positions beyond ``J`` hold values of
    the formula too, but they multiply padding embeddings, which are zero). ``J = 0`` is
    treated as 1 to avoid division by zero.

    ``form="code"``: the authors' released code, ``l_kj = 1 + 4 (k - (d+1)/2)(j - (J+1)/2) / (dJ)``.
    It equals ``1/2 + 2 (k/d - 1/2)(j/J - 1/2)``, the paper's form, up to the half-index
    centring and a factor of 2: its weights lie around 1 where the paper's lie in [0, 1].
    """
    check_pe_form(form)
    d = embedding_dim
    if isinstance(sentence_length, int):
        J_t = torch.tensor(float(max(sentence_length, 1)))
        W = sentence_length if max_words is None else max_words
    else:
        J_t = sentence_length.clamp(min=1).to(torch.get_default_dtype())
        if max_words is None:
            raise ValueError("`max_words` is required when `sentence_length` is a tensor")
        W = max_words
    j = torch.arange(1, W + 1, dtype=J_t.dtype)  # [W]
    k = torch.arange(1, d + 1, dtype=J_t.dtype)  # [d]
    if form == "code":
        y = (j - (J_t.unsqueeze(-1) + 1) / 2) / J_t.unsqueeze(-1)  # [..., W]
        return 1 + 4 * (k - (d + 1) / 2) / d * y.unsqueeze(-1)  # [..., W, d]
    ratio = j / J_t.unsqueeze(-1)  # [..., W]
    ratio = ratio.unsqueeze(-1)  # [..., W, 1]
    return (1 - ratio) - (k / d) * (1 - 2 * ratio)  # [..., W, d]


def sentence_encoding(words: torch.Tensor, embedding: nn.Embedding, use_pe: bool,
                      pe: torch.Tensor | None = None, length: int | None = None,
                      form: str = "paper") -> torch.Tensor:
    """Bag of words ``Σ_j l_j ∘ E x_j`` (with PE) or ``Σ_j E x_j``: ids ``[..., W]`` → ``[..., d]``.

    ``pe`` (``[..., W, d]``, from :func:`position_encoding`) may be passed in to reuse it.
    ``length``: the ``J`` of every sentence (default: its own number of words). ``form``:
    the PE formula (:func:`position_encoding`).
    """
    emb = embedding(words)  # [..., W, d]
    if use_pe:
        if pe is None:
            lengths = (words != 0).sum(-1) if length is None else torch.full(words.shape[:-1], length,
                                                                            device=words.device)
            pe = position_encoding(lengths, emb.shape[-1], words.shape[-1], form)
        emb = emb * pe.to(emb.dtype)
    return emb.sum(-2)


class Bags(NamedTuple):
    """Word ids with their PE coefficients, shared by every embedding matrix (:func:`bag_weights`).

    ids ``[N, W]``; a, b ``[N, W]`` (b is None without PE); shape: the leading shape ``[...]``.
    """

    ids: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor | None
    shape: tuple[int, ...]


def bag_weights(words: torch.Tensor, use_pe: bool, dtype: torch.dtype | None = None,
                length: int | None = None, form: str = "paper", embedding_dim: int | None = None) -> Bags:
    """Per-word weights of the sentence encoding, computed once per batch.

    PE splits as ``l_kj = a_j + (k/d) b_j`` with ``a_j = 1 - j/J`` and ``b_j = 2j/J - 1``, so
    ``Σ_j l_j ∘ E x_j = Σ_j a_j E x_j + (k/d) ∘ Σ_j b_j E x_j`` (two weighted bags). Without
    PE, ``a_j = 1`` and ``b`` is None. Padding words (id 0) get weight 0. ``J`` is each
    sentence's number of words, or ``length`` for every sentence when given.
    ``form="code"`` (needs ``embedding_dim``): with ``y_j = (j - (J+1)/2) / J``,
    ``a_j = 1 - 2 (d+1) y_j / d`` and ``b_j = 4 y_j``.
    ids ``[..., W]`` → :class:`Bags` with ``[N, W]`` tensors, ``N = prod(...)``.
    """
    check_pe_form(form)
    lead, W = tuple(words.shape[:-1]), words.shape[-1]
    flat = words.reshape(-1, W)  # [N, W]
    valid = (flat != 0).to(dtype or torch.get_default_dtype())
    if not use_pe:
        return Bags(flat, valid, None, lead)
    J = valid.sum(-1, keepdim=True).clamp(min=1) if length is None else valid.new_full((1, 1), float(length))
    j = torch.arange(1, W + 1, dtype=valid.dtype, device=words.device)
    if form == "code":
        if embedding_dim is None:
            raise ValueError("`embedding_dim` is required with form='code'")
        d = embedding_dim
        y = (j - (J + 1) / 2) / J  # [N, W]
        return Bags(flat, (1 - 2 * (d + 1) * y / d) * valid, 4 * y * valid, lead)
    ratio = j / J  # [N, W]
    return Bags(flat, (1 - ratio) * valid, (2 * ratio - 1) * valid, lead)


def encode_bags(bags: Bags, weight: torch.Tensor) -> torch.Tensor:
    """``Σ_j a_j E x_j + (k/d) ∘ Σ_j b_j E x_j`` with ``F.embedding_bag``: embedding ``[V, d]``
    → ``[..., d]``."""
    def bag(w: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(bags.ids, weight, per_sample_weights=w.to(weight.dtype), mode="sum",
                               padding_idx=0)  # [N, d]

    out = bag(bags.a)
    if bags.b is not None:
        d = weight.shape[-1]
        k = torch.arange(1, d + 1, dtype=weight.dtype, device=weight.device) / d
        out = out + k * bag(bags.b)
    return out.reshape(*bags.shape, weight.shape[-1])  # [..., d]


def memory_mask(stories: torch.Tensor) -> torch.Tensor:
    """``[B, M]`` bool: True where the sentence has at least one non-padding word."""
    return (stories != 0).any(-1)


def memory_attention(u: torch.Tensor, m: torch.Tensor, mask: torch.Tensor,
                     linear: bool = False) -> torch.Tensor:
    """Attention ``p_i = softmax_i(uᵀ m_i)`` over valid memories (LS: ``p_i = uᵀ m_i``).

    u ``[B, d]``, m ``[B, M, d]``, mask ``[B, M]`` bool → p ``[B, M]``; masked slots get 0,
    a story with no valid memory gets all zeros (no NaN).
    """
    scores = torch.einsum("bd,bmd->bm", u, m)
    if linear:
        return scores.masked_fill(~mask, 0.0)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * mask.to(scores.dtype)


@torch.compiler.disable  # data-dependent sizes (nonzero, the grown memory): run eagerly under torch.compile
def random_noise(stories: torch.Tensor, mask: torch.Tensor, rate: float = 0.1,
                 generator: torch.Generator | None = None,
                 attend_empty: bool = False, capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random noise (RN): insert empty memories, about ``rate`` per real sentence.

    Before each valid sentence an empty memory is inserted with probability ``rate``,
    shifting it (and all older ones) one slot back in time. This jitters the temporal index
    each sentence sees (the regulariser for ``T_A``). Sentences pushed past the last slot
    are dropped; ``capacity`` (the model's memory size) lets the output grow beyond the
    ``M`` given slots up to ``capacity`` slots, so a sentence is dropped only when the memory
    itself is full, not because the batch was trimmed to its longest story. With
    ``attend_empty=False`` (the default, as in the authors' released code, which perturbs
    the time index) the inserted slots stay masked; with ``attend_empty=True`` they are
    valid memories holding only their temporal encoding.
    stories ``[B, M, W]``, mask ``[B, M]`` → ``(stories' [B, M', W], mask' [B, M'])`` with
    ``M' = M`` without ``capacity``, else ``M ≤ M' ≤ max(M, capacity)``.
    """
    B, M, W = stories.shape
    ins = (torch.rand(B, M, generator=generator, device=stories.device) < rate) & mask  # [B, M]
    new_pos = torch.arange(M, device=stories.device) + ins.long().cumsum(1)  # [B, M]
    size = M
    if capacity is not None and B and M:
        needed = int((new_pos * mask).max()) + 1  # one past the oldest shifted sentence
        size = max(M, min(capacity, needed))
    keep = mask & (new_pos < size)
    b_idx, m_idx = keep.nonzero(as_tuple=True)
    out = stories.new_zeros(B, size, W)
    out[b_idx, new_pos[b_idx, m_idx]] = stories[b_idx, m_idx]
    new_mask = mask.new_zeros(B, size)
    new_mask[b_idx, new_pos[b_idx, m_idx]] = True
    if attend_empty:
        eb, em = (ins & (new_pos - 1 < size)).nonzero(as_tuple=True)
        new_mask[eb, new_pos[eb, em] - 1] = True  # the inserted empty memories
    return out, new_mask
