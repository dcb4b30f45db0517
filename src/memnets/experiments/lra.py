"""Long Range Arena classification with softmax, Linear Transformer and NAM attention
(seed 000 Table 3; docs/maths.md §5, §11, §12).

    python -m memnets.experiments.lra --task listops|text --attention softmax,linear,nam
        [--preset cpu|paper] [--max-len 2000] [--steps N] [--max-minutes M]
        [--d-model 64 --layers 2 --heads 4 --ffn 128] [--batch-size 8] [--lr 1e-3]
        [--n-train 2000 --n-test 200] [--min-len L] [--pool mean|cls] [--norm-first] [--zero-init-out]
        [--log-every K] [--eval-every K] [--warmup N] [--decay none|rsqrt]
        [--out DIR] [--seed S] [--threads T] [--device auto|cpu|cuda]

Model: token Embedding (0 = padding) + learned positions + :class:`TransformerEncoder`
(post-LN; ``--norm-first``: pre-LN with a final LayerNorm, as the LRA models) + mean pooling over non-pad positions (or a prepended CLS token) + Linear. Every
attention kind gets the same hyper-parameters, the same data order and initial seed, and the
same number of Adam steps. ``--max-minutes`` caps the training time of the *first* kind
listed (softmax by default); the number of steps it completed becomes the step count of
every other kind, so the comparison stays step-for-step.

Per kind it reports test accuracy, wall seconds and process CPU seconds per training step
(forward + backward + Adam, data already in memory) and the speed-ups ``softmax / kind``, as
one Markdown table (printed and written to ``DIR/table.md``) and ``DIR/results.json`` (which
also holds ``majority_test_accuracy``, the share of the most frequent test label).
Presets: ``cpu`` (default) = d 64, 2 layers, 4 heads, FFN 128; ``paper`` = the LRA base
model: d 512, 4 layers, 8 heads, FFN 1024 (listops) / 2048 (text), length 2000 / 4000,
96,000 / 25,000 training examples, CLS pooling. Explicit flags override a preset.

ListOps trees are kept when ``min_len < length < max_len``; ``--min-len`` defaults to 500 at
``--max-len 2000`` (the LRA rule) and to ``max_len // 4`` otherwise. ``--log-every K`` prints
the mean training loss of every K steps; that curve is kept in ``results.json`` (``loss_curve``);
``--eval-every K`` adds the test accuracy every K steps (``eval_curve``). ``--warmup N`` warms
the learning rate up linearly over N steps; ``--decay rsqrt`` then decays it as
``sqrt(N / step)`` (LRA's ``linear_warmup * rsqrt_decay``).
Generated ListOps sets are cached (:func:`memnets.tasks.listops.cached_listops`).
``--device auto`` (default) trains on CUDA when there is one; the wall time per step is then
measured with the device synchronised, and the CPU time per step means little.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from ..models.transformer import TransformerEncoder
from ..train.env import resolve_device

__all__ = ["LRAClassifier", "PRESETS", "load_task", "lr_factor", "train_one", "run", "format_table", "main"]

PRESETS = {
    "cpu": {"d_model": 64, "layers": 2, "heads": 4, "ffn": 128, "pool": "mean", "batch_size": 8,
            "listops": {"max_len": 2000, "n_train": 2000, "n_test": 200},
            "text": {"max_len": 1000, "n_train": 2000, "n_test": 500}},
    "paper": {"d_model": 512, "layers": 4, "heads": 8, "pool": "cls", "batch_size": 32,
              "listops": {"max_len": 2000, "ffn": 1024, "n_train": 96_000, "n_test": 2_000},
              "text": {"max_len": 4000, "ffn": 2048, "n_train": 25_000, "n_test": 25_000}},
}


class LRAClassifier(nn.Module):
    """Embedding + learned positions + :class:`TransformerEncoder` + pooling + Linear.

    ``forward(tokens [B, S] int64, 0 = padding) -> logits [B, num_classes]``. ``pool="mean"``
    averages the encoder output over non-pad positions; ``pool="cls"`` prepends a CLS token
    (id ``vocab_size``) and reads its output, so positions run to ``max_len + 1``.
    """

    def __init__(self, vocab_size: int, num_classes: int, max_len: int, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, dim_feedforward: int | None = None, dropout: float = 0.0,
                 attention: str = "softmax", pool: str = "mean", attention_options: dict | None = None,
                 norm_first: bool = False):
        super().__init__()
        if pool not in ("mean", "cls"):
            raise ValueError(f"`pool` expected 'mean' or 'cls', got {pool!r}")
        self.pool, self.vocab_size = pool, vocab_size
        self.embed = nn.Embedding(vocab_size + (pool == "cls"), d_model, padding_idx=0)
        self.encoder = TransformerEncoder(d_model, num_layers, num_heads, dim_feedforward, dropout, attention,
                                          norm_first=norm_first, max_len=max_len + (pool == "cls"),
                                          attention_options=attention_options)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"`tokens` expected int64 [B, S], got {tokens.dtype} {tuple(tokens.shape)}")
        if self.pool == "cls":
            cls = torch.full_like(tokens[:, :1], self.vocab_size)
            tokens = torch.cat([cls, tokens], dim=1)                  # [B, S + 1]
        mask = tokens != 0                                            # [B, S] True = keep
        h = self.encoder(self.embed(tokens), mask)                    # [B, S, d]
        if self.pool == "cls":
            return self.head(h[:, 0])
        m = mask.unsqueeze(-1).to(h.dtype)                            # [B, S, 1]
        return self.head((h * m).sum(1) / m.sum(1).clamp_min(1.0))


def default_min_len(max_len: int) -> int:
    """Shortest ListOps tree kept (exclusive) for a model length: 500 at 2000 (LRA), else a quarter."""
    return 500 if max_len == 2000 else max(0, max_len // 4)


def load_task(task: str, max_len: int, n_train: int, n_test: int, seed: int, data_dir=None,
              min_len: int | None = None):
    """``(train_tokens, train_labels, test_tokens, test_labels, vocab_size, num_classes)``."""
    if task == "listops":
        from ..tasks.listops import NUM_CLASSES, VOCAB_SIZE, cached_listops, split_listops
        min_len = default_min_len(max_len) if min_len is None else min_len
        data = cached_listops(n_train + n_test, seed=seed, min_len=min_len, max_len=max_len)
        parts = split_listops(data, (n_train, 0, n_test))
        return (parts["train"].tokens, parts["train"].labels, parts["test"].tokens, parts["test"].labels,
                VOCAB_SIZE, NUM_CLASSES)
    if task == "text":
        from ..tasks.imdb import VOCAB_SIZE, load_imdb
        tr = load_imdb("train", max_len=max_len, data_dir=data_dir)
        te = load_imdb("test", max_len=max_len, data_dir=data_dir)
        g = torch.Generator().manual_seed(seed)
        i = torch.randperm(len(tr.labels), generator=g)[:n_train]
        j = torch.randperm(len(te.labels), generator=g)[:n_test]
        return tr.tokens[i], tr.labels[i], te.tokens[j], te.labels[j], VOCAB_SIZE, 2
    raise ValueError(f"`task` expected 'listops' or 'text', got {task!r}")


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, len(y), batch))
    model.train()
    return correct / max(len(y), 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_one(attention: str, data: tuple, args: argparse.Namespace, steps: int,
              max_seconds: float | None = None) -> dict:
    """Train one classifier for ``steps`` Adam steps (or until ``max_seconds``); evaluate it.
    ``data`` tensors may already sit on ``args.device`` (default CPU)."""
    xtr, ytr, xte, yte, vocab, ncls = data
    device = torch.device(getattr(args, "device", None) or "cpu")
    torch.manual_seed(args.seed)
    options = {"length_norm": True} if attention == "nam" and getattr(args, "nam_length_norm", False) else None
    model = LRAClassifier(vocab, ncls, xtr.shape[1], args.d_model, args.layers, args.heads, args.ffn,
                          args.dropout, attention, args.pool, attention_options=options,
                          norm_first=getattr(args, "norm_first", False)).to(device)
    if getattr(args, "zero_init_out", False):  # every attention block starts as the identity map
        for layer in model.encoder.layers:
            nn.init.zeros_(layer.attn.out.weight)
            nn.init.zeros_(layer.attn.out.bias)
    xtr, ytr, xte, yte = (t.to(device) for t in (xtr, ytr, xte, yte))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_factor(getattr(args, "warmup", 0) or 0, getattr(args, "decay", "none") or "none"))
    g = torch.Generator().manual_seed(args.seed + 1)
    order = torch.cat([torch.randperm(len(ytr), generator=g) for _ in range(steps * args.batch_size // len(ytr) + 1)])
    wall = cpu = 0.0
    losses, done, curve = [], 0, []
    log_every = getattr(args, "log_every", 0) or 0
    eval_every, evals = getattr(args, "eval_every", 0) or 0, []
    for step in range(steps):
        idx = order[step * args.batch_size:(step + 1) * args.batch_size].to(device)
        _sync(device)
        w0, c0 = time.perf_counter(), time.process_time()
        loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        _sync(device)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        losses.append(float(loss.detach()))
        done = step + 1
        if log_every and done % log_every == 0:
            curve.append({"step": done, "loss": sum(losses[-log_every:]) / log_every})
            print(f"  {attention} step {done}: mean training loss {curve[-1]['loss']:.4f} "
                  f"({wall:.0f} s wall)", flush=True)
        if max_seconds is not None and wall >= max_seconds:
            break   # the final evaluation below is the last point of the curve
        if eval_every and done % eval_every == 0 and done < steps:
            evals.append({"step": done, "test_accuracy": _accuracy(model, xte, yte, args.batch_size)})
            print(f"  {attention} step {done}: test accuracy {100 * evals[-1]['test_accuracy']:.1f}%", flush=True)
    t0 = time.perf_counter()
    acc = _accuracy(model, xte, yte, args.batch_size)
    evals.append({"step": done, "test_accuracy": acc})
    return {"attention": attention, "steps": done, "test_accuracy": acc, "test_examples": len(yte),
            "wall_s_per_step": wall / done, "cpu_s_per_step": cpu / done, "train_wall_s": wall,
            "eval_wall_s": time.perf_counter() - t0, "final_loss": sum(losses[-20:]) / len(losses[-20:]),
            "parameters": sum(p.numel() for p in model.parameters()), "loss_curve": curve, "eval_curve": evals}


def lr_factor(warmup: int, decay: str = "none"):
    """Learning-rate multiplier of step ``t`` (0-based, before the update): a linear warm-up
    ``(t + 1) / warmup`` over the first ``warmup`` steps, then 1 (``decay="none"``) or
    ``sqrt(warmup / (t + 1))`` (``decay="rsqrt"``, LRA's ``linear_warmup * rsqrt_decay``)."""
    if warmup < 0:
        raise ValueError(f"`warmup` expected >= 0, got {warmup}")
    if decay not in ("none", "rsqrt"):
        raise ValueError(f"`decay` expected 'none' or 'rsqrt', got {decay!r}")

    def factor(t: int) -> float:
        n = t + 1
        if n < warmup:
            return n / warmup
        return (max(warmup, 1) / n) ** 0.5 if decay == "rsqrt" else 1.0
    return factor


def format_table(rows: list[dict], base: str = "softmax") -> str:
    """Markdown table: accuracy and speed-ups vs ``base`` (wall and CPU time per step)."""
    ref = next((r for r in rows if r["attention"] == base), None)
    out = ["| attention | steps | test acc (%) | s/step wall | speed-up wall | s/step CPU | speed-up CPU |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        sw = f"{ref['wall_s_per_step'] / r['wall_s_per_step']:.2f}" if ref else "-"
        sc = f"{ref['cpu_s_per_step'] / r['cpu_s_per_step']:.2f}" if ref else "-"
        out.append(f"| {r['attention']} | {r['steps']} | {100 * r['test_accuracy']:.1f} | "
                   f"{r['wall_s_per_step']:.3f} | {sw} | {r['cpu_s_per_step']:.3f} | {sc} |")
    return "\n".join(out)


def run(args: argparse.Namespace) -> dict:
    """Run the comparison described by ``args``; writes ``results.json`` and ``table.md``."""
    torch.set_num_threads(args.threads)
    args.device = str(resolve_device(getattr(args, "device", None) or "cpu"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = load_task(args.task, args.max_len, args.n_train, args.n_test, args.seed, args.data_dir,
                     getattr(args, "min_len", None))
    data = (*(t.to(args.device) for t in data[:4]), *data[4:])  # once for every kind
    data_s = time.perf_counter() - t0
    kinds = [k.strip() for k in args.attention.split(",") if k.strip()]
    rows, steps = [], args.steps
    for i, kind in enumerate(kinds):
        limit = 60.0 * args.max_minutes if (i == 0 and args.max_minutes) else None
        row = train_one(kind, data, args, steps, limit)
        steps = row["steps"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "loss_curve"}), flush=True)
    base = "softmax" if "softmax" in kinds else kinds[0]
    table = format_table(rows, base)
    yte = data[3]
    majority = float(torch.bincount(yte).max().cpu()) / max(len(yte), 1)     # accuracy of the most frequent test label
    res = {"task": args.task, "config": {k: v for k, v in vars(args).items() if k != "data_dir"},
           "device": args.device, "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
           "majority_test_accuracy": majority, "data_seconds": data_s, "total_wall_s": time.perf_counter() - t0,
           "threads": torch.get_num_threads(), "rows": rows, "table": table}
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(res, indent=2))
    os.replace(tmp, out / "results.json")
    (out / "table.md").write_text(table + "\n")
    print(table)
    print(f"most frequent test label: {100 * majority:.1f}% of the test set")
    return res


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m memnets.experiments.lra", description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=["listops", "text"], default="listops")
    p.add_argument("--attention", default="softmax,linear,nam", help="comma-separated kinds; the first is timed")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    for name, typ in [("max-len", int), ("d-model", int), ("layers", int), ("heads", int), ("ffn", int),
                      ("batch-size", int), ("n-train", int), ("n-test", int)]:
        p.add_argument(f"--{name}", type=typ, default=None)
    p.add_argument("--pool", choices=["mean", "cls"], default=None)
    p.add_argument("--min-len", type=int, default=None,
                   help="ListOps: keep trees longer than this; default 500 at --max-len 2000, else max_len // 4")
    p.add_argument("--log-every", type=int, default=0, help="print the mean training loss every K steps")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--max-minutes", type=float, default=None, help="cap on the first kind's training time")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=0, help="linear learning-rate warm-up over the first N steps")
    p.add_argument("--decay", choices=["none", "rsqrt"], default="none",
                   help="after the warm-up: constant lr (none) or lr * sqrt(warmup / step) (rsqrt, as LRA)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="also measure test accuracy every K steps (kept in results.json as eval_curve)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--nam-length-norm", action="store_true",
                   help="NAM attention divides its output by the number of keys (NAMAttention(length_norm=True))")
    p.add_argument("--norm-first", action="store_true",
                   help="pre-LN encoder layers with a final LayerNorm (the LRA models), instead of post-LN")
    p.add_argument("--zero-init-out", action="store_true",
                   help="initialise each attention layer's output projection at zero, so every block starts "
                        "as the identity and the optimiser sets the attention's output scale")
    p.add_argument("--out", default="runs/lra")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    args = p.parse_args(argv)
    preset = dict(PRESETS[args.preset])
    preset.update(preset.pop(args.task))
    preset.pop("listops", None), preset.pop("text", None)
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.steps < 1:
        p.error("--steps expected >= 1")
    if args.warmup < 0 or args.eval_every < 0:
        p.error(f"--warmup and --eval-every expected >= 0, got {args.warmup} and {args.eval_every}")
    try:
        resolve_device(args.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    if args.min_len is not None and not 0 <= args.min_len < args.max_len - 1:
        p.error(f"--min-len expected 0 <= min_len < max_len - 1 (max_len {args.max_len}), got {args.min_len}")
    return args


def main(argv=None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
