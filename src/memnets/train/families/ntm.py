"""The NTM algorithmic tasks of Graves et al. (2014) as engine tasks (:mod:`memnets.tasks.ntm_tasks`,
docs/maths.md §7, §11, docs/ntm.md): ``copy``, ``repeat_copy``, ``associative_recall`` and
``priority_sort``.

Model: ``model.backbone = "ntm"``, a :class:`~memnets.memories.ntm.NTM` whose input and
output sizes are the task's, with ``model.options`` as its keyword arguments
(``memory_slots``, ``word_size``, ``read_heads``, ``write_heads``, ``controller``,
``controller_size``, ``shift_range``, ``memory_init``); ``model.d_model`` is not used.

Task settings (``task.options``): the keyword arguments of the task's generator (copy:
``min_len``, ``max_len``, ``bits``; repeat_copy: also ``min_repeats``, ``max_repeats``;
associative_recall: ``min_items``, ``max_items``, ``item_len``, ``bits``; priority_sort:
``n_in``, ``n_out``, ``bits``) and ``same_length`` (copy and repeat_copy, default true: all
sequences of a batch share one length drawn from the training range, so no padded steps run).

Data: ``task.train_size`` sequences per epoch in batches of ``batch_size``; batch ``b`` of
epoch ``e`` is drawn from the seed ``(seed, "train", e, b)``. Evaluation splits
``task.splits``: ``name = [lo, hi]``, the range of the task's size for that split (sequence
length for copy and repeat_copy, number of items for associative_recall, number of input
vectors for priority_sort, whose ``n_out`` keeps its ratio to ``n_in``), ``task.eval_size``
sequences each, drawn independently of the seed.

Loss: the cost in bits per sequence (:func:`~memnets.tasks.ntm_tasks.bits_per_sequence`).
Metrics per split: ``cost_bits``, ``bit_errors`` (wrong bits per sequence, output thresholded
at 0.5), ``seq_acc`` (sequences without a wrong bit) and ``n``. Selection: the lowest
``select_split`` ``bit_errors``, ties by the lower ``cost_bits``.

``results.json``: the common schema (:func:`memnets.train.task.common_results`; ``family`` =
``"ntm"``, ``metric`` = ``"bit_errors"``) plus ``final_cost_bits`` (the last logged training
cost), ``sequences_seen`` and ``sequences_to_cost_below_0.1`` (sequences seen when the
logged training cost first fell below 0.1 bits; null if never).
"""
from __future__ import annotations

import contextlib
import difflib
import inspect
from typing import Any

import torch

from ...tasks.ntm_tasks import (AssociativeRecallTask, CopyTask, PrioritySortTask, RepeatCopyTask, bit_errors,
                                bits_per_sequence)
from ..data import derive_seed
from ..task import RunSummary, Task, common_results
from ._common import all_reduce_sum, decided_by_part

__all__ = ["NTMTask", "GENERATORS", "make_generator"]

GENERATORS = {"copy": CopyTask, "repeat_copy": RepeatCopyTask, "associative_recall": AssociativeRecallTask,
              "priority_sort": PrioritySortTask}
ENGINE_OPTIONS = ("same_length",)


def _gen_keys(name: str) -> list[str]:
    sig = inspect.signature(GENERATORS[name].__init__)
    return [k for k in sig.parameters if k not in ("self", "batch_size", "seed")]


def _model_keys() -> list[str]:
    """The NTM's constructor arguments that ``model.options`` may set (its sizes come from the task)."""
    from ...memories.ntm import NTM

    return [k for k in inspect.signature(NTM.__init__).parameters
            if k not in ("self", "input_size", "output_size", "impl")]


def make_generator(name: str, options: dict[str, Any], size: tuple[int, int] | None = None):
    """The task generator of ``name`` with ``options`` (engine options dropped); ``size``
    (``[lo, hi]`` of a split) replaces its size range."""
    kw = {k: v for k, v in options.items() if k not in ENGINE_OPTIONS}
    if size is not None:
        lo, hi = size
        if name in ("copy", "repeat_copy"):
            kw.update(min_len=lo, max_len=hi)
        elif name == "associative_recall":
            kw.update(min_items=lo, max_items=hi)
        else:
            n_in, n_out = kw.get("n_in", 20), kw.get("n_out", 16)
            kw.update(n_in=hi, n_out=max(1, round(hi * n_out / n_in)))
    return GENERATORS[name](**kw)


