"""``memnets experiment``: the learning runs behind docs/results.md, by name, with presets.

    memnets experiment --list
    memnets experiment fewshot-omniglot/cpu [--data-dir D] [--out DIR]
    memnets experiment lra/listops-200 max_steps=300      # = memnets train lra/listops-200-{softmax,linear,nam}
    memnets experiment ntm-copy/cpu epochs=5              # = memnets train ntm/copy-cpu epochs=5

Every experiment is an alias of one or more ``memnets train`` presets (:data:`ALIASES`; the
families' tasks are :mod:`memnets.train.families`): ``memnets experiment NAME[/PRESET]`` prints
and runs each ``memnets train <family>/<preset>`` in turn. The arguments that follow are
``key=value`` overrides (given to every run; ``@WORD:key=value`` only to the runs whose preset
name contains WORD, e.g. ``@pretrain:epochs=2``), ``--run-dir`` (or ``--out``; with several
runs, each goes to a folder of it), ``--data-dir``, ``--resume`` and ``--quiet``.
"""
from __future__ import annotations

__all__ = ["add_parser", "EXPERIMENTS", "ALIASES", "RESUMING", "train_argv"]

# name -> what it measures
EXPERIMENTS: dict[str, str] = {
    "babi-memn2n": "End-to-End Memory Networks on bAbI en (1k or 10k), per task or joint",
    "babi-seq": "DNC, LSAM, NAM-Transformer (and MemN2N) on bAbI as word sequences",
    "fewshot-omniglot": "generalised few-shot Omniglot: cosine classifier vs NAM few-shot",
    "lra": "Long Range Arena ListOps / byte-level text: softmax vs Linear vs NAM attention",
    "ntm-copy": "NTM on the copy task (cost in bits per sequence, long-sequence generalisation)",
    "ntm-tasks": "NTM on repeat copy, associative recall and priority sort (Graves et al. 2014)",
}

# (experiment, preset or None) -> the `memnets train` presets it runs, in order
_LRA_KINDS = ("softmax", "linear", "nam")
ALIASES: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("ntm-copy", None): ("ntm/copy",),
    ("ntm-copy", "cpu"): ("ntm/copy-cpu",),
    ("ntm-tasks", None): ("ntm/repeat_copy", "ntm/associative_recall", "ntm/priority_sort"),
    ("ntm-tasks", "repeat-copy-10-seeds"): tuple(f"ntm/repeat_copy seed={s} name=ntm-repeat_copy-s{s}"
                                                 for s in range(10)),
    # seeds that took no part in choosing the preset's budget
    ("ntm-tasks", "repeat-copy-seeds-10-13"): tuple(f"ntm/repeat_copy seed={s} name=ntm-repeat_copy-s{s}"
                                                    for s in range(10, 14)),
    ("ntm-tasks", "associative-recall-10-seeds"): tuple(
        f"ntm/associative_recall seed={s} name=ntm-associative_recall-s{s}" for s in range(10)),
    # seeds that took no part in choosing the preset
    ("ntm-tasks", "associative-recall-seeds-10-19"): tuple(
        f"ntm/associative_recall seed={s} name=ntm-associative_recall-s{s}" for s in range(10, 20)),
    ("ntm-tasks", "priority-sort-seeds-0-5"): tuple(
        f"ntm/priority_sort seed={s} name=ntm-priority_sort-s{s}" for s in range(6)),
    ("lra", None): tuple(f"lra/listops-{k}" for k in _LRA_KINDS),
    **{("lra", p): tuple(f"lra/{p}-{k}" for k in _LRA_KINDS)
       for p in ("listops-200", "listops-2000", "listops-2000-gpu", "text-1000", "text-1000-4000", "listops-paper",
                 "text-paper")},
    ("lra", "listops-2000-nam-9000"): ("lra/listops-2000-nam-9000",),
    ("lra", "listops-nam-authors-gpu"): ("lra/listops-nam-authors-gpu",),
    ("babi-memn2n", None): ("babi/memn2n-task1",),
    ("babi-memn2n", "task1"): ("babi/memn2n-task1",),
    ("babi-memn2n", "joint"): ("babi/memn2n-joint",),
    ("babi-memn2n", "joint-paper-text"): ("babi/memn2n-joint-paper-text",),
    # the paper's best of 10: `memnets table` keeps the seed with the lowest validation error
    ("babi-memn2n", "joint-10-seeds"): tuple(f"babi/memn2n-joint seed={s} name=babi-memn2n-joint-s{s}"
                                             for s in range(10)),
    ("babi-seq", None): tuple(f"babi/seq-task1-{k}" for k in ("dnc", "lsam", "nam_transformer")),
    # MemN2N beside the sequence models, with the same time limit
    ("babi-seq", "joint-7min"): ("babi/memn2n-joint time_limit_min=7 name=babi-seq-joint-7min-memn2n",
                                 *(f"babi/seq-joint-7min-{k}" for k in ("lsam", "nam_transformer", "dnc"))),
    ("babi-seq", "joint-10k-dnc-gpu"): ("babi/seq-joint-10k-dnc-gpu",),
    ("babi-seq", "joint-10k-lsam-gpu"): ("babi/seq-joint-10k-lsam-gpu",),
    # pre-training, then each setting on its features ({run0}: the first run's directory)
    **{("fewshot-omniglot", p): ("fewshot/omniglot-pretrain",
                                 *(f"fewshot/omniglot-{w}way-{k}shot task.options.backbone_run={{run0}}"
                                   for k in (1, 5) for w in (5, 20)))
       for p in (None, "cpu")},
}
# experiments whose rerun continues where the last one stopped (`--resume` on every run)
RESUMING = {"fewshot-omniglot"}

