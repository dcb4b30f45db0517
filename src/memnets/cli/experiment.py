"""``memnets experiment``: the learning runs behind docs/results.md, by name, with presets.

    memnets experiment --list
    memnets experiment fewshot-omniglot/cpu [--data-dir D] [--out DIR]
    memnets experiment lra/listops-200 --steps 300      # later flags override the preset's
    memnets experiment ntm-copy --steps 500             # no preset: the experiment's defaults

Each experiment is a module of :mod:`memnets.experiments` (also runnable as
``python -m memnets.experiments.<module>``); a preset is the argument list of a documented
measurement, so that ``memnets experiment NAME/PRESET`` reruns it. The arguments that follow
are passed on unchanged and, being parsed last, override the preset's values.
"""
from __future__ import annotations

import importlib

__all__ = ["add_parser", "EXPERIMENTS", "PRESETS", "experiment_argv"]

# name -> (module under memnets.experiments, what it measures)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "babi-memn2n": ("babi_memn2n", "End-to-End Memory Networks on bAbI en (1k or 10k), per task or joint"),
    "babi-seq": ("babi_seq", "DNC, LSAM, NAM-Transformer (and MemN2N) on bAbI as word sequences"),
    "fewshot-omniglot": ("fewshot_omniglot", "generalised few-shot Omniglot: cosine classifier vs NAM few-shot"),
    "lra": ("lra", "Long Range Arena ListOps / byte-level text: softmax vs Linear vs NAM attention"),
    "ntm-copy": ("ntm_copy", "NTM on the copy task (cost in bits per sequence, long-sequence generalisation)"),
}

# (experiment, preset) -> arguments of the documented run
PRESETS: dict[tuple[str, str], list[str]] = {
    ("babi-memn2n", "task1"): ["--tasks", "1"],
    ("babi-memn2n", "joint"): ["--tasks", "all", "--joint"],
    ("babi-memn2n", "joint-10-seeds"): ["--tasks", "all", "--joint", "--seeds", "10"],
    ("babi-memn2n", "joint-paper-text"): ["--tasks", "all", "--joint", "--recipe", "paper"],
    ("babi-seq", "joint-7min"): ["--models", "memn2n,lsam,nam_transformer,dnc", "--tasks", "all", "--joint",
                                 "--max-minutes", "7"],
    ("babi-seq", "joint-10k-dnc-gpu"): ["--models", "dnc", "--tasks", "all", "--joint", "--ten-k", "--device", "cuda",
                                        "--batch-size", "128", "--max-minutes", "7"],
    ("babi-seq", "joint-10k-lsam-gpu"): ["--models", "lsam", "--tasks", "all", "--joint", "--ten-k", "--device", "cuda",
                                         "--batch-size", "64", "--max-minutes", "7"],
    ("fewshot-omniglot", "cpu"): ["--epochs", "8", "--max-minutes", "40", "--threads", "1"],
    ("lra", "listops-200"): ["--task", "listops", "--attention", "softmax,linear,nam", "--max-len", "200",
                             "--n-train", "10000", "--n-test", "1000", "--batch-size", "32", "--steps", "1500",
                             "--log-every", "100", "--threads", "1"],
    ("lra", "listops-2000"): ["--task", "listops", "--attention", "softmax,linear,nam", "--max-len", "2000",
                              "--n-train", "12000", "--n-test", "500", "--batch-size", "8", "--steps", "1500",
                              "--max-minutes", "50", "--log-every", "100", "--threads", "1"],
    ("lra", "listops-2000-nam-9000"): ["--task", "listops", "--attention", "nam", "--max-len", "2000",
                                       "--n-train", "12000", "--n-test", "500", "--batch-size", "8",
                                       "--steps", "9000", "--norm-first", "--pool", "cls", "--warmup", "1000",
                                       "--log-every", "250", "--eval-every", "1500", "--threads", "1"],
    ("lra", "listops-2000-gpu"): ["--task", "listops", "--max-len", "2000", "--n-train", "20000", "--n-test", "1000",
                                  "--batch-size", "32", "--steps", "40000", "--max-minutes", "7.3",
                                  "--log-every", "250", "--device", "cuda"],
    ("lra", "text-1000"): ["--task", "text", "--attention", "softmax,linear,nam", "--max-len", "1000",
                           "--steps", "600", "--max-minutes", "7", "--threads", "1"],
    ("lra", "text-1000-4000"): ["--task", "text", "--attention", "softmax,linear,nam", "--max-len", "1000",
                                "--n-train", "25000", "--n-test", "1000", "--batch-size", "8", "--steps", "4000",
                                "--norm-first", "--pool", "cls", "--warmup", "500", "--log-every", "250",
                                "--eval-every", "1000", "--threads", "1"],
    ("lra", "listops-paper"): ["--task", "listops", "--preset", "paper", "--steps", "5000"],
    ("lra", "listops-nam-authors-gpu"): ["--task", "listops", "--attention", "nam", "--max-len", "1000",
                                         "--n-train", "96000", "--n-test", "2000", "--d-model", "256",
                                         "--layers", "4", "--heads", "4", "--ffn", "1024", "--pool", "cls",
                                         "--norm-first", "--dropout", "0.1", "--batch-size", "2",
                                         "--lr", "3.95e-4", "--warmup", "16000", "--decay", "rsqrt",
                                         "--weight-decay", "0.01", "--steps", "80000", "--log-every", "1000",
                                         "--eval-every", "8000", "--device", "cuda"],
    ("lra", "text-paper"): ["--task", "text", "--preset", "paper", "--steps", "5000"],
    ("ntm-copy", "cpu"): ["--log-every", "25", "--eval-lengths", "80"],
}


def experiment_argv(name: str, preset: str | None, extra: list[str]) -> list[str]:
    """The argument list passed to the experiment's ``main``: the preset's, then ``extra``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"`experiment` expected one of {sorted(EXPERIMENTS)}, got {name!r}")
    if preset is None:
        return list(extra)
    if (name, preset) not in PRESETS:
        have = sorted(p for e, p in PRESETS if e == name)
        raise ValueError(f"preset of {name!r} expected one of {have}, got {preset!r}")
    return [*PRESETS[(name, preset)], *extra]


def _listing() -> str:
    lines = []
    for name, (module, what) in EXPERIMENTS.items():
        presets = ", ".join(p for e, p in PRESETS if e == name) or "-"
        lines.append(f"{name:18s} {what}\n{'':18s} python -m memnets.experiments.{module}; presets: {presets}")
    return "\n".join(lines)


def _run(args) -> int:
    if args.list or not args.target:
        print(_listing())
        return 0
    name, _, preset = args.target.partition("/")
    argv = experiment_argv(name, preset or None, args.args)
    if preset:
        print(f"memnets experiment {args.target}: {' '.join(argv)}", flush=True)
    module = importlib.import_module(f"memnets.experiments.{EXPERIMENTS[name][0]}")
    module.main(argv)
    return 0


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser("experiment", help="run a documented learning experiment (bAbI, Omniglot, LRA, NTM copy)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", metavar="NAME[/PRESET]",
                   help="experiment, optionally with a preset: the arguments of a documented run (see --list)")
    p.add_argument("--list", action="store_true", help="list experiments and their presets")
    p.add_argument("args", nargs=argparse.REMAINDER, help="further arguments for the experiment (override the preset)")
    p.set_defaults(func=_run)
