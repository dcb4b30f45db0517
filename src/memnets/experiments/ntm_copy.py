"""Train the NTM on the copy task (Graves et al. 2014, §4.1; docs/maths.md §7, §11).

    python -m memnets.experiments.ntm_copy [--steps N --batch-size B --out DIR --seed S]

Setup: LSTM controller 100, memory 128 × 20, one read and one write head, shifts −1..+1,
8-bit vectors, train lengths 1–20, loss = cost in bits per sequence, gradient-norm
clipping 10, Adam lr 1e-3 (Collier & Beel 2018) or RMSProp with momentum (Graves et al.
2014), batch 8. By default all sequences of a batch share one length drawn uniformly from
1–20, so no padded steps are run.

Optional annealing (off by default): once the logged training cost first falls below
``--anneal-below`` bits, the learning rate halves (``--anneal-factor``) every
``--anneal-every`` sequences, down to ``--min-lr``; before that point it stays constant, so
the escape from the initial plateau, whose timing varies from seed to seed, is not slowed.
Logs the cost every ``--log-every`` steps to ``DIR/metrics.jsonl`` and writes
``DIR/results.json`` with the sequences seen until the running cost first fell below 0.1
bits per sequence and the average bit errors on held-out copies of length 20, 40 (and the
longer ``--eval-lengths``), for the final model and for the snapshot taken at the lowest
logged training cost.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path

import torch

from ..memories.ntm import NTM
from ..tasks.ntm_tasks import CopyTask, bit_errors, bits_per_sequence

__all__ = ["train", "evaluate", "main"]


@torch.no_grad()
def evaluate(model: NTM, length: int, n_sequences: int = 64, seed: int = 1234, bits: int = 8) -> dict:
    """Cost (bits/sequence) and average bit errors per sequence on copies of exactly ``length``."""
    model.eval()
    task = CopyTask(min_len=length, max_len=length, bits=bits)
    batch = task.make_batch(n_sequences, torch.Generator().manual_seed(seed))
    y, _ = model(batch.inputs)
    model.train()
    return {"length": length, "sequences": n_sequences,
            "cost_bits": float(bits_per_sequence(y, batch.targets, batch.mask)),
            "bit_errors": float(bit_errors(y, batch.targets, batch.mask))}


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> dict:
    """Run the experiment described by ``args`` (see :func:`main`); returns the results dict."""
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = CopyTask(min_len=args.min_len, max_len=args.max_len, bits=8)
    model = NTM(task.input_size, task.output_size, memory_slots=128, word_size=20, read_heads=1,
                write_heads=1, controller="lstm", controller_size=100, shift_range=1)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.RMSprop(model.parameters(), lr=args.lr, momentum=0.9, alpha=0.95)
    gen = torch.Generator().manual_seed(args.seed)
    lr, anneal_from = args.lr, None  # sequences seen when the cost first fell below --anneal-below
    metrics = open(out / "metrics.jsonl", "w")
    t0 = time.time()
    window: list[float] = []
    reached = None
    log_rows = []
    best_cost, best_step, best_state = math.inf, 0, None
    for step in range(1, args.steps + 1):
        if args.same_length:  # one length per batch: no padded steps to run
            L = int(torch.randint(args.min_len, args.max_len + 1, (1,), generator=gen))
            batch = CopyTask(min_len=L, max_len=L, bits=8).make_batch(args.batch_size, gen)
        else:
            batch = task.make_batch(args.batch_size, gen)
        y, _ = model(batch.inputs)
        loss = bits_per_sequence(y, batch.targets, batch.mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            cost = sum(window) / len(window)
            window = []
            seen = step * args.batch_size
            row = {"step": step, "sequences": seen, "cost_bits": cost, "lr": lr,
                   "time_s": round(time.time() - t0, 1)}
            if reached is None and cost < 0.1:
                reached = seen
            if anneal_from is None and args.anneal_below > 0 and cost < args.anneal_below:
                anneal_from = seen
            if cost < best_cost:  # snapshot at the lowest logged training cost
                best_cost, best_step = cost, step
                best_state = copy.deepcopy(model.state_dict())
            log_rows.append(row)
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            print(json.dumps(row), flush=True)
        if anneal_from is not None:
            halvings = (step * args.batch_size - anneal_from) // args.anneal_every
            lr = max(args.min_lr, args.lr * args.anneal_factor ** halvings)
            for group in opt.param_groups:
                group["lr"] = lr
        if args.max_minutes and time.time() - t0 > args.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes} reached", flush=True)
            break
    metrics.close()
    lengths = sorted({20, 40, *args.eval_lengths})
    evals = [evaluate(model, L) for L in lengths]
    final_state = copy.deepcopy(model.state_dict())
    evals_best = []
    if best_state is not None:
        model.load_state_dict(best_state)
        evals_best = [evaluate(model, L) for L in lengths]
        model.load_state_dict(final_state)
    for e in evals:
        print(json.dumps({"model": "final", **e}), flush=True)
    for e in evals_best:
        print(json.dumps({"model": f"best (step {best_step})", **e}), flush=True)
    results = {
        "task": "copy", "model": "ntm", "config": dict(model.config.__dict__),
        "args": {k: v for k, v in vars(args).items()},
        "steps": step, "sequences_seen": step * args.batch_size,
        "train_seconds": round(time.time() - t0, 1),
        "final_cost_bits": log_rows[-1]["cost_bits"] if log_rows else math.nan,
        "sequences_to_cost_below_0.1": reached,
        "anneal_from_sequences": anneal_from, "final_lr": lr,
        "eval": evals,
        "best_step": best_step, "best_cost_bits": best_cost, "eval_best": evals_best,
        "bar": {"cost_below_0.1_within_sequences": 20000, "max_bit_errors_length_40": 1.0},
    }
    _write_json(out / "results.json", results)
    torch.save({"model": model.state_dict(), "config": model.config.__dict__, "step": step}, out / "model.pt")
    return results


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m memnets.experiments.ntm_copy", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--optimizer", choices=["adam", "rmsprop"], default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=10.0, help="gradient-norm clipping")
    p.add_argument("--anneal-below", type=float, default=0.0,
                   help="start annealing once the logged cost falls below this many bits (0 = never)")
    p.add_argument("--anneal-every", type=int, default=2000, help="sequences between learning-rate cuts")
    p.add_argument("--anneal-factor", type=float, default=0.5)
    p.add_argument("--min-lr", type=float, default=1e-5)
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--eval-lengths", type=int, nargs="*", default=[80, 120])
    p.add_argument("--same-length", action=argparse.BooleanOptionalAction, default=True,
                   help="draw one length per batch (default) instead of one per sequence")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this wall time (0 = off)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/ntm_copy")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name, ok, want in (("--steps", args.steps >= 1, ">= 1"), ("--batch-size", args.batch_size >= 1, ">= 1"),
                           ("--lr", args.lr > 0, "> 0"), ("--clip", args.clip > 0, "> 0"),
                           ("--anneal-below", args.anneal_below >= 0, ">= 0"),
                           ("--anneal-every", args.anneal_every >= 1, ">= 1"),
                           ("--anneal-factor", 0 < args.anneal_factor <= 1, "in (0, 1]"),
                           ("--min-lr", args.min_lr >= 0, ">= 0")):
        if not ok:
            p.error(f"{name} expected a value {want}, got {getattr(args, name[2:].replace('-', '_'))}")
    torch.set_num_threads(args.threads)
    return train(args)


if __name__ == "__main__":
    main()
