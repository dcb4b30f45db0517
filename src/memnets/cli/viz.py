"""``memnets viz``: figures of what a memory does, from a run directory or a quick model.

    memnets viz runs/reduce-ntm [--task-sample SEED] [--out DIR]
    memnets viz --model ntm|dnc|nam_tm|lsam|softmax|nam|linear|delta [--task-sample SEED] [--out DIR]

With a run directory (``memnets train``, any task family) the trained model is rebuilt from
it, run on one sample of its task (the task's own: a digit window, a copy sequence, a test
example, ...) and the figures that fit the model are written as PNGs (plus the learning
curve of the run's metric). With ``--model``
an untrained small model is shown on one copy-task sequence (or a random input for an
attention layer).
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    import argparse

    from ..viz.runs import QUICK_MODELS

    p = sub.add_parser("viz", help="plot memory weightings, tapes, gates, attention maps and learning curves",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?", help="a directory written by `memnets train`")
    p.add_argument("--model", choices=QUICK_MODELS, help="plot an untrained small model instead of a run")
    p.add_argument("--task-sample", type=int, default=0, metavar="SEED", help="seed of the task sample (default 0)")
    p.add_argument("--split", default=None,
                   help="split the sample is drawn from (default: the task's; id for the algorithmic tasks, "
                        "the first split for the NTM tasks)")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best", help="weights to load (default best)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: <run_dir>/figures, or figures/<model> with --model)")
    p.add_argument("--dpi", type=int, default=100, help="PNG resolution (default 100)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..viz.runs import RunDirError, quick_figures, run_figures, write_figures
    from .main import UsageError

    if not args.run_dir and not args.model:
        raise UsageError("expected either a run directory or --model NAME: `memnets viz runs/NAME` (a trained "
                         "run) or `memnets viz --model ntm` (an untrained small model)")
    if args.run_dir and args.model:
        raise UsageError("give a run directory or --model NAME, not both")
    if args.model:
        try:
            figs = quick_figures(args.model, seed=args.task_sample)
        except ImportError as e:
            raise UsageError(f"model {args.model!r} is not available here: {e}") from e
        out = Path(args.out or Path("figures") / args.model)
    else:
        try:
            figs = run_figures(args.run_dir, seed=args.task_sample, checkpoint=args.checkpoint, split=args.split)
        except RunDirError as e:
            raise UsageError(str(e)) from e
        out = Path(args.out or Path(args.run_dir) / "figures")
    if not figs:
        print("no figures fit this model")
        return 1
    for name, path in write_figures(figs, out, dpi=args.dpi).items():
        print(f"{name}: {path}")
    return 0
