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

Both train through the engine (:func:`memnets.train.train`): a run is the ``retrieval`` or
``mqar`` task (:mod:`memnets.train.families.capacity`) with the ``capacity/*-delta`` preset's
optimiser (Adam, gradient-norm clip 1, constant rate), batch ``b`` drawn from ``(seed, b)``,
and one evaluation on ``eval_batch`` held-out sequences after the last step.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_positive_int
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
        self.memory = memory  # its name in memnets.capacity.adapters.MEMORIES
        self.embed = nn.Embedding(num_keys, d_key)
        self.value_dim = value_dim
        self.mem = build_adapter(memory, d_key + value_dim + 1, d_key, value_dim)

    def memory_inputs(self, keys: torch.Tensor, values: torch.Tensor,
                      queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the memory writes and what reads it: ``x [B, T, dk + dv + 1]`` (key embedding,
        value, query flag 0) and ``xq [B, Q, dk + dv + 1]`` (key embedding, zeros, flag 1)."""
        ek, eq = self.embed(keys), self.embed(queries)  # [B, T, dk], [B, Q, dk]
        x = torch.cat([ek, values, values.new_zeros(*keys.shape, 1)], dim=-1)
        xq = torch.cat([eq, eq.new_zeros(*queries.shape, self.value_dim), eq.new_ones(*queries.shape, 1)], dim=-1)
        return x, xq

    def forward(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        return self.mem.write_read(*self.memory_inputs(keys, values, queries))


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


def _engine_config(task: str, cfg, model: dict, options: dict):
    """The :class:`~memnets.train.config.RunConfig` of one lab run: the ``capacity/<task>-delta``
    preset with the run's memory, sizes and options; ``cfg.steps`` steps of ``cfg.batch_size``
    in one epoch, Adam at ``cfg.lr`` (clip 1, constant rate), one evaluation on
    ``cfg.eval_batch`` held-out sequences, a training record every step."""
    from dataclasses import replace

    from ..train import load_config

    base = load_config(f"capacity/{task}-delta")
    return replace(base, name=f"capacity-{task}-{cfg.memory}", seed=cfg.seed, epochs=1, batch_size=cfg.batch_size,
                   log_every=1, device=cfg.device, threads=0, checkpoint_every=0, max_steps=0, time_limit_min=0,
                   model=replace(base.model, backbone=cfg.memory, **model),
                   task=replace(base.task, train_size=cfg.steps * cfg.batch_size, eval_size=cfg.eval_batch,
                                options=options),
                   optim=replace(base.optim, lr=cfg.lr))


def _fit(run_cfg, cfg, run_dir=None) -> dict:
    """Train ``run_cfg`` with the engine (:func:`memnets.train.train`) into ``run_dir`` (default: a
    temporary folder, removed after) and return the lab's row: the fields of ``cfg``, the held-out
    ``loss`` and ``accuracy``, ``train_loss`` (mean of the last 10% of steps), ``seconds`` and
    ``params``."""
    import tempfile

    from ..train import train

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memnets-capacity-") as tmp:
        d = Path(run_dir) if run_dir is not None else Path(tmp) / "run"
        res = train(run_cfg, d, quiet=True)
        records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    held = res["splits"]["heldout"]
    tail = losses[-max(1, len(losses) // 10):] or [float("nan")]
    return {**asdict(cfg), "loss": float(held["loss"]), "accuracy": float(held["accuracy"]),
            "train_loss": sum(tail) / len(tail), "seconds": time.perf_counter() - t0, "params": res["params"]}


def train_retrieval(cfg: RetrievalConfig | None = None, *, run_dir: str | Path | None = None, **overrides) -> dict:
    """Train one memory on setting 1 (or 2 with ``edits``) from scratch; evaluate on fresh data.

    The run is a ``retrieval`` task of the training engine (:mod:`memnets.train.families.capacity`,
    preset ``capacity/retrieval-delta``), written to ``run_dir`` (default: a temporary folder).
    Returns a dict: the config, ``loss`` and ``accuracy`` on ``eval_batch`` held-out sequences,
    ``train_loss`` (mean of the last 10% of steps), ``seconds`` (wall time) and ``params``.
    Deterministic for a given ``seed`` (and thread count).
    """
    cfg = RetrievalConfig(**{**(asdict(cfg) if cfg else {}), **overrides})
    check_positive_int("steps", cfg.steps)
    options = {"num_pairs": cfg.num_pairs, "edits": cfg.edits, "value_kind": cfg.value_kind}
    if cfg.num_writes is not None:
        options["num_writes"] = cfg.num_writes
    run_cfg = _engine_config("retrieval", cfg, {"d_model": cfg.d_key, "options": {"value_dim": cfg.value_dim}},
                             options)
    return _fit(run_cfg, cfg, run_dir)


class TokenModel(nn.Module):
    """MQAR token model: ``E(w_t) ; E(w_{t−1})`` → causal memory → logits ``[B, T, V]``."""

    def __init__(self, memory: str, vocab_size: int, d_model: int = 64):
        super().__init__()
        self.memory = memory  # its name in memnets.capacity.adapters.MEMORIES
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mem = build_adapter(memory, 2 * d_model, d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def memory_input(self, tokens: torch.Tensor) -> torch.Tensor:
        """What the memory reads at each step: ``[E(w_t) ; E(w_{t−1})]`` ``[B, T, 2d]``."""
        e = self.embed(tokens)  # [B, T, d]
        prev = F.pad(e, (0, 0, 1, 0))[:, :-1]  # [B, T, d], E(w_{t-1}), zeros at t = 0
        return torch.cat([e, prev], dim=-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mem.causal(self.memory_input(tokens)))  # [B, T, V]


def train_mqar(cfg: MQARConfig | None = None, *, run_dir: str | Path | None = None, **overrides) -> dict:
    """Train one memory on MQAR (an ``mqar`` task of the training engine, preset
    ``capacity/mqar-delta``); returns the config, held-out ``loss`` / ``accuracy`` over the
    query positions, ``train_loss``, ``seconds`` and ``params``."""
    cfg = MQARConfig(**{**(asdict(cfg) if cfg else {}), **overrides})
    check_positive_int("steps", cfg.steps)
    run_cfg = _engine_config("mqar", cfg, {"d_model": cfg.d_model, "options": {}},
                             {"seq_len": cfg.seq_len, "num_pairs": cfg.num_pairs, "vocab_size": cfg.vocab_size})
    return _fit(run_cfg, cfg, run_dir)
