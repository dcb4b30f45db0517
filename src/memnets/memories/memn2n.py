"""End-to-End Memory Networks (docs/maths.md §9; Sukhbaatar et al. 2015; seed 004 §4).

Per hop k: memories ``m_i = Σ_j l_j ∘ A^k x_ij + T_A^k(i)``, outputs
``c_i = Σ_j l_j ∘ C^k x_ij + T_C^k(i)``, attention ``p = softmax(uᵀ m)``, response
``o = Σ_i p_i c_i``, next controller ``u^{k+1} = u^k + o^k`` (adjacent) or ``H u^k + o^k``
(layer-wise); answer logits ``W u^{K+1} = W (o^K + u^K)``. ``l_j`` is the position encoding
(PE) and ``T`` the temporal encoding (TE); linear start (LS) drops the softmax; random noise
(RN) inserts empty memories during training.

Inputs are word ids, 0 = padding / nil word (its embedding is fixed at zero). Story slot 0
holds the *most recent* sentence (``T(1)`` in the paper's reverse indexing); an all-zero
sentence is padding and is masked out of the attention.

The encodings, the hop attention and random noise are the pure functions of
:mod:`memnets.ops.memn2n`, re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn

from memnets._checks import check_positive_int, check_shape, check_tensor
from memnets.ops._impl import resolve_impl
from memnets.ops.memn2n import (Bags, bag_weights, check_pe_form, encode_bags, memory_attention, memory_mask,
                                position_encoding, random_noise, sentence_encoding)
from memnets.registry import register_model

__all__ = ["MemN2N", "MemN2NConfig", "MemN2NAux", "position_encoding", "sentence_encoding",
           "Bags", "bag_weights", "encode_bags",
           "memory_attention", "random_noise", "memory_mask"]

WEIGHT_TYING = ("adjacent", "layerwise")
PE_LENGTHS = ("sentence", "fixed")


class MemN2NAux(NamedTuple):
    """What ``forward(..., return_aux=True)`` returns beside the logits.

    attention: ``[B, K, M]`` attention probabilities per hop (each row sums to 1 over the
    valid memories when the softmax is on; raw scores under linear start).
    memory_mask: ``[B, M]`` bool, which memory slots were attended (after random noise).
    controller: ``[B, K+1, d]`` the controller states ``u^1 .. u^{K+1}``.
    """

    attention: torch.Tensor
    memory_mask: torch.Tensor
    controller: torch.Tensor


@dataclass(frozen=True)
class MemN2NConfig:
    """Constructor arguments of :class:`MemN2N` (see its docstring)."""

    vocab_size: int
    sentence_size: int
    embedding_dim: int = 20
    hops: int = 3
    memory_size: int = 50
    weight_tying: str = "adjacent"
    position_encoding: bool = True
    temporal_encoding: bool = True
    answer_size: int | None = None
    linear_start: bool = False
    random_noise: float = 0.0
    init_std: float = 0.1
    impl: str = "fused"
    pe_length: str = "sentence"
    pe_form: str = "paper"


@register_model("memn2n")
class MemN2N(nn.Module):
    """End-to-End Memory Network over bAbI-style stories (docs/maths.md §9).

    Args:
        vocab_size: number of word ids ``V`` (id 0 = padding / nil word).
        embedding_dim: ``d`` (paper: 20 per task, 50 joint).
        hops: ``K`` memory hops (paper: 3).
        memory_size: ``M``, most memory slots a story may have (paper: 50); also the number of
            temporal-encoding rows.
        sentence_size: ``W``, most words per sentence or query.
        weight_tying: ``"adjacent"`` (``A^{k+1} = C^k``, ``B = A^1``, ``Wᵀ = C^K``; K+1
            embeddings) or ``"layerwise"`` (one ``A``, one ``C`` for all hops, separate ``B``,
            ``W`` and the linear map ``H``: ``u^{k+1} = H u^k + o^k``).
        position_encoding: PE sentence encoding (else bag of words).
        pe_length: ``J`` of the PE weights: ``"sentence"`` (each sentence's own number of
            words, the paper's text) or ``"fixed"`` (``sentence_size`` for every sentence and
            the query, as the authors' released code does: there a word's weights depend on
            its position alone, not on the length of its sentence).
        pe_form: the PE formula: ``"paper"`` (§4.1 of the paper, weights in [0, 1]) or
            ``"code"`` (the authors' released code, about twice as large, see
            :func:`position_encoding`). With the paper's training recipe (init ``N(0, 0.1²)``,
            SGD lr 0.005–0.01) the scale matters: on bAbI task 16 the paper form stays near 50%
            error, the code form reaches < 1%.
        temporal_encoding: add learned ``T_A(i)``, ``T_C(i)`` per memory slot.
        answer_size: ``A`` answer classes, default ``V`` (must be ``V`` with adjacent tying).
        linear_start: LS; while True the attention softmax of every hop is removed. A plain
            attribute: set ``model.linear_start = False`` to re-insert the softmax.
        random_noise: RN rate (paper: 0.1); applied in training mode only.
        init_std: weights start from ``N(0, init_std²)`` (paper: 0.1).
        impl: ``"auto"`` (default; = ``"fused"``), ``"fused"`` (PE-weighted
            ``F.embedding_bag`` sums, :func:`bag_weights`) or ``"reference"`` (embedding lookup
            per word, :func:`sentence_encoding`). Both give the same values and gradients
            (tested). The old names ``"bag"`` and ``"lookup"`` are accepted with a FutureWarning.

    ``forward(stories [B, M', W'] long, query [B, W''] long, return_aux=False)`` with
    ``M' ≤ M``, ``W', W'' ≤ W`` returns logits ``[B, A]``, or ``(logits, MemN2NAux)``.
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 20, hops: int = 3, memory_size: int = 50,
                 *, sentence_size: int, weight_tying: str = "adjacent", position_encoding: bool = True,
                 temporal_encoding: bool = True, answer_size: int | None = None,
                 linear_start: bool = False, random_noise: float = 0.0, init_std: float = 0.1,
                 impl: str = "auto", pe_length: str = "sentence", pe_form: str = "paper"):
        super().__init__()
        impl = resolve_impl("MemN2N", impl, {"bag": "fused", "lookup": "reference"})
        if pe_length not in PE_LENGTHS:
            raise ValueError(f"`pe_length` expected one of {PE_LENGTHS}, got {pe_length!r}")
        check_pe_form(pe_form)
        self.impl = impl
        for name, v in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim), ("hops", hops),
                        ("memory_size", memory_size), ("sentence_size", sentence_size)):
            check_positive_int(name, v, minimum=2 if name == "vocab_size" else 1)
        if weight_tying not in WEIGHT_TYING:
            raise ValueError(f"`weight_tying` expected one of {WEIGHT_TYING}, got {weight_tying!r}")
        A = vocab_size if answer_size is None else check_positive_int("answer_size", answer_size)
        if weight_tying == "adjacent" and A != vocab_size:
            raise ValueError(f"`answer_size` must equal vocab_size={vocab_size} with adjacent tying "
                             f"(Wᵀ = C^K), got {A}")
        if not 0.0 <= random_noise < 1.0:
            raise ValueError(f"`random_noise` expected a rate in [0, 1), got {random_noise!r}")
        self.config = MemN2NConfig(vocab_size, sentence_size, embedding_dim, hops, memory_size,
                                   weight_tying, position_encoding, temporal_encoding, A,
                                   linear_start, random_noise, init_std, impl, pe_length, pe_form)
        self.linear_start = bool(linear_start)
        self.random_noise = float(random_noise)
        d, K = embedding_dim, hops
        n_emb = K + 1 if weight_tying == "adjacent" else 3  # adjacent: E_0..E_K; layerwise: A, B, C
        self.embeddings = nn.ModuleList(nn.Embedding(vocab_size, d, padding_idx=0) for _ in range(n_emb))
        n_tem = (K + 1 if weight_tying == "adjacent" else 2) if temporal_encoding else 0  # layerwise: T_A, T_C
        self.temporal = nn.ParameterList(nn.Parameter(torch.zeros(memory_size, d)) for _ in range(n_tem))
        if weight_tying == "layerwise":
            self.H = nn.Linear(d, d, bias=False)
            self.W = nn.Linear(d, A, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every weight from ``N(0, init_std²)``; the nil word's embedding stays 0."""
        std = self.config.init_std
        for p in self.parameters():
            nn.init.normal_(p, 0.0, std)
        with torch.no_grad():
            for e in self.embeddings:
                e.weight[0].zero_()

    # The tied roles of each hop (0-based hop index k).
    def embedding_A(self, k: int) -> nn.Embedding:
        return self.embeddings[k] if self.config.weight_tying == "adjacent" else self.embeddings[0]

    def embedding_C(self, k: int) -> nn.Embedding:
        return self.embeddings[k + 1] if self.config.weight_tying == "adjacent" else self.embeddings[2]

    def embedding_B(self) -> nn.Embedding:
        return self.embeddings[0] if self.config.weight_tying == "adjacent" else self.embeddings[1]

    def _temporal(self, k: int, role: str) -> torch.Tensor | None:
        if not self.config.temporal_encoding:
            return None
        if self.config.weight_tying == "adjacent":
            return self.temporal[k if role == "A" else k + 1]
        return self.temporal[0 if role == "A" else 1]

    def answer_weight(self) -> torch.Tensor:
        """``W`` as ``[A, d]``: ``C^K``'s embedding (adjacent) or the separate matrix (layer-wise)."""
        if self.config.weight_tying == "adjacent":
            return self.embeddings[-1].weight
        return self.W.weight

    def forward(self, stories: torch.Tensor, query: torch.Tensor, return_aux: bool = False,
                mask: torch.Tensor | None = None):
        """Answer logits ``[B, A]`` (and :class:`MemN2NAux` when ``return_aux``).

        stories ``[B, M', W']`` long with ``M' ≤ memory_size``, query ``[B, W'']`` long;
        ``mask`` ``[B, M']`` bool overrides which slots are valid (default: the
        non-empty sentences).
        """
        cfg = self.config
        check_tensor("stories", stories)
        check_shape("stories", stories, ["B", "M", "W"], [None, None, None])
        B, M, W = stories.shape
        if B == 0:
            raise ValueError(f"`stories` expected batch size B >= 1, got {list(stories.shape)}")
        check_shape("query", query, ["B", "W"], [B, None])
        for name, x in (("stories", stories), ("query", query)):
            if x.dtype not in (torch.long, torch.int32, torch.int64):
                raise TypeError(f"`{name}` expected integer word ids (torch.long), got {x.dtype}")
        if M > cfg.memory_size or W > cfg.sentence_size or query.shape[1] > cfg.sentence_size:
            raise ValueError(
                f"`stories` expected [B, M, W] with M <= memory_size={cfg.memory_size} and "
                f"W <= sentence_size={cfg.sentence_size} (query too), got stories "
                f"{list(stories.shape)}, query {list(query.shape)}")
        for name, x in (("stories", stories), ("query", query)):
            if x.numel() and (int(x.min()) < 0 or int(x.max()) >= cfg.vocab_size):
                raise ValueError(f"`{name}` expected word ids in [0, vocab_size={cfg.vocab_size}), "
                                 f"got range [{int(x.min())}, {int(x.max())}]")
        mask = memory_mask(stories) if mask is None else check_shape(
            "mask", mask, ["B", "M"], [B, M]).bool()
        if self.training and self.random_noise > 0:
            stories, mask = random_noise(stories, mask, self.random_noise, capacity=cfg.memory_size)
            M = stories.shape[1]
        use_pe = cfg.position_encoding
        J = cfg.sentence_size if cfg.pe_length == "fixed" else None
        encoded: dict[int, torch.Tensor] = {}  # each embedding encodes the story once (tying)
        if self.impl == "reference":
            u = sentence_encoding(query, self.embedding_B(), use_pe, length=J, form=cfg.pe_form)  # [B, d]
            pe = None
            if use_pe:
                lengths = (stories != 0).sum(-1) if J is None else torch.full(stories.shape[:-1], J,
                                                                              device=stories.device)  # [B, M]
                pe = position_encoding(lengths, cfg.embedding_dim, W, cfg.pe_form)  # [B, M, W, d]

            def encode(emb: nn.Embedding) -> torch.Tensor:
                if id(emb) not in encoded:
                    encoded[id(emb)] = sentence_encoding(stories, emb, use_pe, pe)  # [B, M, d]
                return encoded[id(emb)]
        else:
            dtype = self.embeddings[0].weight.dtype
            pe_args = (use_pe, dtype, J, cfg.pe_form, cfg.embedding_dim)
            u = encode_bags(bag_weights(query, *pe_args), self.embedding_B().weight)  # [B, d]
            bags = bag_weights(stories, *pe_args)

            def encode(emb: nn.Embedding) -> torch.Tensor:
                if id(emb) not in encoded:
                    encoded[id(emb)] = encode_bags(bags, emb.weight)  # [B, M, d]
                return encoded[id(emb)]

        controller, attention = [u], []
        for k in range(cfg.hops):
            m = encode(self.embedding_A(k))  # [B, M, d]
            c = encode(self.embedding_C(k))  # [B, M, d]
            t_a, t_c = self._temporal(k, "A"), self._temporal(k, "C")
            if t_a is not None:
                m = m + t_a[:M]
                c = c + t_c[:M]
            p = memory_attention(u, m, mask, linear=self.linear_start)  # [B, M]
            o = torch.einsum("bm,bmd->bd", p, c)
            u = (self.H(u) if cfg.weight_tying == "layerwise" else u) + o
            controller.append(u)
            attention.append(p)
        logits = u @ self.answer_weight().t()  # [B, A]
        if not return_aux:
            return logits
        return logits, MemN2NAux(torch.stack(attention, 1), mask, torch.stack(controller, 1))
