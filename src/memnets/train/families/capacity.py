"""The associative-retrieval tasks of the capacity lab as engine tasks (Schlag, Irie & Schmidhuber
2021, Sec. 4.1; docs/maths.md §6, docs/capacity.md): ``retrieval`` (settings 1 and 2) and
``mqar`` (multi-query associative recall), one memory per run. The sweeps of ``memnets
capacity`` (many short runs, one table; :mod:`memnets.capacity`) train each of their cells as
one of these tasks; ``memnets train capacity/...`` gives a cell a run folder, checkpoints,
resume and DDP.

``retrieval``: :class:`~memnets.capacity.harness.RetrievalModel` — a learned embedding of the
key symbols (width ``model.d_model``) and one memory adapter ``model.backbone`` (a name of
:data:`memnets.capacity.adapters.MEMORIES`: softmax, linear, dpfp1-3, delta, nam, nam_erase,
...); ``model.options.value_dim`` (64). ``task.options``: ``num_pairs`` (S = 16), ``edits``
(false: setting 1; true: setting 2, keys re-assigned, ``num_writes`` writes, default 2·S),
``value_kind`` (``random`` or ``onehot``). Loss: squared error summed over the value dims
(random values; predicting zeros scores 1.0) or cross-entropy (one-hot). Accuracy: the
retrieved vector is nearest to the right value among the sequence's values (or argmax).

``mqar``: :class:`~memnets.capacity.harness.TokenModel` — embedding of width ``model.d_model``,
token shift, one causal memory layer ``model.backbone``, linear head; ``task.options``:
``seq_len`` (512), ``num_pairs`` (64), ``vocab_size`` (512). Loss and accuracy over the query
positions.

Data: ``task.train_size`` sequences per epoch in batches of ``batch_size``, batch ``b`` of
epoch ``e`` drawn from the seed ``(seed, "train", e, b)``; split ``heldout``:
``task.eval_size`` fresh sequences (independent of the seed). Metrics: ``loss``,
``accuracy``, ``n``; the reported evaluation has the highest accuracy (ties: the lower loss).
``results.json``: the common schema (``family`` = ``"capacity"``, ``metric`` = ``"accuracy"``)
plus ``memory`` and ``setting`` (``{"num_pairs", ...}``). ``memnets table`` prints the held-out
accuracy of each memory (rows) by setting (columns).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from ..data import derive_seed
from ..task import RunSummary, Task, common_results
from ._common import all_reduce_sum, check_options

__all__ = ["RetrievalTask", "MQARTask"]

RETRIEVAL_OPTIONS = {"num_pairs": 16, "edits": False, "num_writes": None, "value_kind": "random"}
MQAR_OPTIONS = {"seq_len": 512, "num_pairs": 64, "vocab_size": 512}


class RetrievalTask(Task):
    """``retrieval`` (settings 1 and 2; see the module docstring)."""

    family = "capacity"
    metric = "accuracy"
    known = RETRIEVAL_OPTIONS
    model_known = {"value_dim": 64}

    def options(self, cfg) -> dict:
        return {**self.known, **cfg.task.options}

    def validate(self, cfg) -> None:
        from ...capacity.adapters import unavailable_reason
        from ..config import ConfigError

        check_options(self.name, ("task.options", self.known, cfg.task.options),
                      ("model.options", self.model_known, cfg.model.options))
        reason = unavailable_reason(cfg.model.backbone)
        if reason:
            raise ConfigError(f"`model.backbone` of the {self.name!r} task: {reason}")
        if set(cfg.task.splits) != {"heldout"} or cfg.select_split != "heldout":
            raise ConfigError(f"the {self.name!r} task evaluates on fresh sequences: set task.splits = "
                              "{ heldout = [1, 1] } and select_split = \"heldout\"")
        if cfg.task.train_size < cfg.batch_size:
            raise ConfigError(f"`task.train_size` ({cfg.task.train_size}) must be >= `batch_size` ({cfg.batch_size})")
        o = self.options(cfg)
        if self.name == "retrieval" and o["value_kind"] not in ("random", "onehot"):
            raise ConfigError(f"`task.options.value_kind` expected 'random' or 'onehot', got {o['value_kind']!r}")

    def build_model(self, cfg) -> torch.nn.Module:
        from ...capacity.harness import RetrievalModel

        return RetrievalModel(cfg.model.backbone, self.options(cfg)["num_pairs"], cfg.model.d_model,
                              cfg.model.options.get("value_dim", 64))

    def batch(self, cfg, n: int, g: torch.Generator):
        from ...tasks.retrieval import edit_retrieval_batch, retrieval_batch

        o = self.options(cfg)
        vd = cfg.model.options.get("value_dim", 64)
        if o["edits"]:
            return edit_retrieval_batch(n, o["num_pairs"], o["num_writes"], vd, value_kind=o["value_kind"], generator=g)
        return retrieval_batch(n, o["num_pairs"], vd, value_kind=o["value_kind"], generator=g)

    def forward(self, net, b, cfg, device, autocast=contextlib.nullcontext):
        from ...capacity.harness import retrieval_metrics

        b = type(b)(*(t.to(device) for t in b))
        with autocast():
            pred = net(b.keys, b.values, b.queries)
        return retrieval_metrics(pred.float(), b, self.options(cfg)["value_kind"])

    def probe_loss(self, model, cfg, device):
        return self.forward(model, self.batch(cfg, 2, torch.Generator().manual_seed(0)), cfg, device)[0]

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch, b))
        batch = self.batch(cfg, cfg.batch_size, g)
        return type(batch)(*(t[rank::world] for t in batch))

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        loss, acc = self.forward(net, batch, cfg, device, autocast)
        return loss, lambda: {"acc": acc}

    def eval_splits(self, cfg) -> dict[str, Any]:
        return {"heldout": self.batch(cfg, cfg.task.eval_size, torch.Generator().manual_seed(derive_seed("eval", self.name)))}

    def sample(self, cfg, seed: int = 0, split: str | None = None):
        """The model's arguments for one fresh sequence: ``(keys [1, T], values [1, T, dv],
        queries [1, Q])``."""
        b = self.batch(cfg, 1, torch.Generator().manual_seed(seed))
        return b.keys, b.values, b.queries

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        was = model.training
        model.eval()
        n = len(data[0])
        idx = torch.arange(n)[info.rank::info.world]
        tot = torch.zeros(3, dtype=torch.float64)
        for i in range(0, idx.numel(), 256):
            j = idx[i:i + 256]
            part = type(data)(*(t[j] for t in data))
            loss, acc = self.forward(model, part, cfg, device, autocast)
            tot += torch.tensor([float(loss) * len(j), float(acc) * len(j), len(j)], dtype=torch.float64)
        tot = all_reduce_sum(tot, info, device)
        model.train(was)
        loss, acc, m = tot.tolist()
        return {"loss": loss / max(m, 1), "accuracy": acc / max(m, 1), "n": int(m)}

    def selection_key(self, evals, cfg) -> tuple:
        v = evals[cfg.select_split]
        return (v["accuracy"], -v["loss"] if math.isfinite(v["loss"]) else -math.inf)

    def selection_rule(self, cfg) -> str:
        return (f"highest {cfg.select_split} accuracy, ties by the lower {cfg.select_split} loss, "
                f"then the {cfg.select_ties} evaluation")

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        o = self.options(cfg)
        return {**common_results(self, cfg, s), "memory": cfg.model.backbone,
                "setting": {k: o[k] for k in self.known}}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        """Per task: the held-out ``metric`` (accuracy, %) of each memory (rows) by setting (columns)."""
        metric = metric or "accuracy"
        out = []
        for task in dict.fromkeys(r.get("task") for r in results):
            rs = [r for r in results if r.get("task") == task]
            settings = list(dict.fromkeys(", ".join(f"{k}={v}" for k, v in (r.get("setting") or {}).items()
                                                    if v not in (None, False)) for r in rs))
            mems = list(dict.fromkeys(r.get("memory") for r in rs))
            cells = {}
            for r in rs:
                key = ", ".join(f"{k}={v}" for k, v in (r.get("setting") or {}).items() if v not in (None, False))
                v = ((r.get("splits") or {}).get("heldout") or {}).get(metric)
                cells.setdefault((r.get("memory"), key), []).append(v)
            lines = [f"**{task}**, held-out {metric} (%)", "", "| memory | " + " | ".join(settings) + " |",
                     "|---|" + "---|" * len(settings)]
            for m in mems:
                row = []
                for st in settings:
                    vs = [v for v in cells.get((m, st), []) if v is not None]
                    row.append("–" if not vs else " / ".join(f"{100 * v:.1f}" for v in vs))
                lines.append(f"| {m} | " + " | ".join(row) + " |")
            out.append("\n".join(lines))
        return "\n\n".join(out)


class MQARTask(RetrievalTask):
    """``mqar`` (see the module docstring)."""

    known = MQAR_OPTIONS
    model_known = {}

    def build_model(self, cfg) -> torch.nn.Module:
        from ...capacity.harness import TokenModel

        return TokenModel(cfg.model.backbone, self.options(cfg)["vocab_size"], cfg.model.d_model)

    def batch(self, cfg, n: int, g: torch.Generator):
        from ...tasks.retrieval import mqar_batch

        o = self.options(cfg)
        return mqar_batch(n, o["seq_len"], o["num_pairs"], o["vocab_size"], generator=g)

    def sample(self, cfg, seed: int = 0, split: str | None = None) -> torch.Tensor:
        """Token ids ``[1, T]`` of one fresh sequence."""
        return self.batch(cfg, 1, torch.Generator().manual_seed(seed)).inputs

    def forward(self, net, b, cfg, device, autocast=contextlib.nullcontext):
        b = type(b)(*(t.to(device) for t in b))
        with autocast():
            logits = net(b.inputs)  # [B, T, V]
        logits = logits.float()
        loss = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=-100)
        m = b.labels != -100
        return loss, (logits.argmax(-1)[m] == b.labels[m]).float().mean()
