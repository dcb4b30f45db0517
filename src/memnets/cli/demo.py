"""``memnets demo``: a few minutes that show the whole library working (``make demo``).

1. the NAM ops benchmark (``memnets bench ops --quick``: fast scan vs reference loop);
2. a small NAM Turing Machine and a small Transformer trained on Reduce at tiny scale
   (presets ``demo/reduce-nam_tm`` and ``demo/reduce-transformer``; a model whose module is
   not installed is replaced by the biLSTM baseline, with the reason printed);
3. their ID / OD-easy / OD-hard sequence accuracy as a Table-1-shaped Markdown table;
4. a learning-curve PNG (``<out>/learning_curves.png``).

The figures are tiny-scale smoke results, not the paper's measurements (see docs/results.md).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

__all__ = ["add_parser", "plot_learning_curves"]

DEMO_MODELS = ("nam_tm", "transformer")


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="benchmark + two tiny training runs + table + plot (< 10 min on 2 cores)",
                       description=__doc__)
    p.add_argument("--out", default=None, help="output directory (default: runs/demo-<timestamp>)")
    p.add_argument("--skip-bench", action="store_true", help="skip the ops benchmark")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides applied to both demo presets (e.g. epochs=2)")
    p.set_defaults(func=_run)


def plot_learning_curves(run_dirs: list[Path], path: Path) -> Path:
    """Per-run training loss and per-split sequence accuracy vs epoch, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for d in run_dirs:
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        name = json.loads((d / "config.json").read_text())["model"]["backbone"]
        tr = [r for r in recs if r["kind"] == "train"]
        ax_loss.plot([r["step"] for r in tr], [r["loss"] for r in tr], label=name)
        ev = [r for r in recs if r["kind"] == "eval"]
        for split, style in zip(ev[0]["splits"] if ev else [], ("-", "--", ":")):
            ax_acc.plot([r["epoch"] for r in ev], [r["splits"][split]["seq_acc"] for r in ev], style,
                        label=f"{name} {split}")
    ax_loss.set(xlabel="step", ylabel="train loss (cross-entropy)", yscale="log", title="training loss")
    ax_acc.set(xlabel="epoch", ylabel="sequence accuracy", ylim=(-0.02, 1.02), title="Reduce: accuracy by split")
    ax_loss.legend()
    ax_acc.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _run(args) -> int:
    import torch

    from ..models.seq import backbone_available
    from ..train import load_config, train
    from .table import format_table1

    t0 = time.perf_counter()
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    if not args.skip_bench:
        from ..bench.registry import format_table, run_suite

        print("== 1. NAM ops benchmark (memnets bench ops --quick) ==\n", flush=True)
        print(format_table(run_suite("ops", quick=True)), flush=True)
        print(f"\n(benchmark took {time.perf_counter() - t0:.0f}s)\n", flush=True)
    print("== 2. Training on Reduce at tiny scale ==", flush=True)
    results, dirs = [], []
    for bb in DEMO_MODELS:
        ok, why = backbone_available(bb)
        if not ok:
            print(f"  {bb}: not available here ({why}); using the biLSTM baseline instead", flush=True)
            bb = "lstm"
        cfg = load_config(f"demo/reduce-{bb}", args.overrides)
        d = out / cfg.name
        t1 = time.perf_counter()
        res = train(cfg, d, quiet=args.quiet)
        print(f"  {cfg.name}: {res['params']} parameters, {res['epochs']} epochs in "
              f"{time.perf_counter() - t1:.0f}s", flush=True)
        results.append(res)
        dirs.append(d)
    print("\n== 3. Sequence accuracy (epoch chosen by OD-easy, as the paper) ==\n")
    table = format_table1(results)
    print(table)
    (out / "table.md").write_text(table + "\n")
    png = plot_learning_curves(dirs, out / "learning_curves.png")
    print(f"\n== 4. Learning curves: {png} ==")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f}s "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)", file=sys.stderr)
    return 0
