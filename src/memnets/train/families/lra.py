"""Long Range Arena classification as engine tasks (seed 000 Table 3; docs/maths.md §5, §11,
docs/lra.md): ``listops`` (generated ListOps trees, :mod:`memnets.tasks.listops`) and ``text``
(byte-level IMDB reviews, :mod:`memnets.tasks.imdb`, read from ``--data-dir`` /
``$MEMNETS_DATA`` / ``../shared/data``).

Model: :class:`~memnets.models.lra.LRAClassifier`: token embedding (0 = padding) + learned
positions + a :class:`~memnets.models.transformer.TransformerEncoder` whose attention is
``model.backbone`` (``softmax``, ``linear``, ``nam``, or any other kind the encoder knows) +
mean or CLS pooling + Linear. ``model.d_model`` is its width; ``model.options``: ``layers``
(2), ``heads`` (4), ``ffn`` (128), ``dropout`` (0), ``pool`` (``mean`` or ``cls``),
``norm_first`` (false: post-LN; true: pre-LN with a final LayerNorm, as the LRA models),
``zero_init_out`` (false; true: every attention block starts as the identity map) and
``nam_length_norm`` (false; NAM attention divides its output by the number of keys).

Task settings: ``task.train_size`` training examples (``n_train``), ``task.eval_size`` test
examples (``n_test``), ``task.options``: ``max_len`` (sequence length; 2000), ``min_len``
(ListOps: trees kept when ``min_len < length < max_len``; default 500 at ``max_len`` 2000,
else ``max_len // 4``) and ``data_seed`` (0: the ListOps set and the IMDB subsample).
Evaluation split: ``test`` (``task.splits`` names the splits; their ranges are not used).
Steps: ``task.train_size // batch_size`` per epoch; ``max_steps`` caps the total.

Loss: cross-entropy. Metrics per split: ``accuracy``, ``loss``, ``n``. There is no model
selection on the test split: the reported evaluation is the last one (``select_ties =
"last"``). Every step is timed (wall and process CPU time of forward, backward and the
optimiser step; CUDA synchronised).

``results.json``: the common schema (:func:`memnets.train.task.common_results`; ``family`` =
``"lra"``, ``metric`` = ``"accuracy"``) plus ``wall_s_per_step``, ``cpu_s_per_step``,
``majority_test_accuracy`` (the share of the most frequent test label), ``max_len`` and
``device``. ``memnets table`` prints, per task and length, one row per attention kind with the
test accuracy and the speed-ups of softmax over it (wall and CPU time per step).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

from ..data import batch_indices, epoch_order
from ..task import RunSummary, Task, common_results
from ._common import all_reduce_sum, check_options

__all__ = ["LRATask", "default_min_len", "load_data"]

MODEL_OPTIONS = {"layers": 2, "heads": 4, "ffn": 128, "dropout": 0.0, "pool": "mean", "norm_first": False,
                 "zero_init_out": False, "nam_length_norm": False}
TASK_OPTIONS = {"max_len": 2000, "min_len": None, "data_seed": 0}


def default_min_len(max_len: int) -> int:
    """Shortest ListOps tree kept (exclusive) for a model length: 500 at 2000 (LRA), else a quarter."""
    return 500 if max_len == 2000 else max(0, max_len // 4)


_DATA: dict[tuple, tuple] = {}


def load_data(task: str, max_len: int, n_train: int, n_test: int, seed: int, min_len: int | None = None,
              data_dir=None) -> tuple:
    """``(train_tokens, train_labels, test_tokens, test_labels, vocab_size, num_classes)``
    (kept in memory for the next call with the same arguments)."""
    key = (task, max_len, n_train, n_test, seed, min_len, str(data_dir))
    if key in _DATA:
        return _DATA[key]
    if task == "listops":
        from ...tasks.listops import NUM_CLASSES, VOCAB_SIZE, cached_listops, split_listops

        min_len = default_min_len(max_len) if min_len is None else min_len
        data = cached_listops(n_train + n_test, seed=seed, min_len=min_len, max_len=max_len)
        parts = split_listops(data, (n_train, 0, n_test))
        out = (parts["train"].tokens, parts["train"].labels, parts["test"].tokens, parts["test"].labels,
               VOCAB_SIZE, NUM_CLASSES)
    elif task == "text":
        from ...tasks.imdb import VOCAB_SIZE, load_imdb

        tr = load_imdb("train", max_len=max_len, data_dir=data_dir)
        te = load_imdb("test", max_len=max_len, data_dir=data_dir)
        g = torch.Generator().manual_seed(seed)
        i = torch.randperm(len(tr.labels), generator=g)[:n_train]
        j = torch.randperm(len(te.labels), generator=g)[:n_test]
        out = (tr.tokens[i], tr.labels[i], te.tokens[j], te.labels[j], VOCAB_SIZE, 2)
    else:
        raise ValueError(f"`task` expected 'listops' or 'text', got {task!r}")
    _DATA.clear()  # one data set at a time
    _DATA[key] = out
    return out


class LRATask(Task):
    """``listops`` or ``text`` (``task.name``); see the module docstring."""

    family = "lra"
    metric = "accuracy"
    time_steps = True

    def options(self, cfg) -> tuple[dict, dict]:
        return {**MODEL_OPTIONS, **cfg.model.options}, {**TASK_OPTIONS, **cfg.task.options}

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        check_options(self.name, ("model.options", MODEL_OPTIONS, cfg.model.options),
                      ("task.options", TASK_OPTIONS, cfg.task.options))
        mo, to = self.options(cfg)
        if mo["pool"] not in ("mean", "cls"):
            raise ConfigError(f"`model.options.pool` expected 'mean' or 'cls', got {mo['pool']!r}")
        if not isinstance(to["max_len"], int) or to["max_len"] < 2:
            raise ConfigError(f"`task.options.max_len` expected an integer >= 2, got {to['max_len']!r}")
        if to["min_len"] is not None and not 0 <= to["min_len"] < to["max_len"] - 1:
            raise ConfigError(f"`task.options.min_len` expected 0 <= min_len < max_len - 1, got {to['min_len']}")
        if cfg.select_split not in cfg.task.splits or list(cfg.task.splits) != ["test"]:
            raise ConfigError(f"the {self.name!r} task evaluates on its test split: set task.splits = "
                              "{ test = [1, 1] } and select_split = \"test\"")
        if cfg.task.train_size < cfg.batch_size:
            raise ConfigError(f"`task.train_size` ({cfg.task.train_size}) must be >= `batch_size` ({cfg.batch_size})")

    def data(self, cfg) -> tuple:
        _, to = self.options(cfg)
        return load_data(self.name, to["max_len"], cfg.task.train_size, cfg.task.eval_size, to["data_seed"],
                         to["min_len"])

    def build_model(self, cfg) -> torch.nn.Module:
        from ...models.lra import LRAClassifier

        mo, to = self.options(cfg)
        vocab, ncls = self._sizes()
        opts = {"length_norm": True} if cfg.model.backbone == "nam" and mo["nam_length_norm"] else None
        model = LRAClassifier(vocab, ncls, to["max_len"], cfg.model.d_model, mo["layers"], mo["heads"], mo["ffn"],
                              mo["dropout"], cfg.model.backbone, mo["pool"], attention_options=opts,
                              norm_first=mo["norm_first"])
        if mo["zero_init_out"]:  # every attention block starts as the identity map
            for layer in model.encoder.layers:
                torch.nn.init.zeros_(layer.attn.out.weight)
                torch.nn.init.zeros_(layer.attn.out.bias)
        return model

    def _sizes(self) -> tuple[int, int]:
        if self.name == "listops":
            from ...tasks.listops import NUM_CLASSES, VOCAB_SIZE

            return VOCAB_SIZE, NUM_CLASSES
        from ...tasks.imdb import VOCAB_SIZE

        return VOCAB_SIZE, 2

    def probe_loss(self, model, cfg, device):
        return model(torch.ones(2, 4, dtype=torch.long, device=device)).float().sum()

    def train_data(self, cfg, epoch: int):
        return self.data(cfg), epoch_order(cfg, epoch)

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        (xtr, ytr, *_), order = data
        idx = batch_indices(order, b, cfg.batch_size, rank, world)
        return xtr[idx], ytr[idx]

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        x, y = batch[0].to(device), batch[1].to(device)
        with autocast():
            logits = net(x)
        loss = F.cross_entropy(logits.float(), y)
        return loss, lambda: {"acc": (logits.detach().argmax(-1) == y).float().mean()}

    def eval_splits(self, cfg) -> dict[str, Any]:
        _, _, xte, yte, *_ = self.data(cfg)
        return {"test": (xte, yte)}

    def sample(self, cfg, seed: int = 0, split: str | None = None) -> torch.Tensor:
        x, _ = self.eval_splits(cfg)["test"]
        return x[seed % len(x)][None]

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        x, y = data
        was = model.training
        model.eval()
        idx = torch.arange(len(y))[info.rank::info.world]
        tot = torch.zeros(3, dtype=torch.float64)
        for i in range(0, idx.numel(), cfg.batch_size):
            j = idx[i:i + cfg.batch_size]
            xb, yb = x[j].to(device), y[j].to(device)
            with autocast():
                logits = model(xb).float()
            tot += torch.tensor([float((logits.argmax(-1) == yb).sum()),
                                 float(F.cross_entropy(logits, yb, reduction="sum")), len(j)], dtype=torch.float64)
        tot = all_reduce_sum(tot, info, device)
        model.train(was)
        c, loss, n = tot.tolist()
        return {"accuracy": c / max(n, 1), "loss": loss / max(n, 1), "n": int(n)}

    def selection_key(self, evals, cfg) -> tuple:
        return (0,)  # no selection on the test split: with select_ties = "last", the last evaluation

    def selection_rule(self, cfg) -> str:
        return "none: the last evaluation (the test split is not used to choose a model)"

    def decided_by(self, evals, chosen, cfg):
        return "the last evaluation"

    def progress(self, evals) -> str:
        return "accuracy: " + " ".join(f"{n} {m['accuracy']:.3f}" for n, m in evals.items())

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        _, to = self.options(cfg)
        yte = self.eval_splits(cfg)["test"][1]
        majority = float(torch.bincount(yte).max()) / max(len(yte), 1)
        steps = max(s.steps_timed, 1)
        return {**common_results(self, cfg, s), "max_len": to["max_len"],
                "wall_s_per_step": s.step_wall_s / steps, "cpu_s_per_step": s.step_cpu_s / steps,
                "majority_test_accuracy": majority, "device": s.device}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        """Per task and length: one row per attention kind (test accuracy, wall and CPU seconds per
        training step, and softmax's time over the kind's, the speed-up); runs of one kind are
        listed by seed."""
        metric = metric or "accuracy"
        groups: dict[tuple, list[dict]] = {}
        for r in results:
            groups.setdefault((r.get("task"), r.get("max_len")), []).append(r)
        out = []
        for (task, max_len), rs in groups.items():
            order = {"softmax": 0, "linear": 1, "nam": 2}
            rs = sorted(rs, key=lambda r: (order.get(r.get("model"), 3), r.get("model", ""), r.get("seed", 0)))
            ref = next((r for r in rs if r.get("model") == "softmax"), None)
            lines = [f"**{task}**, length {max_len}", "",
                     f"| attention | seed | steps | test {metric} (%) | s/step wall | speed-up wall | s/step CPU | "
                     "speed-up CPU |", "|---|---|---|---|---|---|---|---|"]
            for r in rs:
                m = ((r.get("splits") or {}).get("test") or {})
                if metric not in m:
                    raise ValueError(f"its results.json has no {metric!r} for split 'test'")
                v = m[metric]
                sw = f"{ref['wall_s_per_step'] / r['wall_s_per_step']:.2f}" if ref and r["wall_s_per_step"] else "–"
                sc = f"{ref['cpu_s_per_step'] / r['cpu_s_per_step']:.2f}" if ref and r["cpu_s_per_step"] else "–"
                cell = f"{100 * v:.1f}" if metric == "accuracy" else f"{v:.4g}"
                lines.append(f"| {r.get('model')} | {r.get('seed', '–')} | {r.get('steps')} | {cell} | "
                             f"{r['wall_s_per_step']:.3f} | {sw} | {r['cpu_s_per_step']:.3f} | {sc} |")
            maj = rs[0].get("majority_test_accuracy")
            if maj is not None:
                lines += ["", f"Most frequent test label: {100 * maj:.1f}% of the test set."]
            out.append("\n".join(lines))
        return "\n\n".join(out)
