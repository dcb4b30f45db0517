"""Train a memory end to end on a retrieval task and measure its recall (docs/maths.md §6).

As in Schlag et al. (2021, Sec. 4.1): only the projections are trained (the key-symbol
embedding, the memory's key/query/value/gate projections and the read-out); the memory is
written with the whole sequence and read with each query after all writes.

* :class:`RetrievalModel` — input of write step t is ``x_t = [E(k_t) ; v_t ; 0]``, of a query
  ``[E(q) ; 0 ; 1]`` (``E`` a learned embedding of the key symbols, width ``d_key``).
* :func:`train_retrieval` — settings 1 and 2 (``edits=True``). Loss: squared error summed
  over the value dims, averaged over queries (random values, ``E‖v‖² = 1``, so predicting
  zeros scores 1.0) or cross-entropy (one-hot values). Accuracy: the retrieved vector is
  nearest (Euclidean) to the right value among all values written in that sequence
  (with edits, the stale values of the same key count as wrong), or argmax for one-hot.
* :class:`TokenModel` / :func:`train_mqar` — MQAR: embedding, token shift
  ``x_t = [E(w_t) ; E(w_{t−1})]``, one causal memory layer, linear head over the vocabulary.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_positive_int
from ..tasks.retrieval import edit_retrieval_batch, mqar_batch, retrieval_batch
from .adapters import build_adapter

__all__ = ["RetrievalConfig", "MQARConfig", "RetrievalModel", "TokenModel", "retrieval_metrics",
           "train_retrieval", "train_mqar"]


@dataclass(frozen=True)
class RetrievalConfig:
    """One training run of settings 1/2: ``num_pairs`` = S (with edits: number of keys)."""

    memory: str = "delta"
    num_pairs: int = 16
    edits: bool = False
    num_writes: int | None = None  # edits only; default 2·S
    d_key: int = 64
    value_dim: int = 64
    value_kind: str = "random"
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    eval_batch: int = 256
    seed: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class MQARConfig:
    """One MQAR training run (CPU-scale defaults; Zoology uses vocab 8192)."""

    memory: str = "delta"
    seq_len: int = 512
    num_pairs: int = 64
    vocab_size: int = 512
    d_model: int = 64
    steps: int = 400
    batch_size: int = 32
    lr: float = 1e-2
    eval_batch: int = 128
    seed: int = 0
    device: str = "cpu"


class RetrievalModel(nn.Module):
    """Key embedding + one memory adapter (:mod:`memnets.capacity.adapters`).

    ``forward(keys [B, T] long, values [B, T, dv], queries [B, Q] long) -> [B, Q, dv]``.
    """

    def __init__(self, memory: str, num_keys: int, d_key: int = 64, value_dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(num_keys, d_key)
        self.value_dim = value_dim
        self.mem = build_adapter(memory, d_key + value_dim + 1, d_key, value_dim)

    def forward(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        ek, eq = self.embed(keys), self.embed(queries)  # [B, T, dk], [B, Q, dk]
        x = torch.cat([ek, values, values.new_zeros(*keys.shape, 1)], dim=-1)  # [B, T, dk + dv + 1]
        xq = torch.cat([eq, eq.new_zeros(*queries.shape, self.value_dim), eq.new_ones(*queries.shape, 1)],
                       dim=-1)  # [B, Q, dk + dv + 1]
        return self.mem.write_read(x, xq)


def retrieval_metrics(pred: torch.Tensor, batch, value_kind: str = "random") -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, accuracy)`` of predictions ``pred [B, Q, dv]`` on a :class:`RetrievalBatch`."""
    if value_kind == "onehot":
        ids = torch.gather(batch.value_ids, 1, batch.target_index)  # [B, Q]
        loss = F.cross_entropy(pred.flatten(0, 1), ids.flatten())
        acc = (pred.argmax(-1) == ids).float().mean()
        return loss, acc
    loss = (pred - batch.targets).pow(2).sum(-1).mean()
    dist = torch.cdist(pred.detach(), batch.values)  # [B, Q, T]
    acc = (dist.argmin(-1) == batch.target_index).float().mean()
    return loss, acc