def train_argv(name: str, preset: str | None, extra: list[str], index: int = 0) -> list[str]:
    """The ``memnets train`` arguments of the ``index``-th run of ``memnets experiment
    NAME[/PRESET] extra...`` (an experiment of :data:`ALIASES`): its train preset, then
    ``extra`` (``--out D`` becomes ``--run-dir D``, or ``--run-dir D/<preset>`` when the
    experiment has several runs; ``--data-dir D`` sets ``$MEMNETS_DATA``). ValueError for a
    flag of the former experiment script."""
    import os

    targets = ALIASES[(name, preset)]
    target, *fixed = targets[index].split()  # a preset, then its own overrides (e.g. seed=3)
    run_name = next((f.split("=", 1)[1] for f in fixed if f.startswith("name=")), target.rsplit("/", 1)[-1])
    out, i = [target, *fixed], 0
    while i < len(extra):
        a = extra[i]
        if a in ("--out", "--run-dir", "--data-dir") and i + 1 < len(extra):
            if a == "--data-dir":
                os.environ["MEMNETS_DATA"] = extra[i + 1]
            elif len(targets) > 1:
                out += ["--run-dir", f"{extra[i + 1]}/{run_name}"]
            else:
                out += ["--run-dir", extra[i + 1]]
            i += 2
            continue
        if a == "--device" and i + 1 < len(extra):  # the override device=D of every run
            out.append(f"device={extra[i + 1]}")
            i += 2
            continue
        if a.startswith("--device="):
            out.append(f"device={a.split('=', 1)[1]}")
            i += 1
            continue
        if a.startswith("@") and ":" in a:  # @WORD:key=value: only for the runs whose preset contains WORD
            word, _, a = a[1:].partition(":")
            if word not in target:
                i += 1
                continue
        if a.startswith("--") and a not in ("--resume", "--quiet"):
            raise ValueError(f"`memnets experiment {name}{'/' + preset if preset else ''}` runs "
                             f"`memnets train {target}`: give settings as key=value overrides (e.g. epochs=5, "
                             f"see `memnets configs show {target}`), --run-dir, --device, --resume or --quiet; "
                             f"got {a!r}")
        out.append(a)
        i += 1
    flags = [a for a in out[1:] if a.startswith("--")]
    # the overrides first, then the flags (each --run-dir with its value)
    rest, j = [], 1
    while j < len(out):
        if out[j] == "--run-dir":
            j += 2
            continue
        if not out[j].startswith("--"):
            rest.append(out[j])
        j += 1
    runs = [x for k, x in enumerate(out) if k > 0 and out[k - 1] == "--run-dir"]
    return [out[0], *rest, *[f for f in flags if f != "--run-dir"], *(["--run-dir", runs[-1]] if runs else [])]


