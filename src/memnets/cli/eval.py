"""``memnets eval <run_dir>``: score a run's saved model on every split of its task (any task
family; the columns are the task's metrics)."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["add_parser", "evaluate_run"]


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a trained run on its splits", description=__doc__)
    p.add_argument("run_dir", help="a directory written by `memnets train`")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="weights to load: best (selected by the OD-easy accuracy) or last")
    p.add_argument("--eval-size", type=int, default=None, help="samples per split (default: the run's)")
    p.add_argument("--draw", type=int, default=0, metavar="N",
                   help="algorithmic tasks: score on splits drawn independently of the ones the run was "
                        "evaluated and selected on (N >= 1; 0, the default: those same splits)")
    p.add_argument("--by-digits", action="store_true",
                   help="also score each digit count of every split (rows 'split/n')")
    p.add_argument("--by-slot", action="store_true",
                   help="also the accuracy of each answer slot k (the k-th MASK; for Fib the k-th least "
                        "significant digit of the sum) per split, as 'split/slots'")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--save", default=None, metavar="FILE",
                   help="also write the scores, with the checkpoint, draw and size they were made with, to this "
                        "JSON file (e.g. beside the run's kept results.json; `memnets table --eval FILENAME` "
                        "reads it there)")
    p.set_defaults(func=_run)


def evaluate_run(run_dir: str | Path, checkpoint: str = "best", eval_size: int | None = None,
                 by_digits: bool = False, by_slot: bool = False, draw: int = 0) -> dict:
    """``{split: metrics}`` for the run's saved weights (the metrics of its task: for the
    algorithmic tasks ``{"seq_acc", "tok_acc", "ans_acc", "loss", "n"}``); with ``by_digits``
    (algorithmic tasks only) also ``"split/n"`` for the samples of each digit count ``n``; with
    ``by_slot`` (algorithmic tasks only) ``"split/slots"``: ``{"slot_acc": [...], "slot_n": [...]}``
    (:func:`memnets.train.families.nsp.slot_accuracy`). ``draw`` (algorithmic tasks only): score
    on splits drawn independently of the run's own (:func:`memnets.train.families.nsp.eval_splits`),
    so that the model selected on the run's splits is scored on samples that did not select it."""
    import dataclasses

    from ..train.runs import RunError, load_run
    from .main import UsageError

    run_dir = Path(run_dir)
    try:  # a missing or malformed config.json, a missing or unfitting checkpoint
        run = load_run(run_dir, checkpoint)
    except RunError as e:
        raise UsageError(str(e)) from e
    if draw < 0:
        raise UsageError(f"--draw expected an integer >= 0, got {draw}")
    if run.family != "nsp":
        if by_digits or by_slot or draw:
            flag = "--by-digits" if by_digits else "--by-slot" if by_slot else "--draw"
            raise UsageError(f"{flag} needs an algorithmic-task run; {run_dir} is a {run.task.name!r} run")
        return run.evaluate(eval_size)
    from ..train.families.nsp import eval_splits, evaluate, slot_accuracy

    cfg = run.config
    if eval_size:
        cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, eval_size=eval_size))
    model = run.model
    out = {}
    for name, s in eval_splits(cfg, draw).items():
        out[name] = evaluate(model, s, batch_size=256)
        if by_digits:
            for n in s.digits.unique().tolist():
                m = s.digits == n
                out[f"{name}/{n}"] = evaluate(model, type(s)(*(t[m] for t in s)), batch_size=256)
        if by_slot:
            acc = slot_accuracy(model, s)
            out[f"{name}/slots"] = {"slot_acc": [a for a, _ in acc], "slot_n": [n for _, n in acc]}
    return out


def _run(args) -> int:
    res = evaluate_run(args.run_dir, args.checkpoint, args.eval_size, args.by_digits, args.by_slot, args.draw)
    if args.save:
        from ..train.checkpoint import atomic_write_text
        from ..train.loop import resume_config

        size = args.eval_size or resume_config(args.run_dir).task.eval_size  # the run's config.json alone
        record = {"run_dir": str(args.run_dir), "checkpoint": args.checkpoint, "draw": args.draw,
                  "eval_size": size, "splits": res}
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.save), json.dumps(record, indent=1) + "\n")
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    slots = {k[:-len("/slots")]: res.pop(k) for k in list(res) if k.endswith("/slots")}
    first = next(iter(res.values()), {})
    if {"seq_acc", "tok_acc", "ans_acc"} <= set(first):  # the algorithmic tasks
        print("| split | seq_acc | tok_acc | ans_acc | n |\n|---|---|---|---|---|")
        for name, m in res.items():
            print(f"| {name} | {m['seq_acc']:.2%} | {m['tok_acc']:.2%} | {m['ans_acc']:.2%} | {m['n']} |")
        if slots:
            width = max(len(v["slot_acc"]) for v in slots.values())
            print("\nAnswer-slot accuracy (slot k: the k-th MASK; for Fib the k-th least significant digit)\n")
            print("| split | " + " | ".join(str(k) for k in range(width)) + " |\n|---|" + "---|" * width)
            for name, v in slots.items():
                cells = [f"{a:.0%}" for a in v["slot_acc"]] + [""] * (width - len(v["slot_acc"]))
                print(f"| {name} | " + " | ".join(cells) + " |")
        return 0
    keys = [k for k, v in first.items() if k != "n" and isinstance(v, (int, float))] + (["n"] if "n" in first else [])
    print("| split | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for name, m in res.items():
        cells = [f"{m[k]:.4g}" if isinstance(m.get(k), float) else str(m.get(k, "–")) for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0
