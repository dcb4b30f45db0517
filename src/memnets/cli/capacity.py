"""``memnets capacity``: associative-memory capacity sweep (Schlag et al. 2021, Sec. 4).

Trains each memory from scratch at each number of stored pairs S and reports retrieval
accuracy / loss: setting 1 (capacity) by default, ``--edits`` adds setting 2 (keys
re-assigned, the latest value must be returned), ``--mqar`` adds multi-query associative
recall. Writes ``<out>/{capacity,edits,mqar}.json``, ``capacity.png`` / ``edits.png`` and
``tables.md``, and prints the Markdown tables. Defaults are CPU scale (a few minutes on 2
cores); ``--paper`` uses the paper's d_key = 64 and S up to 600 (GPU advised).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["add_parser"]

CPU = {"sizes": "8,16,32,64,128", "edit_sizes": "8,16,32,64", "d_key": 32, "steps": 400, "batch_size": 32}
PAPER = {"sizes": "20,40,60,80,100,150,200,250,300,350,400,450,500,600", "edit_sizes": "20,40,60,80,100,150,200",
         "d_key": 64, "steps": 3000, "batch_size": 32}
QUICK = {"sizes": "4,8", "edit_sizes": "4", "d_key": 8, "steps": 10, "batch_size": 4}


def _ints(name: str, text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"`--{name}` expected comma-separated integers, got {text!r}") from None
    if not out or any(v < 1 for v in out):
        raise ValueError(f"`--{name}` expected positive integers, got {text!r}")
    return out


def add_parser(sub) -> None:
    from ..capacity.adapters import DEFAULT_MEMORIES, MEMORIES

    p = sub.add_parser("capacity", help="associative-memory capacity sweep (retrieval, edits, MQAR)",
                       description=__doc__)
    p.add_argument("--memories", default=",".join(DEFAULT_MEMORIES),
                   help=f"comma-separated, from: {', '.join(MEMORIES)} (default: %(default)s)")
    p.add_argument("--sizes", default=None, help="numbers of stored pairs S (default 8,16,32,64,128)")
    p.add_argument("--edit-sizes", default=None, help="numbers of keys for --edits (default 8,16,32,64)")
    p.add_argument("--num-writes", type=int, default=None, help="writes per sequence with --edits (default 2·S)")
    p.add_argument("--steps", type=int, default=None, help="training steps per (memory, S) (default 400)")
    p.add_argument("--batch-size", type=int, default=None, help="training batch (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default %(default)s)")
    p.add_argument("--d-key", type=int, default=None, help="key width d_key (default 32; paper 64)")
    p.add_argument("--value-dim", type=int, default=None, help="value width (default: d_key)")
    p.add_argument("--value-kind", choices=("random", "onehot"), default="random",
                   help="random vectors (MSE loss) or one-hot values (cross-entropy)")
    p.add_argument("--eval-batch", type=int, default=256, help="held-out sequences per evaluation")
    p.add_argument("--edits", action="store_true", help="also run setting 2 (keys re-assigned)")
    p.add_argument("--mqar", action="store_true", help="also run MQAR")
    p.add_argument("--no-capacity", action="store_true", help="skip setting 1 (run only --edits / --mqar)")
    p.add_argument("--mqar-memories", default="delta,nam,linear,softmax", help="memories for MQAR")
    p.add_argument("--seq-len", type=int, default=512, help="MQAR sequence length (default %(default)s)")
    p.add_argument("--pairs", type=int, default=64, help="MQAR key-value pairs (default %(default)s)")
    p.add_argument("--vocab", type=int, default=512, help="MQAR vocabulary (default %(default)s; Zoology 8192)")
    p.add_argument("--d-model", type=int, default=64, help="MQAR model width (default %(default)s)")
    p.add_argument("--mqar-steps", type=int, default=400, help="MQAR training steps (default %(default)s)")
    p.add_argument("--mqar-lr", type=float, default=1e-2, help="MQAR Adam learning rate (default %(default)s)")
    p.add_argument("--out", default="runs/capacity", help="output folder (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="torch device for training, e.g. cuda (default %(default)s)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    scale.add_argument("--paper", action="store_true", help="paper scale: d_key 64, S up to 600 (slow on CPU)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import torch

    from ..capacity.plot import plot_sweep
    from ..capacity.sweep import markdown_table, mqar_table, run_mqar, run_sweep

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = QUICK if args.quick else PAPER if args.paper else CPU
    d_key = args.d_key or preset["d_key"]
    common = dict(d_key=d_key, value_dim=args.value_dim or d_key, value_kind=args.value_kind,
                  steps=preset["steps"] if args.steps is None else args.steps,
                  batch_size=args.batch_size or preset["batch_size"], lr=args.lr,
                  eval_batch=min(args.eval_batch, 16) if args.quick else args.eval_batch, seed=args.seed,
                  device=args.device)
    memories = [m.strip() for m in args.memories.split(",") if m.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables, t0 = [], time.perf_counter()

    def log(s: str) -> None:
        print(s, flush=True)

    def save(name: str, result: dict, plot: bool) -> None:
        (out / f"{name}.json").write_text(json.dumps(result, indent=2))
        if plot:
            plot_sweep(result, out / f"{name}.png")

    if not args.no_capacity:
        r = run_sweep(memories, _ints("sizes", args.sizes or preset["sizes"]), log=log,
                      on_row=lambda part: save("capacity", part, False), **common)
        save("capacity", r, True)
        tables.append(markdown_table(r))
    if args.edits:
        r = run_sweep(memories, _ints("edit-sizes", args.edit_sizes or preset["edit_sizes"]), edits=True,
                      num_writes=args.num_writes, log=log, on_row=lambda part: save("edits", part, False),
                      **common)
        save("edits", r, True)
        tables.append(markdown_table(r))
    if args.mqar:
        mq = dict(seq_len=64, num_pairs=8, vocab_size=64, d_model=16, steps=10, batch_size=4, eval_batch=8) \
            if args.quick else dict(seq_len=args.seq_len, num_pairs=args.pairs, vocab_size=args.vocab,
                                    d_model=args.d_model, steps=args.mqar_steps, batch_size=common["batch_size"])
        mq_mems = [m.strip() for m in args.mqar_memories.split(",") if m.strip()]
        r = run_mqar(mq_mems, log=log, lr=args.mqar_lr, seed=args.seed, device=args.device, **mq)
        save("mqar", r, False)
        tables.append(mqar_table(r))
    text = "\n\n".join(tables) + f"\n\nwall time: {time.perf_counter() - t0:.0f} s\n"
    (out / "tables.md").write_text(text)
    print()
    print(text)
    return 0
