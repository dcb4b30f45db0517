"""``memnets train <preset|config.toml> [key=value ...] [--resume] [--run-dir D]``: train a model."""
from __future__ import annotations

import json
import sys

__all__ = ["add_parser"]

EPILOG = """examples:
  memnets train cpu/reduce-nam_tm
  memnets train ntm/copy-cpu epochs=5
  memnets train cpu/reduce-transformer epochs=5 optim.lr=3e-4 --run-dir runs/tf-short
  memnets train my_run.toml model.options.num_heads=2 --resume
presets: `memnets configs ls`; runs under torchrun use DistributedDataParallel."""


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser("train", help="train a model from a preset or TOML config", description=__doc__,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="preset name (see `memnets configs ls`) or path to a .toml file")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. optim.lr=3e-4 task.train_size=6400")
    p.add_argument("--resume", action="store_true", help="continue the run in the run directory exactly")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..train import ConfigError, load_config, train
    from ..train.checkpoint import RunLockedError
    from ..train.nan_guard import NonFiniteError
    from .main import UsageError

    try:
        cfg = load_config(args.config, args.overrides)
        res = train(cfg, args.run_dir, resume=args.resume, quiet=args.quiet)
    except (ConfigError, RunLockedError) as e:
        raise UsageError(str(e)) from e
    except NonFiniteError as e:
        print(f"memnets train: error: {e}; the run stopped (its last checkpoint stays; lower optim.lr, "
              "or set optim.nan_policy=skip to drop such steps)", file=sys.stderr, flush=True)
        return 1
    if res.get("splits") is not None:
        from ..train.task import get_task

        metric = get_task(cfg.task.name).metric  # seq_acc for the algorithmic tasks
        print(json.dumps({"name": res["name"], "best_epoch": res["best_epoch"],
                          metric: {k: round(v[metric], 4) for k, v in res["splits"].items()}}))
    return 0
