"""``memnets train <preset|config.toml> [key=value ...] [--resume] [--run-dir D]``: train a model."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

__all__ = ["add_parser"]

EPILOG = """examples:
  memnets train cpu/reduce-nam_tm
  memnets train ntm/copy-cpu epochs=5
  memnets train cpu/reduce-transformer epochs=5 optim.lr=3e-4 --run-dir runs/tf-short
  memnets train cpu/reduce-nam_tm epochs=5 --run-dir runs/short
  memnets train cpu/reduce-nam_tm --resume --run-dir runs/short     (continues with epochs=5)
  memnets train cpu/reduce-nam_tm epochs=10 --resume --run-dir runs/short   (trains it on to 10)
  memnets train cpu/reduce-nam_tm --device cpu
--resume continues the run from its saved config.json: the overrides it was started with
need not be repeated; on resume only compile, cuda_graph, threads, time_limit_min, tensorboard,
description and optim.nan_policy may change (a run stopped by a non-finite gradient goes on
with optim.nan_policy=skip), and the budget may grow (epochs, max_steps; not under the cosine
schedule): a finished run then trains on exactly as the longer run would have.
Ctrl-C stops a run and prints the command that continues it.
presets: `memnets configs ls`; runs under torchrun use DistributedDataParallel."""


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser("train", help="one run: train one model on one task with one seed, from a preset or TOML file",
                       description=__doc__,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="preset name (see `memnets configs ls`) or path to a .toml file")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. optim.lr=3e-4 task.train_size=6400")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in the run directory exactly, from its saved config.json (overrides "
                        "only for compile, threads, time_limit_min, tensorboard, description, and a "
                        "larger epochs or max_steps)")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    from .main import add_device_option

    add_device_option(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..train import ConfigError, load_config, train
    from ..train.checkpoint import RunLockedError
    from ..train.nan_guard import NonFiniteError
    from .main import UsageError

    from ..train.loop import resume_config

    run_dir = None
    try:
        cfg = load_config(args.config, args.overrides)
        run_dir = Path(args.run_dir or Path("runs") / cfg.name)
        if args.resume and (run_dir / "config.json").is_file():
            cfg = resume_config(run_dir, args.overrides)  # the run's own config, not the preset's
            if not args.quiet:
                print(f"memnets train: resuming {run_dir} ({cfg.name}) with its saved config.json",
                      file=sys.stderr, flush=True)
        res = train(cfg, run_dir, resume=args.resume, quiet=args.quiet)
    except (ConfigError, RunLockedError) as e:
        raise UsageError(str(e)) from e
    except KeyboardInterrupt:
        if run_dir is None:
            raise
        print(f"memnets train: interrupted; {_resume_hint(args, run_dir)}", file=sys.stderr, flush=True)
        return 130
    except NonFiniteError as e:
        if cfg.optim.nan_policy == "skip" or run_dir is None:  # skip raises only on a non-finite parameter
            print(f"memnets train: error: {e}; the run stopped (its last checkpoint stays; lower optim.lr)",
                  file=sys.stderr, flush=True)
        else:
            print(f"memnets train: error: {e}; the run stopped. Lower optim.lr, or drop such steps: "
                  f"{_resume_hint(args, run_dir, ['optim.nan_policy=skip'])}", file=sys.stderr, flush=True)
        return 1
    if res.get("splits") is not None:
        from ..train.task import get_task

        metric = get_task(cfg.task.name).metric  # seq_acc for the algorithmic tasks
        print(json.dumps({"name": res["name"], "best_epoch": res["best_epoch"],
                          metric: {k: round(v[metric], 4) for k, v in res["splits"].items()}}))
    return 0


def resume_command(config: str, run_dir: str | Path, overrides: list[str] | None = None) -> str:
    """The shell command that continues the run in ``run_dir`` (``overrides``: only those a
    run without its ``config.json`` yet needs)."""
    return shlex.join(["memnets", "train", str(config), *(overrides or []), "--resume", "--run-dir", str(run_dir)])


def _resume_hint(args, run_dir: Path, changes: list[str] | None = None) -> str:
    """What an interrupted run left and the command that continues it (with the overrides
    ``changes``, keys that may change on resume)."""
    pointer = run_dir / "checkpoints" / "last.json"
    try:
        step = json.loads(pointer.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    saved = (run_dir / "config.json").is_file()
    cmd = resume_command(args.config, run_dir, [*([] if saved else args.overrides), *(changes or [])])
    where = f"its last checkpoint (step {step}) is in {run_dir}" if step is not None else \
        f"no checkpoint was written yet in {run_dir} (resuming starts it from step 0)"
    return f"{where}; continue it with:\n  {cmd}"