def _make_batch(cfg: RetrievalConfig, n: int, g: torch.Generator):
    """A batch drawn on the CPU generator, moved to ``cfg.device``."""
    if cfg.edits:
        b = edit_retrieval_batch(n, cfg.num_pairs, cfg.num_writes, cfg.value_dim,
                                 value_kind=cfg.value_kind, generator=g)
    else:
        b = retrieval_batch(n, cfg.num_pairs, cfg.value_dim, value_kind=cfg.value_kind, generator=g)
    return type(b)(*(t.to(cfg.device) for t in b))


def _fit(model: nn.Module, cfg, run) -> dict:
    """Adam on ``run(batch_size, generator) -> (loss, accuracy)`` for ``cfg.steps`` steps
    (gradient-norm clip 1), then evaluation on ``cfg.eval_batch`` held-out samples."""
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed)
    t0, losses = time.perf_counter(), []
    for _ in range(cfg.steps):
        loss, _ = run(cfg.batch_size, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        loss, acc = run(cfg.eval_batch, torch.Generator().manual_seed(10_000 + cfg.seed))
    tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
    return {**asdict(cfg), "loss": float(loss), "accuracy": float(acc), "train_loss": sum(tail) / len(tail),
            "seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in model.parameters())}


def train_retrieval(cfg: RetrievalConfig | None = None, **overrides) -> dict:
    """Train one memory on setting 1 (or 2 with ``edits``) from scratch; evaluate on fresh data.

    Returns a dict: the config, ``loss`` and ``accuracy`` on ``eval_batch`` held-out sequences,
    ``train_loss`` (mean of the last 10% of steps), ``seconds`` (wall time) and ``params``.
    Deterministic for a given ``seed`` (and thread count).
    """
    cfg = RetrievalConfig(**{**(asdict(cfg) if cfg else {}), **overrides})
    check_positive_int("steps", cfg.steps, minimum=0)
    torch.manual_seed(cfg.seed)
    model = RetrievalModel(cfg.memory, cfg.num_pairs, cfg.d_key, cfg.value_dim).to(cfg.device)

    def run(batch_size: int, g: torch.Generator):
        b = _make_batch(cfg, batch_size, g)
        return retrieval_metrics(model(b.keys, b.values, b.queries), b, cfg.value_kind)

    return _fit(model, cfg, run)


class TokenModel(nn.Module):
    """MQAR token model: ``E(w_t) ; E(w_{t−1})`` → causal memory → logits ``[B, T, V]``."""

    def __init__(self, memory: str, vocab_size: int, d_model: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mem = build_adapter(memory, 2 * d_model, d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed(tokens)  # [B, T, d]
        prev = F.pad(e, (0, 0, 1, 0))[:, :-1]  # [B, T, d], E(w_{t-1}), zeros at t = 0
        return self.head(self.mem.causal(torch.cat([e, prev], dim=-1)))  # [B, T, V]


def train_mqar(cfg: MQARConfig | None = None, **overrides) -> dict:
    """Train one memory on MQAR; returns the config, held-out ``loss`` / ``accuracy`` over the
    query positions, ``train_loss``, ``seconds`` and ``params``."""
    cfg = MQARConfig(**{**(asdict(cfg) if cfg else {}), **overrides})
    check_positive_int("steps", cfg.steps, minimum=0)
    torch.manual_seed(cfg.seed)
    model = TokenModel(cfg.memory, cfg.vocab_size, cfg.d_model).to(cfg.device)

    def run(batch_size: int, g: torch.Generator):
        b = mqar_batch(batch_size, cfg.seq_len, cfg.num_pairs, cfg.vocab_size, generator=g)
        b = type(b)(*(t.to(cfg.device) for t in b))
        logits = model(b.inputs)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=-100)
        m = b.labels != -100
        acc = (logits.argmax(-1)[m] == b.labels[m]).float().mean()
        return loss, acc

    return _fit(model, cfg, run)