class NTMTask(Task):
    """One of :data:`GENERATORS` (``task.name``); see the module docstring."""

    family = "ntm"
    metric = "bit_errors"
    higher_is_better = False

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        known = _gen_keys(self.name) + list(ENGINE_OPTIONS)
        for k in cfg.task.options:
            if k not in known:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"; did you mean `task.options.{close[0]}`?" if close else ""
                raise ConfigError(f"unknown option `task.options.{k}` of the {self.name!r} task{hint} "
                                  f"(known: {', '.join(known)})")
        if cfg.model.backbone != "ntm":
            raise ConfigError(f"`model.backbone` of the {self.name!r} task expected 'ntm', got {cfg.model.backbone!r}")
        model_keys = _model_keys()
        for k in cfg.model.options:
            if k not in model_keys:
                raise ConfigError(f"unknown option `model.options.{k}` of the NTM (known: {', '.join(model_keys)})")
        if cfg.select_split not in cfg.task.splits:
            raise ConfigError(f"`select_split` expected one of {sorted(cfg.task.splits)}, got {cfg.select_split!r}")
        if cfg.task.train_size < cfg.batch_size:
            raise ConfigError(f"`task.train_size` ({cfg.task.train_size}) must be >= `batch_size` ({cfg.batch_size})")
        try:
            make_generator(self.name, cfg.task.options)
            for split, rng in cfg.task.splits.items():
                make_generator(self.name, cfg.task.options, rng)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"task {self.name!r}: {e}") from None

    def generator(self, cfg, size=None):
        return make_generator(self.name, cfg.task.options, size)

    def build_model(self, cfg) -> torch.nn.Module:
        from ...memories.ntm import NTM

        g = self.generator(cfg)
        return NTM(g.input_size, g.output_size, **cfg.model.options)

    def probe_loss(self, model, cfg, device):
        g = self.generator(cfg)
        return model(torch.zeros(2, 3, g.input_size, device=device))[0].float().sum()

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch, b))
        gen = self.generator(cfg)
        if cfg.task.options.get("same_length", True) and self.name in ("copy", "repeat_copy"):
            L = int(torch.randint(gen.min_len, gen.max_len + 1, (1,), generator=g))
            gen = self.generator(cfg, (L, L))
        batch = gen.make_batch(cfg.batch_size, g)
        return tuple(t[rank::world] for t in batch)

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        x, y, m = (t.to(device) for t in batch)
        with autocast():
            out = net(x)[0]
        out = out.float()
        loss = bits_per_sequence(out, y, m)
        return loss, lambda: {"bit_errors": bit_errors(out.detach(), y, m)}

    def eval_splits(self, cfg) -> dict[str, Any]:
        out = {}
        for name, rng in cfg.task.splits.items():
            g = torch.Generator().manual_seed(derive_seed("eval", self.name, name))
            out[name] = self.generator(cfg, rng).make_batch(cfg.task.eval_size, g)
        return out

    def sample(self, cfg, seed: int = 0, split: str | None = None) -> torch.Tensor:
        """Inputs ``[1, T, input_size]`` of one sequence of ``split`` (default: the first split)."""
        splits = cfg.task.splits
        name = split or next(iter(splits))
        if name not in splits:
            raise ValueError(f"`split` expected one of {sorted(splits)}, got {name!r}")
        return self.generator(cfg, splits[name]).make_batch(1, torch.Generator().manual_seed(seed)).inputs

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        was = model.training
        model.eval()
        idx = torch.arange(data.inputs.shape[0])[info.rank::info.world]
        tot = torch.zeros(4, dtype=torch.float64)
        bs = max(cfg.batch_size, 64)
        for i in range(0, idx.numel(), bs):
            j = idx[i:i + bs]
            x, y, m = data.inputs[j].to(device), data.targets[j].to(device), data.mask[j].to(device)
            with autocast():
                out = model(x)[0]
            out = out.float()
            n = x.shape[0]
            wrong = (((out > 0).float() != y).float().sum(-1) * m).sum(-1)  # [B]
            tot += torch.tensor([float(bits_per_sequence(out, y, m)) * n, float(bit_errors(out, y, m)) * n,
                                 float((wrong == 0).sum()), n], dtype=torch.float64)
        tot = all_reduce_sum(tot, info, device)
        model.train(was)
        c, e, ok, n = tot.tolist()
        n = max(n, 1)
        return {"cost_bits": c / n, "bit_errors": e / n, "seq_acc": ok / n, "n": int(n)}

    def selection_key(self, evals, cfg) -> tuple:
        sel = evals[cfg.select_split]
        return (-sel["bit_errors"], -sel["cost_bits"])

    def selection_rule(self, cfg) -> str:
        return (f"lowest {cfg.select_split} bit_errors, ties by {cfg.select_split} cost_bits, "
                f"then the {cfg.select_ties} evaluation")

    def decided_by(self, evals, chosen, cfg):
        return decided_by_part([self.selection_key(e, cfg) for e in evals], chosen,
                               (f"{cfg.select_split} bit_errors", f"{cfg.select_split} cost_bits"))

    def progress(self, evals) -> str:
        return "bit_errors: " + " ".join(f"{n} {m['bit_errors']:.2f}" for n, m in evals.items())

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        train = [r for r in s.records if r.get("kind") == "train"]
        reached = next((r["step"] * cfg.batch_size for r in train if r["loss"] < 0.1), None)
        return {**common_results(self, cfg, s), "final_cost_bits": train[-1]["loss"] if train else None,
                "sequences_seen": s.steps * cfg.batch_size, "sequences_to_cost_below_0.1": reached}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        """One table per task: rows are runs (by seed), columns the ``metric`` (default bit
        errors per sequence) on each split at the reported evaluation, the last logged training
        cost and the sequences seen until it first fell below 0.1 bits; and where a run of the
        task dropped updates (``optim.spike_skip``, ``optim.nan_policy = "skip"``), how many."""
        metric = metric or "bit_errors"
        by_task: dict[str, list[dict]] = {}
        for r in results:
            by_task.setdefault(str(r.get("task")), []).append(r)
        out = []
        for task in sorted(by_task, key=lambda t: list(GENERATORS).index(t) if t in GENERATORS else 9):
            rs = sorted(by_task[task], key=lambda r: (r.get("seed", 0), r.get("name", "")))
            splits: list[str] = []
            for r in rs:
                splits += [s for s in (r.get("splits") or {}) if s not in splits]
            dropped = lambda r: r.get("updates_dropped") or {}  # noqa: E731
            drops = any(dropped(r).get("spikes") or dropped(r).get("non_finite") for r in rs)
            lines = [f"**{task}** ({metric} per sequence at the reported evaluation)", "",
                     "| run | seed | params | steps | " + " | ".join(splits) + " | final cost (bits) | "
                     "sequences to < 0.1 bits |" + (" updates dropped (spikes / non-finite) |" if drops else ""),
                     "|---|---|---|---|" + "---|" * len(splits) + "---|---|" + ("---|" if drops else "")]
            for r in rs:
                cells = []
                for s in splits:
                    v = ((r.get("splits") or {}).get(s) or {}).get(metric)
                    if v is None and (r.get("splits") or {}).get(s) is not None:
                        raise ValueError(f"its results.json has no {metric!r} for split {s!r}")
                    cells.append("–" if v is None else f"{v:.3g}")
                fc = r.get("final_cost_bits")
                lines.append(f"| {r.get('name')} | {r.get('seed', '–')} | {r.get('params')} | {r.get('steps')} | "
                             + " | ".join(cells) + f" | {'–' if fc is None else f'{fc:.3g}'} | "
                             f"{r.get('sequences_to_cost_below_0.1') or '–'} |"
                             + (f" {dropped(r).get('spikes', '–')} / {dropped(r).get('non_finite', '–')} |" if drops
                                else ""))
            out.append("\n".join(lines))
        return "\n\n".join(out)