def _short(runs: tuple[str, ...]) -> list[str]:
    """The runs of an alias as listed: ``p seed=0 ...`` ... ``p seed=9 ...`` becomes ``p seed=0..9``
    (consecutive seeds of one preset); any other list is given run by run."""
    base = {r.split()[0] for r in runs}
    seeds = [next((int(w[5:]) for w in r.split() if w.startswith("seed=") and w[5:].isdigit()), None) for r in runs]
    if len(runs) > 3 and len(base) == 1 and None not in seeds and seeds == list(range(seeds[0], seeds[0] + len(runs))):
        return [f"{base.pop()} seed={seeds[0]}..{seeds[-1]} ({len(runs)} runs)"]
    return list(runs)


def _listing() -> str:
    lines = []
    for name, what in EXPERIMENTS.items():
        runs = f"\n{'':18s} ".join(f"{name}{'/' + p if p else ''} = memnets train {' + '.join(_short(t))}"
                                    for (e, p), t in ALIASES.items() if e == name)
        lines.append(f"{name:18s} {what}\n{'':18s} {runs}")
    return "\n".join(lines)


def _run(args) -> int:
    if args.list or not args.target:
        print(_listing())
        return 0
    name, _, preset = args.target.partition("/")
    if name not in EXPERIMENTS:
        raise ValueError(f"`experiment` expected one of {sorted(EXPERIMENTS)}, got {name!r}")
    if (name, preset or None) not in ALIASES:
        have = sorted(p for e, p in ALIASES if e == name and p)
        raise ValueError(f"preset of {name!r} expected one of {have}, got {preset!r}")
    return _run_aliases(args.target, name, preset or None, args.args)


def _run_aliases(target: str, name: str, preset: str | None, extra: list[str]) -> int:
    """Run every ``memnets train`` preset of the experiment in turn. When the first stops at its
    time limit, the others get its step count (``max_steps``) and no time limit, so that every
    run of the comparison makes the same number of steps (LRA); ``{run0}`` in a run's overrides
    is the first run's directory (few-shot: the pre-training run)."""
    from ..train.runs import RunError, load_run
    from .main import main

    from ..train import load_config

    more: list[str] = []
    run0 = None
    for i in range(len(ALIASES[(name, preset)])):
        argv = train_argv(name, preset, extra, i)
        at = next((j for j, a in enumerate(argv) if a.startswith("--")), len(argv))
        argv = [*argv[:at], *more, *argv[at:]]  # after the caller's overrides, so that they win
        if name in RESUMING and "--resume" not in argv:
            argv.append("--resume")
        if run0 is not None:
            argv = [a.replace("{run0}", run0) for a in argv]
        run_dir = argv[argv.index("--run-dir") + 1] if "--run-dir" in argv else \
            f"runs/{load_config(argv[0], [a for a in argv[1:] if '=' in a and not a.startswith('--')]).name}"
        run0 = run0 or run_dir
        print(f"memnets experiment {target}: memnets train {' '.join(argv)}", flush=True)
        rc = main(["train", *argv])
        if rc:
            return rc
        if i == 0 and len(ALIASES[(name, preset)]) > 1:
            try:
                res = load_run(run_dir).results or {}
            except RunError:
                res = {}
            if res.get("stopped_by_time_limit"):
                more = [f"max_steps={res['steps']}", "time_limit_min=0"]
    return 0


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser("experiment", help="the runs behind one documented result (bAbI, Omniglot, LRA, NTM copy), one after the other",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", metavar="NAME[/PRESET]",
                   help="experiment, optionally with a preset: the train presets of a documented run (see --list)")
    p.add_argument("--list", action="store_true", help="list experiments and their presets")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="key=value overrides for every run, --run-dir/--out DIR, --data-dir DIR, --device DEVICE, "
                        "--resume, --quiet")
    p.set_defaults(func=_run)
